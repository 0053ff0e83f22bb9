"""Verdicts for a study's `expect:` entries: `RULE` states the verdict rule in the words the
reports print under Verdicts, and `verdicts()` is that rule, step by step, on the intervals of
workbench.report.intervals and the learned-at-all gates of workbench.recipes.train.learned_gate. Every
claim decision (an outcome that `decides`, workbench.report.outcomes) rests on a test at the
look's and Holm's level; the gates only qualify it and never end the test. An inconclusive verdict says what its seeds
detect and would need (the power of the t test). Adaptive seeds: workbench.recipes.train.sequential.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import stats as st
from scipy.optimize import brentq

from workbench.report.document import fmt, level_text
from workbench.report.intervals import (ALPHA, LEVEL, UNBOUNDED, Interval, Share, difference, finite, first_seeds,
                                        mean_ci, share_difference)
from workbench.recipes.train.learned_gate import MARGIN, Gate, GateState, Learned
from workbench.report.outcomes import CEILING_LABEL, Outcome

# Futility (adaptive seeds, since 2026-12-04; workbench.recipes.train.sequential.futility): from this
# many seeds on, an inconclusive comparison whose seeds cannot decide it gets no more; "cannot": under
# this power at `max` seeds at the observed difference and spread (for the difference, and for the
# equivalence where the entry has a margin), or neither group learned.
FUTILE_FROM = 4  # 3 seeds give the spread 2 df: too few to read it from
FUTILE_POWER = 0.05

RULE = (
    f"Rule: a verdict compares two groups (one sweep point each, its finished seeds) and is decided only by a "
    f"test of the difference of their means: a t interval, paired over seeds when both groups finished the same "
    f"seeds, Welch's otherwise (failure shares: Fisher's exact test). Holm's step-down covers every hypothesis of "
    f"the study, fixed before the run: each `expect:` entry's 'no difference' and, with a `margin:`, its 'outside "
    f"±margin' (one that ends before a test counts with p = 1); taken in order of p-value, each is read at level "
    f"{ALPHA:g}/t, t the number of entries still holding an unrejected hypothesis (at most one of an entry's two "
    f"can be true: Shaffer 1986), and only while every one before it was rejected. '{Outcome.HOLDS}' when the "
    f"difference's interval at that level lies entirely on the expected side of 0, '{Outcome.DOES_NOT_HOLD}' when "
    f"entirely on the other side; with a `margin:`, '{Outcome.EQUIVALENT}' when both one-sided tests of ±margin "
    f"reject at their level (the 1 - 2a interval lies inside ±margin), which reads first, since the margin is the "
    f"smallest difference of interest; otherwise '{Outcome.INCONCLUSIVE}', with the smallest difference the seeds "
    f"detect at 80% power and the seeds the observed one would need. Beside it, did each group learn? A group "
    f"learned when the interval of its mean score at the look's level ({LEVEL:.0%} with a fixed list of seeds) lies "
    f"past a threshold: the strongest of the task's baselines (predictors that cannot solve it) moved {MARGIN:.0%} "
    f"of the way to a perfect score, at the training length and at the compared length; it did not learn when the "
    f"interval lies short of it, and is undetermined otherwise. The gates never decide and never end the test: a "
    f"decided difference whose winner learned and whose other group did not reads '{Outcome.HOLDS} (only A "
    f"learned)'; when the data show that neither group learned, the tested outcome carries '(neither group learned)' "
    f"and does not count as testing the claim. Both groups at the metric's best value on every seed: "
    f"'{CEILING_LABEL}'; the same value in both groups on every seed: '{Outcome.IDENTICAL}'. Cost measures need no "
    f"gate. Adaptive seeds: looks at `first` seeds, then about 1.5 times as many each round up to `max`; each look "
    f"tests at the alpha a Pocock-type spending function (Lan & DeMets 1983) adds at that look, gates and intervals "
    f"included, and a comparison keeps the first look that ends it; an {Outcome.INCONCLUSIVE} comparison's groups "
    f"get the next look's seeds, unless from {FUTILE_FROM} seeds on more cannot decide it (neither group learned, or "
    f"`max` seeds would find the observed difference, and with a `margin:` the equivalence, with under "
    f"{FUTILE_POWER:.0%} power): non-binding futility, which adds no decision. A comparison of what runs spent to reach a stated score (flops_to_target, lower is "
    f"better) reads '{Outcome.NOT_REACHED}' when a finished run of either group never reached it."
)

# ---- planning seeds ---------------------------------------------------------------------------

POWER = 0.8
MAX_PLANNED_SEEDS = 1000


def power(effect: float, sd: float, n: int, alpha: float, paired: bool) -> float:
    """Power of the two-sided t test at level `alpha` to detect a true difference `effect`
    with `n` seeds per group (exact, from the noncentral t): paired over seeds with `sd` the
    spread of the per-seed differences, else two samples with `sd` each group's spread."""
    if n < 2 or sd <= 0:
        return math.nan
    df, scale = (n - 1, sd / math.sqrt(n)) if paired else (2 * n - 2, sd * math.sqrt(2 / n))
    crit = st.t.ppf(1 - alpha / 2, df)
    nc = abs(effect) / scale
    exact = float(st.nct.sf(crit, df, nc) + st.nct.cdf(-crit, df, nc))
    # scipy's noncentral t gives NaN far in the tail, where the normal approximation is exact enough
    return exact if math.isfinite(exact) else float(st.norm.sf(crit - nc) + st.norm.cdf(-crit - nc))


