"""The report of a training study: verdicts, setup, leaderboards with intervals, curves,
extrapolation, cost, failures, notes and environment, from the store's flat run table.

Every table keeps every variant: one whose runs all failed is listed with "–" and its
status counts, and each failed, diverged or out-of-memory run appears with its message and
the step it reached.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from workbench.registry import get_variant
from workbench.report import figures
from workbench.report.convergence import settling, settling_section
from workbench.report.document import (
    Code,
    Figure,
    Item,
    Paragraph,
    Report,
    Section,
    Table,
    VerdictLine,
    fmt,
    fmt_bytes,
    fmt_interval,
    fmt_seconds,
    fmt_signed_interval,
)
from workbench.report.stats import (
    MARGIN,
    UNBOUNDED,
    INCONCLUSIVE,
    Comparison,
    Interval,
    Learned,
    Share,
    Verdict,
    difference,
    higher_is_better,
    learned_criterion,
    learned_gate,
    mean_ci,
    seed_looks,
    sequential_verdicts,
    verdicts,
)
from workbench.report.tuning import TuningSection, split_stages
from workbench.report.variants import Variants, short_key, value_text
from workbench.cost.fit import fit_power_law, power_law_crossing
from workbench.report.ladder import cross_scale_line
from workbench.report.compute_curves import AXIS_LABELS, against, to_target_by_run
from workbench.results import ATTENTION_ENTROPY, DESCRIPTIVE_METRICS, FAILURE_SHARE, FAILURES, KEPT, PROGRESS, TO_TARGET, Status
from workbench.study import RUN_MEASURES
from workbench.study.keys import label, point_labels
from workbench.sweep import point_key, resolve_point
from workbench.tasks import METRIC_RANGES
from workbench.tuning import PointTuning


# Run measures shown next to each leaderboard (column in the store -> heading, formatter).
MEASURES: dict[str, tuple[str, Callable[[float], str]]] = {
    "n_params": ("parameters", lambda x: fmt(int(x)) if not math.isnan(x) else "–"),
    "tokens_per_s": ("tokens/s", fmt),
    "peak_memory_bytes": ("peak memory", fmt_bytes),
    "wall_time_s": ("wall time", fmt_seconds),
}
MEASURE_HIGHER = {"tokens_per_s": True}  # every other run measure: lower is better


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


def metric_direction(metric: str, task_name: str) -> bool:
    """True when higher is better: the task declares its metrics' directions, loss is lower;
    what a run spent to reach a target (flops_to_target) is lower."""
    if metric.split(":")[0] in TO_TARGET:
        return False
    base = metric.split("@")[0]
    if base in RUN_MEASURES:
        return MEASURE_HIGHER.get(base, False)
    if base in ("loss", FAILURE_SHARE):
        return False
    try:
        declared = get_variant("task", task_name).metrics
    except Exception:  # noqa: BLE001 - a task no longer installed: fall back to the name
        declared = {}
    return declared.get(base, higher_is_better(base))


def metric_range(metric: str, task_name: str) -> tuple[float, float]:
    """(lowest, highest) possible value of a metric, as its task declares (unbounded if unknown)."""
    base = metric.split("@")[0]
    try:
        ranges = get_variant("task", task_name).ranges
    except Exception:  # noqa: BLE001 - a task no longer installed: the built-in ranges
        ranges = METRIC_RANGES
    return ranges.get(base, UNBOUNDED)


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


def gate_record(g: Learned) -> dict[str, Any]:
    """A group's learned-at-all check as plain JSON (summary.json)."""
    return {**asdict(g), "learned": g.learned}


def group_record(group: str, iv: Interval) -> dict[str, Any]:
    """A compared group's mean with its interval as plain JSON (summary.json)."""
    return {"group": group, "mean": iv.mean, "lo": iv.lo, "hi": iv.hi, "n": iv.n, "constant": iv.constant}


def split_metric(col: str) -> tuple[str, int | None]:
    """accuracy@64 -> (accuracy, 64); 'flops_to_target: bpc@32 ≤ 2.5' -> (flops_to_target, None)."""
    if col.split(":")[0] in TO_TARGET:
        return col.split(":")[0], None
    name, _, length = col.partition("@")
    return name, int(length) if length else None


