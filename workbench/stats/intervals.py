"""Means with intervals over seeds, differences between groups with their t tests, and shares of
seeds (failures as outcomes).

Every test is computed on arrays whose last axis is the seeds (NaN: no finished run of that
seed), so that one call decides a report's single study or a simulation's hundred thousand
(`mean_intervals`, `differences`); the functions of one group or one pair (`mean_ci`,
`difference`, ...) are those arrays with one row. The t intervals and tests are those of
scipy.stats (ttest_1samp, ttest_rel, ttest_ind with unequal variances), computed from scipy's t
distribution directly (tests/stats/test_intervals.py checks them against scipy.stats); exact
binomial and Fisher tests come from scipy.stats.

Intervals. A group's mean has the two-sided t interval over its seeds (seeds are few, 2-12,
so the normal approximation would be too narrow). A difference between two groups is *paired*
over seeds when both finished the same seeds (the same seed gives the same data stream, and the
same initial weights where the arms' parameters allow, docs/verdicts.md: the seed-to-seed
variation they share cancels), otherwise Welch's (unequal variances). Bounded metrics (accuracy
in [0, 1], BLEU in [0, 100], ...) get the t interval intersected with their range: the true mean
lies inside the range, so cutting away the impossible part leaves the coverage as it was, and no
interval of an accuracy reads 1.19. A bootstrap was the alternative: with 3 seeds its percentile
interval is far too narrow, and a logit transform is undefined at 0 and 1, where exact match
often sits. A group whose seeds all scored the same has no spread: it is flagged
(`Interval.constant`) instead of being shown as a zero-width, precise-looking interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import special
from scipy import stats as st

from workbench.stats.numbers import fmt

LEVEL = 0.95
ALPHA = 1 - LEVEL
UNBOUNDED = (-math.inf, math.inf)
PAIRED, WELCH = "paired", "Welch"


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
        return float(equivalence_p(np.float64(self.mean), np.float64(self.se), np.float64(self.df), margin))


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


# ---- the arrays: seeds on the last axis, NaN where a seed has no finished run ------------------------


def distinct(*arrays) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct combinations of equal-shaped float arrays (each's values at them) and, per
    element, the index of its combination: a slow function of few distinct inputs runs once each."""
    key = arrays[0].ravel().astype(complex)
    if len(arrays) == 2:
        key = key + 1j * arrays[1].ravel()
    values, index = np.unique(key, return_inverse=True)
    return [values.real, values.imag][: len(arrays)], index.ravel()


def t_quantile(df, level) -> np.ndarray:
    """The two-sided t critical value at `level` (scipy's inverse t distribution), computed once
    per distinct (df, level): the inverse is slow, and a look's many intervals share a few."""
    df, level = np.broadcast_arrays(np.asarray(df, dtype=float), np.asarray(level, dtype=float))
    (dfs, levels), index = distinct(df, level)
    with np.errstate(invalid="ignore"):
        quantiles = special.stdtrit(dfs, 1 - (1 - levels) / 2)
    return quantiles[index].reshape(df.shape)


def spread_free(x: np.ndarray, count) -> np.ndarray:
    """Two or more values that are all equal (to rounding: t would be numerical noise)."""
    return Moments.of(x).constant & (np.asarray(count) >= 2)