def equivalence_power(difference: float, sd: float, n: int, alpha: float, paired: bool, margin: float) -> float:
    """Power of the two one-sided tests of ±`margin`, each at level `alpha`, with `n` seeds per
    group when the true difference is `difference` (`sd` as in `power`): the chance that the
    1 - 2 alpha interval lies inside ±margin, in the normal approximation with the t quantile
    (Schuirmann 1987's power with the spread taken as known)."""
    if n < 2 or sd <= 0:
        return math.nan
    df, scale = (n - 1, sd / math.sqrt(n)) if paired else (2 * n - 2, sd * math.sqrt(2 / n))
    crit = st.t.ppf(1 - alpha, df)
    inside = st.norm.cdf((margin - difference) / scale - crit) + st.norm.cdf((margin + difference) / scale - crit) - 1
    return max(0.0, float(inside))


def detectable(sd: float, n: int, alpha: float, paired: bool) -> float:
    """The smallest true difference the test finds with POWER at `n` seeds."""
    if n < 2 or sd <= 0:
        return math.nan
    high = sd
    while power(high, sd, n, alpha, paired) < POWER:
        high *= 2
    return float(brentq(lambda e: power(e, sd, n, alpha, paired) - POWER, 0.0, high, xtol=1e-6 * sd))


def seeds_needed(effect: float, sd: float, alpha: float, paired: bool) -> int | None:
    """Seeds per group for POWER against a true difference `effect`; None past MAX_PLANNED_SEEDS."""
    if not effect or sd <= 0 or not math.isfinite(effect):
        return None
    n = 2
    while power(effect, sd, n, alpha, paired) < POWER:
        n = n + 1 if n < 64 else int(n * 1.1)
        if n > MAX_PLANNED_SEEDS:
            return None
    return n


def plan_text(c: Comparison, diff: Interval) -> str:
    """'; 3 seeds detect ±0.12 with 80% power; the observed difference 0.05 would need about 9
    seeds': what an inconclusive verdict would need, at the level it was read at."""
    a, b = (finite(v) for v in (c.better_values, c.than_values))
    paired = diff.method == "paired"
    if paired:
        sd = float(np.std(finite(pd.Series(c.better_values).sort_index().to_numpy()
                                 - pd.Series(c.than_values).sort_index().to_numpy()), ddof=1))
    else:
        sd = math.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2) if min(len(a), len(b)) >= 2 else math.nan
    alpha = 1 - diff.level
    if not math.isfinite(sd) or sd <= 0:
        return ""
    mde = detectable(sd, diff.n, alpha, paired)
    target = c.margin or abs(diff.mean)
    needed = seeds_needed(target, sd, alpha, paired)
    what = f"the margin ±{fmt(c.margin)}" if c.margin else f"the observed difference {fmt(target)}"
    more = f"about {needed} seeds" if needed is not None else f"more than {MAX_PLANNED_SEEDS} seeds"
    return f"; {diff.n} seeds detect ±{fmt(mde)} with {POWER:.0%} power; {what} would need {more}"


