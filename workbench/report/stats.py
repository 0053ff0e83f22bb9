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
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as st

from workbench.report.document import fmt

LEVEL = 0.95
ALPHA = 1 - LEVEL
# A group learned when its score at the training length is better than chance by at least
# this share of the distance from chance to the perfect score (1 for accuracy, 0 for loss).
MARGIN = 0.1
NOT_TESTED = "not tested"
NOT_REACHED = "not reached"  # a *_to_target comparison where a finished run never reached the target

RULE = (
    f"Rule: a verdict compares two groups (one sweep point each, its finished seeds). First, both must have "
    f"learned: at the training length each group's mean score must beat chance (the score of a predictor "
    f"that ignores the input, derived from the task) by at least {MARGIN:.0%} of the distance from chance to a "
    f"perfect score; otherwise the verdict is '{NOT_TESTED}' and names the group. Cost measures (time, "
    f"memory, throughput) need no gate. Then the difference of the means gets a t interval, paired over seeds "
    f"when both groups finished the same seeds, Welch's otherwise. Holm's correction covers the study's tested "
    f"comparisons: taken in order of p-value, the i-th of m uses a {LEVEL:.0%} interval widened to level "
    f"1 - {ALPHA:g}/(m - i + 1), and is decided only while every comparison before it was. 'holds' when "
    f"that interval lies entirely on the expected side of 0, 'does not hold' when entirely on the other "
    f"side, 'inconclusive' when it contains 0, when a group has fewer than 2 finished seeds, or when every "
    f"seed gave the same difference (no spread, no interval). A comparison of what runs spent to reach a stated "
    f"score (flops_to_target, lower is better) reads '{NOT_REACHED}' when a finished run of either group never "
    f"reached it."
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
    """One group's score at the training length against chance."""

    group: str
    metric: str  # e.g. accuracy@12
    score: float  # mean over finished seeds (NaN: none)
    chance: float  # NaN: unknown
    needed: float  # the score the margin asks for
    higher: bool
    perfect: float = math.nan  # the metric's best possible value (1 for accuracy, 0 for loss)

    @property
    def learned(self) -> bool:
        if math.isnan(self.score) or math.isnan(self.needed):
            return False
        return self.score >= self.needed if self.higher else self.score <= self.needed

    @property
    def text(self) -> str:
        if math.isnan(self.chance):
            return f"{self.group}: no chance level of {self.metric}"
        if math.isnan(self.score):
            return f"{self.group}: no finished run reports {self.metric}"
        sign = "≥" if self.higher else "≤"
        return (f"{self.group}: {self.metric} {fmt(self.score)} vs chance {fmt(self.chance)} "
                f"(learned: {sign} {fmt(self.needed)})")


def learned_gate(group: str, metric: str, score: float, chance: float, perfect: float, higher: bool) -> Learned:
    """The margin rule: learned when `score` closes at least MARGIN of the gap from `chance`
    to `perfect` (the metric's best possible value)."""
    needed = chance + MARGIN * (perfect - chance) if math.isfinite(perfect) else math.nan
    return Learned(group, metric, score, chance, needed, higher, perfect)


def score_text(g: Learned) -> str:
    if math.isnan(g.chance):
        return "no chance level"
    return "no finished run" if math.isnan(g.score) else fmt(g.score)


def learned_criterion(name: str, gates: Sequence[Learned]) -> str:
    """One line for a report's header: the learned rule for metric `name` (the threshold each
    group must reach at its training length) and which groups met it, e.g.
    'Learned (accuracy@12 ≥ 0.252, 10% of the way from chance 0.169 to 1): all 4 groups met it'."""
    known = [g for g in gates if not (math.isnan(g.chance) or math.isnan(g.needed))]
    if not known:
        return (f"Learned: no chance level of {name} is known for this task, so no group can be shown to have "
                "learned it (verdicts on it read 'not tested')")
    thresholds: dict[tuple, list[str]] = {}
    for g in known:
        thresholds.setdefault((g.metric, g.chance, g.needed, g.higher, g.perfect), []).append(g.group)

    def threshold(metric: str, needed: float, higher: bool) -> str:
        return f"{metric} {'≥' if higher else '≤'} {fmt(needed)}"

    if len(thresholds) == 1:
        (metric, chance, needed, higher, perfect), _ = next(iter(thresholds.items()))
        rule = f"{threshold(metric, needed, higher)}, {MARGIN:.0%} of the way from chance {fmt(chance)} to {fmt(perfect)}"
    else:  # the chance level (or the training length) differs between groups, e.g. by family
        rule = f"{MARGIN:.0%} of the way from chance to a perfect score: " + "; ".join(
            f"{threshold(metric, needed, higher)} for {' and '.join(groups)} (chance {fmt(chance)})"
            for (metric, chance, needed, higher, _), groups in thresholds.items())
    missed = [g for g in gates if not g.learned]
    n = len(gates)
    if not missed:
        outcome = {1: "the group met it", 2: "both groups met it"}.get(n, f"all {n} groups met it")
    else:
        why = "; ".join(f"{g.group} ({score_text(g)})" for g in missed)  # labels may hold commas
        outcome = (f"no group met it ({why})" if len(missed) == n
                   else f"{n - len(missed)} of {n} groups met it; not met: {why}")
    return f"Learned ({rule}): {outcome}"


# ---- verdicts ---------------------------------------------------------------------------------


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
    gates: tuple[Learned, ...] = ()  # the two groups at the training length; () = no gate (cost)
    note: str = ""
    unreached: tuple[str, ...] = ()  # *_to_target: per group with finished runs short of the target, in words


@dataclass(frozen=True)
class Verdict:
    """The outcome of one `expect:` entry."""

    metric: str
    better: str
    than: str
    outcome: str  # "holds" | "does not hold" | "inconclusive" | "not tested" | "not reached"
    reason: str  # why, in words; for inconclusive and not tested it goes in the parentheses
    better_ci: Interval
    than_ci: Interval
    diff: Interval  # better - than, at the (Holm-widened) level it was decided at
    p_holm: float = math.nan
    gates: tuple[Learned, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.outcome} ({self.reason})" if self.outcome in ("inconclusive", NOT_TESTED, NOT_REACHED) else self.outcome

    @property
    def statement(self) -> str:
        return f"{self.better} is better than {self.than} on {self.metric}"


def verdicts(comparisons: Sequence[Comparison]) -> list[Verdict]:
    """Apply RULE to a study's comparisons (Holm runs over those that reach a test)."""
    out: list[Verdict | None] = []
    tested: list[tuple[int, Comparison, Interval, Interval]] = []
    for c in comparisons:
        a, b = (mean_ci(v, bounds=c.bounds) for v in (c.better_values, c.than_values))
        diff = difference(c.better_values, c.than_values, bounds=c.bounds)

        def make(outcome: str, reason: str, c=c, a=a, b=b, diff=diff) -> Verdict:
            return Verdict(c.metric, c.better, c.than, outcome, reason, a, b, diff, gates=c.gates)

        missing = [g for g in c.gates if not g.learned]
        empty = [(name, iv) for name, iv in ((c.better, a), (c.than, b)) if iv.n == 0]
        few = [(name, iv) for name, iv in ((c.better, a), (c.than, b)) if iv.n == 1]
        if c.unreached:
            out.append(make(NOT_REACHED, "; ".join(c.unreached)))
        elif empty:
            out.append(make("inconclusive", f"no finished run of {empty[0][0]} reports {c.metric}"))
        elif missing:
            out.append(make(NOT_TESTED, "did not learn at the training length: " + "; ".join(g.text for g in missing)))
        elif few:
            out.append(make("inconclusive", f"{few[0][0]} has 1 finished seed; an interval needs 2"))
        elif diff.constant:
            out.append(make("inconclusive", "every seed gave the same difference: no spread, no interval"))
        else:
            tested.append((len(out), c, a, b))
            out.append(None)
    pvalues = [difference(c.better_values, c.than_values).p for _, c, _, _ in tested]
    adjusted, m = holm(pvalues), len(tested)
    order = np.argsort(pvalues, kind="stable")
    for rank, k in enumerate(order):
        slot, c, a, b = tested[k]
        level = 1 - ALPHA / (m - rank)
        diff = difference(c.better_values, c.than_values, level=level, bounds=c.bounds)  # p: before Holm

        def make(outcome: str, reason: str, c=c, a=a, b=b, diff=diff, p=adjusted[k]) -> Verdict:
            return Verdict(c.metric, c.better, c.than, outcome, reason, a, b, diff, p_holm=p, gates=c.gates)

        if adjusted[k] > ALPHA:
            stopped = diff.lo > 0 or diff.hi < 0  # its own interval separates, an earlier one did not
            out[slot] = make("inconclusive", "Holm: an earlier comparison did not separate" if stopped
                             else "the interval of the difference contains 0")
            continue
        above = diff.mean > 0
        where = f"the difference lies entirely {'above' if above else 'below'} 0"
        out[slot] = make("holds" if above == c.higher else "does not hold", where)
    return [v for v in out if v is not None]


def verdict(better_values, than_values, metric: str, better: str, than: str, higher: bool | None = None,
            bounds: tuple[float, float] = UNBOUNDED) -> Verdict:
    """One comparison on its own (m = 1, no gate). Series over seeds (index = seed) pair when
    they hold the same seeds; plain lists are compared with Welch's interval."""
    higher = higher_is_better(metric) if higher is None else higher
    return verdicts([Comparison(metric, better, than, better_values, than_values, higher=higher, bounds=bounds)])[0]
