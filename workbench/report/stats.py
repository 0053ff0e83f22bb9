"""Statistics of a report: means with 95% intervals over seeds, differences between groups,
the learned-at-all gate, and verdicts for a study's `expect:` entries. Every number comes
from scipy.stats (t intervals and tests); `RULE` states the verdict rule in the words the
reports print under Verdicts, and `verdicts()` is that rule, step by step.

Intervals. A group's mean has the two-sided t interval over its seeds (seeds are few, 2-5,
so the normal approximation would be too narrow). A difference between two groups is
*paired* over seeds when both finished the same seeds (the same seed gives the same data
stream and initialisation draw, so seed-to-seed variation cancels), otherwise Welch's
(unequal variances). Bounded metrics (accuracy in [0, 1], BLEU in [0, 100], ...) get the t
interval intersected with their range: the true mean lies inside the range, so cutting
away the impossible part leaves the coverage as it was, and no interval of an accuracy
reads 1.19. A bootstrap was the alternative: with 3 seeds its percentile interval is far
too narrow, and a logit transform is undefined at 0 and 1, where exact match often sits.
A group whose seeds all scored the same has no spread: it is flagged (`Interval.constant`)
instead of being shown as a zero-width, precise-looking interval.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import stats as st
from scipy.optimize import brentq

from workbench.report.document import fmt

LEVEL = 0.95
ALPHA = 1 - LEVEL
# A group learned when its score at the training length is better than chance by at least
# this share of the distance from chance to the perfect score (1 for accuracy, 0 for loss).
MARGIN = 0.1
NOT_TESTED = "not tested"
NOT_REACHED = "not reached"  # a *_to_target comparison where a finished run never reached the target

RULE = (
    f"Rule: a verdict compares two groups (one sweep point each, its finished seeds). First, did each learn? At "
    f"the training length, and at the compared length when that differs, a group's mean score must beat the "
    f"strongest of the task's baselines (predictors that cannot solve it: one that ignores the input, one that "
    f"reads only the answer's own prefix, one that knows the input's symbols but not their order, as the task "
    f"declares) by at least {MARGIN:.0%} of the distance from that baseline to a perfect score. Only the expected-"
    f"better group learned: 'holds (only A learned)'; only the other: 'does not hold (only B learned)'; neither: "
    f"'{NOT_TESTED}', naming both; a tuned group none of whose candidates learned is '{NOT_TESTED}'. Cost measures "
    f"need no gate. Both groups at the metric's best value on every seed: 'ceiling: the task does not separate "
    f"them'. Otherwise the difference of the means gets a t interval, paired over seeds when both groups finished "
    f"the same seeds, Welch's otherwise (failure shares: Fisher's exact test). Holm's correction covers every "
    f"`expect:` comparison of the study, fixed before the run (one that ends before a test counts with p = 1): "
    f"taken in order of p-value, the i-th of m uses a {LEVEL:.0%} interval widened to level 1 - {ALPHA:g}/(m - i + "
    f"1), and is decided only while every comparison before it was. With a `margin:`, 'equivalent' when the "
    f"1 - 2*{ALPHA:g}/m interval lies inside ±margin (two one-sided tests). 'holds' when the interval lies "
    f"entirely on the expected side of 0, 'does not hold' when entirely on the other side, 'inconclusive' when it "
    f"contains 0 (with the smallest difference the seeds detect at 80% power, and the seeds the observed one "
    f"would need), when a group has fewer than 2 finished seeds, or when every seed gave the same difference. "
    f"Adaptive seeds: each look tests at the alpha an O'Brien-Fleming-type spending function (Lan & DeMets "
    f"1983) adds at that look, and a comparison keeps the first look that decides it. A comparison of what "
    f"runs spent to reach a stated score (flops_to_target, lower is better) reads '{NOT_REACHED}' when a "
    f"finished run of either group never reached it."
)

# Metric base names (before '@length') where smaller is better; everything else (accuracy,
# bleu, exact match, ...) is higher-is-better.
LOWER_IS_BETTER = ("loss", "perplexity", "ppl", "nll", "error", "cer", "wer", "time", "latency", "memory", "bytes")
UNBOUNDED = (-math.inf, math.inf)


def higher_is_better(metric: str) -> bool:
    """accuracy@128 -> True, val_loss -> False: by the metric's base name."""
    base = metric.split("@")[0].lower()
    return not any(word in base for word in LOWER_IS_BETTER)


