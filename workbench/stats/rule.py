"""Verdicts for a study's `expect:` entries: `RULE` states the verdict rule in the words the
reports print under Verdicts, and `verdicts()` applies it to a study's comparisons and words each
outcome. The decision itself is workbench.stats.family's, on the comparisons as arrays (the same
functions decide the null simulation's hundred thousand studies); here are the comparisons, the
verdicts and their reasons. Every claim decision (an outcome that `decides`,
workbench.stats.outcomes) rests on a test at the look's and Holm's level; the gates
(workbench.stats.gate) only qualify it and never end the test. An inconclusive verdict says what
its seeds detect and would need (workbench.stats.power). Adaptive seeds: workbench.stats.sequential.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from workbench.stats.family import MIN_SEEDS, OUTCOMES, Decided, Family, Status, at_best, decide
from workbench.stats.gate import GATE_STATES, MARGIN, Gate, GateState, Learned
from workbench.stats.intervals import (ALPHA, LEVEL, PAIRED, UNBOUNDED, Interval, Share, finite, interval_of, mean_ci,
                                       share_difference)
from workbench.stats.numbers import fmt, fmt_signed, level_text
from workbench.stats.outcomes import Outcome
from workbench.stats.power import MAX_PLANNED_SEEDS, POWER, detectable, seeds_for_equivalence, seeds_needed

# Futility (adaptive seeds, since 2026-12-04; workbench.stats.sequential.futility): from this many
# seeds on, an inconclusive comparison whose seeds cannot decide it gets no more; "cannot": under
# this power at `max` seeds at the observed difference and spread (for the difference, and for the
# equivalence where the entry has a margin), or neither group learned.
FUTILE_FROM = 4  # 3 seeds give the spread 2 df: too few to read it from
FUTILE_POWER = 0.05

RULE = (
    f"Rule: a verdict compares two groups (one sweep point each, its finished seeds) and is decided only by a "
    f"test of the difference of their means: a t interval, paired over seeds when both groups finished the same "
    f"seeds, Welch's otherwise (failure shares: Fisher's exact test), on at least {MIN_SEEDS} seeds per group "
    f"(with fewer, seeds that each either learn or not can line up by chance). Holm's step-down covers every "
    f"hypothesis of the study, fixed before the run: each `expect:` entry's 'no difference' and, with a `margin:`, "
    f"its 'outside ±margin' (one that ends before a test counts with p = 1); taken in order of p-value, each is "
    f"read at level {ALPHA:g}/t, t the number of entries still holding an unrejected hypothesis (at most one of an "
    f"entry's two can be true: Shaffer 1986), and only while every one before it was rejected. '{Outcome.HOLDS}' "
    f"when the difference's interval at that level lies entirely on the expected side of 0, "
    f"'{Outcome.DOES_NOT_HOLD}' when entirely on the other side; with a `margin:`, '{Outcome.EQUIVALENT}' when both "
    f"one-sided tests of ±margin reject at their level (the 1 - 2a interval lies inside ±margin), which reads "
    f"first, since the margin is the smallest difference of interest, unless both groups' means lie within the "
    f"margin of the metric's best value ('{Outcome.CEILING}') or worst ('{Outcome.FLOOR}'), where the range alone "
    f"keeps them that close and the task does not separate them; otherwise '{Outcome.INCONCLUSIVE}', with the "
    f"smallest difference the seeds detect at 80% power and the seeds the observed one would need. Beside it, did "
    f"each group learn? A group learned when the interval of its mean score at the look's level ({LEVEL:.0%} with "
    f"a fixed list of seeds) lies past a threshold: the strongest of the task's baselines (predictors that cannot "
    f"solve it) moved {MARGIN:.0%} of the way to a perfect score, at the training length and at the compared "
    f"length; it did not learn when the interval lies short of it, and is undetermined otherwise. The gates never "
    f"decide and never end the test: a decided difference whose winner learned and whose other group did not "
    f"reads '{Outcome.HOLDS} (only A learned)'; when the data show that neither group learned, the tested outcome "
    f"carries '(neither group learned)' and does not count as testing the claim; a '{Outcome.HOLDS}' whose other "
    f"group lies below the level the entry says the claim predicts for it says so. Both groups at the metric's "
    f"best value on every seed: '{Outcome.CEILING}'; the same value in both groups on every seed: "
    f"'{Outcome.IDENTICAL}'. Cost measures need no gate. Adaptive seeds: looks at `first` seeds, then about 1.5 "
    f"times as many each round up to `max`; from the first look with {MIN_SEEDS} seeds on, each look tests at the "
    f"alpha a Pocock-type spending function (Lan & DeMets 1983) adds at that look (the first such look at all it "
    f"has spent by then), gates and intervals included, and a comparison keeps the first look that ends it; an "
    f"{Outcome.INCONCLUSIVE} comparison's groups get the next look's seeds, unless from {FUTILE_FROM} seeds on "
    f"more cannot decide it (neither group learned, or `max` seeds would find the observed difference, and with a "
    f"`margin:` the equivalence, with under {FUTILE_POWER:.0%} power): non-binding futility, which adds no "
    f"decision. A comparison of what runs spent to reach a stated score (flops_to_target, lower is better) reads "
    f"'{Outcome.NOT_REACHED}' when a finished run of either group never reached it."
)

HOLDS, DOES_NOT_HOLD, INCONCLUSIVE, EQUIVALENT, CEILING, FLOOR, IDENTICAL, NOT_REACHED = (
    Outcome.HOLDS, Outcome.DOES_NOT_HOLD, Outcome.INCONCLUSIVE, Outcome.EQUIVALENT, Outcome.CEILING, Outcome.FLOOR,
    Outcome.IDENTICAL, Outcome.NOT_REACHED)
CONTAINS_ZERO = "the interval of the difference contains 0"


@dataclass(frozen=True)
class Comparison:
    """One `expect:` pair to decide: per-seed values of both groups (index: seed)."""

    metric: str
    better: str
    than: str
    better_values: pd.Series | Sequence[float]  # a Series over seeds pairs with one over the same seeds
    than_values: pd.Series | Sequence[float]
    higher: bool
    bounds: tuple[float, float] = UNBOUNDED
    gates: tuple[Gate, ...] = ()  # both groups at the training length (and the compared one); () = no gate
    note: str = ""
    margin: float | None = None  # the smallest difference of interest: within ±margin is EQUIVALENT
    counts: bool = False  # values are 0/1 per seed (1: the seed failed): compare the shares of failed seeds
    seeds_run: int = 0  # seeds both groups ran (any outcome): the looks an adaptive study has data for
    unreached: tuple[str, ...] = ()  # *_to_target: per group with finished runs short of the target, in words
    recorded: pd.Series | None = None  # per seed, when the later of the two groups' runs was recorded (ISO, UTC)
    predicted: tuple[str, float] | None = None  # the level the claim predicts for `than`: a baseline's name, score
    relation: str = "better"  # the statement's word: "lower" / "higher" for a descriptive measure's stated direction

    @property
    def shares(self) -> tuple[Share, Share] | None:
        if not self.counts:
            return None
        return tuple(Share(int(finite(v).sum()), len(finite(v))) for v in (self.better_values, self.than_values))

    def at_seeds(self, seeds: Sequence) -> Comparison:
        """The comparison on the seeds `seeds` only (ids), gates included: an earlier look."""
        def keep(values):
            return values[values.index.isin(seeds)] if isinstance(values, pd.Series) else values
        return replace(self, better_values=keep(self.better_values), than_values=keep(self.than_values),
                       gates=tuple(replace(g, scores=keep(g.scores)) for g in self.gates), recorded=keep(self.recorded))

    @property
    def data_complete(self) -> str:
        """When the last run behind this comparison was recorded: the date of its decision."""
        return "" if self.recorded is None or not len(self.recorded) else str(max(self.recorded))


@dataclass(frozen=True)
class Verdict:
    """The outcome of one `expect:` entry."""

    metric: str
    better: str
    than: str
    outcome: Outcome
    reason: str  # why, in words: shown in the label's parentheses where the outcome needs one
    better_ci: Interval  # each group's mean at the level its gates were read at
    than_ci: Interval
    diff: Interval  # better - than, at the (Holm-widened) level it was decided at
    p_holm: float = math.nan
    gates: tuple[Learned, ...] = ()  # read at the verdict's look
    only: str = ""  # the one group that learned, when the other did not (a decided difference only)
    undetermined: tuple[str, ...] = ()  # groups whose gate neither passed nor failed, beside a decided difference
    neither: str = ""  # the data show that neither group learned: both gates, in words ("" otherwise)
    short_of_prediction: str = ""  # a HOLDS whose `than` lies below the level its claim predicts, in words
    look: int = 0  # adaptive seeds: the look (1-based) the verdict is read at; 0: a fixed set of seeds
    looks: int = 0
    seeds: int = 0  # seeds per group at that look
    decided_at: str = ""  # when the last run it reads was recorded (ISO, UTC)
    relation: str = "better"  # as its Comparison's

    @property
    def tests_claim(self) -> bool:
        """Whether the comparison tests its claim: not when neither group learned (two models
        that learned nothing may differ, but not in what the claim is about). Such a verdict
        keeps its outcome and is not counted as a decided claim (findings, the index)."""
        return not self.neither

    @property
    def qualifier(self) -> str:
        """What the gates and the claim's predicted level add to the outcome, in words ("" when nothing)."""
        parts = []
        if self.neither:
            parts.append(f"neither group learned: {self.neither}")
        elif self.only:
            parts.append(f"only {self.only} learned")
        elif self.undetermined and self.outcome.decides:
            parts.append(f"whether {' and '.join(self.undetermined)} learned is undetermined")
        if self.short_of_prediction:
            parts.append(self.short_of_prediction)
        return "; ".join(parts)

    @property
    def label(self) -> str:
        if not self.qualifier:
            return self.outcome.label(self.reason)
        if self.outcome in (CEILING, FLOOR):
            return f"{self.outcome.label(self.reason)} ({self.qualifier})"
        return f"{self.outcome} ({self.reason}; {self.qualifier})" if self.outcome.explained else \
            f"{self.outcome} ({self.qualifier})"

    @property
    def statement(self) -> str:
        return f"{self.better} is {self.relation} than {self.than} on {self.metric}"