# ---- verdicts ---------------------------------------------------------------------------------

HOLDS, DOES_NOT_HOLD, INCONCLUSIVE, EQUIVALENT, CEILING, IDENTICAL, NOT_REACHED = (
    Outcome.HOLDS, Outcome.DOES_NOT_HOLD, Outcome.INCONCLUSIVE, Outcome.EQUIVALENT, Outcome.CEILING,
    Outcome.IDENTICAL, Outcome.NOT_REACHED)


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

    @property
    def shares(self) -> tuple[Share, Share] | None:
        if not self.counts:
            return None
        return tuple(Share(int(finite(v).sum()), len(finite(v))) for v in (self.better_values, self.than_values))

    def truncated(self, seeds: int) -> Comparison:
        """The comparison on the first `seeds` seeds (by id) of each group, gates included: an earlier look."""
        def first(values):
            return first_seeds(values, seeds) if isinstance(values, pd.Series) else values
        return replace(self, better_values=first(self.better_values), than_values=first(self.than_values),
                       gates=tuple(g.truncated(seeds) for g in self.gates), recorded=first(self.recorded))

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
    look: int = 0  # adaptive seeds: the look (1-based) the verdict is read at; 0: a fixed set of seeds
    looks: int = 0
    seeds: int = 0  # seeds per group at that look
    decided_at: str = ""  # when the last run it reads was recorded (ISO, UTC)

    @property
    def tests_claim(self) -> bool:
        """Whether the comparison tests its claim: not when neither group learned (two models
        that learned nothing may differ, but not in what the claim is about). Such a verdict
        keeps its outcome and is not counted as a decided claim (findings, the index)."""
        return not self.neither

    @property
    def qualifier(self) -> str:
        """What the gates add to the outcome, in words ("" when nothing)."""
        if self.neither:
            return f"neither group learned: {self.neither}"
        if self.only:
            return f"only {self.only} learned"
        if self.undetermined and self.outcome.decides:
            return f"whether {' and '.join(self.undetermined)} learned is undetermined"
        return ""

    @property
    def label(self) -> str:
        if not self.qualifier:
            return self.outcome.label(self.reason)
        return f"{self.outcome} ({self.reason}; {self.qualifier})" if self.outcome.explained else \
            f"{self.outcome} ({self.qualifier})"

    @property
    def statement(self) -> str:
        return f"{self.better} is better than {self.than} on {self.metric}"


def perfect_on_every_seed(values, higher: bool, bounds: tuple[float, float]) -> bool:
    x = finite(values)
    perfect = bounds[1] if higher else bounds[0]
    return len(x) > 0 and math.isfinite(perfect) and bool(np.all(x == perfect))


def group_state(gates: Sequence[Learned], group: str) -> GateState | None:
    """A group learned when every gate of it did, did not when any did not; None: no gate."""
    states = [g.state for g in gates if g.group == group]
    if not states:
        return None
    if GateState.NOT_LEARNED in states:
        return GateState.NOT_LEARNED
    return GateState.LEARNED if all(s is GateState.LEARNED for s in states) else GateState.UNDETERMINED


def gate_texts(gates: Sequence[Learned], group: str) -> str:
    return "; ".join(g.text for g in gates if g.group == group and not g.learned)


def qualified(v: Verdict, c: Comparison) -> Verdict:
    """A decided difference with what the gates say beside it: 'only A learned' when the winner
    learned and the other did not; the groups whose gate is undetermined."""
    states = {group: group_state(v.gates, group) for group in (c.better, c.than)}
    if None in states.values() or v.neither:
        return v
    winner, loser = (c.better, c.than) if v.outcome == HOLDS else (c.than, c.better)
    if (v.outcome in (HOLDS, DOES_NOT_HOLD) and states[winner] is GateState.LEARNED
            and states[loser] is GateState.NOT_LEARNED):
        return replace(v, only=winner)
    return replace(v, undetermined=tuple(g for g, s in states.items() if s is GateState.UNDETERMINED))


