"""The runs of one training study as its report reads them: the final runs, labelled by
variant and in sweep order, each `expect:` entry's column, and what every section asks of
them (a variant's values and interval, the headline metrics, a metric's direction and range).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.errors import WorkbenchError
from workbench.registry import get_variant
from workbench.report import figures
from workbench.report.document import Item, fmt, fmt_interval
from workbench.stats.intervals import Interval, mean_ci
from workbench.report.sweep_points import Variants
from workbench.recipes.train.compute_curves import to_target_by_run
from workbench.results import (DESCRIPTIVE_METRICS, FAILURE_SHARE, RUN_MEASURES, SHARE_OF_FAILED, SPENT, TO_TARGET,
                               TUNE, Metric, Status)
from workbench.tasks import METRICS
from workbench.recipes.train.tuning import PointTuning


def split_stages(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(final runs, tuning runs) of a flat results table."""
    tuning = runs["stage"] == TUNE if "stage" in runs else pd.Series(False, index=runs.index)
    return runs[~tuning].reset_index(drop=True), runs[tuning].reset_index(drop=True)


@dataclass
class TrainInputs:
    """Everything a training report is computed from (all read from the store)."""

    study: Any  # workbench.study.TrainStudy
    runs: pd.DataFrame  # one row per run (store.load_results)
    curves: pd.DataFrame  # long rows: run_id, step, metric, value
    environment: dict[str, str]
    command: str  # the command that reproduces the runs
    pictures: Callable[[Variants, pd.DataFrame, Path], list[Item]] | None = None
    tuning: Sequence[PointTuning] = ()  # with `tune:`: each sweep point's candidates and choice
    timing_caveat: str | None = None  # workbench.report.timing_caveat of the runs: timings from a shared machine


def metric_declaration(metric: str, task_name: str) -> Metric:
    """What a report column means (workbench.results.Metric): a task's score as its task
    declares it, a run measure as the run does; what a run spent to reach a target
    (flops_to_target) is spent; the share of failed seeds is a share, lower is better."""
    if metric.split(":")[0] in TO_TARGET:
        return SPENT
    base = metric.split("@")[0]
    if base in RUN_MEASURES:
        return RUN_MEASURES[base]
    if base == FAILURE_SHARE:
        return SHARE_OF_FAILED
    try:
        task = get_variant("task", task_name)
    except Exception:  # noqa: BLE001 - a task no longer installed: the built-in declarations
        if base not in METRICS:
            raise WorkbenchError(f"{metric}: task {task_name!r}, which declares it, is not installed, and it is "
                                 f"not a built-in metric ({', '.join(METRICS)}): install the task to report on it"
                                 ) from None
        return METRICS[base]
    return task.metric(base)


def metric_direction(metric: str, task_name: str) -> bool | None:
    """True when higher is better (None: a descriptive measure)."""
    return metric_declaration(metric, task_name).higher_is_better


def metric_range(metric: str, task_name: str) -> tuple[float, float]:
    """(lowest, highest) possible value of a metric, as its declaration states."""
    return metric_declaration(metric, task_name).range


def metric_columns(runs: pd.DataFrame, task_cls_metrics: Sequence[str]) -> list[str]:
    """Final-metric columns (`accuracy@64`, `loss@64`, `bleu`), task metrics first, by length,
    then descriptive measures (attention_entropy@16) when the runs recorded them."""
    names = [*task_cls_metrics, "loss", *DESCRIPTIVE_METRICS]
    found = []
    for col in runs.columns:
        m = re.fullmatch(r"(\w+)(?:@(\d+))?", str(col))
        if m and m.group(1) in names:
            found.append((names.index(m.group(1)), int(m.group(2) or 0), col))
    return [col for *_, col in sorted(found)]


def interval_text(iv: Interval) -> str:
    """'0.912 [0.899, 0.925]'; seeds without spread are flagged instead of given a zero-width interval."""
    if iv.constant:
        return f"{fmt(iv.mean)} (all {iv.n} seeds equal)"
    return fmt_interval(iv.mean, iv.lo, iv.hi)


def split_metric(col: str) -> tuple[str, int | None]:
    """accuracy@64 -> (accuracy, 64); 'flops_to_target: bpc@32 ≤ 2.5' -> (flops_to_target, None)."""
    if col.split(":")[0] in TO_TARGET:
        return col.split(":")[0], None
    name, _, length = col.partition("@")
    return name, int(length) if length else None