# ---- the comparisons as arrays ------------------------------------------------------------------


def seed_axis(comparisons: Sequence[Comparison], seeds: Sequence | None) -> list:
    """The seed ids the family's arrays run along, in run order: `seeds` (the study's), else every
    id any comparison's values or gates hold, sorted."""
    if seeds is not None:
        return list(seeds)
    ids = set()
    for c in comparisons:
        for values in (c.better_values, c.than_values, *(g.scores for g in c.gates)):
            if isinstance(values, pd.Series):
                ids |= set(values.index)
    return sorted(ids)


def along(values, ids: list, width: int) -> np.ndarray:
    """`values` over the seed ids `ids` (a Series; NaN where it has none), or a list's finite
    values in order, padded with NaN to `width`."""
    if isinstance(values, pd.Series) and values.index.is_unique:
        x = values.astype(float).reindex(ids).to_numpy()
    else:
        x = finite(values)
    return np.pad(x, (0, width - len(x)), constant_values=np.nan)


def family_of(comparisons: Sequence[Comparison], seeds: Sequence | None = None) -> Family:
    """The comparisons as the rule's arrays (a batch of one study)."""
    ids = seed_axis(comparisons, seeds)
    width = max([len(ids)] + [len(finite(v)) for c in comparisons for v in (c.better_values, c.than_values)
                              if not isinstance(v, pd.Series)])
    slots = max([len(c.gates) for c in comparisons] + [0])
    m = len(comparisons)
    gate_scores, needed = np.full((1, m, slots, width), np.nan), np.full((m, slots), np.nan)
    gate_higher, gate_group, gate_bounds = np.ones((m, slots), bool), np.full((m, slots), -1), np.zeros((m, slots, 2))
    for k, c in enumerate(comparisons):
        for j, g in enumerate(c.gates):
            gate_scores[0, k, j] = along(g.scores, ids, width)
            needed[k, j], gate_higher[k, j], gate_bounds[k, j] = g.limit.needed, g.higher, g.bounds
            gate_group[k, j] = 0 if g.group == c.better else 1 if g.group == c.than else -1
    return Family(
        better=np.stack([along(c.better_values, ids, width) for c in comparisons])[None] if m else np.zeros((1, 0, 0)),
        than=np.stack([along(c.than_values, ids, width) for c in comparisons])[None] if m else np.zeros((1, 0, 0)),
        higher=np.array([c.higher for c in comparisons], bool),
        bounds=np.array([c.bounds for c in comparisons], float).reshape(m, 2),
        margin=np.array([c.margin if c.margin else np.nan for c in comparisons], float),
        pairable=np.array([isinstance(c.better_values, pd.Series) and isinstance(c.than_values, pd.Series)
                           for c in comparisons], bool),
        counts=np.array([c.counts for c in comparisons], bool),
        ended=np.array([Status.NOT_REACHED if c.unreached else Status.TESTED for c in comparisons], int),
        gate_scores=gate_scores, gate_needed=needed, gate_higher=gate_higher, gate_group=gate_group,
        gate_bounds=gate_bounds)


