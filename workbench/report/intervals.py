"""Means with 95% intervals over seeds, differences between groups, and shares of seeds (failures
as outcomes). The t intervals and tests are those of scipy.stats (ttest_1samp, ttest_rel,
ttest_ind with unequal variances), computed from scipy's t distribution directly
(tests/recipes/test_stats.py checks them against scipy.stats); exact binomial and Fisher tests
come from scipy.stats.

Intervals. A group's mean has the two-sided t interval over its seeds (seeds are few, 2-5,
so the normal approximation would be too narrow). A difference between two groups is
*paired* over seeds when both finished the same seeds (the same seed gives the same data
stream, and the same initial weights where the arms' parameters allow, docs/verdicts.md: the
seed-to-seed variation they share cancels), otherwise Welch's (unequal variances). Bounded
metrics (accuracy in [0, 1], BLEU in [0, 100], ...) get the t interval intersected with their
range: the true mean lies inside the range, so cutting
away the impossible part leaves the coverage as it was, and no interval of an accuracy
reads 1.19. A bootstrap was the alternative: with 3 seeds its percentile interval is far
too narrow, and a logit transform is undefined at 0 and 1, where exact match often sits.
A group whose seeds all scored the same has no spread: it is flagged (`Interval.constant`)
instead of being shown as a zero-width, precise-looking interval.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import special
from scipy import stats as st

from workbench.report.document import fmt

LEVEL = 0.95
ALPHA = 1 - LEVEL
UNBOUNDED = (-math.inf, math.inf)


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
    se: float = math.nan  # for a t interval: its standard error and degrees of freedom
    df: float = math.nan

    def equivalence_p(self, margin: float) -> float:
        """p-value of "the difference lies outside ±margin" by two one-sided t tests (Schuirmann
        1987): the larger of the two one-sided p's. At most a when the 1 - 2a interval lies
        inside ±margin. NaN without a t interval."""
        if not (self.se > 0 and math.isfinite(self.df)):
            return math.nan
        below = float(special.stdtr(self.df, -(self.mean + margin) / self.se))  # H0: difference <= -margin
        above = float(special.stdtr(self.df, (self.mean - margin) / self.se))  # H0: difference >= +margin
        return max(below, above)


def finite(values: Sequence[float] | np.ndarray | pd.Series) -> np.ndarray:
    x = values.to_numpy(dtype=float) if isinstance(values, pd.Series) else np.asarray(values, dtype=float)
    return x[np.isfinite(x)]


def first_seeds(values: pd.Series, seeds: int) -> pd.Series:
    """The values of the first `seeds` seed ids (the index) of `values`: an earlier look."""
    if len(values) <= seeds:
        return values
    if values.index.is_monotonic_increasing and values.index.is_unique:
        return values.iloc[:seeds]
    return values[values.index.isin(sorted(set(values.index))[:seeds])]


def clipped(mean: float, lo: float, hi: float, bounds: tuple[float, float]) -> tuple[float, float]:
    return max(lo, bounds[0]), min(hi, bounds[1])


def no_spread(x: np.ndarray) -> bool:
    """Two or more values that are all equal (to rounding: t would be numerical noise)."""
    return len(x) >= 2 and float(np.ptp(x)) <= 1e-12 * max(1.0, float(np.abs(x).max()))


def t_interval(estimate: float, se: float, df: float, level: float) -> tuple[float, float]:
    """estimate ± t_{1 - (1 - level)/2, df} * se: the interval scipy's t tests give, from its
    inverse t distribution directly (the verdicts of an adaptive study compute thousands)."""
    half = float(special.stdtrit(df, 1 - (1 - level) / 2)) * se
    return estimate - half, estimate + half


def t_pvalue(t: float, df: float) -> float:
    """Two-sided p-value of a t statistic (as scipy.stats.ttest_* report it)."""
    return float(2 * special.stdtr(df, -abs(t)))


# The numeric cores below take tuples and are cached: an adaptive study's looks read the same
# seeds again at every round (and the null simulation of tests/recipes/test_sequential.py runs thousands).


def mean_ci(values: Sequence[float] | np.ndarray | pd.Series, level: float = LEVEL,
            bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """Mean and two-sided t interval of finite values (NaNs, e.g. from failed runs, are
    skipped), kept inside `bounds`. One value, or values without spread, have no interval."""
    return _mean_ci(tuple(finite(values).tolist()), level, bounds)


@functools.lru_cache(maxsize=1 << 16)
def _mean_ci(values: tuple[float, ...], level: float, bounds: tuple[float, float]) -> Interval:
    x = np.array(values)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if n < 2 or no_spread(x):
        return Interval(mean, math.nan, math.nan, n, constant=no_spread(x), level=level)
    lo, hi = t_interval(mean, float(x.std(ddof=1)) / math.sqrt(n), n - 1, level)
    return Interval(mean, *clipped(mean, lo, hi, bounds), n, level=level)


def difference_bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    """Range of a difference of two values in `bounds` (e.g. [-1, 1] for accuracies)."""
    return bounds[0] - bounds[1], bounds[1] - bounds[0]


def welch_diff(a, b, level: float = LEVEL, bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """mean(a) - mean(b) with Welch's t interval and test (the Welch-Satterthwaite degrees of
    freedom, as scipy.stats.ttest_ind(equal_var=False))."""
    return _welch_diff(tuple(finite(a).tolist()), tuple(finite(b).tolist()), level, bounds)


@functools.lru_cache(maxsize=1 << 16)
def _welch_diff(a: tuple[float, ...], b: tuple[float, ...], level: float, bounds: tuple[float, float]) -> Interval:
    x, y = np.array(a), np.array(b)
    if len(x) == 0 or len(y) == 0:
        return Interval(math.nan, math.nan, math.nan, 0, method="Welch")
    diff = float(x.mean() - y.mean())
    n = min(len(x), len(y))
    if len(x) < 2 or len(y) < 2:
        return Interval(diff, math.nan, math.nan, n, method="Welch")
    if no_spread(x) and no_spread(y):  # zero standard error: no interval, no test
        return Interval(diff, math.nan, math.nan, n, constant=True, method="Welch")
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)  # a group without spread adds 0, exactly
    se = math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1))
    lo, hi = t_interval(diff, se, df, level)
    return Interval(diff, *clipped(diff, lo, hi, difference_bounds(bounds)), n,
                    method="Welch", p=t_pvalue(diff / se, df), level=level, se=se, df=df)


def paired_diff(a: pd.Series, b: pd.Series, level: float = LEVEL, bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """mean(a - b) over seeds (the Series' index) with the paired t interval and test (as
    scipy.stats.ttest_rel); both must hold the same seeds."""
    if not (a.index.is_monotonic_increasing and b.index.is_monotonic_increasing):
        a, b = a.sort_index(), b.sort_index()
    return _paired_diff(tuple(finite(a.to_numpy() - b.to_numpy()).tolist()), level, bounds)


@functools.lru_cache(maxsize=1 << 16)
def _paired_diff(differences: tuple[float, ...], level: float, bounds: tuple[float, float]) -> Interval:
    d = np.array(differences)
    diff = float(d.mean()) if len(d) else math.nan
    if len(d) < 2:
        return Interval(diff, math.nan, math.nan, len(d), method="paired")
    if no_spread(d):
        return Interval(diff, math.nan, math.nan, len(d), constant=True, method="paired")
    se = float(d.std(ddof=1)) / math.sqrt(len(d))
    lo, hi = t_interval(diff, se, len(d) - 1, level)
    return Interval(diff, *clipped(diff, lo, hi, difference_bounds(bounds)), len(d),
                    method="paired", p=t_pvalue(diff / se, len(d) - 1), level=level, se=se, df=len(d) - 1)


def same_seeds(a: pd.Series, b: pd.Series) -> bool:
    return len(a) >= 2 and len(a) == len(b) and a.index.is_unique and set(a.index) == set(b.index)


def difference(a, b, level: float = LEVEL, bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """a - b: paired over seeds when both are Series over the same seeds (index = seed),
    Welch otherwise. NaN values (failed runs) are dropped first."""
    if isinstance(a, pd.Series) and isinstance(b, pd.Series):
        a, b = (v if np.isfinite(v.to_numpy(dtype=float)).all() else v.dropna() for v in (a, b))
        if same_seeds(a, b):
            return paired_diff(a, b, level, bounds)
    return welch_diff(a, b, level, bounds)


def paired_correlation(a: pd.Series, b: pd.Series) -> float:
    """Pearson correlation of two groups' values over the seeds both have (the Series' index):
    how closely the arms' seed-to-seed variations go together, which is what the paired
    difference cancels (var(a - b) = var a + var b - 2 r sd(a) sd(b)). NaN with fewer than 3 common seeds
    (two points always lie on a line), a group without spread, or a seed listed twice."""
    if not (a.index.is_unique and b.index.is_unique):
        return math.nan
    both = pd.concat([a.astype(float), b.astype(float)], axis=1, join="inner").to_numpy()
    both = both[np.isfinite(both).all(axis=1)]
    if len(both) < 3 or no_spread(both[:, 0]) or no_spread(both[:, 1]):
        return math.nan
    return float(np.corrcoef(both[:, 0], both[:, 1])[0, 1])


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