CONTAINS_ZERO = "the interval of the difference contains 0"


@dataclass(frozen=True)
class Hypothesis:
    """One null hypothesis in the study's Holm family: a comparison's "no difference", or with a
    `margin:` also its "the difference lies outside ±margin" (two one-sided tests)."""

    index: int  # the comparison it belongs to
    equivalence: bool
    p: float  # 1.0 for a comparison that ended before a test


def step_down(hypotheses: Sequence[Hypothesis], alpha: float) -> dict[tuple[int, bool], tuple[float | None, float]]:
    """Holm's step-down (Holm 1979) with Shaffer's refinement for logically related hypotheses
    (Shaffer 1986, "Modified sequentially rejective multiple test procedures", JASA 81: 826-831).
    Taken in order of p, the r-th hypothesis is read at alpha / t_r, and only while every one
    before it was rejected; t_r is the most of the remaining hypotheses that can be true at once.
    A comparison's "no difference" and "outside ±margin" cannot both be true (margin > 0), so
    t_r counts the comparisons that still hold an unrejected hypothesis: Holm's M when no entry
    has a margin. Returns each hypothesis' (level, or None where the step-down stopped before
    it; adjusted p: the smallest alpha at which the procedure rejects it)."""
    order = sorted(hypotheses, key=lambda h: h.p)
    out: dict[tuple[int, bool], tuple[float | None, float]] = {}
    running, stopped = 0.0, False
    for rank, h in enumerate(order):
        possible = len({later.index for later in order[rank:]})
        running = max(running, min(1.0, possible * h.p))
        out[(h.index, h.equivalence)] = (None if stopped else alpha / possible, running)
        stopped = stopped or not h.p <= alpha / possible
    return out


def verdicts(comparisons: Sequence[Comparison], alpha: float = ALPHA, plan: bool = True) -> list[Verdict]:
    """Apply RULE to a study's comparisons at family level `alpha` (an adaptive study's look
    alpha). Gates and group intervals are read at 1 - alpha.

    The family is every hypothesis of the study: each comparison's "no difference" and, for one
    with a `margin:`, its "outside ±margin", in one step-down (`step_down`: Holm's, with Shaffer's
    count of the hypotheses that can be true at once), so the family-wise error of differences
    and equivalences together is at most alpha. A comparison that ends before a test (not
    reached, ceiling, identical, too few seeds) counts with p = 1. `plan`: an inconclusive verdict
    states what its seeds detect and what it would need (`plan_text`)."""
    out: list[Verdict] = []
    tested: dict[int, Interval] = {}  # comparison -> its difference, for those that reach a test
    for c in comparisons:
        gates = tuple(g.at(1 - alpha) for g in c.gates)
        if c.shares is not None:
            a, b = (s.interval for s in c.shares)
            diff = share_difference(*c.shares)
        else:
            a, b = (mean_ci(v, level=1 - alpha, bounds=c.bounds) for v in (c.better_values, c.than_values))
            diff = difference(c.better_values, c.than_values, bounds=c.bounds)
        neither = ("; ".join(gate_texts(gates, g) for g in (c.better, c.than))
                   if gates and all(group_state(gates, g) is GateState.NOT_LEARNED for g in (c.better, c.than))
                   else "")
        verdict = Verdict(c.metric, c.better, c.than, INCONCLUSIVE, "", a, b, diff, gates=gates, neither=neither,
                          decided_at=c.data_complete)
        empty = [name for name, iv in ((c.better, a), (c.than, b)) if iv.n == 0]
        few = [name for name, iv in ((c.better, a), (c.than, b)) if iv.n == 1]
        if c.unreached:
            verdict = replace(verdict, outcome=NOT_REACHED, reason="; ".join(c.unreached))
        elif empty:
            verdict = replace(verdict, reason=f"no finished run of {empty[0]} reports {c.metric}")
        elif c.shares is None and all(perfect_on_every_seed(v, c.higher, c.bounds)
                                      for v in (c.better_values, c.than_values)):
            verdict = replace(verdict, outcome=CEILING, reason="both groups scored the metric's best value on every seed")
        elif diff.constant and diff.mean == 0:
            verdict = replace(verdict, outcome=IDENTICAL, reason=f"both groups gave the same {c.metric} on every seed")
        elif few and c.shares is None:
            verdict = replace(verdict, reason=f"{few[0]} has 1 finished seed; an interval needs 2")
        elif diff.constant:
            verdict = replace(verdict, reason="every seed gave the same difference: no spread, no interval")
        else:
            tested[len(out)] = diff
        out.append(verdict)
    margins = [i for i, c in enumerate(comparisons) if c.margin and c.shares is None]
    def p(i: int, margin: float | None = None) -> float:  # 1.0 for one that ended before its test
        value = math.nan if i not in tested else tested[i].p if margin is None else tested[i].equivalence_p(margin)
        return value if math.isfinite(value) else 1.0

    hypotheses = ([Hypothesis(i, False, p(i)) for i in range(len(comparisons))]
                  + [Hypothesis(i, True, p(i, comparisons[i].margin)) for i in margins])
    levels = step_down(hypotheses, alpha)
    for i in tested:
        (level, p_holm), (equivalence_level, p_equivalence) = levels[(i, False)], levels.get((i, True), (None, math.nan))
        out[i] = decide(comparisons[i], out[i], level, equivalence_level, p_holm, p_equivalence,
                        alpha / len(comparisons), plan)
    return out


