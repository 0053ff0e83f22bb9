"""Measurement plumbing at tiny sizes: each instrument against a number known in advance."""

import pytest
import torch
import torch.nn.functional as F
from conftest import HANG_GUARD_S

from workbench.cost.fit import analytic_crossover, loglog_slope, measured_crossover
from workbench.cost.flops import allowed_pairs, count_flops, cpu_flash_pairs
from workbench.cost.measure import measure_point, run_points
from workbench.cost.memory_figures import peak_memory, saved_tensor_bytes
from workbench.cost.timing import time_call
from workbench.cost.workload import Point
from workbench.cost.memory import LiveTensorBytes, peak_tensor_bytes
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


def test_live_tensor_bytes_of_a_known_allocation_pattern():
    def pattern():
        a = torch.empty(1000)  # 4000 bytes live
        b = torch.empty(2000)  # 12000: the peak
        del a  # 8000
        c = torch.empty(500)  # 10000
        b.view(20, 100).t()  # views share b's storage: no new bytes
        return c

    assert peak_tensor_bytes(pattern) == 12000
    with LiveTensorBytes() as live:
        kept = pattern()
    assert live.peak == 12000 and live.current == 2000  # only c outlives the block
    del kept
    assert live.current == 0
    x = torch.randn(1000)  # allocated before: not the block's growth
    assert peak_tensor_bytes(lambda: x.add_(1)) == 0
    peak, instrument = peak_memory(lambda: torch.ones(2**20) * 2, torch.device("cpu"))
    assert (peak, instrument) == (2 * 4 * 2**20, "torch_dispatch_live_tensor_bytes")


