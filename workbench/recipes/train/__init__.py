"""The `train` study kind: train every run of a sweep, decide its `expect:` entries, report.
Everything only this kind uses lives here, from its study file to its report.

    study.py     TrainStudy: the study file (task, model, train, sweep, expect, tune, seeds, scale)
    sweep.py     a study -> its runs, each validated (run ids)
    tuning.py    each sweep point's chosen training values (`tune:`)
    recipe.py    TrainKind: validate, dry run, the loop (tuning, final runs, adaptive seeds), report
    sequential.py  adaptive seeds: the looks and the loop that adds seeds while a comparison is open
    runs.py      TrainInputs (what a report is computed from) and TrainRuns (the runs by variant)
    gates.py     Gates: did each variant learn at all (the task's baselines, the threshold)
    verdicts.py  Verdicts: the comparisons and their verdict lines; seeds_wanted (the seed rule)
    computed.py  TrainResults: runs, gates and verdicts, computed once for every section
    tables.py    the table sections (Across scale, Setup, Learned, Leaderboard, Failed runs, Environment)
    figures.py   the figure sections (verdict figures, Figures, Fits)
    report.py    SECTIONS in reading order, and the report from a store
    compare.py   `workbench compare`: one training report over several study folders
    plan.py      `workbench plan`: a pilot, its noise and CPU, the seeds each `expect:` entry needs

The statistics and sections behind them: stats (the verdict rule), learned_gate, ladder,
convergence (did the budget suffice?), seed_planning (`workbench plan`'s simulations),
tuning_section, compute_curves, verdict_figure (the first screen's figure), pictures (attention maps).
"""