# ---- the verdicts, in words --------------------------------------------------------------------------


def verdicts(comparisons: Sequence[Comparison], alpha: float = ALPHA, plan: bool = True,
             seeds: Sequence | None = None, min_seeds: int = MIN_SEEDS, reading: float | None = None) -> list[Verdict]:
    """Apply RULE to a study's comparisons at family level `alpha` (an adaptive study's look
    alpha); `seeds`: the study's seed ids in run order (default: those the comparisons hold).
    Gates and group intervals are read at 1 - alpha (1 - `reading` where given: a look that decides
    nothing reads them at what its spending function has reached).

    The family is every hypothesis of the study: each comparison's "no difference" and, for one
    with a `margin:`, its "outside ±margin", in one step-down (workbench.stats.family.step_down:
    Holm's, with Shaffer's count of the hypotheses that can be true at once), so the family-wise
    error of differences and equivalences together is at most alpha. A comparison that ends before
    a test (not reached, ceiling, identical, too few seeds) counts with p = 1. `plan`: an
    inconclusive verdict states what its seeds detect and what it would need (`plan_text`).
    `min_seeds`: the fewest seeds per group a verdict is decided on (a LookRule's)."""
    if not comparisons:
        return []
    reading = alpha if reading is None else reading
    decided = decide(family_of(comparisons, seeds), alpha, min_seeds, reading)
    return [worded(c, decided, k, reading, len(comparisons), plan, min_seeds) for k, c in enumerate(comparisons)]


