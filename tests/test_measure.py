"""Measurement plumbing at tiny sizes: each instrument against a number known in advance."""

import pytest
import torch

from workbench.fit import analytic_crossover, measured_crossover
from workbench.measure import (Point, allowed_pairs, count_flops, measure_point, peak_memory,
                               return_freed_memory_to_os, run_points, saved_tensor_bytes, time_call)
from workbench.registry import get_variant

TINY = {"vocab_size": 32, "d_model": 16, "n_heads": 4, "n_layers": 2, "position": "none"}


def test_saved_tensor_bytes_of_known_ops():
    x = torch.randn(1000, requires_grad=True)
    assert saved_tensor_bytes(lambda: torch.sin(x).sum().backward()) == 1000 * 4  # sin saves its input
    # x * x saves x twice: one storage, counted once; the view shares it too
    assert saved_tensor_bytes(lambda: (x * x.view(10, 100).view(1000)).sum().backward()) == 1000 * 4
    w = torch.nn.Parameter(torch.randn(1000))
    assert saved_tensor_bytes(lambda: (x * w).sum().backward(), exclude=[w]) == 1000 * 4
    assert saved_tensor_bytes(lambda: (x * w).sum().backward()) == 2 * 1000 * 4


def test_flop_count_of_a_matmul_is_exact():
    a, b = torch.randn(8, 16), torch.randn(16, 32)
    assert count_flops(lambda: a @ b).total == 2 * 8 * 16 * 32


def test_cpu_peak_memory_sees_a_known_buffer():
    return_freed_memory_to_os()
    size = 64 * 2**20
    peak, instrument = peak_memory(lambda: torch.ones(size // 4), torch.device("cpu"))
    assert instrument == "cpu_peak_rss_delta"
    # RSS counts pages: a few already-resident freed pages may be reused by the buffer
    assert 0.97 * size <= peak <= size + 16 * 2**20


def test_time_call_reports_order_statistics():
    t = time_call(lambda: sum(range(1000)), warmup=1, repeats=5, device=torch.device("cpu"))
    assert t.repeats == 5 and t.instrument == "perf_counter"
    assert 0 < t.min_s <= t.q25_s <= t.median_s <= t.q75_s <= t.max_s


def test_allowed_pairs_of_full_and_sliding_window():
    pos = torch.arange(100)[None]
    full = get_variant("attention", "full")
    window = get_variant("attention", "sliding_window")
    f = full(full.Params(), n_heads=1, n_kv_heads=1, head_dim=4)
    w = window(window.Params(window=10), n_heads=1, n_kv_heads=1, head_dim=4)
    assert allowed_pairs(f, pos, pos, causal=True, chunk=7) == 100 * 101 // 2
    assert allowed_pairs(f, pos, pos, causal=False) == 100 * 100
    assert allowed_pairs(w, pos, pos, causal=True, chunk=16) == sum(min(i + 1, 10) for i in range(100))


def test_layer_point_labels_figures_and_counts_projections_exactly():
    n, d = 32, 16
    row = measure_point(Point(model=TINY, scope="layer", mode="train_step", length=n, repeats=2, threads=1))
    assert row["status"] == "ok"
    # forward QKV (d -> 3d) and output (d -> d) projections, x3 with the backward
    assert row["flops_counted_projections"] == 3 * (2 * n * d * 3 * d + 2 * n * d * d)
    # the CPU fused kernel is invisible to the counter: its FLOPs are analytic and labelled so
    assert row["flops_counted_attention"] == 0
    assert row["flops_analytic_attention"] == 3 * 4 * d * (n * (n + 1) // 2)
    assert row["flops_source"] == "flop_counter+analytic_attention"
    assert row["flops"] == row["flops_counted"] + row["flops_analytic_attention"]
    assert row["activation_instrument"] == "saved_tensors_hooks" and row["activation_bytes"] > 0
    assert row["peak_instrument"] == "cpu_peak_rss_delta"


def test_measured_crossover_of_naive_attention_matches_the_analytic_one():
    model = {**TINY, "attention": "naive"}
    rows = [measure_point(Point(model=model, scope="block", mode="forward", length=n, repeats=1, warmup=0))
            for n in (32, 64, 128, 256)]
    assert all(r["flops_source"] == "flop_counter" for r in rows)  # explicit matmuls are counted
    for r, n in zip(rows, (32, 64, 128, 256)):
        r.update(status="ok", mode="forward", length=n)
        assert r["flops_counted_attention"] == 4 * n * n * TINY["d_model"]
    cross = measured_crossover(rows)
    assert cross.method == "interpolated"
    assert cross.length == pytest.approx(analytic_crossover(model)) == 6 * TINY["d_model"]


@pytest.mark.parametrize(("attention", "held"), [("full", 40), ({"name": "sliding_window", "window": 8}, 8)])
def test_decode_cache_bytes_follow_the_formula(attention, held):
    model = {**TINY, "attention": attention, "n_kv_heads": 2}
    B, L = 3, 40
    cached = measure_point(Point(model=model, scope="model", mode="decode", length=L, batch_size=B,
                                 kv_cache=True, repeats=2))
    layers, kv, hd = 2, 2, 4
    assert cached["kv_cache_bytes"] == cached["kv_cache_bytes_formula"] == 2 * layers * kv * hd * held * B * 4
    uncached = measure_point(Point(model=model, scope="model", mode="decode", length=L, batch_size=B,
                                   kv_cache=False, repeats=2))
    assert uncached["kv_cache_bytes"] is None
    assert uncached["flops_counted"] > cached["flops_counted"]  # L + 1 tokens against one


@pytest.mark.slow
def test_oom_point_is_recorded_and_the_next_point_still_runs():
    # 2^22 tokens x 16 floats = 256 MiB of input alone, against a 64 MiB allowance.
    huge = Point(model=TINY, scope="block", mode="forward", length=2**22, memory_limit_gb=1 / 16, repeats=1)
    small = Point(model=TINY, scope="block", mode="forward", length=16, repeats=1)
    rows = run_points([huge, small], time_budget_s=120)
    assert [r["status"] for r in rows] == ["oom", "ok"]
    assert "allocate" in rows[0]["error"]
    assert rows[1]["time_median_s"] > 0 and rows[1]["length"] == 16
