"""The report of a training study: verdicts, setup, leaderboards with intervals, curves,
extrapolation, cost, failures, notes and environment, from the store's flat run table.

Every table keeps every variant: one whose runs all failed is listed with "–" and its
status counts, and each failed, diverged or out-of-memory run appears with its message and
the step it reached.

TrainReport puts the report's parts together: the runs (workbench.recipes.train.runs), the
learned-at-all gates (train_gates), the verdicts (train_verdicts), the tables (train_tables),
the figures (train_figures) and whether the budget sufficed (convergence).
"""

from __future__ import annotations

import pandas as pd

from workbench.report.convergence import settling, settling_section
from workbench.report.document import Paragraph, Report, Section
from workbench.report.tuning import TuningSection
from workbench.recipes.train.runs import metric_direction, metric_range
from workbench.recipes.train.verdicts import TrainVerdicts
from workbench.recipes.train.tables import TrainTables
from workbench.recipes.train.figures import TrainFigures


class TrainReport(TrainVerdicts, TrainTables, TrainFigures):
    """Computes the sections of one training study's report; figures go to `dest/figures/`."""

    def build(self) -> Report:
        decided = self.verdicts()
        sections = [self.scale_section(decided), self.setup()]
        if self.study.tune is not None:
            tuning = TuningSection(self.study, self.inputs.tuning, self.variants, self.palette, self.dest)
            sections.append(tuning.build())
        sections += [self.learned_section(), self.leaderboards(), self.settling_section(), self.fits_section(),
                     self.figures_section()]
        if self.inputs.pictures is not None:
            items = self.inputs.pictures(self.variants, self.finished, self.dest)
            if items:
                sections.append(Section("What the model does", items))
        sections.append(self.failures())
        if self.study.notes.strip():
            sections.append(Section("Notes", [Paragraph(p.strip()) for p in self.study.notes.split("\n\n") if p.strip()]))
        sections.append(self.environment())
        lines = [self.verdict_line(v, index) for v, index in decided]
        return Report(name=self.study.name, kind="train", question=self.study.description or "(no description)",
                      verdicts=lines, sections=[s for s in sections if s is not None], learned=self.learned_lines(),
                      verdict_figures=self.verdict_figures(lines))

    def settling_section(self) -> Section | None:
        """Whether the budget sufficed: the verdict metrics over the last 20% of the steps."""
        curves = self.inputs.curves
        if curves is None or curves.empty:
            return None
        metrics = list(dict.fromkeys(exp.metric for exp in self.study.expect if exp.target is None))
        scales = {m: (metric_direction(m, self.task_name), metric_range(m, self.task_name)) for m in metrics}
        return settling_section(settling(curves, self.finished, metrics, scales))

    def results_csv(self) -> pd.DataFrame:
        """Every run, one row each, in sweep order (tuning runs last), with its variant label first."""
        runs = pd.concat([self.runs, self.tuning_runs])
        frame = runs.drop(columns=["variant"])
        frame.insert(0, "variant", runs["variant"])
        return frame