def worded(c: Comparison, d: Decided, k: int, alpha: float, m: int, plan: bool, min_seeds: int) -> Verdict:
    """Comparison k of the decided family as a Verdict: its outcome, reason and qualifiers; `alpha`
    the look's reading alpha (gates, group intervals, and a difference the step-down did not reach)."""
    gates = tuple(g.at(1 - alpha) for g in c.gates)
    shares = c.shares
    a, b = ((s.interval for s in shares) if shares is not None else
            (mean_ci(v, level=1 - alpha, bounds=c.bounds) for v in (c.better_values, c.than_values)))
    states = [None if s < 0 else GATE_STATES[s] for s in d.group_states[0, k]]
    neither = ("; ".join(gate_texts(gates, g) for g in (c.better, c.than))
               if states == [GateState.NOT_LEARNED] * 2 else "")
    level, eq_level = d.level[0, k], d.equivalence_level[0, k]
    shown = level if np.isfinite(level) and level > 0 else alpha / m  # not reached: at the first level
    diff = (share_difference(*shares) if shares is not None
            else interval_of(d.diffs.at((0, k)), 1 - shown, c.bounds))
    v = Verdict(c.metric, c.better, c.than, OUTCOMES[d.outcome[0, k]], "", a, b, diff, p_holm=float(d.p_holm[0, k]),
                gates=gates, neither=neither, decided_at=c.data_complete, relation=c.relation)
    status = Status(d.status[0, k])
    if status is not Status.TESTED:
        return replace(v, p_holm=math.nan, reason=ended_reason(c, status, a, b, diff, plan, min_seeds))
    if v.outcome in (EQUIVALENT, CEILING, FLOOR):
        tost = interval_of(d.diffs.at((0, k)), 1 - 2 * eq_level, c.bounds)
        also = f"; the difference is decided too, {'above' if diff.mean > 0 else 'below'} 0" if d.decided[0, k] else ""
        reason = f"the {level_text(tost.level)} interval lies within ±{fmt(c.margin)}{also}"
        if v.outcome is not EQUIVALENT:
            reason = at_bound_reason(c, v.outcome, a, b) + "; " + reason
        return qualified(replace(v, diff=tost, p_holm=float(d.p_equivalence_holm[0, k]), reason=reason), c, states)
    if v.outcome is INCONCLUSIVE:
        separates = not math.isnan(diff.lo) and (diff.lo > 0 or diff.hi < 0)
        why = ("Holm: an earlier comparison did not separate" if not np.isfinite(level) and separates
               else f"Fisher's exact p = {fmt(diff.p)}" if shares is not None else CONTAINS_ZERO)
        return replace(v, reason=why + (plan_text(c, diff) if plan and why == CONTAINS_ZERO else ""))
    return qualified(replace(v, reason=f"the difference lies entirely {'above' if diff.mean > 0 else 'below'} 0"),
                     c, states)


