"""Did each variant learn at all? The chance levels of its task's baselines at the training
length, the learned-at-all gate (workbench.stats.gate), the share of seeds that
failed, and the header's Learned lines (the Learned section is tables.learned)."""

from __future__ import annotations

import functools
import json
import math
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from workbench.registry import get_variant
from workbench.stats.intervals import LEVEL, Share
from workbench.stats.sequential import LOOKS
from workbench.stats.gate import Gate, Learned, beats, learned_criterion, make_gate, threshold
from workbench.report.sweep_points import short_key, value_text
from workbench.results import FAILURE_SHARE, KEPT, Status
from workbench.study import RUN_MEASURES
from workbench.study.keys import canonical_json
from workbench.recipes.train.sweep import resolve_point
from workbench.tasks import Consumed
from workbench.recipes.train.runs import TrainRuns, metric_direction, split_metric


@functools.lru_cache(maxsize=16)
def built_task(task: str, seed: int):
    """The task section `task` (JSON) built for `seed`, once per process for the last few: the
    runner asks for its baselines after every round of seeds, and a report per group."""
    spec = json.loads(task)
    cls = get_variant("task", spec.pop("name"))
    return cls(cls.Params.model_validate(spec), seed=seed)


@functools.lru_cache(maxsize=1024)
def task_baselines(task: str, seed: int, family: str, length: int) -> dict[str, dict[str, float]]:
    """`Task.baselines` of the task section `task` (JSON) built for `seed`, computed once per process."""
    return built_task(task, seed).baselines(family, length)


_SECTIONS: dict[tuple[str, str], dict[str, Any]] = {}


def point_sections(sections: str, point_json: str, study, point: dict[str, Any]) -> dict[str, Any]:
    """A sweep point's resolved task section, model family and training section, resolved once
    per process for the study's sections (`sections`, JSON) and the point: the adaptive-seed loop
    asks after every round, and resolving validates the whole configuration."""
    key = (sections, point_json)
    if key not in _SECTIONS:
        resolved = resolve_point(study, point)
        _SECTIONS[key] = {"task": resolved["task"], "family": resolved["model"]["family"], "train": resolved["train"]}
    return _SECTIONS[key]


