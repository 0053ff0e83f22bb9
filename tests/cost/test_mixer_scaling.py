"""The scaling machinery with a token mixer (workbench.cost.workload builds `make_mixer` at scope
layer): Gated DeltaNet measured in every mode, its FLOPs counted with its triangular solves, its
constant-size cache against its formula; the report builds for a study that sweeps it beside
full attention (the n^2 crossover only where a dense kernel is)."""

from __future__ import annotations

import pytest
import torch

from workbench.cost.fit import loglog_slope
from workbench.cost.flops import count_flops
from workbench.cost.measure import measure_point
from workbench.cost.workload import Point, build_workload
from workbench.errors import SpecError
from workbench.recipes.scaling.report import dense_pattern
from workbench.model.spec import parse_spec

TINY = {"vocab_size": 32, "d_model": 16, "n_heads": 4, "n_layers": 2, "position": "none"}
DELTANET = {**TINY, "attention": {"name": "gated_deltanet", "chunk_size": 16}}


def test_a_mixer_is_measured_at_scope_layer_in_both_modes():
    for mode in ("forward", "train_step"):
        row = measure_point(Point(model=DELTANET, scope="layer", mode=mode, length=64, repeats=1))
        assert row["status"] == "finished" and row["error"] is None
        assert row["flops"] > 0 and row["peak_bytes"] > 0 and row["time_median_s"] > 0
    module = build_workload(Point(model=DELTANET, scope="layer", length=8)).root
    assert type(module).__name__ == "GatedDeltaNet"  # the mixer itself, not a SelfAttention around a kernel


def test_the_triangular_solves_are_counted():
    """n^2 FLOPs per right-hand-side column; chunks of 16 over 64 tokens: 4 chunks, 4 heads, two
    solves (values of 4 and decayed keys of 4 columns) of 16 unknowns each."""
    a, b = torch.randn(3, 8, 8).tril(), torch.randn(3, 8, 5)
    assert count_flops(lambda: torch.linalg.solve_triangular(a, b, upper=False)).total == 3 * 8 * 8 * 5
    workload = build_workload(Point(model=DELTANET, scope="layer", length=64))
    by_op = count_flops(workload.run).by_op
    assert by_op["aten.linalg_solve_triangular"] == 2 * (4 * 4 * 16 * 16 * 4)


def test_a_mixer_scales_linearly_in_flops_and_memory_at_scope_layer():
    lengths = (64, 128, 256, 512)
    rows = [measure_point(Point(model=DELTANET, scope="layer", mode="forward", length=n, repeats=1, warmup=0))
            for n in lengths]
    assert loglog_slope(lengths, [r["flops"] for r in rows]).exponent == pytest.approx(1, abs=0.02)
    assert loglog_slope(lengths, [r["peak_bytes"] for r in rows]).exponent == pytest.approx(1, abs=0.1)


@pytest.mark.parametrize("L", [8, 40])
def test_decoding_a_mixer_caches_the_bytes_of_its_formula_whatever_the_context(L):
    row = measure_point(Point(model=DELTANET, scope="model", mode="decode", length=L, batch_size=3,
                              kv_cache=True, repeats=2))
    # per layer: 4 heads x 4 x 4 state numbers and (2*16 + 16) channels x 3 convolution inputs, float32
    assert row["kv_cache_bytes"] == row["kv_cache_bytes_formula"] == 2 * 3 * (4 * 4 * 4 + 48 * 3) * 4


def test_scope_attention_refuses_a_mixer_by_name():
    with pytest.raises(SpecError, match="gated_deltanet is a token mixer"):
        build_workload(Point(model=DELTANET, scope="attention", length=8))


def test_only_a_dense_kernel_gets_the_n_squared_crossover():
    assert dense_pattern(parse_spec({**TINY, "attention": "full"}).resolved())
    assert not dense_pattern(parse_spec(DELTANET).resolved())
    assert not dense_pattern(parse_spec({**TINY, "attention": {"repeat": ["gated_deltanet", "full"]}}).resolved())
