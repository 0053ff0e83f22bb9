"""The verdicts of a training study: each `expect:` entry's comparisons, decided by
workbench.stats.rule (look by look with adaptive seeds), each as a verdict line; the outcomes
at each rung of a scale ladder; and which groups get more seeds next (`seeds_wanted`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from functools import cached_property
from typing import Any

import pandas as pd

from workbench.errors import WorkbenchError
from workbench.report.document import VerdictLine, fmt, fmt_signed_interval, level_text
from workbench.stats.intervals import Interval, first_seeds, paired_correlation
from workbench.stats.gate import Learned
from workbench.stats.sequential import LOOKS, LookRule, seeds_for_next_look, sequential_verdicts
from workbench.stats.rule import Comparison, Verdict, verdicts
from workbench.report.sweep_points import short_key, value_text
from workbench.recipes.train.report.ladder import cross_scale_line
from workbench.report.registration import post_hoc
from workbench.results import FAILURE_SHARE
from workbench.study.keys import label, point_labels
from workbench.recipes.train.sweep import point_key
from workbench.recipes.train.gates import Gates
from workbench.recipes.train.runs import TrainRuns, interval_text, metric_direction, split_metric
from workbench.recipes.train.tuning import PointTuning


def gate_record(g: Learned) -> dict[str, Any]:
    """A group's learned-at-all check as plain JSON (summary.json), at the verdict's look."""
    return {**asdict(g), "learned": g.learned, "state": str(g.state)}


def group_record(group: str, iv: Interval) -> dict[str, Any]:
    """A compared group's mean with its interval, and the interval's level, as plain JSON (summary.json)."""
    return {"group": group, "mean": iv.mean, "lo": iv.lo, "hi": iv.hi, "n": iv.n, "constant": iv.constant,
            "level": iv.level}


class Verdicts:
    """The `expect:` comparisons of a study's runs, their verdicts and verdict lines."""

    def __init__(self, runs: TrainRuns, gates: Gates):
        self.runs, self.gates, self.study = runs, gates, runs.study

    def comparisons(self) -> tuple[list[Comparison], list[int]]:
        """Each `expect:` pair to decide, with the index of the entry it comes from (an entry
        whose points differ in an unswept-by-it key gives one comparison per pair)."""
        comparisons, origins = [], []
        for index, exp in enumerate(self.study.expect):
            origins.append(index)
            metric = self.runs.expect_column(exp)
            gated = exp.target.metric if exp.target is not None else metric  # the score a group must have learned
            # a descriptive measure has no direction of its own: the entry states the one its claim expects
            higher = metric_direction(metric, self.runs.task_name) if exp.direction is None else exp.direction == "higher"
            relation = exp.direction or "better"
            bounds = (0.0, 1.0) if metric == FAILURE_SHARE else self.runs.range_of(metric)
            gate = self.gates.gate_name(gated)
            pairs = self.runs.variants.pairs(exp.better, exp.than)
            if not pairs:  # neither point was run (e.g. a profile dropped it): say so
                a = ", ".join(f"{short_key(k)}={value_text(v)}" for k, v in exp.better.items())
                b = ", ".join(f"{short_key(k)}={value_text(v)}" for k, v in exp.than.items())
                comparisons.append(Comparison(metric, a, b, [], [], higher, bounds, note=exp.note, relation=relation))
                continue
            origins += [index] * (len(pairs) - 1)
            for a, b in pairs:
                gates = () if gate is None else (*self.gates.group_gates(a, gate, gated),
                                                 *self.gates.group_gates(b, gate, gated))
                if metric == FAILURE_SHARE:
                    values = self.gates.failed_seeds(a), self.gates.failed_seeds(b)
                else:
                    values = self.runs.values(a, metric), self.runs.values(b, metric)
                unreached = tuple(t for t in (self.runs.unreached_text(metric, a), self.runs.unreached_text(metric, b))
                                  if t)
                ran = min(self.runs.seeds_run.get(v, 0) for v in (a, b))
                comparisons.append(Comparison(metric, a, b, *values, higher, bounds, gates, exp.note,
                                              margin=exp.margin, counts=metric == FAILURE_SHARE, seeds_run=ran,
                                              unreached=unreached, recorded=self.recorded(a, b),
                                              predicted=self.predicted(exp, index, b, metric), relation=relation))
        return comparisons, origins

    def predicted(self, exp, index: int, than: str, metric: str) -> tuple[str, float] | None:
        """The level the entry says its claim predicts for `than` (`than_predicted`, a baseline of
        the task) on the verdict's metric at its length: (name, score); None when it names none."""
        if exp.than_predicted is None:
            return None
        name, length = split_metric(metric)
        levels = self.gates.baseline_levels(than, length if length is not None else self.gates.train_length(than))
        score = levels.get(exp.than_predicted, {}).get(name)
        if score is None:
            known = [b for b, scores in levels.items() if name in scores]
            raise WorkbenchError(f"expect.{index}.than_predicted: the task has no baseline {exp.than_predicted!r} of "
                                 f"{name} (valid: {', '.join(known) or 'none is known here'})")
        return exp.than_predicted, float(score)

    @cached_property
    def first_result(self) -> str | None:
        """When the study's first run (tuning included) was recorded; None in stores without times."""
        times = self.runs.all_runs.get("recorded_at")
        return None if times is None or times.dropna().empty else str(times.dropna().min())

    def recorded(self, a: str, b: str) -> pd.Series | None:
        """Per seed both groups ran, the later of their runs' recording times (ISO, UTC)."""
        runs = self.runs.final_runs
        if "recorded_at" not in runs:
            return None
        times = [runs[runs["variant"] == v].groupby("seed")["recorded_at"].max() for v in (a, b)]
        both = pd.concat(times, axis=1).dropna()
        return both.max(axis=1).sort_index()

    @cached_property
    def point_keys(self) -> dict[str, str]:
        """Variant label -> its sweep point's key (as `sweep.point_key` writes it)."""
        out = {}
        for point in self.study.sweep.points():
            labels = {k: label(v) for k, v in point.items()}
            keys = self.runs.keys
            out[self.runs.variants.label([value_text(point[k]) for k in keys])] = point_key(labels, keys)
        return out

    @cached_property
    def decided(self) -> list[tuple[Verdict, int]]:
        """Each verdict with the index of the `expect:` entry it decides; an adaptive study's
        comparisons are decided look by look (workbench.stats.sequential)."""
        comparisons, origins = self.comparisons()
        plan, seeds = self.study.seed_plan, self.study.every_seed
        decided = (verdicts(comparisons, seeds=seeds) if plan is None
                   else sequential_verdicts(comparisons, LOOKS.looks(plan.first, plan.max), seeds=seeds))
        return list(zip(decided, origins))

    def across_scale(self, decided: Sequence[tuple[Verdict, int]]) -> list[dict[str, Any]]:
        """Per `expect:` entry (and per value of any other swept key it does not fix), its
        outcome at each rung of the scale ladder and the cross-scale line (workbench.recipes.train.report.ladder)."""
        scale_keys = list(self.study.scale or {})
        rung_order = [value_text(v) for v in self.study.scale[self.study.rung_key]]
        rows: dict[tuple[int, str], dict[str, Any]] = {}
        for v, index in decided:
            if v.better not in self.runs.variants.labels:
                continue
            exp = self.study.expect[index]
            variants = self.runs.variants
            values = dict(zip(variants.keys, variants.points[variants.labels.index(v.better)]))
            context = ", ".join(f"{short_key(k)}={x}" for k, x in values.items()
                                if k not in scale_keys and k not in exp.better and k not in exp.than)
            row = rows.setdefault((index, context), {
                "index": index, "context": context, "outcomes": {}, "labels": {},
                "statement": f"{self.variants_text(exp.better)} is {exp.direction or 'better'} than "
                             f"{self.variants_text(exp.than)} on "
                             f"{self.runs.expect_column(exp)}"})
            row["outcomes"][values[self.study.rung_key]] = v.outcome
            row["labels"][values[self.study.rung_key]] = v.label
        for row in rows.values():
            row["line"] = cross_scale_line([(rung, row["outcomes"][rung]) for rung in rung_order if rung in row["outcomes"]])
        return list(rows.values())

    @staticmethod
    def variants_text(point: dict[str, Any]) -> str:
        return ", ".join(value_text(v) for v in point.values())

    def differs(self, a: str, b: str) -> list[str]:
        """The settings groups `a` and `b` differ in: swept keys, and tuned ones whose chosen values
        differ (`tune:`), so that a comparison across two of them reads as such (findings)."""
        variants = self.runs.variants
        if a not in variants.labels or b not in variants.labels:
            return []
        points = [dict(zip(variants.keys, variants.points[variants.labels.index(g)])) for g in (a, b)]
        swept = [k for k in variants.keys if points[0].get(k) != points[1].get(k)]
        chosen = [self.chosen(point) for point in points]
        tuned = [k for k in dict.fromkeys([*chosen[0], *chosen[1]])
                 if k not in swept and chosen[0].get(k) != chosen[1].get(k)]
        return swept + tuned

    def rung(self, group: str) -> dict[str, str]:
        """{scale key: value} of the ladder rung `group` belongs to ({} without a ladder): which width a
        verdict speaks for, as the index's 2026 table reads it."""
        variants = self.runs.variants
        if not self.study.scale or group not in variants.labels:
            return {}
        point = dict(zip(variants.keys, variants.points[variants.labels.index(group)]))
        return {k: point[k] for k in self.study.scale if k in point}

    def chosen(self, point: dict[str, Any]) -> dict[str, Any]:
        """The values tuning chose for the sweep point `point` (labels by key), {} without `tune:`."""
        for tuned in self.runs.tuning:
            if tuned.chosen is not None and all(value_text(tuned.swept.get(k)) == v for k, v in point.items()):
                return dict(tuned.chosen.values)
        return {}

    def seed_correlation(self, v: Verdict) -> float:
        """Pearson r of the two groups' values over the seeds a paired verdict read; NaN otherwise."""
        if v.diff.method != "paired":
            return math.nan
        a, b = (self.runs.values(group, v.metric) for group in (v.better, v.than))
        return paired_correlation(*((first_seeds(a, v.seeds), first_seeds(b, v.seeds)) if v.look else (a, b)))

    def line(self, v: Verdict, index: int) -> VerdictLine:
        exp = self.study.expect[index]
        def group(name: str, iv: Interval) -> str:  # each interval says its level: the look's, not the tables' 95%
            return f"{name}: {interval_text(iv)}" + ("" if iv.constant else f" ({iv.n} seeds, {level_text(iv.level)})")

        d, r = v.diff, self.seed_correlation(v)
        detail = f"{group(v.better, v.better_ci)}; {group(v.than, v.than_ci)}"
        if not math.isnan(d.mean):
            how = f"{level_text(d.level)} {d.method} t interval" if not math.isnan(d.lo) else f"{d.method}, no interval"
            holm = f", Holm-adjusted p {fmt(v.p_holm)}" if not math.isnan(v.p_holm) else ""
            correlation = f", seeds' correlation r {fmt(r, 2)}" if not math.isnan(r) else ""
            shown = fmt(d.mean) if math.isnan(d.lo) else fmt_signed_interval(d.mean, d.lo, d.hi)
            detail += f"; difference {shown} ({how}{holm}{correlation})"
        if v.gates:
            detail += ". Learned: " + "; ".join(g.text for g in v.gates)
        if v.look:
            detail += f". Read at look {v.look} of {v.looks} ({v.seeds} seeds per group)"
        if v.decided_at:
            detail += f". Its last run was recorded {v.decided_at[:16].replace('T', ' ')} UTC"
        late = post_hoc(exp.registered, self.first_result) if exp.margin else ""
        label = f"{v.label} [post hoc margin: {late}]" if late else v.label
        return VerdictLine(statement=v.statement, outcome=v.outcome, label=label, detail=detail, note=exp.note,
                           post_hoc=late, tests_claim=v.tests_claim, differs=self.differs(v.better, v.than),
                           qualifier=v.qualifier, rung=self.rung(v.better),
                           gates=[gate_record(g) for g in v.gates],
                           difference={"mean": d.mean, "lo": d.lo, "hi": d.hi, "level": d.level, "method": d.method,
                                       "p": d.p, "p_holm": v.p_holm, "r": r},
                           look={"look": v.look, "of": v.looks, "seeds": v.seeds, "decided_at": v.decided_at}
                           if v.look else None,
                           groups=[group_record(name, iv) for name, iv in ((v.better, v.better_ci), (v.than, v.than_ci))],
                           expect={"index": index, "metric": exp.metric, "better": point_labels(exp.better),
                                   "than": point_labels(exp.than)})


def seeds_wanted(study, runs: pd.DataFrame, tuning: Sequence[PointTuning] = (), rule: LookRule = LOOKS) -> dict[str, int]:
    """Adaptive seeds: point_key -> the seeds its group should have by the next look, for the
    groups of every comparison of the stored `runs` still inconclusive below the plan's maximum
    (workbench.stats.sequential.seeds_for_next_look). The loop calls it after each round; `rule`
    another look rule than the runner's (benchmarks.decide compares two on the same runs)."""
    train_runs = TrainRuns(study, runs, tuning=tuning)
    verdicts = Verdicts(train_runs, Gates(train_runs))
    looks = rule.looks(study.seed_plan.first, study.seed_plan.max)
    comparisons, _ = verdicts.comparisons()
    wanted = seeds_for_next_look(comparisons, looks, rule, seeds=study.every_seed)
    return {verdicts.point_keys[group]: n for group, n in wanted.items() if group in verdicts.point_keys}