@dataclass(frozen=True)
class Interval:
    """A mean (or a difference of means) with its t interval; lo/hi are NaN without one."""

    mean: float
    lo: float
    hi: float
    n: int  # values (seeds) behind it; for a difference, the smaller group
    constant: bool = False  # n >= 2 values, all equal: no spread, so no interval
    method: str = ""  # for a difference: "paired" or "Welch"
    p: float = math.nan  # for a difference: two-sided p-value of "no difference"
    level: float = LEVEL


def finite(values: Sequence[float] | np.ndarray | pd.Series) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return x[np.isfinite(x)]


def clipped(mean: float, lo: float, hi: float, bounds: tuple[float, float]) -> tuple[float, float]:
    return max(lo, bounds[0]), min(hi, bounds[1])


def no_spread(x: np.ndarray) -> bool:
    """Two or more values that are all equal (to rounding: t would be numerical noise)."""
    return len(x) >= 2 and float(np.ptp(x)) <= 1e-12 * max(1.0, float(np.abs(x).max()))


def mean_ci(values: Sequence[float] | np.ndarray | pd.Series, level: float = LEVEL,
            bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """Mean and two-sided t interval of finite values (NaNs, e.g. from failed runs, are
    skipped), kept inside `bounds`. One value, or values without spread, have no interval."""
    x = finite(values)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if n < 2 or no_spread(x):
        return Interval(mean, math.nan, math.nan, n, constant=no_spread(x), level=level)
    ci = st.ttest_1samp(x, 0.0).confidence_interval(level)
    return Interval(mean, *clipped(mean, float(ci.low), float(ci.high), bounds), n, level=level)


def difference_bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    """Range of a difference of two values in `bounds` (e.g. [-1, 1] for accuracies)."""
    return bounds[0] - bounds[1], bounds[1] - bounds[0]


def welch_diff(a, b, level: float = LEVEL, bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """mean(a) - mean(b) with Welch's t interval and test (scipy.stats.ttest_ind)."""
    x, y = finite(a), finite(b)
    if len(x) == 0 or len(y) == 0:
        return Interval(math.nan, math.nan, math.nan, 0, method="Welch")
    diff = float(x.mean() - y.mean())
    n = min(len(x), len(y))
    if len(x) < 2 or len(y) < 2:
        return Interval(diff, math.nan, math.nan, n, method="Welch")
    if no_spread(x) and no_spread(y):  # zero standard error: no interval, no test
        return Interval(diff, math.nan, math.nan, n, constant=True, method="Welch")
    with warnings.catch_warnings():  # a group without spread: scipy warns about its zero variance,
        warnings.simplefilter("ignore", RuntimeWarning)  # which is exact, and so is the interval
        test = st.ttest_ind(x, y, equal_var=False)
        ci = test.confidence_interval(level)
    return Interval(diff, *clipped(diff, float(ci.low), float(ci.high), difference_bounds(bounds)), n,
                    method="Welch", p=float(test.pvalue), level=level)


def paired_diff(a: pd.Series, b: pd.Series, level: float = LEVEL, bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """mean(a - b) over seeds (the Series' index) with the paired t interval and test
    (scipy.stats.ttest_rel); both must hold the same seeds."""
    d = finite(a.sort_index().to_numpy() - b.sort_index().to_numpy())
    diff = float(d.mean())
    if len(d) < 2:
        return Interval(diff, math.nan, math.nan, len(d), method="paired")
    if no_spread(d):
        return Interval(diff, math.nan, math.nan, len(d), constant=True, method="paired")
    test = st.ttest_rel(a.sort_index().to_numpy(), b.sort_index().to_numpy())
    ci = test.confidence_interval(level)
    return Interval(diff, *clipped(diff, float(ci.low), float(ci.high), difference_bounds(bounds)), len(d),
                    method="paired", p=float(test.pvalue), level=level)


def same_seeds(a: pd.Series, b: pd.Series) -> bool:
    return len(a) >= 2 and set(a.index) == set(b.index) and len(set(a.index)) == len(a)


def difference(a, b, level: float = LEVEL, bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """a - b: paired over seeds when both are Series over the same seeds (index = seed),
    Welch otherwise. NaN values (failed runs) are dropped first."""
    if isinstance(a, pd.Series) and isinstance(b, pd.Series):
        a, b = a.dropna(), b.dropna()
        if same_seeds(a, b):
            return paired_diff(a, b, level, bounds)
    return welch_diff(a, b, level, bounds)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (step-down; Holm 1979): the i-th smallest of m is multiplied by
    m - i + 1 (i from 1), then made non-decreasing in that order and capped at 1."""
    order = np.argsort(pvalues, kind="stable")
    m = len(pvalues)
    adjusted, running = [0.0] * m, 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * float(pvalues[j])))
        adjusted[j] = running
    return adjusted


# ---- the learned-at-all gate ----------------------------------------------------------------


@dataclass(frozen=True)
class Learned:
    """One group's score at one length against the task's baselines (predictors that cannot
    solve the task); the gate measures it against the strongest of them."""

    group: str
    metric: str  # e.g. accuracy@12
    score: float  # mean over finished seeds (NaN: none)
    chance: float  # the strongest baseline's score (NaN: unknown)
    needed: float  # the score the margin asks for
    higher: bool
    perfect: float = math.nan  # the metric's best possible value (1 for accuracy, 0 for loss)
    baseline: str = "chance"  # the strongest baseline's name
    baselines: tuple[tuple[str, float], ...] = ()  # every baseline's score, as the task declares them
    untested: str = ""  # why the group cannot be tested at all (e.g. no tuning candidate learned)

    @property
    def learned(self) -> bool:
        if self.untested or math.isnan(self.score) or math.isnan(self.needed):
            return False
        return self.score >= self.needed if self.higher else self.score <= self.needed

    @property
    def text(self) -> str:
        if self.untested:
            return f"{self.group}: {self.untested}"
        if math.isnan(self.chance):
            return f"{self.group}: no chance level of {self.metric}"
        if math.isnan(self.score):
            return f"{self.group}: no finished run reports {self.metric}"
        sign = "≥" if self.higher else "≤"
        return (f"{self.group}: {self.metric} {fmt(self.score)} vs {self.baseline} {fmt(self.chance)} "
                f"(learned: {sign} {fmt(self.needed)})")


def learned_gate(group: str, metric: str, score: float, chance: float | dict[str, float], perfect: float,
                 higher: bool, untested: str = "") -> Learned:
    """The margin rule: learned when `score` closes at least MARGIN of the gap from the
    strongest baseline to `perfect` (the metric's best possible value). `chance` is one
    score (the input-ignoring baseline) or every baseline's score by name."""
    baselines = chance if isinstance(chance, dict) else {"chance": chance}
    known = {name: v for name, v in baselines.items() if math.isfinite(v)}
    if known:
        name = (max if higher else min)(known, key=known.get)
        strongest = known[name]
    else:
        name, strongest = next(iter(baselines), "chance"), math.nan
    needed = strongest + MARGIN * (perfect - strongest) if math.isfinite(perfect) else math.nan
    return Learned(group, metric, score, strongest, needed, higher, perfect, name, tuple(baselines.items()), untested)


def score_text(g: Learned) -> str:
    if math.isnan(g.chance):
        return "no chance level"
    return "no finished run" if math.isnan(g.score) else fmt(g.score)


def learned_criterion(name: str, gates: Sequence[Learned]) -> str:
    """One line for a report's header: the learned rule for metric `name` (the threshold each
    group must reach at its training length) and which groups met it, e.g.
    'Learned (accuracy@12 ≥ 0.499, 10% of the way from order-blind 0.443 to 1): all 4 groups met it'."""
    known = [g for g in gates if not (math.isnan(g.chance) or math.isnan(g.needed))]
    if not known:
        return (f"Learned: no chance level of {name} is known for this task, so no group can be shown to have "
                "learned it (verdicts on it read 'not tested')")
    thresholds: dict[tuple, list[str]] = {}
    for g in known:
        thresholds.setdefault((g.metric, g.baseline, g.chance, g.needed, g.higher, g.perfect), []).append(g.group)

    def threshold(metric: str, needed: float, higher: bool) -> str:
        return f"{metric} {'≥' if higher else '≤'} {fmt(needed)}"

    if len(thresholds) == 1:
        (metric, baseline, chance, needed, higher, perfect), _ = next(iter(thresholds.items()))
        rule = (f"{threshold(metric, needed, higher)}, {MARGIN:.0%} of the way from {baseline} {fmt(chance)} "
                f"to {fmt(perfect)}")
    else:  # the baseline (or the training length) differs between groups, e.g. by family
        rule = f"{MARGIN:.0%} of the way from the strongest baseline to a perfect score: " + "; ".join(
            f"{threshold(metric, needed, higher)} for {' and '.join(groups)} ({baseline} {fmt(chance)})"
            for (metric, baseline, chance, needed, higher, _), groups in thresholds.items())
    missed = [g for g in gates if not g.learned]
    n = len(gates)
    if not missed:
        outcome = {1: "the group met it", 2: "both groups met it"}.get(n, f"all {n} groups met it")
    else:
        why = "; ".join(f"{g.group} ({score_text(g)})" for g in missed)  # labels may hold commas
        outcome = (f"no group met it ({why})" if len(missed) == n
                   else f"{n - len(missed)} of {n} groups met it; not met: {why}")
    return f"Learned ({rule}): {outcome}"


# ---- failures as outcomes ---------------------------------------------------------------------



@dataclass(frozen=True)
class Share:
    """k of n seeds, with the exact (Clopper-Pearson) 95% interval of the share."""

    k: int
    n: int

    @property
    def interval(self) -> Interval:
        if self.n == 0:
            return Interval(math.nan, math.nan, math.nan, 0)
        ci = st.binomtest(self.k, self.n).proportion_ci(LEVEL, method="exact")
        return Interval(self.k / self.n, float(ci.low), float(ci.high), self.n)

    @property
    def text(self) -> str:
        iv = self.interval
        return "–" if self.n == 0 else f"{self.k}/{self.n} = {fmt(iv.mean)} [{fmt(iv.lo)}, {fmt(iv.hi)}]"


def share_difference(a: Share, b: Share) -> Interval:
    """a - b of two shares with the two-sided p of Fisher's exact test (no interval: the
    groups' own Clopper-Pearson intervals are shown beside it)."""
    if a.n == 0 or b.n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, method="Fisher's exact")
    p = st.fisher_exact([[a.k, a.n - a.k], [b.k, b.n - b.k]]).pvalue
    return Interval(a.k / a.n - b.k / b.n, math.nan, math.nan, min(a.n, b.n), method="Fisher's exact", p=float(p))


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

HOLDS, DOES_NOT_HOLD, INCONCLUSIVE, EQUIVALENT, CEILING = "holds", "does not hold", "inconclusive", "equivalent", "ceiling"
DECIDED = (HOLDS, DOES_NOT_HOLD, EQUIVALENT)  # what a test (rather than a gate) can conclude
CEILING_LABEL = "ceiling: the task does not separate them"


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
    gates: tuple[Learned, ...] = ()  # both groups at the training length (and the compared one); () = no gate
    note: str = ""
    margin: float | None = None  # the smallest difference of interest: within ±margin is "equivalent"
    counts: bool = False  # values are 0/1 per seed (1: the seed failed): compare the shares of failed seeds
    seeds_run: int = 0  # seeds both groups ran (any outcome): the looks an adaptive study has data for
    unreached: tuple[str, ...] = ()  # *_to_target: per group with finished runs short of the target, in words

    @property
    def shares(self) -> tuple[Share, Share] | None:
        if not self.counts:
            return None
        return tuple(Share(int(finite(v).sum()), len(finite(v))) for v in (self.better_values, self.than_values))

    def learned(self, group: str) -> bool:
        return all(g.learned for g in self.gates if g.group == group)

    def truncated(self, seeds: int) -> Comparison:
        """The comparison on the first `seeds` seeds (by id) of each group: an earlier look."""
        def first(values):
            if not isinstance(values, pd.Series):
                return values
            return values[values.index.isin(sorted(set(values.index))[:seeds])] if len(values) else values
        return replace(self, better_values=first(self.better_values), than_values=first(self.than_values))


@dataclass(frozen=True)
class Verdict:
    """The outcome of one `expect:` entry."""

    metric: str
    better: str
    than: str
    outcome: str  # holds | does not hold | equivalent | ceiling | inconclusive | not tested | not reached
    reason: str  # why, in words: shown in the label's parentheses where the outcome needs one
    better_ci: Interval
    than_ci: Interval
    diff: Interval  # better - than, at the (Holm-widened) level it was decided at
    p_holm: float = math.nan
    gates: tuple[Learned, ...] = ()
    only: str = ""  # the one group that learned, when the other did not

    @property
    def label(self) -> str:
        if self.outcome == CEILING:
            return CEILING_LABEL
        if self.only:
            return f"{self.outcome} (only {self.only} learned)"
        return f"{self.outcome} ({self.reason})" if self.outcome in (INCONCLUSIVE, NOT_TESTED, NOT_REACHED) else self.outcome

    @property
    def statement(self) -> str:
        return f"{self.better} is better than {self.than} on {self.metric}"


def perfect_on_every_seed(values, higher: bool, bounds: tuple[float, float]) -> bool:
    x = finite(values)
    perfect = bounds[1] if higher else bounds[0]
    return len(x) > 0 and math.isfinite(perfect) and bool(np.all(x == perfect))


def gate_verdict(c: Comparison, make) -> Verdict | None:
    """The outcome the learned gate decides alone, or None when both groups learned."""
    untested = [g for g in c.gates if g.untested]
    if untested:
        return make(NOT_TESTED, "; ".join(g.text for g in untested))
    a, b = c.learned(c.better), c.learned(c.than)
    if a and b:
        return None
    if a:
        return replace(make(HOLDS, "did not learn: " + gate_texts(c, c.than)), only=c.better)
    if b:
        return replace(make(DOES_NOT_HOLD, "did not learn: " + gate_texts(c, c.better)), only=c.than)
    return make(NOT_TESTED, "neither group learned: " + gate_texts(c, c.better) + "; " + gate_texts(c, c.than))


def gate_texts(c: Comparison, group: str) -> str:
    return "; ".join(g.text for g in c.gates if g.group == group and not g.learned)


CONTAINS_ZERO = "the interval of the difference contains 0"


def verdicts(comparisons: Sequence[Comparison], alpha: float = ALPHA, plan: bool = True) -> list[Verdict]:
    """Apply RULE to a study's comparisons. Holm's family is every comparison: one that ends
    before a test (not reached, not tested, one group only, ceiling) counts in m with p = 1. `plan`: an
    inconclusive verdict states what its seeds detect and what it would need (`plan_text`)."""
    m = len(comparisons)
    out: list[Verdict | None] = []
    tested: dict[int, tuple[Comparison, Interval, Interval]] = {}
    pvalues = [1.0] * m
    for i, c in enumerate(comparisons):
        if c.shares is not None:
            a, b = (s.interval for s in c.shares)
            diff = share_difference(*c.shares)
        else:
            a, b = (mean_ci(v, bounds=c.bounds) for v in (c.better_values, c.than_values))
            diff = difference(c.better_values, c.than_values, bounds=c.bounds)

        def make(outcome: str, reason: str, c=c, a=a, b=b, diff=diff) -> Verdict:
            return Verdict(c.metric, c.better, c.than, outcome, reason, a, b, diff, gates=c.gates)

        empty = [name for name, iv in ((c.better, a), (c.than, b)) if iv.n == 0]
        few = [name for name, iv in ((c.better, a), (c.than, b)) if iv.n == 1]
        decided_by_gate = gate_verdict(c, make)
        if c.unreached:
            out.append(make(NOT_REACHED, "; ".join(c.unreached)))
        elif decided_by_gate is not None:
            out.append(decided_by_gate)
        elif empty:
            out.append(make(INCONCLUSIVE, f"no finished run of {empty[0]} reports {c.metric}"))
        elif c.shares is None and all(perfect_on_every_seed(v, c.higher, c.bounds)
                                      for v in (c.better_values, c.than_values)):
            out.append(make(CEILING, "both groups scored the metric's best value on every seed"))
        elif few and c.shares is None:
            out.append(make(INCONCLUSIVE, f"{few[0]} has 1 finished seed; an interval needs 2"))
        elif diff.constant:
            out.append(make(INCONCLUSIVE, "every seed gave the same difference: no spread, no interval"))
        else:
            tested[i] = (c, a, b)
            pvalues[i] = diff.p
            out.append(None)
    adjusted = holm(pvalues)
    order = np.argsort(pvalues, kind="stable")
    for rank, k in enumerate(order):
        if k not in tested:
            continue
        c, a, b = tested[k]
        level = 1 - alpha / (m - rank)
        if c.shares is not None:
            diff = share_difference(*c.shares)
        else:
            diff = difference(c.better_values, c.than_values, level=level, bounds=c.bounds)  # p: before Holm

        def make(outcome: str, reason: str, c=c, a=a, b=b, diff=diff, p=adjusted[k]) -> Verdict:
            return Verdict(c.metric, c.better, c.than, outcome, reason, a, b, diff, p_holm=p, gates=c.gates)

        if c.margin and c.shares is None:
            # Two one-sided tests at Bonferroni's alpha/m each (Schuirmann 1987): equivalent when
            # the 1 - 2 alpha/m interval lies inside ±margin.
            tost = difference(c.better_values, c.than_values, level=1 - 2 * alpha / m, bounds=c.bounds)
            if -c.margin < tost.lo and tost.hi < c.margin:
                out[k] = replace(make(EQUIVALENT, f"the {tost.level:.1%} interval lies within ±{fmt(c.margin)}"),
                                 diff=tost)
                continue
        if adjusted[k] > alpha:
            stopped = not math.isnan(diff.lo) and (diff.lo > 0 or diff.hi < 0)  # an earlier one did not separate
            why = ("Holm: an earlier comparison did not separate" if stopped
                   else f"Fisher's exact p = {fmt(diff.p)}" if c.shares is not None else CONTAINS_ZERO)
            out[k] = make(INCONCLUSIVE, why + (plan_text(c, diff) if plan and why == CONTAINS_ZERO else ""))
            continue
        above = diff.mean > 0
        where = f"the difference lies entirely {'above' if above else 'below'} 0"
        out[k] = make(HOLDS if above == c.higher else DOES_NOT_HOLD, where)
    return [v for v in out if v is not None]


# ---- adaptive seeds: repeated looks with alpha spending ----------------------------------------


def seed_looks(first: int, most: int) -> list[int]:
    """Seeds per group at each look of an adaptive study: `first`, then twice as many each
    round, ending at `most`; e.g. 3, 6, 12, 20. Few looks keep the alpha each one gets large."""
    looks = [first]
    while looks[-1] < most:
        looks.append(min(most, 2 * looks[-1]))
    return looks


def spent(fraction: float, alpha: float = ALPHA) -> float:
    """Alpha spent by information fraction t: the O'Brien-Fleming-type spending function of
    Lan & DeMets (1983), 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))."""
    return 0.0 if fraction <= 0 else float(2 - 2 * st.norm.cdf(st.norm.ppf(1 - alpha / 2) / math.sqrt(fraction)))


def look_alphas(looks: Sequence[int], alpha: float = ALPHA) -> list[float]:
    """The alpha each look tests at: what the spending function adds since the previous look.
    They sum to alpha, so by the union bound the chance of any false decision over all looks
    stays at most alpha, whatever the correlation between looks."""
    fractions = [n / looks[-1] for n in looks]
    return [spent(t, alpha) - spent(prev, alpha) for prev, t in zip([0.0, *fractions], fractions)]


def sequential_verdicts(comparisons: Sequence[Comparison], looks: Sequence[int]) -> list[Verdict]:
    """Verdicts of an adaptive study: at each look (its first n seeds, for the comparisons
    whose groups ran them) RULE runs at that look's spent alpha; a comparison keeps the first
    look that decides it, otherwise its last look's verdict."""
    alphas = look_alphas(looks)
    final: list[Verdict | None] = [None] * len(comparisons)
    last: list[Comparison] = list(comparisons)  # each comparison as its deciding (or last) look saw it
    for j, (n, alpha) in enumerate(zip(looks, alphas)):
        available = [j == 0 or c.seeds_run >= n for c in comparisons]
        at_look = [c.truncated(n) if ok else replace(c, better_values=pd.Series(dtype=float),
                                                      than_values=pd.Series(dtype=float))
                   for c, ok in zip(comparisons, available)]
        for i, v in enumerate(verdicts(at_look, alpha, plan=False)):
            if not available[i] or (final[i] is not None and final[i].outcome in DECIDED):
                continue
            if v.outcome in DECIDED:
                v = replace(v, reason=f"{v.reason}; look {j + 1} of {len(looks)} ({n} seeds, alpha {fmt(alpha)})")
            final[i], last[i] = v, at_look[i]
    return [replace(v, reason=v.reason + plan_text(c, v.diff)) if v.reason == CONTAINS_ZERO else v
            for v, c in zip(final, last) if v is not None]


def verdict(better_values, than_values, metric: str, better: str, than: str, higher: bool | None = None,
            bounds: tuple[float, float] = UNBOUNDED, margin: float | None = None) -> Verdict:
    """One comparison on its own (m = 1, no gate). Series over seeds (index = seed) pair when
    they hold the same seeds; plain lists are compared with Welch's interval."""
    higher = higher_is_better(metric) if higher is None else higher
    return verdicts([Comparison(metric, better, than, better_values, than_values, higher=higher, bounds=bounds,
                                margin=margin)])[0]
