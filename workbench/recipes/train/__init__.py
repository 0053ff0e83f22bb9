"""The `train` study kind: train every run of a sweep, decide its `expect:` entries, report.

    recipe.py    TrainKind: validate, dry run, the loop (tuning, final runs, adaptive seeds), report
    runs.py      TrainInputs (what a report is computed from) and TrainRuns (the runs by variant)
    gates.py     Gates: did each variant learn at all (the task's baselines, the threshold)
    verdicts.py  Verdicts: the comparisons and their verdict lines; seeds_wanted (the seed rule)
    results.py   TrainResults: runs, gates and verdicts, computed once for every section
    tables.py    the table sections (Across scale, Setup, Learned, Leaderboard, Failed runs, Environment)
    figures.py   the figure sections (verdict figures, Figures, Fits)
    report.py    SECTIONS in reading order, and the report from a store
    compare.py   `workbench compare`: one training report over several study folders
    plan.py      `workbench plan`: a pilot, its noise and CPU, the seeds each `expect:` entry needs
"""
