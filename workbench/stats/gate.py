"""The learned-at-all gate: did a group learn at all? Its per-seed scores against a threshold
set by the task's baselines (predictors that cannot solve the task), a margin of the way
towards a perfect score.

"Learned" is a statement about a mean over a few seeds, so it carries that mean's
uncertainty. At a given level (an adaptive study's look level; 95% elsewhere) a group

- *learned* when the t interval of its mean lies entirely on the better side of the threshold,
- *did not learn* when it lies entirely on the other side,
- is *undetermined* otherwise (also with one finished seed: no interval).

This is the interval form of a one-sided t test of the mean against the threshold, each side
at half the level's alpha, as in a test of non-inferiority against a fixed bound (the same
duality as Schuirmann's two one-sided tests, which `stats` uses for equivalence). A group whose
seeds all scored the same has no spread; it counts as that value exactly (an exact score, e.g.
accuracy 1.0 on every seed, rather than an estimate).

The gate never decides a comparison on its own and never ends its test (workbench.stats.rule):
it qualifies a decided difference ("only A learned"), marks a verdict whose groups the data
show both did not learn ("neither group learned": it does not test the claim), and,
undetermined, sends an adaptive study to more seeds. `gate_states` reads many gates at once
(the verdict rule's arrays, workbench.stats.family); `Learned.state` is one of them.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np
import pandas as pd

from workbench.stats.intervals import LEVEL, first_seeds, mean_ci, mean_intervals
from workbench.stats.numbers import fmt, level_text

# A group learned when its score at the training length is better than the strongest baseline by
# at least this share of the distance from that baseline to the perfect score (1 for accuracy,
# 0 for loss).
MARGIN = 0.1


class GateState(StrEnum):
    LEARNED = "learned"
    NOT_LEARNED = "did not learn"
    UNDETERMINED = "undetermined"


GATE_STATES = list(GateState)  # the codes of `gate_states`: index into this list
LEARNED_CODE, NOT_LEARNED_CODE, UNDETERMINED_CODE = range(3)


def state_codes(score, lo, hi, n, needed, higher) -> np.ndarray:
    """Each gate's state as a code (GATE_STATES): learned when the interval's worse end is past
    the threshold, not learned when its better end falls short, undetermined otherwise (also with
    one seed, no score or no threshold). Seeds without spread count as their value exactly."""
    exact = np.isnan(lo) & (n >= 2)
    lo, hi = np.where(exact, score, lo), np.where(exact, score, hi)
    worst, best = np.where(higher, lo, hi), np.where(higher, hi, lo)
    with np.errstate(invalid="ignore"):
        learned = np.where(higher, worst >= needed, worst <= needed)
        short = ~np.where(higher, best >= needed, best <= needed)
    known = ~np.isnan(score) & ~np.isnan(needed) & ~np.isnan(lo)
    return np.where(known & learned, LEARNED_CODE, np.where(known & short, NOT_LEARNED_CODE, UNDETERMINED_CODE))


def gate_states(scores: np.ndarray, needed, higher, level, bounds: tuple[float, float]) -> np.ndarray:
    """The states of many gates at once (seeds on the last axis of `scores`, NaN: none), each
    read at `level` against its threshold `needed`: codes into GATE_STATES."""
    mean, lo, hi, n, _ = mean_intervals(scores, level, bounds)
    return state_codes(mean, lo, hi, n, needed, higher)


@dataclass(frozen=True)
class Threshold:
    """The score a group must beat: the strongest baseline moved MARGIN of the way to perfect."""

    baseline: str  # the strongest baseline's name
    chance: float  # its score (NaN: unknown)
    needed: float  # the threshold (NaN: unknown)
    baselines: tuple[tuple[str, float], ...] = ()  # every baseline the task declares, by name


def threshold(baselines: dict[str, float], perfect: float, higher: bool,
              gating: Collection[str] | None = None) -> Threshold:
    """The strongest of `baselines` (by the metric's direction; only those named in `gating`
    when the task names them, `Task.gate_baselines`) and the margin rule's threshold. Every
    baseline is kept for display."""
    known = {name: v for name, v in baselines.items() if math.isfinite(v) and (gating is None or name in gating)}
    if known:
        name = (max if higher else min)(known, key=known.get)
        strongest = known[name]
    else:
        name, strongest = next(iter(baselines), "chance"), math.nan
    needed = strongest + MARGIN * (perfect - strongest) if math.isfinite(perfect) else math.nan
    return Threshold(name, strongest, needed, tuple(baselines.items()))


def beats(score: float, needed: float, higher: bool) -> bool:
    return score >= needed if higher else score <= needed


@dataclass(frozen=True)
class Learned:
    """One group's gate at one length and level: its mean with the interval, the threshold, and
    what the interval says of it."""

    group: str
    metric: str  # e.g. accuracy@12
    score: float  # mean over finished seeds (NaN: none)
    lo: float  # the interval of the mean at `level` (NaN: none)
    hi: float
    n: int  # finished seeds behind the mean
    level: float
    chance: float  # the strongest baseline's score (NaN: unknown)
    needed: float  # the threshold
    higher: bool
    perfect: float = math.nan
    baseline: str = "chance"
    baselines: tuple[tuple[str, float], ...] = ()
    untested: str = ""  # a qualifier shown beside the gate, e.g. no tuning candidate learned

    @property
    def state(self) -> GateState:
        code = state_codes(np.float64(self.score), np.float64(self.lo), np.float64(self.hi), np.int64(self.n),
                           np.float64(self.needed), self.higher)
        return GATE_STATES[int(code)]

    @property
    def learned(self) -> bool:
        return self.state is GateState.LEARNED

    @property
    def not_learned(self) -> bool:
        return self.state is GateState.NOT_LEARNED

    @property
    def text(self) -> str:
        """e.g. 'none: accuracy@12 0.426 [0.41, 0.44] (95%) vs order-blind 0.443 (learned: ≥ 0.499): did not learn'."""
        if math.isnan(self.chance):
            return f"{self.group}: no chance level of {self.metric}"
        if math.isnan(self.score):
            return f"{self.group}: no finished run reports {self.metric}"
        sign = "≥" if self.higher else "≤"
        spread = (f" [{fmt(self.lo)}, {fmt(self.hi)}] ({level_text(self.level)})" if not math.isnan(self.lo)
                  else f" (all {self.n} seeds equal)" if self.n >= 2 else " (1 seed)")
        untested = f"; {self.untested}" if self.untested else ""
        return (f"{self.group}: {self.metric} {fmt(self.score)}{spread} vs {self.baseline} {fmt(self.chance)} "
                f"(learned: {sign} {fmt(self.needed)}): {self.state}{untested}")


@dataclass(frozen=True)
class Gate:
    """What one group must show at one length to have learned: its per-seed scores (index: seed)
    and the threshold. `at(level)` reads it at a level; `truncated(n)` keeps an earlier look's
    seeds."""

    group: str
    metric: str
    scores: pd.Series
    limit: Threshold
    higher: bool
    perfect: float = math.nan
    bounds: tuple[float, float] = (-math.inf, math.inf)
    untested: str = ""

    def truncated(self, seeds: int) -> Gate:
        return replace(self, scores=first_seeds(self.scores, seeds))

    def at(self, level: float = LEVEL) -> Learned:
        iv = mean_ci(self.scores, level=level, bounds=self.bounds)
        t = self.limit
        return Learned(self.group, self.metric, iv.mean, iv.lo, iv.hi, iv.n, level, t.chance, t.needed, self.higher,
                       self.perfect, t.baseline, t.baselines, self.untested)


def make_gate(group: str, metric: str, scores: pd.Series | Sequence[float], baselines: dict[str, float],
              perfect: float, higher: bool, bounds: tuple[float, float] = (-math.inf, math.inf),
              untested: str = "", gating: Collection[str] | None = None) -> Gate:
    """The gate of `group` on `metric` against the strongest of `baselines` (name -> score)."""
    series = scores if isinstance(scores, pd.Series) else pd.Series(list(scores), dtype=float)
    limit = threshold(baselines or {"chance": math.nan}, perfect, higher, gating)
    return Gate(group, metric, series.astype(float), limit, higher, perfect, bounds, untested)


def score_text(g: Learned) -> str:
    if math.isnan(g.chance):
        return "no chance level"
    return "no finished run" if math.isnan(g.score) else fmt(g.score)


def learned_criterion(name: str, gates: Sequence[Learned]) -> str:
    """One line for a report's header: the learned rule for metric `name` (the threshold each
    group must reach at its training length) and where each group stands, e.g.
    'Learned (accuracy@12 ≥ 0.499, 10% of the way from order-blind 0.443 to 1; 95% interval of
    the mean above it): all 4 groups learned'."""
    known = [g for g in gates if not (math.isnan(g.chance) or math.isnan(g.needed))]
    if not known:
        return (f"Learned: no chance level of {name} is known for this task, so no group can be shown to have "
                "learned it (verdicts on it still test the difference; none can read 'only A learned')")
    thresholds: dict[tuple, list[str]] = {}
    for g in known:
        thresholds.setdefault((g.metric, g.baseline, g.chance, g.needed, g.higher, g.perfect), []).append(g.group)

    def limit(metric: str, needed: float, higher: bool) -> str:
        return f"{metric} {'≥' if higher else '≤'} {fmt(needed)}"

    levels = sorted({g.level for g in known})
    level = (level_text(levels[0]) if len(levels) == 1
             else f"({', '.join(map(level_text, levels))}: each group's last look)")
    if len(thresholds) == 1:
        (metric, baseline, chance, needed, higher, perfect), _ = next(iter(thresholds.items()))
        rule = (f"{limit(metric, needed, higher)}, {MARGIN:.0%} of the way from {baseline} {fmt(chance)} "
                f"to {fmt(perfect)}")
    else:  # the baseline (or the training length) differs between groups, e.g. by family
        rule = f"{MARGIN:.0%} of the way from the strongest baseline to a perfect score: " + "; ".join(
            f"{limit(metric, needed, higher)} for {' and '.join(groups)} ({baseline} {fmt(chance)})"
            for (metric, baseline, chance, needed, higher, _), groups in thresholds.items())
    rule += f"; learned when the {level} interval of the mean lies past it"
    n = len(gates)
    by_state = {state: [g for g in gates if g.state is state] for state in GateState}
    if len(by_state[GateState.LEARNED]) == n:
        outcome = {1: "the group learned", 2: "both groups learned"}.get(n, f"all {n} groups learned")
    else:
        parts = [f"{len(by_state[GateState.LEARNED])} of {n} groups learned"]
        for state in (GateState.NOT_LEARNED, GateState.UNDETERMINED):
            if by_state[state]:
                parts.append(f"{state}: " + "; ".join(f"{g.group} ({score_text(g)})" for g in by_state[state]))
        outcome = "; ".join(parts)
    return f"Learned ({rule}): {outcome}"

