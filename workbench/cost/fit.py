"""Fits on scaling measurements: log-log exponents and the attention/FFN crossover (claim E2).

Exponents. A cost that grows like c * n^p is a line of slope p in log-log axes. Constant
overheads flatten the low end, so the slope is fitted over the top `top` lengths only, by
least squares on (log n, log cost), with the slope's standard error from the same fit
(scipy.stats.linregress). Two points give a slope and no error estimate (NaN).

Crossover (E2). Per layer and forward pass, with n tokens, width d = h * hd, K/V heads
h_kv and FFN hidden width d_ff, counting 2 FLOPs per multiply-add:

    attention   scores q.k^T: n * n * hd multiply-adds per head, weighted sum of v: the
                same again, over h heads                      ->  4 * n^2 * d
    projections Q: n*d*d, K and V: 2*n*d*(h_kv*hd), output: n*d*d
                                                              ->  2 * n * d * (2d + 2 h_kv hd)
    FFN         up and down, n*d*d_ff each (gated: three matrices of d_ff)
                                                              ->  4 * n * d * d_ff  (6 when gated)

Attention passes the rest when 4 n^2 d > n * (projections + FFN per token), i.e. at

    n* = (2d (2d + 2 h_kv hd) + 4 d d_ff) / (4 d) = d + h_kv hd + d_ff

For multi-head attention (h_kv hd = d) with a 4x FFN (d_ff = 4d): 8 n d^2 + 16 n d^2 =
24 n d^2 against 4 n^2 d, so n* = 6 d.

Two accountings (workbench.cost.flops). The formula above is the *executed* work of a kernel
that computes the whole n x n score matrix (the naive kernel, causal or not). The *useful*
work of a causal layer counts only the n (n + 1) / 2 allowed pairs, 2 n (n + 1) d FLOPs:

    n* = 2 (d + h_kv hd + d_ff) - 1          (12 d - 1 for MHA with a 4x FFN)

A bidirectional layer allows every pair, so there both accountings give the first formula.
Tiled kernels (the CPU flash kernel skips whole key blocks past the diagonal) execute an
amount between the two, which depends on their tile sizes: no closed formula is claimed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from scipy import stats

from workbench.results import Status
from workbench.model.spec import ModelSpec, parse_spec


@dataclass(frozen=True)
class SlopeFit:
    exponent: float
    stderr: float  # standard error of the slope; NaN with two points
    intercept: float  # log(cost) at log(n) = 0
    lengths: tuple[int, ...]  # the lengths the fit used

    @property
    def n_points(self) -> int:
        return len(self.lengths)


def loglog_slope(lengths: Sequence[float], values: Sequence[float], top: int = 4) -> SlopeFit:
    """Least-squares slope of log(value) against log(length) over the `top` largest lengths.

    Non-finite or non-positive values (failed points) are dropped first; at least two
    points must remain."""
    pairs = sorted((float(n), float(v)) for n, v in zip(lengths, values, strict=True)
                   if v is not None and math.isfinite(float(v)) and float(v) > 0 and float(n) > 0)
    pairs = pairs[-top:]
    if len({n for n, _ in pairs}) < 2:
        raise ValueError(f"a log-log slope needs two distinct lengths with positive values; got {pairs}")
    x = np.log([n for n, _ in pairs])
    y = np.log([v for _, v in pairs])
    if len(pairs) == 2:
        slope = (y[1] - y[0]) / (x[1] - x[0])
        return SlopeFit(float(slope), math.nan, float(y[0] - slope * x[0]), tuple(int(n) for n, _ in pairs))
    fit = stats.linregress(x, y)
    return SlopeFit(float(fit.slope), float(fit.stderr), float(fit.intercept), tuple(int(n) for n, _ in pairs))


MEASURED = (Status.FINISHED,)  # the status of a measurement that produced figures
METRICS = ("time_median_s", "flops", "flops_executed", "activation_bytes", "peak_bytes", "kv_cache_bytes")


def fit_exponents(rows: pd.DataFrame | Sequence[dict[str, Any]], *, by: Sequence[str] = ("variant", "scope", "mode", "kv_cache"),
                  metrics: Sequence[str] = METRICS, top: int = 4) -> pd.DataFrame:
    """One row per group of `by` and metric: exponent, its standard error and the lengths
    used. Only measured rows count (status "finished");
    metrics with fewer than two usable points are left out."""
    df = pd.DataFrame(rows)
    if "status" in df:
        df = df[df["status"].isin(MEASURED)]
    keys = [c for c in by if c in df.columns]
    out = []
    for group, part in df.groupby(keys, dropna=False, sort=True) if keys else [((), df)]:
        group = group if isinstance(group, tuple) else (group,)
        for metric in metrics:
            if metric not in part:
                continue
            values = pd.to_numeric(part[metric], errors="coerce")
            usable = values.notna() & (values > 0)
            if part.loc[usable, "length"].nunique() < 2:
                continue
            fit = loglog_slope(part.loc[usable, "length"].tolist(), values[usable].tolist(), top=top)
            out.append({**dict(zip(keys, group, strict=True)), "metric": metric, "exponent": fit.exponent,
                        "stderr": fit.stderr, "n_points": fit.n_points,
                        "lengths": ",".join(str(n) for n in fit.lengths)})
    return pd.DataFrame(out)


@dataclass(frozen=True)
class Crossover:
    length: float  # n where attention's cost equals the rest's
    method: str  # "interpolated" between bracketing lengths, or "extrapolated" from a fit


def crossover_length(lengths: Sequence[float], attention: Sequence[float], rest: Sequence[float]) -> Crossover:
    """The length where `attention` (growing faster) reaches `rest` (projections + FFN).

    Between the two measured lengths that bracket the crossing, log(attention / rest) is
    interpolated linearly in log n (exact for power laws). Without a bracket, a line through
    all points in (log n, log ratio) is extended to ratio 1 and the result says so."""
    points = sorted((float(n), float(a) / float(r)) for n, a, r in zip(lengths, attention, rest, strict=True)
                    if float(a) > 0 and float(r) > 0)
    if len(points) < 2:
        raise ValueError("a crossover needs two lengths with positive attention and rest figures")
    x = np.log([n for n, _ in points])
    y = np.log([ratio for _, ratio in points])
    for i in range(len(points) - 1):
        if y[i] == 0:
            return Crossover(points[i][0], "interpolated")
        if y[i] < 0 < y[i + 1] or y[i] > 0 > y[i + 1]:
            t = -y[i] / (y[i + 1] - y[i])
            return Crossover(float(np.exp(x[i] + t * (x[i + 1] - x[i]))), "interpolated")
    if y[-1] == 0:
        return Crossover(points[-1][0], "interpolated")
    slope, intercept = np.polyfit(x, y, 1)
    if slope == 0:
        raise ValueError("attention's share does not change with length: no crossover")
    return Crossover(float(np.exp(-intercept / slope)), "extrapolated")


Accounting = Literal["useful", "executed"]
ACCOUNTING_COLUMNS = {"useful": "flops_attention", "executed": "flops_executed_attention"}


def analytic_crossover(spec: ModelSpec | dict[str, Any], accounting: Accounting = "executed") -> float:
    """n* where attention's FLOPs reach those of projections + FFN (module docstring).

    executed: a whole n x n score matrix, n* = d + h_kv hd + d_ff (6 d for MHA with a 4x FFN);
    useful: the pairs a causal layer allows, n* = 2 (d + h_kv hd + d_ff) - 1 (12 d - 1)."""
    spec = parse_spec(spec)
    d, kv_width = spec.d_model, spec.n_kv_heads * spec.head_dim
    q_width = spec.n_heads * spec.head_dim
    d_ff, gated = _ffn_width(spec)
    # Per token, forward FLOPs: projections 2 d (2 q_width + 2 kv_width), FFN (4 or 6) d d_ff;
    # attention per pair of tokens: 4 q_width.
    per_token = 2 * d * (2 * q_width + 2 * kv_width) + (6 if gated else 4) * d * d_ff
    if accounting == "useful" and spec.family != "encoder":  # causal: 4 q_width n (n + 1) / 2
        return per_token / (2 * q_width) - 1
    return per_token / (4 * q_width)


def crossover_formula(spec: ModelSpec | dict[str, Any], accounting: Accounting) -> str:
    """The analytic formula of `analytic_crossover`, in words, for reports."""
    spec = parse_spec(spec)
    if accounting == "useful" and spec.family != "encoder":
        return "2 (d + h_kv hd + d_ff) - 1 (causal: n (n + 1) / 2 pairs)"
    return "d + h_kv hd + d_ff (n x n pairs)"


def _ffn_width(spec: ModelSpec) -> tuple[int, bool]:
    """(hidden width, gated) of the spec's FFN, read from a built instance so that the
    defaults (4 d, or 8/3 d when gated) come from the FFN class itself."""
    choice = spec.uniform("ffn", "the analytic crossover")
    ffn = choice.cls(choice.params, d_model=spec.d_model, bias=False)
    if hasattr(ffn, "gate_up"):
        return ffn.gate_up.out_features // 2, True
    if hasattr(ffn, "up"):
        return ffn.up.out_features, False
    return 0, False  # no FFN


def measured_crossover(rows: pd.DataFrame | Sequence[dict[str, Any]], accounting: Accounting = "executed") -> Crossover:
    """Crossover from the FLOPs of forward rows: attention (useful or executed, see
    workbench.cost.flops) against projections + FFN."""
    df = pd.DataFrame(rows)
    df = df[df["status"].isin(MEASURED) & (df["mode"] == "forward")].sort_values("length")
    column = ACCOUNTING_COLUMNS[accounting]
    if (df[column] <= 0).any():
        raise ValueError(f"some forward rows have no attention FLOPs ({column}): no crossover to measure")
    return crossover_length(df["length"].tolist(), df[column].tolist(),
                            (df["flops_projections"] + df["flops_ffn"]).tolist())


# ---- loss against compute: a saturating power law -------------------------------------------
#
# L(C) = E + A * (C / C0)^-alpha: the irreducible loss E, and a term that shrinks as a power of
# the training compute C (Kaplan et al. 2020; Hoffmann et al. 2022 fit the same form). C0, the
# smallest compute fitted, keeps A on the scale of the losses. Intervals come from a bootstrap
# over seeds: whole seeds (every rung of one seed together) are drawn with replacement and the
# law refitted; the 2.5th and 97.5th percentiles of each parameter are its 95% interval.


@dataclass(frozen=True)
class PowerLaw:
    E: float
    A: float
    alpha: float
    C0: float  # the compute A refers to

    def loss(self, compute: float | np.ndarray) -> float | np.ndarray:
        return self.E + self.A * (np.asarray(compute, dtype=float) / self.C0) ** -self.alpha


@dataclass(frozen=True)
class PowerLawFit:
    law: PowerLaw
    intervals: dict[str, tuple[float, float]]  # E, A, alpha -> 95% bootstrap interval (NaN: too few seeds)
    n_points: int
    n_seeds: int
    compute_range: tuple[float, float]


def saturating_power_law(compute: Sequence[float], loss: Sequence[float], C0: float | None = None) -> PowerLaw:
    """Least-squares L = E + A (C/C0)^-alpha (scipy.optimize.curve_fit), E and A >= 0 and
    0 <= alpha <= 5; at least three distinct compute values. RuntimeError when it does not
    converge."""
    from scipy.optimize import curve_fit

    c, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    keep = np.isfinite(c) & np.isfinite(y) & (c > 0)
    c, y = c[keep], y[keep]
    if len(np.unique(c)) < 3:
        raise ValueError(f"a saturating power law has 3 parameters: it needs 3 distinct compute values, got {len(np.unique(c))}")
    C0 = float(C0 or c.min())
    p0 = (max(0.0, 0.9 * y.min()), max(y.max() - y.min(), 1e-6), 0.5)
    (E, A, alpha), _ = curve_fit(lambda x, E, A, a: E + A * x ** -a, c / C0, y, p0=p0,
                                 bounds=([0.0, 0.0, 0.0], [np.inf, np.inf, 5.0]), maxfev=20000)
    return PowerLaw(float(E), float(A), float(alpha), C0)


def fit_power_law(rows: pd.DataFrame, *, compute: str = "compute", loss: str = "loss", seed: str = "seed",
                  n_boot: int = 1000, rng_seed: int = 0) -> PowerLawFit:
    """The law through every (compute, loss) row, with bootstrap intervals over `seed`s."""
    rows = rows[[compute, loss, seed]].dropna()
    law = saturating_power_law(rows[compute], rows[loss])
    seeds = rows[seed].unique()
    draws: list[tuple[float, float, float]] = []
    rng = np.random.default_rng(rng_seed)
    by_seed = {s: part for s, part in rows.groupby(seed)}
    for _ in range(n_boot if len(seeds) > 1 else 0):
        sample = pd.concat([by_seed[s] for s in rng.choice(seeds, size=len(seeds), replace=True)])
        try:
            fit = saturating_power_law(sample[compute], sample[loss], C0=law.C0)
        except (RuntimeError, ValueError):  # a draw without 3 distinct rungs or that does not converge
            continue
        draws.append((fit.E, fit.A, fit.alpha))
    intervals = {}
    for i, name in enumerate(("E", "A", "alpha")):
        values = [d[i] for d in draws]
        intervals[name] = ((float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5)))
                           if len(values) >= 20 else (math.nan, math.nan))
    return PowerLawFit(law, intervals, len(rows), len(seeds), (float(rows[compute].min()), float(rows[compute].max())))


def power_law_crossing(a: PowerLaw, b: PowerLaw, lo: float, hi: float, points: int = 512) -> float | None:
    """The compute in [lo, hi] where the two laws' losses are equal (the first sign change of
    their difference on a log grid, refined by scipy.optimize.brentq); None: they do not cross there."""
    from scipy.optimize import brentq

    grid = np.geomspace(lo, hi, points)
    diff = a.loss(grid) - b.loss(grid)
    for i in range(points - 1):
        if diff[i] == 0:
            return float(grid[i])
        if diff[i] * diff[i + 1] < 0:
            return float(brentq(lambda c: float(a.loss(c) - b.loss(c)), grid[i], grid[i + 1]))
    return float(grid[-1]) if diff[-1] == 0 else None