class TrainRuns:
    """The final runs of one training study, labelled by variant, with what every section of its
    report (and the adaptive-seed rule) reads from them."""

    def __init__(self, study, runs: pd.DataFrame, curves: pd.DataFrame | None = None,
                 tuning: Sequence[PointTuning] = ()):
        self.study, self.curves, self.tuning = study, curves, tuning
        self.all_runs = runs  # as stored: tuning runs too
        self._values: dict[tuple[str, str], pd.Series] = {}  # (variant, metric) -> its finished seeds' values
        self.task_name = self.study.task["name"]
        self.keys = list(self.study.sweep.keys)
        swept = {k: self.study.sweep.values(k) for k in self.keys}
        runs = runs.copy()
        self.variants = Variants.of(self.keys, runs, swept)
        runs["variant"] = self.variants.label_runs(runs)
        order = ["index", "seed"] if "index" in runs else ["variant", "seed"]
        runs = runs.sort_values(order, key=self._variant_order).reset_index(drop=True)
        self.unreached: dict[str, set[str]] = {}  # to-target column -> finished runs that never reached it
        for exp in self.study.expect:
            if exp.target is not None:
                runs[self.expect_column(exp)] = self.to_target(exp, runs)
        self.final_runs, self.tuning_runs = split_stages(runs)  # tables and verdicts: final runs only
        self.finished = self.final_runs[self.final_runs["status"] == Status.FINISHED]
        try:
            task_metrics = list(get_variant("task", self.task_name).metrics)
        except Exception:  # noqa: BLE001
            task_metrics = []
        self.task_metrics = task_metrics
        self.metrics = metric_columns(self.final_runs, task_metrics)
        self.primary = task_metrics[0] if task_metrics else "loss"

    @cached_property
    def palette(self) -> dict[str, Any]:
        """Each variant's colour, in sweep order for legends (only figures ask)."""
        colours = figures.variant_palette(self.variants.labels)
        return {v: colours[v] for v in self.variants.labels}

    @cached_property
    def seeds_run(self) -> dict[str, int]:
        """Seeds each variant ran (any outcome): the looks an adaptive study has data for."""
        return self.final_runs["variant"].value_counts().to_dict()

    def expect_column(self, exp) -> str:
        """The runs-table column an `expect:` entry compares: its metric, or for a *_to_target
        entry 'flops_to_target: bpc@32 ≤ 2.5' (computed from the curves)."""
        if exp.target is None:
            return exp.metric
        sign = "≥" if metric_direction(exp.target.metric, self.task_name) else "≤"
        return f"{exp.metric}: {exp.target.metric} {sign} {exp.target.value:g}"

    def to_target(self, exp, runs: pd.DataFrame) -> pd.Series:
        """Each run's `exp.metric` (e.g. flops_to_target) for its target, NaN where not reached
        (those finished runs are remembered for the verdict) or where no spending was recorded."""
        column = self.expect_column(exp)
        curves = self.curves
        if curves is None or curves.empty:
            return pd.Series(math.nan, index=runs.index)
        higher = metric_direction(exp.target.metric, self.task_name)
        values = to_target_by_run(curves, exp.metric, exp.target.metric, exp.target.value, higher)
        finished = set(runs.loc[runs["status"] == Status.FINISHED, "run_id"])
        self.unreached[column] = {run for run, v in values.items() if run in finished and math.isnan(v)}
        return runs["run_id"].map(values).astype(float)

    def unreached_text(self, column: str, variant: str) -> str | None:
        """'gelu: 2 of 3 finished seeds never reached bpc@32 ≤ 2.5', or None when all reached."""
        if not self.unreached.get(column):
            return None
        mine = self.finished[self.finished["variant"] == variant]
        missed = mine["run_id"].isin(self.unreached[column]).sum()
        if not missed:
            return None
        return f"{variant}: {missed} of {len(mine)} finished seeds never reached {column.split(': ', 1)[1]}"

    def _variant_order(self, col: pd.Series) -> pd.Series:
        if col.name == "variant":
            return col.map({v: i for i, v in enumerate(self.variants.labels)})
        return col

    # ---- headline metrics and baseline -------------------------------------------------------

    @property
    def headline(self) -> list[str]:
        """Expectation metrics, then the task's first metric at each evaluation length."""
        wanted = [self.expect_column(e) for e in self.study.expect]
        wanted += [m for m in self.metrics if split_metric(m)[0] == self.primary]
        out = []
        for m in wanted:
            if m in self.final_runs.columns and m not in out:
                out.append(m)
        return out or self.metrics[:1]

    def baseline_of(self, variant: str) -> str | None:
        if self.study.baseline is None:
            return None
        return self.variants.counterpart(variant, self.study.baseline)

    @cached_property
    def finished_by_variant(self) -> dict[str, pd.DataFrame]:
        """The finished runs of each variant (the adaptive-seed loop reads them after every round)."""
        return {variant: rows for variant, rows in self.finished.groupby("variant", sort=False)}

    def values(self, variant: str, metric: str) -> pd.Series:
        """Finished runs' values of `metric`, indexed by seed (failed metrics dropped)."""
        if (variant, metric) not in self._values:
            mine = self.finished_by_variant.get(variant)
            if mine is None or metric not in mine:
                values = pd.Series([], dtype=float)
            else:
                x, seeds = mine[metric].to_numpy(dtype=float), mine["seed"].to_numpy()
                values = pd.Series(x[~np.isnan(x)], index=seeds[~np.isnan(x)])
            self._values[(variant, metric)] = values
        return self._values[(variant, metric)]

    def range_of(self, metric: str) -> tuple[float, float]:
        return metric_range(metric, self.task_name)

    def interval(self, variant: str, metric: str) -> Interval:
        return mean_ci(self.values(variant, metric), bounds=self.range_of(metric))