def ended_reason(c: Comparison, status: Status, a: Interval, b: Interval, diff: Interval, plan: bool,
                 min_seeds: int) -> str:
    """Why a comparison ended before its test, in words."""
    groups = ((c.better, a), (c.than, b))
    if status is Status.NOT_REACHED:
        return "; ".join(c.unreached)
    if status is Status.EMPTY:
        return f"no finished run of {next(name for name, iv in groups if iv.n == 0)} reports {c.metric}"
    if status is Status.CEILING:
        return "both groups scored the metric's best value on every seed"
    if status is Status.IDENTICAL:
        return f"both groups gave the same {c.metric} on every seed"
    if status is Status.ONE_SEED:
        return f"{next(name for name, iv in groups if iv.n == 1)} has 1 finished seed; an interval needs 2"
    if status is Status.CONSTANT:
        return "every seed gave the same difference: no spread, no interval"
    fewest = min(a.n, b.n)
    return (f"{fewest} seeds per group; a verdict needs {min_seeds}, since with fewer, seeds that each learn or not "
            f"line up by chance" + (plan_text(c, diff) if plan else ""))


def at_bound_reason(c: Comparison, outcome: Outcome, a: Interval, b: Interval) -> str:
    """Why an equivalence reads as a ceiling or floor: both means within the margin of the bound."""
    best = outcome is CEILING
    bound = c.bounds[1] if best == c.higher else c.bounds[0]
    return (f"both groups lie within ±{fmt(c.margin)} of the metric's {'best' if best else 'worst'} value "
            f"{fmt(bound)} ({fmt(a.mean)} and {fmt(b.mean)}), so the range alone keeps them within the margin")


def perfect_on_every_seed(values, higher: bool, bounds: tuple[float, float]) -> bool:
    """Every finished seed scored the metric's best value (the rule's ceiling)."""
    best = bounds[1] if higher else bounds[0]
    return math.isfinite(best) and bool(at_best(finite(values)[None, :], best)[0])


