"""The power of the rule's tests: what a number of seeds can find, and the seeds a difference or
an equivalence needs. Futility (workbench.stats.sequential) reads them at the observed
difference and spread; an inconclusive verdict states them (workbench.stats.rule.plan_text).

Both are exact for the t tests the rule runs, with the spread taken as the one observed: the
difference's from the noncentral t, the equivalence's (two one-sided t tests, Schuirmann 1987)
by integrating its chance over the sample SD's chi distribution (`SPREAD_NODES` quantiles). An
equivalence's power in the normal approximation, which takes the sample SD as known, overstates
it at few seeds, since the interval it needs to fit inside the margin is wider than that
approximation allows for (tests/stats/test_power.py checks both against simulated TOSTs).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special
from scipy.optimize import brentq

from workbench.stats.intervals import distinct

POWER = 0.8
MAX_PLANNED_SEEDS = 1000
SPREAD_NODES = 64  # quantiles of the sample SD's distribution the equivalence's power averages over


def scale_df(sd, n, paired):
    """The standard error and degrees of freedom of the rule's t test at n seeds per group, for a
    spread sd (of the per-seed differences when paired, of each group's seeds otherwise)."""
    n = np.asarray(n, dtype=float)
    paired = np.asarray(paired, dtype=bool)
    return (np.where(paired, sd / np.sqrt(n), sd * np.sqrt(2 / n)), np.where(paired, n - 1, 2 * n - 2))


def power(effect, sd, n, alpha, paired):
    """Power of the two-sided t test at level `alpha` to detect a true difference `effect` with
    `n` seeds per group (exact, from the noncentral t): paired over seeds with `sd` the spread of
    the per-seed differences, else two samples with `sd` each group's spread. Arrays broadcast;
    NaN under 2 seeds or without spread."""
    effect, sd, n, alpha = (np.asarray(v, dtype=float) for v in (effect, sd, n, alpha))
    with np.errstate(invalid="ignore", divide="ignore"):
        scale, df = scale_df(sd, n, paired)
        crit = special.stdtrit(df, 1 - alpha / 2)
        nc = np.abs(effect) / scale
        exact = 1 - special.nctdtr(df, nc, crit) + special.nctdtr(df, nc, -crit)
        # the noncentral t is inexact far in the tail, where the normal approximation is exact enough
        normal = special.ndtr(nc - crit) + special.ndtr(-crit - nc)
    out = np.where(np.isfinite(exact) & (exact >= 0) & (exact <= 1), exact, normal)
    out = np.where((n >= 2) & (sd > 0), out, np.nan)
    return float(out) if out.ndim == 0 else out


def sample_sd_nodes(df: np.ndarray) -> np.ndarray:
    """[..., SPREAD_NODES]: quantiles of s / sigma, the sample SD over the true one, at `df`
    degrees of freedom (sqrt(chi2_df / df)), computed once per distinct df."""
    quantiles = (np.arange(SPREAD_NODES) + 0.5) / SPREAD_NODES
    (values,), index = distinct(np.asarray(df, dtype=float))
    with np.errstate(invalid="ignore", divide="ignore"):
        nodes = np.sqrt(2 * special.gammaincinv(values[:, None] / 2, quantiles[None, :]) / values[:, None])
    return nodes[index].reshape(np.shape(df) + (SPREAD_NODES,))


def equivalence_power(difference, sd, n, alpha, paired, margin):
    """Power of the two one-sided tests of ±`margin`, each at level `alpha`, with `n` seeds per
    group when the true difference is `difference` (`sd` as in `power`): the chance that the
    1 - 2 alpha t interval lies inside ±margin, exact for the t test (the sample SD integrated
    over its chi distribution). Arrays broadcast; NaN under 2 seeds or without spread."""
    difference, sd, n, alpha, margin = np.broadcast_arrays(
        *(np.asarray(v, dtype=float) for v in (difference, sd, n, alpha, margin)))
    paired = np.broadcast_to(np.asarray(paired, dtype=bool), difference.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        scale, df = scale_df(sd, n, paired)
        crit = special.stdtrit(df, 1 - alpha)[..., None]
        half = crit * scale[..., None] * sample_sd_nodes(df)  # the interval's half width at each node
        room = margin[..., None] - half  # where the estimate must lie: |estimate| < room
        inside = (special.ndtr((room - difference[..., None]) / scale[..., None])
                  - special.ndtr((-room - difference[..., None]) / scale[..., None]))
        chance = np.where(room > 0, inside, 0.0).mean(axis=-1)
    out = np.where((n >= 2) & (sd > 0), chance, np.nan)
    return float(out) if out.ndim == 0 else out


def noncentrality_at(chance: float, df: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """The noncentrality |effect| / standard error at which the two-sided t test at level `alpha`
    with `df` degrees of freedom has power `chance` (power grows with it), once per distinct (df,
    alpha): a batch of verdicts compares against it instead of computing each one's power."""
    df, alpha = np.broadcast_arrays(np.asarray(df, dtype=float), np.asarray(alpha, dtype=float))
    (dfs, alphas), index = distinct(df, alpha)

    def at(d: float, a: float) -> float:
        # paired at n = df + 1 seeds and sd = sqrt(n): the standard error is 1, so the effect is the noncentrality
        def gap_nc(nc: float) -> float:
            return float(power(nc, math.sqrt(d + 1), d + 1, a, True)) - chance
        if not (d >= 1 and 0 < a < 1) or gap_nc(0.0) >= 0:
            return 0.0
        high = 1.0
        while gap_nc(high) < 0:
            high *= 2
        return float(brentq(gap_nc, 0.0, high, xtol=1e-9))
    values = np.array([at(d, a) for d, a in zip(dfs, alphas)])
    return values[index].reshape(df.shape)


def detectable(sd: float, n: int, alpha: float, paired: bool) -> float:
    """The smallest true difference the test finds with POWER at `n` seeds."""
    if n < 2 or sd <= 0:
        return math.nan
    high = sd
    while power(high, sd, n, alpha, paired) < POWER:
        high *= 2
    return float(brentq(lambda e: power(e, sd, n, alpha, paired) - POWER, 0.0, high, xtol=1e-6 * sd))


def seeds_for(chance, least: int = 2) -> int | None:
    """The fewest seeds from `least` on whose `chance(n)` reaches POWER; None past MAX_PLANNED_SEEDS."""
    n = least
    while not chance(n) >= POWER:
        n = n + 1 if n < 64 else int(n * 1.1)
        if n > MAX_PLANNED_SEEDS:
            return None
    return n


def seeds_needed(effect: float, sd: float, alpha: float, paired: bool, least: int = 2) -> int | None:
    """Seeds per group for POWER against a true difference `effect` (at least `least`); None past
    MAX_PLANNED_SEEDS."""
    if not effect or sd <= 0 or not math.isfinite(effect):
        return None
    return seeds_for(lambda n: power(effect, sd, n, alpha, paired), least)


def seeds_for_equivalence(difference: float, sd: float, alpha: float, paired: bool, margin: float,
                          least: int = 2) -> int | None:
    """Seeds per group for POWER to show equivalence within ±`margin` when the true difference is
    `difference` (inside the margin); None past MAX_PLANNED_SEEDS or outside it."""
    if sd <= 0 or not abs(difference) < margin:
        return None
    return seeds_for(lambda n: equivalence_power(difference, sd, n, alpha, paired, margin), least)
