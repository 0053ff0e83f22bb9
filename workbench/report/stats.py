"""Statistics of a report: means with 95% confidence intervals over seeds, differences to the
baseline, and verdicts for a study's `expect:` entries.

Every interval is a two-sided 95% t interval: seeds are few (2-5), so the normal
approximation would be too narrow. Differences use Welch's t interval (unequal variances,
Welch-Satterthwaite degrees of freedom). With a single seed there is no interval (NaN).

Verdict rule (shown at the top of every report that declares `expect:`):
    For each entry {metric, better: A, than: B}, take the finished runs of A and of B, and
    compute each group's mean and 95% t interval over seeds.
    - "holds":          the intervals do not overlap and A's mean is better than B's
                        (higher or lower, as the metric's direction says);
    - "does not hold":  the intervals do not overlap and A's mean is worse than B's;
    - "inconclusive (intervals overlap)": the intervals overlap (touching counts as overlap);
    - "inconclusive (...)" with another reason when a group has fewer than 2 finished seeds
      (no interval can be computed) or no finished run at all.
    Non-overlap of two 95% intervals is a conservative test (stricter than a 5% Welch test),
    which is why the Welch interval of the difference is shown next to the verdict as well.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as st

LEVEL = 0.95

# Metric base names (before '@length') where smaller is better; everything else (accuracy,
# bleu, exact match, ...) is higher-is-better.
LOWER_IS_BETTER = ("loss", "perplexity", "ppl", "nll", "error", "cer", "wer", "time", "latency", "memory", "bytes")


def higher_is_better(metric: str) -> bool:
    """accuracy@128 -> True, val_loss -> False: by the metric's base name."""
    base = metric.split("@")[0].lower()
    return not any(word in base for word in LOWER_IS_BETTER)


@dataclass(frozen=True)
class Interval:
    """A mean with its 95% t interval over n values; lo/hi are NaN when n < 2."""

    mean: float
    lo: float
    hi: float
    n: int


def mean_ci(values: Sequence[float] | np.ndarray, level: float = LEVEL) -> Interval:
    """Mean and two-sided t interval of finite values (NaNs, e.g. from failed runs, are skipped)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n)
    sem = float(x.std(ddof=1)) / math.sqrt(n)
    half = float(st.t.ppf(0.5 + level / 2, df=n - 1)) * sem
    return Interval(mean, mean - half, mean + half, n)


def welch_diff(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, level: float = LEVEL) -> Interval:
    """mean(a) - mean(b) with Welch's t interval; NaN bounds when either side has < 2 values."""
    x, y = (np.asarray(v, dtype=float) for v in (a, b))
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if len(x) == 0 or len(y) == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    diff = float(x.mean() - y.mean())
    n = min(len(x), len(y))
    if len(x) < 2 or len(y) < 2:
        return Interval(diff, math.nan, math.nan, n)
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se = math.sqrt(vx + vy)
    if se == 0:  # identical values on both sides: the difference is exact
        return Interval(diff, diff, diff, n)
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    half = float(st.t.ppf(0.5 + level / 2, df=df)) * se
    return Interval(diff, diff - half, diff + half, n)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one `expect:` entry."""

    metric: str
    better: str
    than: str
    outcome: str  # "holds" | "does not hold" | "inconclusive"
    reason: str  # why, in words; for inconclusive it goes in the parentheses
    better_ci: Interval
    than_ci: Interval
    diff: Interval  # better - than, Welch interval

    @property
    def label(self) -> str:
        return f"inconclusive ({self.reason})" if self.outcome == "inconclusive" else self.outcome

    @property
    def statement(self) -> str:
        return f"{self.better} is better than {self.than} on {self.metric}"


def verdict(better_values: Sequence[float], than_values: Sequence[float], metric: str,
            better: str, than: str, higher: bool | None = None) -> Verdict:
    """Apply the rule of this module's docstring to two groups of per-seed values; `higher`
    says whether larger values of the metric are better (default: by its name)."""
    higher = higher_is_better(metric) if higher is None else higher
    a, b = mean_ci(better_values), mean_ci(than_values)
    diff = welch_diff(better_values, than_values)

    def make(outcome: str, reason: str) -> Verdict:
        return Verdict(metric, better, than, outcome, reason, a, b, diff)

    for name, iv in ((better, a), (than, b)):
        if iv.n == 0:
            return make("inconclusive", f"no finished run of {name} reports {metric}")
    for name, iv in ((better, a), (than, b)):
        if iv.n < 2:
            return make("inconclusive", f"{name} has {iv.n} finished seed; an interval needs 2")
    if a.lo <= b.hi and b.lo <= a.hi:
        return make("inconclusive", "intervals overlap")
    above = a.mean > b.mean
    where = f"{better}'s interval lies entirely {'above' if above else 'below'} {than}'s"
    return make("holds" if above == higher else "does not hold", where)
