"""The verdict rule, in one folder that imports nothing else of the workbench: read it, test it
and change it here (tests/test_architecture.py keeps it apart).

    numbers.py     how a number prints (one place for the rule's words and every report)
    intervals.py   means and differences with their t intervals and tests, on arrays of seeds;
                   shares of failed seeds with Fisher's exact test
    gate.py        did a group learn at all: the task's baselines, the threshold, the gate's state
    outcomes.py    what a verdict can conclude (Outcome) and the rule's version (VERDICT_RULE)
    family.py      the rule on arrays: one look of a study's comparisons (or of a simulated batch
                   of them), Holm's step-down with Shaffer's count, MIN_SEEDS
    rule.py        RULE in words; Comparison and Verdict; verdicts(): a study's outcomes, worded
    power.py       what seeds detect, the seeds a difference or an equivalence needs
    sequential.py  adaptive seeds: the looks and their alphas, futility, which groups get more
                   seeds, and the add-seeds loop
    planning.py    the seeds a study needs, by simulating the rule (`workbench plan`)

The recipes and the report call these; the null simulation (tests/stats/test_null.py) and
`workbench plan` call the same functions on many studies at once.
"""