def decide(c: Comparison, v: Verdict, level: float | None, equivalence_level: float | None, p_holm: float,
           p_equivalence_holm: float, least: float, plan: bool) -> Verdict:
    """A tested comparison's verdict from its step-down levels (None: the step-down stopped
    before it, whose interval is then shown at `least`, the first hypothesis' level). A comparison
    whose two hypotheses are both rejected (a decided difference within the margin) reads
    EQUIVALENT: the margin is the smallest difference of interest; its reason says the
    difference was decided too."""
    shown = level if level is not None else least
    diff = (share_difference(*c.shares) if c.shares is not None
            else difference(c.better_values, c.than_values, level=1 - shown, bounds=c.bounds))
    decided = level is not None and diff.p <= level
    if equivalence_level is not None and diff.equivalence_p(c.margin) <= equivalence_level:
        tost = difference(c.better_values, c.than_values, level=1 - 2 * equivalence_level, bounds=c.bounds)
        also = f"; the difference is decided too, {'above' if diff.mean > 0 else 'below'} 0" if decided else ""
        return qualified(replace(v, outcome=EQUIVALENT, diff=tost, p_holm=p_equivalence_holm,
                                 reason=f"the {level_text(tost.level)} interval lies within ±{fmt(c.margin)}{also}"), c)
    v = replace(v, diff=diff, p_holm=p_holm)
    if not decided:
        separates = not math.isnan(diff.lo) and (diff.lo > 0 or diff.hi < 0)
        why = ("Holm: an earlier comparison did not separate" if level is None and separates
               else f"Fisher's exact p = {fmt(diff.p)}" if c.shares is not None else CONTAINS_ZERO)
        return replace(v, reason=why + (plan_text(c, diff) if plan and why == CONTAINS_ZERO else ""))
    above = diff.mean > 0
    return qualified(replace(v, outcome=HOLDS if above == c.higher else DOES_NOT_HOLD,
                             reason=f"the difference lies entirely {'above' if above else 'below'} 0"), c)


def verdict(better_values, than_values, metric: str, better: str, than: str, *, higher: bool,
            bounds: tuple[float, float] = UNBOUNDED, margin: float | None = None) -> Verdict:
    """One comparison on its own (m = 1, no gate), `higher`: the metric's direction (its
    declaration, workbench.results.Metric). Series over seeds (index = seed) pair when they hold
    the same seeds; plain lists are compared with Welch's interval."""
    return verdicts([Comparison(metric, better, than, better_values, than_values, higher=higher, bounds=bounds,
                                margin=margin)])[0]
