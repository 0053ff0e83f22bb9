"""The `train` study kind: train every run of a sweep, decide its `expect:` entries, report.
Everything only this kind uses lives here, from its study file to its report; the verdict rule
it applies is workbench.stats.

    study.py           TrainStudy: the study file (task, model, train, sweep, expect, tune, seeds, scale)
    sweep.py           a study -> its runs, each validated (run ids)
    tuning.py          each sweep point's chosen training values (`tune:`)
    recipe.py          TrainKind: validate, dry run, the loop (tuning, final runs, adaptive seeds), report
    runs.py            TrainInputs (what a report is computed from) and TrainRuns (the runs by variant)
    compute_curves.py  what a run spent until it first reached a stated score (*_to_target)
    gates.py           Gates: did each variant learn at all (the task's baselines, the threshold)
    verdicts.py        Verdicts: the comparisons and their verdict lines; seeds_wanted (the seed rule)
    compare.py         `workbench compare`: one training report over several study folders
    plan.py            `workbench plan`: a pilot, its noise and CPU, the seeds each `expect:` entry needs
    report/            the report's sections, one module each (report/__init__.py lists them)
"""