def gate_texts(gates: Sequence[Learned], group: str) -> str:
    return "; ".join(g.text for g in gates if g.group == group and not g.learned)


def qualified(v: Verdict, c: Comparison, states: list[GateState | None]) -> Verdict:
    """A decided difference with what the gates say beside it: 'only A learned' when the winner
    learned and the other did not; the groups whose gate is undetermined; and a HOLDS whose `than`
    lies below the level its claim predicts for it."""
    v = replace(v, short_of_prediction=short_of_prediction(v, c))
    by_group = dict(zip((c.better, c.than), states))
    if None in states or v.neither:
        return v
    winner, loser = (c.better, c.than) if v.outcome == HOLDS else (c.than, c.better)
    if (v.outcome in (HOLDS, DOES_NOT_HOLD) and by_group[winner] is GateState.LEARNED
            and by_group[loser] is GateState.NOT_LEARNED):
        return replace(v, only=winner)
    return replace(v, undetermined=tuple(g for g, s in by_group.items() if s is GateState.UNDETERMINED))


def short_of_prediction(v: Verdict, c: Comparison) -> str:
    """For a HOLDS whose `than` group's interval lies entirely short of the level the claim
    predicts for it (`Comparison.predicted`), the words that say so; else ""."""
    if v.outcome is not HOLDS or c.predicted is None or math.isnan(v.than_ci.mean):
        return ""
    name, level = c.predicted
    iv = v.than_ci
    far = iv.mean if math.isnan(iv.lo) else (iv.hi if c.higher else iv.lo)  # the interval's end nearest the level
    if not (far < level if c.higher else far > level):
        return ""
    return (f"{c.than} at {fmt(iv.mean)} stays {'below' if c.higher else 'above'} {name} {fmt(level)}, the level the "
            f"claim predicts for it: it falls short for more than the claimed reason")


def plan_text(c: Comparison, diff: Interval) -> str:
    """What an inconclusive verdict's seeds detect and what it would need, at the level it was read
    at, with the target named: '; 4 seeds detect ±0.12 with 80% power; to find the observed
    difference -0.0653 (against the claim) with 80% power would take about 44 seeds'."""
    if not (diff.se > 0 and diff.n >= 2):
        return ""
    paired = diff.method == PAIRED
    sd = diff.se * math.sqrt(diff.n) if paired else diff.se * math.sqrt(diff.n / 2)
    alpha = 1 - diff.level
    text = f"; {diff.n} seeds detect ±{fmt(detectable(sd, diff.n, alpha, paired))} with {POWER:.0%} power"
    if c.margin:
        needed = seeds_for_equivalence(diff.mean, sd, alpha, paired, c.margin, MIN_SEEDS)
        what = (f"to show equivalence within ±{fmt(c.margin)} with {POWER:.0%} power, were the observed difference "
                f"{fmt_signed(diff.mean)} the true one,")
        if abs(diff.mean) >= c.margin:
            return text + f"; the observed difference {fmt_signed(diff.mean)} lies outside ±{fmt(c.margin)}"
    else:
        needed = seeds_needed(diff.mean, sd, alpha, paired, MIN_SEEDS)
        side = "the claim's direction" if (diff.mean > 0) == c.higher else "against the claim"
        what = f"to find the observed difference {fmt_signed(diff.mean)} ({side}) with {POWER:.0%} power"
    more = f"about {needed} seeds" if needed is not None else f"more than {MAX_PLANNED_SEEDS} seeds"
    return f"{text}; {what} would take {more}"


def verdict(better_values, than_values, metric: str, better: str, than: str, *, higher: bool,
            bounds: tuple[float, float] = UNBOUNDED, margin: float | None = None) -> Verdict:
    """One comparison on its own (m = 1, no gate), `higher`: the metric's direction (its
    declaration, workbench.results.Metric). Series over seeds (index = seed) pair when they hold
    the same seeds; plain lists are compared with Welch's interval."""
    return verdicts([Comparison(metric, better, than, better_values, than_values, higher=higher, bounds=bounds,
                                margin=margin)])[0]