def test_live_tensor_bytes_see_the_backward_pass():
    x = torch.randn(256, 64, requires_grad=True)
    forward = peak_tensor_bytes(lambda: (x @ x.T).sin().sum())
    train = peak_tensor_bytes(lambda: (x @ x.T).sin().sum().backward())
    assert forward == 2 * 256 * 256 * 4 + 4  # the scores, their sine, and the 0-d sum
    # backward: the gradient of sin (256 x 256) while autograd still holds the saved scores
    assert train >= forward + 256 * 256 * 4


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
    assert row["status"] == "finished"
    # forward QKV (d -> 3d) and output (d -> d) projections, x3 with the backward
    assert row["flops_projections"] == 3 * (2 * n * d * 3 * d + 2 * n * d * d)
    # useful attention: the causal pairs, forward and backward (x3)
    assert row["flops_attention"] == 3 * 4 * d * (n * (n + 1) // 2)
    assert row["flops"] == row["flops_projections"] + row["flops_attention"]
    # executed: the CPU flash kernel computes one 32 x 32 tile (n = 32), the masked half
    # included; its backward recomputes the scores (forward 2 products, backward 5)
    assert row["flops_executed_source"] == "flop_counter+cpu_flash_tiles"
    assert row["flops_executed_attention"] == (2 + 5) * 2 * d * n * n
    assert row["flops_executed"] == row["flops_projections"] + row["flops_executed_attention"]
    assert row["activation_instrument"] == "saved_tensors_hooks" and row["activation_bytes"] > 0
    assert row["peak_instrument"] == "torch_dispatch_live_tensor_bytes" and row["peak_bytes"] > 0
    assert row["process_peak_rss_delta_bytes"] >= 0  # kept apart, labelled


def test_cpu_flash_tiles_follow_the_kernel_blocking():
    # 1024 queries: blocks of 256 rows; keys in blocks of 512, skipped past the diagonal
    assert cpu_flash_pairs(1024, 1024, causal=True) == 256 * (512 + 512 + 1024 + 1024)
    assert cpu_flash_pairs(1024, 1024, causal=False) == 1024 * 1024
    assert cpu_flash_pairs(100, 100, causal=True) == 100 * 100  # one key block covers all
    q = torch.randn(1, 2, 1024, 8)
    counted = count_flops(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
    assert counted.total == 4 * 2 * 8 * cpu_flash_pairs(1024, 1024, causal=True)


@pytest.mark.parametrize("mode", ["forward", "train_step"])
def test_full_and_naive_do_the_same_useful_work(mode):
    for n in (64, 200, 800):
        full, naive = (measure_point(Point(model={**TINY, "attention": a}, scope="block", mode=mode, length=n,
                                           repeats=1, warmup=0)) for a in ("full", "naive"))
        assert full["flops"] == naive["flops"] and full["flops_attention"] == naive["flops_attention"]
        for row in (full, naive):
            assert row["flops_executed"] >= row["flops"]
        # naive computes the whole n x n matrix (backward: 2 x forward); the fused kernel its tiles,
        # skipping key blocks past the diagonal (backward: 2.5 x forward, scores recomputed)
        naive_factor, tile_factor = (3, 3.5) if mode == "train_step" else (1, 1)
        assert naive["flops_executed_attention"] == naive_factor * 4 * TINY["d_model"] * n * n
        assert full["flops_executed_attention"] == tile_factor * 4 * TINY["d_model"] * cpu_flash_pairs(n, n, True)
    assert cpu_flash_pairs(800, 800, True) < 800 * 800


def test_tiled_sliding_window_counts_its_tiles():
    n, w, d = 64, 8, TINY["d_model"]
    row = measure_point(Point(model={**TINY, "attention": {"name": "sliding_window", "window": w}}, scope="block",
                              mode="forward", length=n, repeats=1, warmup=0))
    assert row["flops_attention"] == 4 * d * sum(min(i + 1, w) for i in range(n))  # the band
    # n / w query blocks of w rows, each against its own and the previous block (2 w keys)
    assert row["flops_executed_attention"] == 4 * d * (n // w) * w * 2 * w


def test_measured_crossover_of_naive_attention_matches_the_analytic_one():
    model = {**TINY, "attention": "naive"}
    lengths = (32, 64, 128, 256, 512)
    rows = [measure_point(Point(model=model, scope="block", mode="forward", length=n, repeats=1, warmup=0))
            for n in lengths]
    assert all(r["flops_executed_source"] == "flop_counter" for r in rows)  # explicit matmuls are counted
    for r, n in zip(rows, lengths):
        r.update(status="finished", mode="forward", length=n)
        assert r["flops_executed_attention"] == 4 * n * n * TINY["d_model"]
    cross = measured_crossover(rows, "executed")
    assert cross.method == "interpolated"
    assert cross.length == pytest.approx(analytic_crossover(model, "executed")) == 6 * TINY["d_model"]
    useful = measured_crossover(rows, "useful")
    # n (n + 1) is not a power law: interpolating in log n is exact only to ~1e-3 here
    assert useful.length == pytest.approx(analytic_crossover(model, "useful"), rel=1e-3)
    assert analytic_crossover(model, "useful") == 12 * TINY["d_model"] - 1


def test_peak_memory_of_naive_attention_grows_quadratically_and_of_the_fused_kernel_linearly():
    lengths = (128, 256, 512, 1024)
    exponents = {}
    for attention in ("naive", "full"):
        peaks = [measure_point(Point(model={**TINY, "attention": attention}, scope="attention", mode="forward",
                                     length=n, repeats=1, warmup=0))["peak_bytes"] for n in lengths]
        exponents[attention] = loglog_slope(lengths, peaks).exponent
    assert exponents["naive"] == pytest.approx(2, abs=0.1)
    assert exponents["full"] == pytest.approx(1, abs=0.05)


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
    assert uncached["flops"] > cached["flops"]  # L + 1 tokens against one
    # Without the cache, the context is recomputed but the LM head runs on the last position only.
    forward = measure_point(Point(model=model, scope="model", mode="forward", length=L + 1, batch_size=B, repeats=1))
    head = 2 * B * TINY["d_model"] * TINY["vocab_size"]
    assert uncached["flops"] == forward["flops"] - L * head


@pytest.mark.slow
def test_oom_point_is_recorded_and_the_next_point_still_runs():
    # 2^22 tokens x 16 floats = 256 MiB of input alone, against a 64 MiB allowance.
    huge = Point(model=TINY, scope="block", mode="forward", length=2**22, memory_limit_gb=1 / 16, repeats=1)
    small = Point(model=TINY, scope="block", mode="forward", length=16, repeats=1)
    rows = run_points([huge, small], time_budget_s=HANG_GUARD_S, startup_timeout_s=HANG_GUARD_S)
    assert [r["status"] for r in rows] == ["oom", "finished"]
    assert "allocate" in rows[0]["error"]
    assert rows[1]["time_median_s"] > 0 and rows[1]["length"] == 16


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("attention", [{"name": "sliding_window", "window": 40},
                                       {"name": "sparse", "block": 16, "n_global_blocks": 1, "n_random_blocks": 2}])
def test_flex_attention_points_count_block_mask_tiles(attention, monkeypatch):
    """On CUDA sliding_window, sparse and full+ALiBi run FlexAttention, which torch's FLOP counter
    cannot run under (TypeError: no implementation for 'torch.ops.higher_order.flex_attention').
    Eager FlexAttention on the CPU stands in: the point finishes, its timed calls went through
    FlexAttention, the useful count is the allowed pairs and the executed count the block
    mask's computed 128 x 128 tiles."""
    from workbench.model import attention as attention_module
    from workbench.model import flex
    from workbench.cost import measure

    monkeypatch.setattr(flex, "FLEX_DEVICES", ("cpu",))
    # The CPU tensor-bytes instrument (a dispatch mode) cannot run eager FlexAttention either; on
    # CUDA peak memory is torch.cuda.max_memory_allocated. This test is about FLOPs.
    monkeypatch.setattr(measure, "peak_memory", lambda fn, device: (fn(), (0, "not measured"))[1])
    calls = []
    cls = get_variant("attention", attention["name"])
    monkeypatch.setattr(cls, "flex", lambda self, *a, **kw: calls.append(1) or attention_module.AttentionVariant.flex(self, *a, **kw))
    n, B, model = 300, 2, {**TINY, "d_model": 64, "attention": attention}  # head_dim 16: the kernel's minimum
    row = measure_point(Point(model=model, scope="layer", mode="forward", length=n, batch_size=B,
                              repeats=1, warmup=0))
    assert row["status"] == "finished" and calls
    variant = cls(cls.Params.model_validate({k: v for k, v in attention.items() if k != "name"}),
                  n_heads=4, n_kv_heads=4, head_dim=16)
    pos = torch.arange(n).expand(B, n)
    assert row["flops_attention"] == 4 * 16 * 4 * allowed_pairs(variant, pos, pos, causal=True)
    mask = variant.flex_block_mask(n, True, torch.device("cpu"))
    tiles = mask.to_dense()[0].sum(-1).sum(-1)  # computed tiles per mask head (partial + full)
    per_head = tiles.sum() * (4 // tiles.numel())
    assert row["flops_executed_attention"] == 4 * 16 * B * int(per_head) * 128 * 128
    assert row["flops_executed_source"].endswith("+flex_block_mask_tiles")
    if attention["name"] == "sliding_window":  # the band skips whole tiles: less than n x n
        assert row["flops_executed_attention"] < 4 * 16 * 4 * B * 384 * 384