@dataclass(frozen=True)
class Moments:
    """Per row of an array of seeds: how many finished, their mean and (n >= 2) variance."""

    n: np.ndarray
    mean: np.ndarray
    var: np.ndarray  # ddof 1; NaN under 2 values
    constant: np.ndarray  # 2 or more values, all equal

    @classmethod
    def of(cls, x: np.ndarray) -> Moments:
        x = np.asarray(x, dtype=float)
        ok = np.isfinite(x)
        n = ok.sum(axis=-1)
        kept = np.where(ok, x, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = kept.sum(axis=-1) / n
            centred = np.where(ok, x - mean[..., None], 0.0)
            var = np.where(n >= 2, (centred**2).sum(axis=-1) / (n - 1), np.nan)
            # all equal to rounding (t would be numerical noise): a spread under 1e-12 of the values' size
            constant = (n >= 2) & (var <= (1e-12 * np.maximum(1.0, np.abs(mean))) ** 2)
        return cls(n, np.where(n > 0, mean, np.nan), np.where(constant, 0.0, var), constant)


def mean_intervals(x: np.ndarray, level, bounds: tuple[float, float] = UNBOUNDED) -> tuple[np.ndarray, ...]:
    """(mean, lo, hi, n, constant) of each row's t interval at `level`, cut to `bounds`; no
    interval (NaN) with one value or without spread."""
    m = Moments.of(x)
    with np.errstate(invalid="ignore"):
        half = t_quantile(np.maximum(m.n - 1, 1), level) * np.sqrt(m.var / np.maximum(m.n, 1))
    has = (m.n >= 2) & ~m.constant
    lo = np.where(has, np.maximum(m.mean - half, bounds[0]), np.nan)
    hi = np.where(has, np.minimum(m.mean + half, bounds[1]), np.nan)
    return m.mean, lo, hi, m.n, m.constant


@dataclass(frozen=True)
class Differences:
    """Each row's difference of means (better - than) with its t test: paired over seeds when
    both groups finished the same seeds (and `pairable`), Welch's otherwise. Arrays of one shape."""

    mean: np.ndarray
    se: np.ndarray  # NaN: no test (a group under 2 seeds, or no spread)
    df: np.ndarray
    n: np.ndarray  # pairs, or the smaller group's seeds
    paired: np.ndarray  # bool
    constant: np.ndarray  # bool: no spread at all (every difference the same, or both groups constant)
    n_better: np.ndarray
    n_than: np.ndarray
    mean_better: np.ndarray  # each group's own mean (over its finished seeds)
    mean_than: np.ndarray

    @property
    def tested(self) -> np.ndarray:
        return np.isfinite(self.se) & (self.se > 0)

    @property
    def p(self) -> np.ndarray:
        """Two-sided p of "no difference" (NaN without a test)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.tested, 2 * special.stdtr(self.df, -np.abs(self.mean / self.se)), np.nan)

    def interval(self, level, bounds: tuple[float, float] = UNBOUNDED) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) at `level`, cut to the range of a difference of two values in `bounds`."""
        low, high = difference_bounds(bounds)
        with np.errstate(invalid="ignore"):
            half = t_quantile(self.df, level) * self.se
        return (np.where(self.tested, np.maximum(self.mean - half, low), np.nan),
                np.where(self.tested, np.minimum(self.mean + half, high), np.nan))

    def at(self, index) -> Differences:
        return Differences(*(getattr(self, f)[index] for f in self.__dataclass_fields__))


def equivalence_p(mean, se, df, margin) -> np.ndarray:
    """p of "the difference lies outside ±margin" by two one-sided t tests (Schuirmann 1987): the
    larger of the two one-sided p's; at most a when the 1 - 2a interval lies inside ±margin. NaN
    without a test or a margin."""
    with np.errstate(invalid="ignore", divide="ignore"):
        below = special.stdtr(df, -(mean + margin) / se)  # H0: difference <= -margin
        above = special.stdtr(df, (mean - margin) / se)  # H0: difference >= +margin
        return np.where(np.isfinite(se) & (se > 0) & np.isfinite(margin), np.maximum(below, above), np.nan)


def differences(better: np.ndarray, than: np.ndarray, pairable=True) -> Differences:
    """The difference of each row's group means and its test (seeds on the last axis, aligned by
    seed id; NaN: no finished run). Paired where both rows finished the same seeds, at least 2."""
    better, than = np.asarray(better, dtype=float), np.asarray(than, dtype=float)
    a, b = Moments.of(better), Moments.of(than)
    same = np.asarray(pairable) & (np.isfinite(better) == np.isfinite(than)).all(axis=-1) & (a.n >= 2)
    d = Moments.of(np.where(same[..., None], better - than, np.nan))
    with np.errstate(invalid="ignore", divide="ignore"):
        va, vb = a.var / a.n, b.var / b.n  # a group without spread adds 0, exactly
        welch_se = np.sqrt(va + vb)
        welch_df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
        paired_se = np.sqrt(d.var / d.n)
    welch_constant = a.constant & b.constant
    mean = np.where(same, d.mean, a.mean - b.mean)
    constant = np.where(same, d.constant, welch_constant)
    usable = np.where(same, d.n >= 2, (a.n >= 2) & (b.n >= 2)) & ~constant
    se = np.where(usable, np.where(same, paired_se, welch_se), np.nan)
    df = np.where(usable, np.where(same, d.n - 1, welch_df), np.nan)
    n = np.where(same, d.n, np.minimum(a.n, b.n))
    return Differences(mean, se, df, n, same, constant & (n >= 2), a.n, b.n, a.mean, b.mean)


# ---- one group, one pair --------------------------------------------------------------------------


def mean_ci(values: Sequence[float] | np.ndarray | pd.Series, level: float = LEVEL,
            bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """Mean and two-sided t interval of finite values (NaNs, e.g. from failed runs, are
    skipped), kept inside `bounds`. One value, or values without spread, have no interval."""
    mean, lo, hi, n, constant = (v[0] for v in mean_intervals(finite(values)[None, :], level, bounds))
    return Interval(float(mean), float(lo), float(hi), int(n), constant=bool(constant), level=level)


def interval_of(d: Differences, level: float, bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """A one-row `Differences` as an Interval at `level`."""
    lo, hi = d.interval(level, bounds)
    method = PAIRED if d.paired else WELCH
    return Interval(float(d.mean), float(lo), float(hi), int(d.n), constant=bool(d.constant), method=method,
                    p=float(d.p), level=level, se=float(d.se), df=float(d.df))


def difference_bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    """Range of a difference of two values in `bounds` (e.g. [-1, 1] for accuracies)."""
    return bounds[0] - bounds[1], bounds[1] - bounds[0]


def aligned(a, b) -> tuple[np.ndarray, np.ndarray, bool]:
    """Two groups' values as arrays over the same seeds (the union of their seed ids, NaN where a
    group has none), and whether they may pair: Series over seeds pair, plain lists do not."""
    if isinstance(a, pd.Series) and isinstance(b, pd.Series) and a.index.is_unique and b.index.is_unique:
        both = pd.concat([a.astype(float), b.astype(float)], axis=1).sort_index()
        return both.iloc[:, 0].to_numpy(), both.iloc[:, 1].to_numpy(), True
    x, y = finite(a), finite(b)
    width = max(len(x), len(y))
    return (np.pad(x, (0, width - len(x)), constant_values=np.nan), np.pad(y, (0, width - len(y)), constant_values=np.nan),
            False)


def difference(a, b, level: float = LEVEL, bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """a - b: paired over seeds when both are Series over the same finished seeds (index = seed),
    Welch otherwise. NaN values (failed runs) leave their seed out."""
    x, y, pairable = aligned(a, b)
    return interval_of(differences(x[None, :], y[None, :], pairable).at(0), level, bounds)


def welch_diff(a, b, level: float = LEVEL, bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """mean(a) - mean(b) with Welch's t interval and test (the Welch-Satterthwaite degrees of
    freedom, as scipy.stats.ttest_ind(equal_var=False))."""
    x, y, _ = aligned(list(finite(a)), list(finite(b)))
    return interval_of(differences(x[None, :], y[None, :], False).at(0), level, bounds)


def paired_diff(a: pd.Series, b: pd.Series, level: float = LEVEL, bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """mean(a - b) over seeds (the Series' index) with the paired t interval and test (as
    scipy.stats.ttest_rel); both must hold the same seeds."""
    return difference(a, b, level, bounds)


def paired_correlation(a: pd.Series, b: pd.Series) -> float:
    """Pearson correlation of two groups' values over the seeds both have (the Series' index):
    how closely the arms' seed-to-seed variations go together, which is what the paired
    difference cancels (var(a - b) = var a + var b - 2 r sd(a) sd(b)). NaN with fewer than 3 common seeds
    (two points always lie on a line), a group without spread, or a seed listed twice."""
    if not (a.index.is_unique and b.index.is_unique):
        return math.nan
    both = pd.concat([a.astype(float), b.astype(float)], axis=1, join="inner").to_numpy()
    both = both[np.isfinite(both).all(axis=1)]
    if len(both) < 3 or spread_free(both[:, 0], len(both)) or spread_free(both[:, 1], len(both)):
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