class Gates:
    """Each variant's baselines and learned-at-all gates, computed from its runs."""

    def __init__(self, runs: TrainRuns):
        self.runs, self.study = runs, runs.study
        self._baselines: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
        self._gates: dict[tuple[str, str, int], Gate] = {}

    @cached_property
    def resolved_points(self) -> dict[str, dict[str, Any]]:
        """Each variant's resolved task section and model family, as its runs were configured
        ({} when the study no longer resolves here, e.g. a plugin is gone)."""
        out = {}
        labels = set(self.runs.variants.labels)
        sections = canonical_json([self.study.task, self.study.model, self.study.train.model_dump(exclude_unset=True)])
        try:
            for point in self.study.sweep.points():
                label = self.runs.variants.label([value_text(point[k]) for k in self.runs.keys])
                if label in labels and label not in out:
                    out[label] = point_sections(sections, canonical_json(point), self.study, point)
        except Exception:  # noqa: BLE001 - the gate then reads "no chance level" instead of failing the report
            return {}
        return out

    def baseline_levels(self, variant: str, length: int) -> dict[str, dict[str, float]]:
        """The task's baselines (name -> metric -> score, `Task.baselines`) for this variant's
        family at one evaluation length, each the mean over the study's seeds (a held-out set
        depends on the seed), or over the seeds whose runs it was fitted on (`Task.seen_baselines`);
        {} when the task cannot be built here."""
        key = (variant, length)
        if key not in self._baselines:
            self._baselines[key] = {}
            point = self.resolved_points.get(variant)
            if point is not None:
                spec = json.dumps(point["task"], sort_keys=True, default=str)
                consumed = self.consumed(variant, point["train"]["batch_size"])
                try:
                    levels = [task_baselines(spec, seed, point["family"], length) for seed in self.study.seeds]
                    levels += [built_task(spec, seed).seen_baselines(point["family"], length, c)
                               for seed, c in consumed.items()]
                except Exception:  # noqa: BLE001 - e.g. a task no longer installed, a corpus file gone
                    levels = []
                for name in dict.fromkeys(name for lv in levels for name in lv):
                    had = [lv[name] for lv in levels if name in lv]
                    self._baselines[key][name] = {metric: float(np.mean([h[metric] for h in had])) for metric in had[0]}
        return self._baselines[key]

    def consumed(self, variant: str, batch_size: int) -> dict[int, Consumed]:
        """Per seed, the training tokens its kept run recorded (`train_tokens`): what it trained on."""
        runs = self.runs.final_runs
        if "train_tokens" not in runs:
            return {}
        mine = runs[(runs["variant"] == variant) & runs["status"].isin(KEPT) & runs["train_tokens"].notna()]
        return {int(seed): Consumed(batch_size, int(tokens)) for seed, tokens in zip(mine["seed"], mine["train_tokens"])}

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
        first = self.runs.variants.labels[0] if self.runs.variants.labels else None
        levels = self.baseline_levels(first, self.train_length(first)) if first is not None else {}
        known = {m for scores in levels.values() for m in scores}
        return next((c for c in (name, *self.runs.task_metrics, "loss") if c in known), name)

    @cached_property
    def gating_baselines(self):
        """The baselines the task names for its gate (`Task.gate_baselines`; None: all)."""
        try:
            return getattr(get_variant("task", self.runs.task_name), "gate_baselines", None)
        except Exception:  # noqa: BLE001 - a task no longer installed: every baseline gates
            return None

    @cached_property
    def baselines_text(self) -> str:
        """What each of the task's baselines knows (`Task.baselines_text`), and which gate (`gating_baselines`)."""
        try:
            known = get_variant("task", self.runs.task_name).baselines_text
        except Exception:  # noqa: BLE001 - a task no longer installed: its baselines go unexplained
            known = "as the task declares them"
        gating = self.gating_baselines
        return known + (f". The learned gate reads {' and '.join(gating)} only; the others are shown, not gated"
                        if gating else ". The learned gate reads the strongest of them")

    def gate(self, variant: str, name: str, length: int | None = None) -> Gate:
        """`variant`'s gate on `name` at `length` (default: its training length): its per-seed
        scores there against the task's baselines there (built once: a group is in many comparisons)."""
        length = self.train_length(variant) if length is None else length
        if (variant, name, length) not in self._gates:
            self._gates[(variant, name, length)] = self.built_gate(variant, name, length)
        return self._gates[(variant, name, length)]

    def built_gate(self, variant: str, name: str, length: int) -> Gate:
        metric = f"{name}@{length}"
        higher = metric_direction(metric, self.runs.task_name)
        lo, hi = self.runs.range_of(metric)
        baselines = {b: scores[name] for b, scores in self.baseline_levels(variant, length).items() if name in scores}
        return make_gate(variant, metric, self.runs.values(variant, metric), baselines, hi if higher else lo, higher,
                         (lo, hi), self.untuned.get(variant, ""), self.gating_baselines)

    def learned(self, variant: str, name: str, length: int | None = None) -> Learned:
        """Whether `variant` learned: with a fixed list of seeds over all its finished seeds at
        95%; with adaptive seeds at the last look its seeds reached, on that look's seeds and at
        its level, as a verdict read at that look shows the same group (one gate per group and look)."""
        gate = self.gate(variant, name, length)
        plan = self.study.seed_plan
        if plan is None:
            return gate.at(LEVEL)
        looks = LOOKS.looks(plan.first, plan.max)
        ran = self.runs.seeds_run.get(variant, 0)
        alphas = LOOKS.reading_alphas(looks)
        look, alpha = next(((n, a) for n, a in reversed(list(zip(looks, alphas))) if n <= ran), (looks[0], alphas[0]))
        return gate.truncated(look).at(1 - alpha)

    @cached_property
    def untuned(self) -> dict[str, str]:
        """Tuned variants none of whose candidates' mean tuning metric passed the gate's threshold
        (a qualifier shown beside the gate: the final runs' own scores decide what it says)."""
        if self.study.tune is None:
            return {}
        metric = self.study.tune.metric
        name, length = split_metric(metric)
        higher = metric_direction(metric, self.runs.task_name)
        lo, hi = self.runs.range_of(metric)
        keys = " and ".join(short_key(k).replace("_", " ") for k in self.study.tune.keys)
        what = "learning rate" if self.study.tune.keys == ["train.lr"] else f"value of {keys}"
        out = {}
        for tuned in self.runs.tuning:
            variant = self.runs.variants.label([value_text(tuned.swept.get(k)) for k in self.runs.keys])
            baselines = {b: scores[name] for b, scores in self.baseline_levels(variant, length).items() if name in scores}
            if variant not in self.runs.variants.labels or not baselines or not tuned.done:
                continue
            limit = threshold(baselines, hi if higher else lo, higher, self.gating_baselines)
            if not any(beats(c.mean, limit.needed, higher) for c in tuned.candidates if c.eligible):
                out[variant] = f"no {what} in the grid passed the threshold in tuning"
        return out

    def group_gates(self, variant: str, name: str, metric: str) -> tuple[Gate, ...]:
        """The gates of one group for a verdict on `metric`: at the training length, and at
        the compared length when that differs and the runs evaluated `name` there."""
        gates = [self.gate(variant, name)]
        length = split_metric(metric)[1]
        if length is not None and length != self.train_length(variant) and f"{name}@{length}" in self.runs.final_runs:
            gates.append(self.gate(variant, name, length))
        return tuple(gates)

    def seed_outcomes(self, variant: str) -> pd.DataFrame:
        """Per seed that ended (finished or diverged; index: seed), two 0/1 columns kept apart:
        `diverged`, and `missed` when it finished but its own score at the training length misses
        the group's gate (it did not learn; a missing score counts as missed)."""
        runs = self.runs.final_runs
        mine = runs[(runs["variant"] == variant) & runs["status"].isin(KEPT)]
        diverged = (mine["status"] == Status.DIVERGED).to_numpy()
        missed = np.zeros(len(mine), dtype=bool)
        names = list(self.per_metric)
        if names:
            gate = self.learned(variant, names[0])
            if math.isfinite(gate.needed) and gate.metric in mine:
                scores = mine[gate.metric].astype(float)
                missed = (scores < gate.needed if gate.higher else scores > gate.needed).fillna(True).to_numpy() & ~diverged
        return pd.DataFrame({"diverged": diverged.astype(float), "missed": missed.astype(float)},
                            index=mine["seed"].to_numpy())

    def failed_seeds(self, variant: str) -> pd.Series:
        """Per seed that ended: 1 when it diverged or did not learn, else 0 (the failure share's values)."""
        outcomes = self.seed_outcomes(variant)
        return outcomes["diverged"] + outcomes["missed"]

    def failure_share(self, variant: str) -> Share:
        failed = self.failed_seeds(variant)
        return Share(int(failed.sum()), len(failed))

    def failure_text(self, variant: str) -> str:
        """The Learned table's cell for one group: the share of seeds that diverged or did not
        learn, with its interval, then each kind counted apart ('2/2 = 1 [0.158, 1]: 2 did not learn')."""
        outcomes = self.seed_outcomes(variant)
        kinds = [f"{int(outcomes[c].sum())} {word}" for c, word in (("diverged", "diverged"), ("missed", "did not learn"))
                 if outcomes[c].any()]
        return self.failure_share(variant).text + (f": {', '.join(kinds)}" if kinds else "")

    @cached_property
    def per_metric(self) -> dict[str, list[Learned]]:
        """Per gated metric (of the headline metrics), every variant's learned-at-all check, in
        sweep order: what the header's Learned lines and the Learned section show."""
        names = list(dict.fromkeys(g for g in map(self.gate_name, self.runs.headline) if g is not None))
        return {name: [self.learned(variant, name) for variant in self.runs.variants.labels] for name in names}

    def learned_lines(self) -> list[str]:
        """The header's Learned lines: one per gated metric."""
        if not self.runs.variants.labels:
            return []
        if not self.per_metric:
            return ["Learned: no criterion applies: every verdict compares cost measures (time, memory, "
                    "throughput), which need no gate"]
        return [learned_criterion(name, gates) for name, gates in self.per_metric.items()]
