"""The report of a training study, section by section (workbench.report.document sections).

    build.py           SECTIONS in reading order, the header, and the report from a store
    computed.py        TrainResults: runs, gates and verdicts, computed once for every section
    tables.py          the table sections (Across scale, Setup, Learned, Leaderboard, Failed runs, Environment)
    figures.py         the figure sections (verdict figures, Figures, Fits)
    verdict_figure.py  the first screen's figure: each compared group's seeds, mean and interval
    ladder.py          a verdict's outcomes across the rungs of a scale ladder, in one line
    convergence.py     whether the budget sufficed: the verdict metrics over the last steps
    tuning_section.py  with `tune:`, each point's candidates and what it chose
    pictures.py        attention and position pictures from the saved weights

The verdict rule these sections print is workbench.stats; the comparisons they read come from
workbench.recipes.train.verdicts.
"""