class TrainReport:
    """Computes the sections of one training study's report; figures go to `dest/figures/`."""

    def __init__(self, inputs: TrainInputs, dest: Path):
        self.inputs, self.dest = inputs, dest
        self.study = inputs.study
        self.task_name = self.study.task["name"]
        self.keys = list(self.study.sweep.keys)
        swept = {k: self.study.sweep.values(k) for k in self.keys}
        runs = inputs.runs.copy()
        self.variants = Variants.of(self.keys, runs, swept)
        runs["variant"] = self.variants.label_runs(runs)
        order = ["index", "seed"] if "index" in runs else ["variant", "seed"]
        runs = runs.sort_values(order, key=self._variant_order).reset_index(drop=True)
        self.unreached: dict[str, set[str]] = {}  # to-target column -> finished runs that never reached it
        for exp in self.study.expect:
            if exp.target is not None:
                runs[self.expect_column(exp)] = self.to_target(exp, runs)
        self.runs, self.tuning_runs = split_stages(runs)  # tables and verdicts: final runs only
        self.finished = self.runs[self.runs["status"] == Status.FINISHED]
        self.palette = figures.variant_palette(self.variants.labels)
        self.palette = {v: self.palette[v] for v in self.variants.labels}  # sweep order for legends
        try:
            task_metrics = list(get_variant("task", self.task_name).metrics)
        except Exception:  # noqa: BLE001
            task_metrics = []
        self.task_metrics = task_metrics
        self._baselines: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
        self.metrics = metric_columns(self.runs, task_metrics)
        self.primary = task_metrics[0] if task_metrics else "loss"

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
        curves = self.inputs.curves
        if curves is None or curves.empty:
            return pd.Series(math.nan, index=runs.index)
        higher = metric_direction(exp.target.metric, self.task_name)
        values = to_target_by_run(curves, exp.metric, exp.target.metric, exp.target.value, higher)
        finished = set(runs.loc[runs["status"] == Status.FINISHED, "run_id"])
        self.unreached[column] = {run for run, v in values.items() if run in finished and math.isnan(v)}
        return runs["run_id"].map(values).astype(float)

    def unreached_text(self, column: str, variant: str) -> str | None:
        """'gelu: 2 of 3 finished seeds never reached bpc@32 ≤ 2.5', or None when all reached."""
        mine = self.finished[self.finished["variant"] == variant]
        missed = mine["run_id"].isin(self.unreached.get(column, set())).sum()
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
            if m in self.runs.columns and m not in out:
                out.append(m)
        return out or self.metrics[:1]

    def baseline_of(self, variant: str) -> str | None:
        if self.study.baseline is None:
            return None
        return self.variants.counterpart(variant, self.study.baseline)

    def values(self, variant: str, metric: str) -> pd.Series:
        """Finished runs' values of `metric`, indexed by seed (failed metrics dropped)."""
        mine = self.finished[self.finished["variant"] == variant]
        if metric not in mine:
            return pd.Series([], dtype=float)
        return pd.Series(mine[metric].to_numpy(dtype=float), index=mine["seed"].to_numpy()).dropna()

    def range_of(self, metric: str) -> tuple[float, float]:
        # Run measures (time, memory, throughput, parameters) are never negative.
        spent = split_metric(metric)[0] in RUN_MEASURES or metric.split(":")[0] in TO_TARGET
        return (0.0, math.inf) if spent else metric_range(metric, self.task_name)

    def interval(self, variant: str, metric: str) -> Interval:
        return mean_ci(self.values(variant, metric), bounds=self.range_of(metric))

    # ---- chance level and the learned-at-all gate ---------------------------------------------

    @cached_property
    def resolved_points(self) -> dict[str, dict[str, Any]]:
        """Each variant's resolved task section and model family, as its runs were configured
        ({} when the study no longer resolves here, e.g. a plugin is gone)."""
        out = {}
        try:
            for point in self.study.sweep.points():
                label = self.variants.label([value_text(point[k]) for k in self.keys])
                if label in self.variants.labels and label not in out:
                    resolved = resolve_point(self.study, point)
                    out[label] = {"task": resolved["task"], "family": resolved["model"]["family"],
                                  "train": resolved["train"]}
        except Exception:  # noqa: BLE001 - the gate then reads "no chance level" instead of failing the report
            return {}
        return out

    def baseline_levels(self, variant: str, length: int) -> dict[str, dict[str, float]]:
        """The task's baselines (name -> metric -> score, `Task.baselines`) for this variant's
        family at one evaluation length, as the mean over the study's seeds (a held-out set
        depends on the seed); {} when the task cannot be built here."""
        key = (variant, length)
        if key not in self._baselines:
            self._baselines[key] = {}
            point = self.resolved_points.get(variant)
            if point is not None:
                spec = dict(point["task"])
                try:
                    cls = get_variant("task", spec.pop("name"))
                    levels = [cls(cls.Params.model_validate(spec), seed=seed).baselines(point["family"], length)
                              for seed in self.study.seeds]
                except Exception:  # noqa: BLE001 - e.g. a task no longer installed, a corpus file gone
                    levels = []
                if levels:
                    self._baselines[key] = {name: {metric: float(np.mean([lv[name][metric] for lv in levels]))
                                                for metric in scores} for name, scores in levels[0].items()}
        return self._baselines[key]

    def train_length(self, variant: str) -> int:
        """The variant's training length (a study may sweep task.train_length)."""
        task = self.resolved_points.get(variant, {}).get("task", self.study.task)
        return int(task["train_length"])

    def gate_name(self, metric: str) -> str | None:
        """The metric that decides whether a group learned, for a verdict on `metric`: the same
        metric when it has a baseline, else the task's first metric that has one (loss last);
        None for cost measures and failure shares, which need no gate."""
        name = split_metric(metric)[0]
        if name in RUN_MEASURES or name == FAILURE_SHARE:
            return None
        first = self.variants.labels[0] if self.variants.labels else None
        levels = self.baseline_levels(first, self.train_length(first)) if first is not None else {}
        known = {m for scores in levels.values() for m in scores}
        return next((c for c in (name, *self.task_metrics, "loss") if c in known), name)

    def learned(self, variant: str, name: str, length: int | None = None) -> Learned:
        """Whether `variant` learned: its mean `name` at `length` (default: its training
        length) against the task's baselines there."""
        length = self.train_length(variant) if length is None else length
        gate = f"{name}@{length}"
        higher = metric_direction(gate, self.task_name)
        lo, hi = self.range_of(gate)
        baselines = {b: scores[name] for b, scores in self.baseline_levels(variant, length).items() if name in scores}
        return learned_gate(variant, gate, self.interval(variant, gate).mean, baselines or {"chance": math.nan},
                            hi if higher else lo, higher, self.untuned.get(variant, ""))

    @cached_property
    def untuned(self) -> dict[str, str]:
        """Tuned variants none of whose candidates learned (its mean tuning metric against the
        task's baselines, as the gate reads it): such a variant cannot be tested."""
        if self.study.tune is None:
            return {}
        metric = self.study.tune.metric
        name, length = split_metric(metric)
        higher = metric_direction(metric, self.task_name)
        lo, hi = self.range_of(metric)
        keys = " and ".join(short_key(k).replace("_", " ") for k in self.study.tune.keys)
        what = "learning rate" if self.study.tune.keys == ["train.lr"] else f"value of {keys}"
        out = {}
        for tuned in self.inputs.tuning:
            variant = self.variants.label([value_text(tuned.swept.get(k)) for k in self.keys])
            baselines = {b: scores[name] for b, scores in self.baseline_levels(variant, length).items() if name in scores}
            if variant not in self.variants.labels or not baselines or not tuned.done:
                continue
            if not any(learned_gate(variant, metric, c.mean, baselines, hi if higher else lo, higher).learned
                       for c in tuned.candidates if c.eligible):
                out[variant] = f"no {what} in the grid trained this variant"
        return out

    def group_gates(self, variant: str, name: str, metric: str) -> tuple[Learned, ...]:
        """The gates of one group for a verdict on `metric`: at the training length, and at
        the compared length when that differs and the runs evaluated `name` there."""
        gates = [self.learned(variant, name)]
        length = split_metric(metric)[1]
        if length is not None and length != self.train_length(variant) and f"{name}@{length}" in self.runs:
            gates.append(self.learned(variant, name, length))
        return tuple(gates)

    def failed_seeds(self, variant: str) -> pd.Series:
        """Per seed that ended (finished or diverged): 1 when it diverged or did not learn (its
        own score at the training length misses the group's gate), else 0."""
        mine = self.runs[(self.runs["variant"] == variant) & self.runs["status"].isin(KEPT)]
        names = list(self.gates)
        failed = mine["status"] == Status.DIVERGED
        if names:
            gate = self.learned(variant, names[0])
            if math.isfinite(gate.needed) and gate.metric in mine:
                scores = mine[gate.metric].astype(float)
                missed = scores < gate.needed if gate.higher else scores > gate.needed
                failed = failed | missed.fillna(True)
        return pd.Series(failed.astype(float).to_numpy(), index=mine["seed"].to_numpy())

    def failure_share(self, variant: str) -> Share:
        failed = self.failed_seeds(variant)
        return Share(int(failed.sum()), len(failed))

    def comparisons(self) -> tuple[list[Comparison], list[int]]:
        """Each `expect:` pair to decide, with the index of the entry it comes from (an entry
        whose points differ in an unswept-by-it key gives one comparison per pair)."""
        comparisons, origins = [], []
        for index, exp in enumerate(self.study.expect):
            origins.append(index)
            metric = self.expect_column(exp)
            gated = exp.target.metric if exp.target is not None else metric  # the score a group must have learned
            higher = metric_direction(metric, self.task_name)
            bounds = (0.0, 1.0) if metric == FAILURE_SHARE else self.range_of(metric)
            gate = self.gate_name(gated)
            pairs = self.variants.pairs(exp.better, exp.than)
            if not pairs:  # neither point was run (e.g. a profile dropped it): say so
                a = ", ".join(f"{short_key(k)}={value_text(v)}" for k, v in exp.better.items())
                b = ", ".join(f"{short_key(k)}={value_text(v)}" for k, v in exp.than.items())
                comparisons.append(Comparison(metric, a, b, [], [], higher, bounds, note=exp.note))
                continue
            origins += [index] * (len(pairs) - 1)
            for a, b in pairs:
                gates = () if gate is None else (*self.group_gates(a, gate, gated), *self.group_gates(b, gate, gated))
                if metric == FAILURE_SHARE:
                    values = self.failed_seeds(a), self.failed_seeds(b)
                else:
                    values = self.values(a, metric), self.values(b, metric)
                unreached = tuple(t for t in (self.unreached_text(metric, a), self.unreached_text(metric, b)) if t)
                ran = min(int((self.runs["variant"] == v).sum()) for v in (a, b))
                comparisons.append(Comparison(metric, a, b, *values, higher, bounds, gates, exp.note,
                                              margin=exp.margin, counts=metric == FAILURE_SHARE, seeds_run=ran,
                                              unreached=unreached))
        return comparisons, origins

    def seeds_wanted(self) -> dict[str, int]:
        """Adaptive seeds: point_key -> the seeds its group should have by the next look, for
        the groups of every comparison still inconclusive below the plan's maximum."""
        plan = self.study.seed_plan
        looks = seed_looks(plan.first, plan.max)
        comparisons, _ = self.comparisons()
        wanted: dict[str, int] = {}
        for c, v in zip(comparisons, sequential_verdicts(comparisons, looks)):
            following = next((n for n in looks if n > c.seeds_run), None)
            if v.outcome != INCONCLUSIVE or following is None:
                continue
            for group in (c.better, c.than):
                key = self.point_keys.get(group)
                if key is not None:
                    wanted[key] = max(wanted.get(key, 0), following)
        return wanted

    @cached_property
    def point_keys(self) -> dict[str, str]:
        """Variant label -> its sweep point's key (as `sweep.point_key` writes it)."""
        out = {}
        for point in self.study.sweep.points():
            labels = {k: label(v) for k, v in point.items()}
            out[self.variants.label([value_text(point[k]) for k in self.keys])] = point_key(labels, self.keys)
        return out

    def verdicts(self) -> list[tuple[Verdict, int]]:
        """Each verdict with the index of the `expect:` entry it decides; an adaptive study's
        comparisons are decided look by look (stats.sequential_verdicts)."""
        comparisons, origins = self.comparisons()
        plan = self.study.seed_plan
        decided = (verdicts(comparisons) if plan is None
                   else sequential_verdicts(comparisons, seed_looks(plan.first, plan.max)))
        return list(zip(decided, origins))

    def across_scale(self, decided: Sequence[tuple[Verdict, int]]) -> list[dict[str, Any]]:
        """Per `expect:` entry (and per value of any other swept key it does not fix), its
        outcome at each rung of the scale ladder and the cross-scale line (workbench.report.ladder)."""
        scale_keys = list(self.study.scale or {})
        rung_order = [value_text(v) for v in self.study.scale[self.study.rung_key]]
        rows: dict[tuple[int, str], dict[str, Any]] = {}
        for v, index in decided:
            if v.better not in self.variants.labels:
                continue
            exp = self.study.expect[index]
            values = dict(zip(self.variants.keys, self.variants.points[self.variants.labels.index(v.better)]))
            context = ", ".join(f"{short_key(k)}={x}" for k, x in values.items()
                                if k not in scale_keys and k not in exp.better and k not in exp.than)
            row = rows.setdefault((index, context), {
                "index": index, "context": context, "outcomes": {}, "labels": {},
                "statement": f"{self.variants_text(exp.better)} is better than {self.variants_text(exp.than)} on "
                             f"{self.expect_column(exp)}"})
            row["outcomes"][values[self.study.rung_key]] = v.outcome
            row["labels"][values[self.study.rung_key]] = v.label
        for row in rows.values():
            row["line"] = cross_scale_line([(rung, row["outcomes"][rung]) for rung in rung_order if rung in row["outcomes"]])
        return list(rows.values())

    @staticmethod
    def variants_text(point: dict[str, Any]) -> str:
        return ", ".join(value_text(v) for v in point.values())

    def scale_section(self, decided: Sequence[tuple[Verdict, int]]) -> Section | None:
        if not self.study.scale:
            return None
        rungs = [value_text(v) for v in self.study.scale[self.study.rung_key]]
        matching = "; ".join(f"{k}: {', '.join(value_text(x) for x in values)}" for k, values in self.study.scale.items())
        rows = []
        for row in self.across_scale(decided):
            rows.append([row["statement"] + (f" ({row['context']})" if row["context"] else ""),
                         *(row["labels"].get(r, "–") for r in rungs), row["line"]])
        return Section("Across scale", [
            Paragraph(f"Scale ladder: {matching} (one value per rung). Every expect: entry is decided at each rung "
                      "by the rule under Verdicts (Holm's correction covers every rung's comparison together); the "
                      "last column says whether the verdict holds across the rungs."),
            Table(["expectation", *(f"{short_key(self.study.rung_key)} = {r}" for r in rungs), "across scale"], rows,
                  caption="Each expect: entry at every rung of the ladder")])

    def fit_metric(self) -> str:
        """The loss the ladder's fits read: the first expect: entry's metric when it is a loss,
        else the evaluation loss at the training length."""
        losses = [self.expect_column(e) for e in self.study.expect
                  if split_metric(self.expect_column(e))[0] in ("loss", "bpc", "perplexity")]
        return losses[0] if losses else f"loss@{self.study.task['train_length']}"

    def fits_section(self) -> Section | None:
        """Per variant (the swept keys without the ladder's), L = E + A (C/C0)^-alpha through its
        finished runs' final loss against their counted training FLOPs, every rung and seed
        (workbench.cost.fit), and where two variants' fitted curves cross."""
        if not self.study.scale or "train_flops" not in self.finished:
            return None
        metric = self.fit_metric()
        base_keys = [k for k in self.keys if k not in self.study.scale]
        runs = self.finished.assign(base=Variants.of(base_keys, self.finished).label_runs(self.finished)
                                    if base_keys else "all runs")
        fits, rows, notes, points = {}, [], [], []
        for base, part in runs.groupby("base", sort=False):
            data = pd.DataFrame({"compute": pd.to_numeric(part["train_flops"], errors="coerce"),
                                 "loss": pd.to_numeric(part.get(metric), errors="coerce"), "seed": part["seed"]})
            try:
                fit = fit_power_law(data)
            except (ValueError, RuntimeError) as err:
                notes.append(f"{base}: no fit ({err})")
                continue
            fits[base] = fit
            points.append(data.assign(variant=base))
            ci = {k: fmt_interval(getattr(fit.law, k), *fit.intervals[k]) if not math.isnan(fit.intervals[k][0])
                  else f"{fmt(getattr(fit.law, k))} (one seed: no interval)" for k in ("E", "A", "alpha")}
            rows.append([base, ci["E"], ci["A"], ci["alpha"], fmt(fit.law.C0), str(fit.n_points), str(fit.n_seeds)])
        if not fits:
            return Section("Fits", [Paragraph("; ".join(notes) or "No finished runs to fit.")])
        items: list[Item] = [Paragraph(
            f"{metric} against counted training FLOPs C, per variant over every rung and seed: L = E + A (C/C0)^-α "
            "(scipy curve_fit, E, A ≥ 0), with 95% intervals from 1,000 bootstrap draws of whole seeds. C0 is the "
            "smallest compute fitted."),
            Table(["variant", "E [95% CI]", "A [95% CI]", "α [95% CI]", "C0 (FLOPs)", "runs", "seeds"], rows,
                  caption=f"Saturating power laws of {metric} against training FLOPs",
                  numeric=[False, True, True, True, True, True, True])]
        names = list(fits)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                lo = max(fits[a].compute_range[0], fits[b].compute_range[0])
                hi = min(fits[a].compute_range[1], fits[b].compute_range[1])
                where = power_law_crossing(fits[a].law, fits[b].law, lo, hi) if lo < hi else None
                if where is None:
                    ahead = a if fits[a].law.loss(hi) < fits[b].law.loss(hi) else b
                    items.append(Paragraph(f"{a} and {b}: the fitted curves do not cross within the measured range "
                                           f"({fmt(lo)} to {fmt(hi)} FLOPs); {ahead} is lower throughout."))
                else:
                    items.append(Paragraph(f"{a} and {b}: the fitted curves cross at {fmt(where)} FLOPs (measured range "
                                           f"{fmt(lo)} to {fmt(hi)})."))
        items += [Paragraph(n) for n in notes]
        palette = figures.variant_palette(list(fits))
        items.append(self.figure(
            figures.loss_vs_compute(pd.concat(points), {b: f.law.loss for b, f in fits.items()}, palette,
                                    self.dest / "figures" / "loss_vs_compute.png", metric=metric),
            f"{metric} of every finished run against its counted training FLOPs (dots), with each variant's fitted "
            "saturating power law (lines).", f"{metric} against training compute with fitted laws"))
        return Section("Fits", [i for i in items if i is not None])

    def verdict_line(self, v: Verdict, index: int) -> VerdictLine:
        exp = self.study.expect[index]
        def group(name: str, iv: Interval) -> str:
            return f"{name}: {interval_text(iv)}" + ("" if iv.constant else f" ({iv.n} seeds)")

        d = v.diff
        detail = f"{group(v.better, v.better_ci)}; {group(v.than, v.than_ci)}"
        if not math.isnan(d.mean):
            level = f"{d.level:.1%}".replace(".0%", "%")
            how = f"{level} {d.method} t interval" if not math.isnan(d.lo) else f"{d.method}, no interval"
            holm = f", Holm-adjusted p {fmt(v.p_holm)}" if not math.isnan(v.p_holm) else ""
            shown = fmt(d.mean) if math.isnan(d.lo) else fmt_signed_interval(d.mean, d.lo, d.hi)
            detail += f"; difference {shown} ({how}{holm})"
        if v.gates:
            detail += ". Learned: " + "; ".join(g.text if g.untested else f"{g.text} {'yes' if g.learned else 'no'}"
                                                for g in v.gates)
        return VerdictLine(statement=v.statement, outcome=v.outcome, label=v.label, detail=detail, note=exp.note,
                           gates=[gate_record(g) for g in v.gates],
                           difference={"mean": d.mean, "lo": d.lo, "hi": d.hi, "level": d.level, "method": d.method,
                                       "p": d.p, "p_holm": v.p_holm},
                           groups=[group_record(name, iv) for name, iv in ((v.better, v.better_ci), (v.than, v.than_ci))],
                           expect={"index": index, "metric": exp.metric, "better": point_labels(exp.better),
                                   "than": point_labels(exp.than)})

    @cached_property
    def gates(self) -> dict[str, list[Learned]]:
        """Per gated metric (of the headline metrics), every variant's learned-at-all check, in
        sweep order: what the header's Learned lines and the Learned section show."""
        names = list(dict.fromkeys(g for g in map(self.gate_name, self.headline) if g is not None))
        return {name: [self.learned(variant, name) for variant in self.variants.labels] for name in names}

    def learned_lines(self) -> list[str]:
        """The header's Learned lines: one per gated metric."""
        if not self.variants.labels:
            return []
        if not self.gates:
            return ["Learned: no criterion applies: every verdict compares cost measures (time, memory, "
                    "throughput), which need no gate"]
        return [learned_criterion(name, gates) for name, gates in self.gates.items()]

    def learned_section(self) -> Section | None:
        """Per variant, its score at the training length beside every baseline of the task, the
        threshold, whether it learned, and its share of seeds that diverged or did not learn."""
        if not self.gates or not self.variants.labels:
            return None
        items: list[Item] = [Paragraph(
            "Baselines: predictors that cannot solve the task, each derived from the task's own generator "
            "(`Task.baselines`, exactly or by Monte Carlo with a fixed seed): input-ignoring (knows the layout, "
            "not a token), prefix-aware (also reads the answer's own teacher-forced prefix), order-blind (knows "
            "which symbols the input holds, not their order), as the task declares them. A group learned when "
            "its mean over finished seeds at the training length (and, for a verdict at another length, there "
            f"too) is better than the strongest baseline by at least {MARGIN:.0%} of the distance from it to a "
            "perfect score. Failed seeds: those that diverged or whose own score missed the threshold, with an "
            "exact (Clopper-Pearson) 95% interval of their share.")]
        for name, gates in self.gates.items():
            names = list(dict.fromkeys(b for g in gates for b, _ in g.baselines))
            rows = []
            for variant, g in zip(self.variants.labels, gates):
                scores = dict(g.baselines)
                rows.append([variant, g.metric, interval_text(self.interval(variant, g.metric)),
                             *(fmt(scores.get(b, math.nan)) for b in names), fmt(g.needed),
                             "yes" if g.learned else f"no ({g.untested})" if g.untested else "no",
                             self.failure_share(variant).text])
            better = "≥" if metric_direction(name, self.task_name) else "≤"
            items.append(Table(["variant", "at the training length", f"{name} mean [95% CI]", *names,
                                f"learned: {better}", "learned", "failed seeds [95% CI]"], rows,
                               caption=f"{name}: score at the training length against the task's baselines",
                               numeric=[False, False, True, *([True] * len(names)), True, False, True]))
        return Section("Learned at the training length", items)

    # ---- sections ----------------------------------------------------------------------------

    def setup(self) -> Section:
        s = self.study
        items: list[Item] = []
        task = dict(s.task)
        items.append(Paragraph(f"Task: {task.pop('name')}; " + ", ".join(f"{k}={v}" for k, v in sorted(task.items()))))
        items.append(Paragraph(self.budget_text()))
        if s.train.budget is not None and s.train.budget.kind != "seconds":
            items.append(self.steps_table())
        if s.tune is not None:
            items.append(Paragraph("Tuned per variant (see Tuning), replacing the values above: " + "; ".join(
                f"{k} over {', '.join(value_text(v) for v in values)}" for k, values in s.tune.values.items())))
        swept_model = {k.split(".", 1)[1] for k in self.keys if k.startswith("model.")}
        fixed = {k: v for k, v in s.model.items() if k not in swept_model}
        items.append(Paragraph("Fixed model parts (everything else at its default):"))
        items.append(Code(yaml.safe_dump(fixed, sort_keys=True).strip() if fixed else "{} (all defaults)"))
        if self.keys:
            items.append(Paragraph("Swept: " + "; ".join(
                f"{k} over {', '.join(value_text(v) for v in s.sweep.values(k))}" for k in self.keys)))
        if s.baseline is not None:
            items.append(Paragraph("Baseline: " + ", ".join(f"{k}={value_text(v)}" for k, v in s.baseline.items())))
        items.append(self.status_table())
        items.append(Paragraph("Reproduce:"))
        items.append(Code(self.inputs.command))
        return Section("Setup", items)

    def seeds_text(self) -> str:
        plan = self.study.seed_plan
        if plan is None:
            return f"seeds {', '.join(map(str, self.study.seeds))}"
        looks = seed_looks(plan.first, plan.max)
        return (f"adaptive seeds: {plan.first} per group, more for groups of undecided comparisons up to {plan.max} "
                f"(looks at {', '.join(map(str, looks))} seeds, each at the alpha an O'Brien-Fleming-type spending "
                "function adds there)")

    def budget_text(self) -> str:
        s, train = self.study, self.study.train
        optimiser = (f"lr {train.lr:g}, {train.schedule} schedule, {train.warmup_steps} warmup steps, "
                     f"precision {train.precision}")
        if train.budget is None:
            steps = train.resolved(s.task["train_length"])["steps"]
            return f"Budget per run: {steps:,} steps of {train.batch_size} sequences ({optimiser}); {self.seeds_text()}."
        how = {"flops": "counted training FLOPs (useful FLOPs of the forward, x3 for a training step); each variant "
                        "trains for the steps its own cost per step buys (table below)",
               "tokens": "real training tokens; each variant trains for the steps they buy (table below)",
               "seconds": "training seconds (evaluation excluded); each run stops when they are spent"}[train.budget.kind]
        per_rung = any(key.startswith("train.budget.") for key in s.scale or {})
        return (f"Budget per run: {train.budget.text()}" + (" as train: gives it (the ladder sets each rung's own: see Across "
                "scale)" if per_rung else "") + f" of {how}; batches of {train.batch_size} sequences ({optimiser}); "
                f"{self.seeds_text()}.")

    def steps_table(self) -> Table:
        """Per variant: the steps its budget buys at batch 0's cost, the steps its runs took, how
        their last step ended, and what they spent."""
        rows = []
        for variant in self.variants.labels:
            train = self.resolved_points.get(variant, {}).get("train")
            mine = self.finished[self.finished["variant"] == variant]

            def mean(column: str) -> str:
                return fmt(float(mine[column].mean())) if column in mine and mine[column].notna().any() else "–"

            last = mine["last_step"].dropna().value_counts() if "last_step" in mine else pd.Series(dtype=int)
            rows.append([variant, f"{train['steps']:,}" if train else "–", mean("steps_done"),
                         ", ".join(f"{kind} ({n})" for kind, n in last.items()) or "–",
                         mean("train_flops"), mean("train_tokens")])
        return Table(["variant", "steps at batch 0's cost", "steps run (mean)", "last step (runs)",
                      "train FLOPs spent (mean)", "train tokens (mean)"], rows,
                     caption="Steps each variant's budget buys, and what its finished runs spent (the last step trains "
                     "the sequences the budget still pays for: all, some (partial) or none (dropped))",
                     numeric=[False, True, True, False, True, True])

    def status_table(self) -> Table:
        statuses = [Status.FINISHED, *FAILURES]
        statuses += sorted(set(self.runs["status"]) - set(statuses))
        rows = []
        for variant in self.variants.labels:
            mine = self.runs[self.runs["variant"] == variant]
            counts = [int((mine["status"] == st).sum()) for st in statuses]
            rows.append([variant, *map(str, counts), str(len(mine))])
        totals = [int((self.runs["status"] == st).sum()) for st in statuses]
        rows.append(["total", *map(str, totals), str(len(self.runs))])
        columns = ["variant", *statuses, "runs"]
        return Table(columns, rows, caption="Runs by status", numeric=[False] + [True] * (len(columns) - 1))

    def leaderboard(self, metric: str) -> Table:
        higher = metric_direction(metric, self.task_name)
        rows = []
        for variant in self.variants.labels:
            iv = self.interval(variant, metric)
            n_runs = int((self.runs["variant"] == variant).sum())
            base = self.baseline_of(variant)
            if base is None:
                diff = "–"
            elif base == variant:
                diff = "baseline"
            else:
                d = difference(self.values(variant, metric), self.values(base, metric), bounds=self.range_of(metric))
                diff = fmt_signed_interval(d.mean, d.lo, d.hi) + (f" ({d.method})" if d.method and not
                                                                  math.isnan(d.lo) else "")
                diff += "" if len(self.variants.keys) == 1 or not self.study.baseline else f" vs {base}"
            measures = []
            mine = self.finished[self.finished["variant"] == variant]
            for col, (_, formatter) in MEASURES.items():
                value = float(mine[col].mean()) if col in mine and len(mine) else math.nan
                text = formatter(value)
                if col == "peak_memory_bytes" and "peak_memory_instrument" in mine and len(mine) and text != "–":
                    text += f" ({', '.join(sorted(set(mine['peak_memory_instrument'].dropna().astype(str))))})"
                measures.append(text)
            rows.append(((iv.mean if not math.isnan(iv.mean) else None),
                         [variant, interval_text(iv), f"{iv.n}/{n_runs}", diff, *measures]))
        # Best first by mean; variants without a finished run last, in sweep order.
        scored = sorted([r for r in rows if r[0] is not None], key=lambda r: -r[0] if higher else r[0])
        rows = [r for _, r in scored] + [r for m, r in rows if m is None]
        columns = ["variant", f"{metric} mean [95% CI]", "finished seeds", "Δ to baseline [95% CI]",
                   *(heading for heading, _ in MEASURES.values())]
        better = "higher" if higher else "lower"
        return Table(columns, rows, caption=f"{metric} ({better} is better; sorted best first)",
                     numeric=[False] + [True] * (len(columns) - 1))

    def all_metrics_table(self) -> Table | None:
        """Every final metric, one row per evaluation length and variant and one column per metric,
        so the table keeps a handful of columns however many lengths a study evaluates."""
        if len(self.metrics) <= 1:
            return None
        names = list(dict.fromkeys(split_metric(m)[0] for m in self.metrics))
        lengths = sorted({split_metric(m)[1] for m in self.metrics}, key=lambda n: -1 if n is None else n)
        rows = []
        for length in lengths:
            for variant in self.variants.labels:
                columns = [name if length is None else f"{name}@{length}" for name in names]
                cells = [interval_text(self.interval(variant, c)) if c in self.metrics else "–" for c in columns]
                rows.append(["–" if length is None else str(length), variant, *cells])
        arrows = ["" if name in DESCRIPTIVE_METRICS else " ↑" if metric_direction(name, self.task_name)
                  else " ↓" for name in names]
        return Table(["length", "variant", *(f"{name}{a}" for name, a in zip(names, arrows))], rows,
                     caption="Every final metric at each evaluation length: mean [95% CI] over finished seeds "
                     "(↑ higher is better, ↓ lower; no arrow: descriptive)",
                     numeric=[True, False] + [True] * len(names))

    def leaderboards(self) -> Section:
        items: list[Item] = [Paragraph(
            "Means over finished seeds with 95% t intervals, kept inside the metric's range; Δ is the difference "
            "to the baseline with its 95% t interval, paired over seeds when both ran the same seeds, Welch's "
            "otherwise. Run measures (parameters, tokens/s, peak memory, wall time) are means "
            "over finished runs; peak memory names its instrument.")]
        if self.inputs.timing_caveat:
            items.append(Paragraph(self.inputs.timing_caveat))
        items += [self.leaderboard(m) for m in self.headline]
        table = self.all_metrics_table()
        if table is not None:
            items.append(table)
        return Section("Leaderboard", items)

    def figure(self, path: Path | None, caption: str, alt: str) -> Figure | None:
        if path is None:
            return None
        return Figure(path.relative_to(self.dest).as_posix(), caption, alt)

    def figures_section(self) -> Section:
        fig_dir = self.dest / "figures"
        items: list[Item] = []
        curves = self.curves()
        # Seeds that spent different amounts by the same step (time; FLOPs or tokens of padded batches)
        # share no x values to average over: each run is drawn on its own.
        per_seed = not curves.empty and bool(curves.groupby(["variant", "metric", "step"])["x"].nunique().max() > 1)
        if not curves.empty:
            panels = [(f"{split} {metric}", metric) for split, metric in self.curve_panels()]
            flat = [name for name, _ in panels if (curves["metric"] == name).any()
                    and figures.constant(curves[curves["metric"] == name]["value"])]
            items.append(self.figure(
                figures.learning_curves(curves, self.palette, fig_dir / "learning_curves.png",
                                        panels=[name for name, _ in panels],
                                        bounds={name: self.range_of(metric) for name, metric in panels},
                                        xlabel=AXIS_LABELS[self.study.curves_against], per_seed=per_seed),
                f"Learning curves against {AXIS_LABELS[self.study.curves_against]}: "
                + ("one line per run (its seeds had spent different amounts at the same step, so no mean or band)"
                   if per_seed else "each seed as a thin line; per variant the mean over seeds with a 95% t band, "
                   "kept inside the metric's range") + " (all runs, including those that stopped early)."
                + self.flat_note(flat, curves), "learning curves per variant"))
        for name in dict.fromkeys(split_metric(m)[0] for m in self.metrics):
            long = self.by_length(name)
            if long is None:
                continue
            if figures.constant(long["value"]):
                items.append(Paragraph(f"{name}: {fmt(long['value'].dropna().iloc[0])} for every variant at every "
                                       "evaluation length, so it is not drawn."))
                continue
            items.append(self.figure(
                figures.quality_vs_length(long, self.palette, fig_dir / f"{name}_vs_length.png", metric=name,
                                          train_length=self.study.task.get("train_length"),
                                          bounds=self.range_of(name)),
                f"{name} against evaluation length (extrapolation beyond the dashed training length): each seed "
                "as a thin line, the mean with a 95% t band over seeds.", f"{name} against evaluation length"))
        headline = self.headline[0] if self.headline else None
        if headline is not None:
            summary = self.cost_summary(headline)
            for cost, label, slug in (("wall_time_s", "wall time per run (s)", "time"),
                                      ("peak_memory_bytes", "peak memory (bytes)", "memory")):
                if cost in summary:
                    seeds = self.finished[["variant", headline, cost]].rename(columns={headline: "value"}) \
                        if headline in self.finished and cost in self.finished else None
                    caveat = self.inputs.timing_caveat if cost == "wall_time_s" else None
                    caveat = f" {caveat}" if caveat else ""
                    items.append(self.figure(
                        figures.quality_vs_cost(summary, self.palette, fig_dir / f"{slug}_vs_quality.png",
                                                metric=headline, cost=cost, cost_label=label,
                                                bounds=self.range_of(headline), seeds=seeds),
                        f"{headline} against {label.split(' (')[0]}: each seed as a dot, the mean with its 95% CI "
                        f"over seeds.{caveat}", f"{headline} against {label}"))
        return Section("Figures", [i for i in items if i is not None])

    @staticmethod
    def flat_note(flat: Sequence[str], curves: pd.DataFrame) -> str:
        """The caption's word on panels left out because every value was the same."""
        if not flat:
            return ""
        values = "; ".join(f"{name} is {fmt(curves[curves['metric'] == name]['value'].iloc[0])}" for name in flat)
        return f" Not drawn, the same at every step for every run: {values}."

    def curve_panels(self) -> list[tuple[str, str]]:
        """(split, metric) of the learning-curve panels: the training loss, and the evaluation
        loss and headline metric at the training length (or the first evaluation length), and
        the attention entropy when the runs recorded it."""
        lengths = self.study.task.get("eval_lengths") or [self.study.task["train_length"]]
        length = self.study.task["train_length"] if self.study.task["train_length"] in lengths else lengths[0]
        panels = [("train", "loss"), ("eval", f"loss@{length}"), ("eval", f"{self.primary}@{length}")]
        entropy = f"{ATTENTION_ENTROPY}@{self.study.task['train_length']}"  # recorded at the training length only
        curves = self.inputs.curves
        if curves is not None and not curves.empty and (curves["metric"] == entropy).any():
            panels.append(("eval", entropy))
        return panels

    def curves(self) -> pd.DataFrame:
        """Long rows (variant, seed, step, metric, value, x) of the curve panels, every run; x is
        the step or what the run had spent by then (the study's `curves_against`)."""
        curves = self.inputs.curves
        columns = ["variant", "seed", "step", "metric", "value"]
        if curves is None or curves.empty:
            return pd.DataFrame(columns=[*columns, "x"])
        parts = []
        for split, metric in self.curve_panels():
            part = curves[(curves["split"] == split) & (curves["metric"] == metric)].copy()
            part["metric"] = f"{split} {metric}"
            parts.append(part)
        joined = pd.concat(parts).merge(self.runs[["run_id", "variant", "seed"]], on="run_id", how="inner")
        joined = against(pd.concat([joined, curves[curves["split"] == PROGRESS]]), self.study.curves_against)
        joined = joined.dropna(subset=["value", "variant"])
        return joined.sort_values(["metric", "variant", "seed", "step"])[[*columns, "x"]].reset_index(drop=True)

    def by_length(self, name: str) -> pd.DataFrame | None:
        cols = [m for m in self.metrics if split_metric(m)[0] == name and split_metric(m)[1] is not None]
        if len(cols) < 2:
            return None
        long = self.finished.melt(id_vars=["variant", "seed"], value_vars=cols, var_name="metric", value_name="value")
        long["length"] = long["metric"].map(lambda m: split_metric(m)[1])
        return long.dropna(subset=["value"])

    def cost_summary(self, metric: str) -> pd.DataFrame:
        rows = []
        for variant in self.variants.labels:
            mine = self.finished[self.finished["variant"] == variant]
            iv = mean_ci(mine[metric]) if metric in mine else mean_ci([])
            row = {"variant": variant, "mean": iv.mean, "ci_lo": iv.lo, "ci_hi": iv.hi}
            for cost in ("wall_time_s", "peak_memory_bytes"):
                if cost in mine:
                    row[cost] = float(mine[cost].mean()) if len(mine) else math.nan
            rows.append(row)
        return pd.DataFrame(rows)

    def failures(self) -> Section:
        failed = self.runs[self.runs["status"] != Status.FINISHED]
        if failed.empty:
            return Section("Failed runs", [Paragraph("Every run finished.")])
        rows = []
        for row in failed.to_dict("records"):
            step = row.get("diverged_step")
            if step is None or pd.isna(step):
                step = row.get("steps_done")
            rows.append([row["variant"], str(row["seed"]), str(row["status"]),
                         "–" if step is None or pd.isna(step) else f"{int(step):,}",
                         str(row.get("error") or "").strip() or "–"])
        return Section("Failed runs", [
            Paragraph("Runs that failed, diverged or ran out of memory are kept here and counted in the tables; "
                      "their metrics do not enter the means. Step: where the run stopped (for a diverged run, "
                      "the step whose loss was not finite)."),
            Table(["variant", "seed", "status", "step", "message"], rows, numeric=[False, True, False, True, False])])

    def settling_section(self) -> Section | None:
        """Whether the budget sufficed: the verdict metrics over the last 20% of the steps."""
        curves = self.inputs.curves
        if curves is None or curves.empty:
            return None
        metrics = list(dict.fromkeys(exp.metric for exp in self.study.expect if exp.target is None))
        return settling_section(settling(curves, self.finished, metrics))

    def environment(self) -> Section:
        env = self.inputs.environment
        rows = [[k, str(env[k])] for k in sorted(env)]
        return Section("Environment", [Table(["", "value"], rows)])

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
                      verdicts=lines, sections=[s for s in sections if s is not None], learned=self.learned_lines())


    def results_csv(self) -> pd.DataFrame:
        """Every run, one row each, in sweep order (tuning runs last), with its variant label first."""
        runs = pd.concat([self.runs, self.tuning_runs])
        frame = runs.drop(columns=["variant"])
        frame.insert(0, "variant", runs["variant"])
        return frame
