"""Tuning: every sweep point chooses its own training values before its seeds run.

    tune: {train.lr: [1.0e-3, 3.0e-3, 1.0e-2], metric: loss@16, seeds: 1}

Why: variants differ in the learning rate they train best at (Post-LN needs a smaller one
than Pre-LN), so a comparison at one shared rate measures how well each variant suits that
rate, not the variant. Each point is compared at its own best value instead.

    stage 1  tuning runs  (sweep.tuning_runs) every point x every candidate x `seeds` seeds
             past every final seed (a reported seed never chose its own value): trained like
             any run, scored on validation sets that are disjoint from their training data
             and from the evaluation sets (workbench.tasks.base)
    choose   (choose)     per point, the candidate with the best mean metric over its tuning
             runs, in the metric's direction; a candidate with a diverged run, or without a
             finite metric, is not eligible; ties go to the candidate listed first
    extend   (extensions) a choice at the edge of a numeric grid (one key, e.g. train.lr) is
             not bracketed: the point gets a candidate one grid ratio further, and chooses
             again, until bracketed or EXTEND_BOUND candidates past the grid
    stage 2  final runs   (sweep.expand with the choices) every point x every seed at its
             chosen values: ordinary runs, with the ids an untuned study at those values has

A point chooses only when every one of its tuning runs is done (finished or diverged): a
failed tuning run is retried by the next `workbench run` first, so a choice never changes
after its final runs exist. Tuning and final runs live in one store; a run's stage is
"tune" when its config evaluates on the validation split (`results.run_stage`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from workbench.registry import get_variant
from workbench.recipes.train.study import TrainStudy
from workbench.study.keys import get_dotted, label
from workbench.results import KEPT, TUNE, Status, run_stage
from workbench.recipes.train.sweep import point_key



@dataclass(frozen=True)
class Candidate:
    """One candidate value (of every tuned key) at one sweep point, with its tuning runs."""

    values: dict[str, Any]  # tuned key -> value, as the study file gives it
    statuses: tuple[str, ...]  # of the recorded tuning runs
    scores: tuple[float, ...]  # the metric of each finished tuning run (NaN where it has none)
    runs: int  # tuning runs it should have (one per tuning seed)

    @property
    def done(self) -> bool:
        return len(self.statuses) == self.runs and all(s in KEPT for s in self.statuses)

    @property
    def eligible(self) -> bool:
        return (self.done and all(s == Status.FINISHED for s in self.statuses)
                and all(math.isfinite(v) for v in self.scores))

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else math.nan


EXTEND_BOUND = 3  # candidates a point may add past its grid's edge before the search stops


@dataclass(frozen=True)
class PointTuning:
    """The tuning outcome of one sweep point."""

    swept: dict[str, Any]  # the point's value labels on the swept keys
    candidates: tuple[Candidate, ...]  # the study's grid in its order, then values added past an edge
    chosen: Candidate | None  # None while a tuning run is not done, or when none is eligible
    grid: int = 0  # how many of the candidates are the study's own grid

    @property
    def done(self) -> bool:
        return all(c.done for c in self.candidates)

    @property
    def edge(self) -> int:
        """-1 / +1 when the choice is the smallest / largest value of a numeric grid (it is
        not bracketed), 0 when bracketed or the grid is not one numeric key."""
        values = [numeric(c.values) for c in self.candidates]
        if self.chosen is None or len(values) < 2 or any(v is None for v in values):
            return 0
        mine = numeric(self.chosen.values)
        return -1 if mine == min(values) else 1 if mine == max(values) else 0

    @property
    def stopped_at_bound(self) -> bool:
        """The choice is still at an edge after EXTEND_BOUND values past the grid."""
        return self.edge != 0 and len(self.candidates) - self.grid >= EXTEND_BOUND


def numeric(values: Mapping[str, Any]) -> float | None:
    """The value of a one-key candidate that a ratio can extend (a positive float), else None."""
    if len(values) != 1:
        return None
    value = next(iter(values.values()))
    return float(value) if isinstance(value, float) and value > 0 else None


def grid_ratio(candidates: Iterable[Candidate]) -> float:
    """The grid's own ratio: the geometric mean step between its sorted values."""
    values = sorted(v for c in candidates if (v := numeric(c.values)) is not None)
    return (values[-1] / values[0]) ** (1 / (len(values) - 1))


def extensions(study: TrainStudy, tunings: Iterable[PointTuning]) -> dict[str, list[dict[str, Any]]]:
    """point_key -> the candidates each point has past its grid, plus the next one where its
    choice sits at an edge and the bound is not reached (one grid ratio beyond that edge)."""
    (key,) = study.tune.keys if len(study.tune.keys) == 1 else (None,)
    out = {}
    for t in tunings:
        extra = [dict(c.values) for c in t.candidates[t.grid:]]
        if key is not None and t.done and t.edge and not t.stopped_at_bound:
            values = [numeric(c.values) for c in t.candidates]
            edge = (min if t.edge < 0 else max)(values)
            ratio = grid_ratio(t.candidates[: t.grid])
            extra.append({key: float(f"{edge * ratio ** t.edge:.3g}")})
        if extra:
            out[point_key(t.swept, study.sweep.keys)] = extra
    return out


def higher_is_better(study: TrainStudy, metric: str) -> bool:
    """The direction of a tuning metric, as the study's task declares it."""
    return get_variant("task", study.task["name"]).metric(metric).higher_is_better


def labels(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: label(value) for key, value in values.items()}


def choose(study: TrainStudy, rows: Iterable[Mapping[str, Any]]) -> list[PointTuning]:
    """Each sweep point's candidates and choice, from recorded runs (`Store.runs()` rows:
    swept, config, status, metrics); rows of final runs are ignored."""
    tune = study.tune
    if tune is None:
        return []
    keys = study.sweep.keys
    recorded: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        if run_stage(row["config"]) == TUNE:
            recorded[point_key(row["swept"], keys), point_key(row["swept"], tune.keys)].append(row)
    higher = higher_is_better(study, tune.metric)
    grid = [labels(values) for values in tune.points()]
    out = []
    for point in study.sweep.points():
        swept = labels(point)
        past_edge = {}  # candidates tried beyond the grid, recorded for this point
        for (point, values), mine in recorded.items():
            if point == point_key(swept, keys) and json.loads(values) not in grid:
                past_edge[values] = {k: get_dotted(mine[0]["config"], k) for k in tune.keys}
        candidates = []
        for values in [*tune.points(), *past_edge.values()]:
            mine = recorded[point_key(swept, keys), point_key(labels(values), tune.keys)]
            scores = tuple(score(r["metrics"].get(tune.metric)) for r in mine if r["status"] == Status.FINISHED)
            candidates.append(Candidate(values, tuple(r["status"] for r in mine), scores, tune.seeds))
        eligible = [c for c in candidates if c.eligible]
        best = None
        if eligible and all(c.done for c in candidates):
            best = min(eligible, key=lambda c: -c.mean if higher else c.mean)  # the first of equals
        out.append(PointTuning(swept, tuple(candidates), best, grid=len(grid)))
    return out


def score(value: Any) -> float:
    return math.nan if value is None else float(value)


def chosen_values(tunings: Iterable[PointTuning], keys: list[str]) -> dict[str, dict[str, Any]]:
    """point_key -> chosen {tuned key: value}, for `sweep.expand`; points without a choice are absent."""
    return {point_key(t.swept, keys): dict(t.chosen.values) for t in tunings if t.chosen is not None}
