"""Fitting code on synthetic curves with known exponents and crossovers."""

import math

import numpy as np
import pandas as pd
import pytest

from workbench.cost.fit import analytic_crossover, crossover_length, fit_exponents, loglog_slope, measured_crossover

LENGTHS = [256, 512, 1024, 2048, 4096, 8192]


@pytest.mark.parametrize("exponent", [1.0, 1.5, 2.0])
def test_exact_power_law_recovers_the_exponent(exponent):
    fit = loglog_slope(LENGTHS, [3e-6 * n**exponent for n in LENGTHS], top=4)
    assert fit.exponent == pytest.approx(exponent, abs=1e-9)
    assert fit.stderr == pytest.approx(0.0, abs=1e-9)
    assert fit.lengths == (1024, 2048, 4096, 8192)


def test_noisy_power_law_is_within_its_standard_errors():
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(200):
        values = [n**2 * math.exp(rng.normal(0, 0.05)) for n in LENGTHS]
        fit = loglog_slope(LENGTHS, values, top=4)
        hits += abs(fit.exponent - 2.0) <= 2 * fit.stderr
    # 4 points, 2 dof: |t| <= 2 holds ~82% of the time for a correct standard error.
    assert 0.7 <= hits / 200 <= 0.95


def test_only_the_top_of_the_range_is_fitted():
    # a constant overhead flattens the low end; the top points see the n^2 term
    values = [1e5 + n**2 for n in LENGTHS]
    assert loglog_slope(LENGTHS, values, top=3).exponent > 1.9
    assert loglog_slope(LENGTHS, values, top=6).exponent < 1.8


def test_failed_points_are_dropped_and_two_points_have_no_error():
    fit = loglog_slope([1024, 2048, 4096], [1.0, 4.0, float("nan")])
    assert fit.exponent == pytest.approx(2.0)
    assert math.isnan(fit.stderr)
    with pytest.raises(ValueError):
        loglog_slope([1024, 2048], [1.0, None])


def test_fit_exponents_groups_by_variant_and_ignores_failed_rows():
    rows = [{"variant": v, "mode": "train_step", "length": n, "status": "finished", "time_median_s": n**p}
            for v, p in (("full", 2.0), ("sliding_window", 1.0)) for n in LENGTHS]
    rows.append({"variant": "full", "mode": "train_step", "length": 16384, "status": "oom", "time_median_s": None})
    fits = fit_exponents(pd.DataFrame(rows), by=("variant", "mode"), metrics=("time_median_s",), top=3)
    by_variant = fits.set_index("variant")["exponent"]
    assert by_variant["full"] == pytest.approx(2.0)
    assert by_variant["sliding_window"] == pytest.approx(1.0)
    assert set(fits["lengths"]) == {"2048,4096,8192"}


def test_crossover_interpolated_between_bracketing_lengths():
    d = 128
    attention = [4 * n * n * d for n in LENGTHS]
    rest = [24 * n * d * d for n in LENGTHS]
    cross = crossover_length(LENGTHS, attention, rest)
    assert cross.method == "interpolated"
    assert cross.length == pytest.approx(6 * d)


def test_crossover_extrapolated_when_no_length_brackets_it():
    d = 4096  # crossover at 6d = 24576, beyond the measured lengths
    cross = crossover_length(LENGTHS, [4 * n * n * d for n in LENGTHS], [24 * n * d * d for n in LENGTHS])
    assert cross.method == "extrapolated"
    assert cross.length == pytest.approx(6 * d, rel=1e-9)


@pytest.mark.parametrize(("spec", "expected"), [
    ({"d_model": 256, "n_heads": 4}, 6 * 256),  # MHA, 4x FFN: 6d
    ({"d_model": 256, "n_heads": 4, "n_kv_heads": 1}, 256 + 64 + 1024),  # d + h_kv*hd + d_ff
    ({"d_model": 256, "n_heads": 4, "ffn": {"name": "gelu", "d_ff": 512}}, 256 + 256 + 512),
])
def test_analytic_crossover(spec, expected):
    assert analytic_crossover(spec) == pytest.approx(expected)
    # Useful work of a causal layer: n (n + 1) / 2 pairs, so attention catches up at 2 n* - 1.
    assert analytic_crossover({**spec, "family": "decoder"}, "useful") == pytest.approx(2 * expected - 1)
    # Bidirectional: every pair is allowed, both accountings agree.
    assert analytic_crossover({**spec, "family": "encoder"}, "useful") == pytest.approx(expected)


def test_measured_crossover_refuses_rows_without_attention_flops():
    rows = [{"status": "finished", "mode": "forward", "length": n, "flops_attention": 0, "flops_executed_attention": 0,
             "flops_projections": 1, "flops_ffn": 1} for n in (64, 128)]
    for accounting in ("useful", "executed"):
        with pytest.raises(ValueError, match="no attention FLOPs"):
            measured_crossover(rows, accounting)
