"""The hand-written fast paths of the model's hot loop equal their references: RMSNorm's
backward against nn.RMSNorm (values, gradients, gradcheck), RoPE's complex product against the
rotation it stands for, and one RoPE table per forward shared by every layer."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from workbench import build_model
from workbench.model.norm import RMSNorm, _RMSNormFunction
from workbench_plugins import position_rope
from workbench_plugins.position_rope import apply_rotation, rotation


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rmsnorm_equals_torch_rmsnorm(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 16, generator=g, dtype=dtype).requires_grad_()
    ours, ref = RMSNorm(16, eps=1e-5).to(dtype), nn.RMSNorm(16, eps=1e-5).to(dtype)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(16, generator=g, dtype=dtype))
        ref.weight.copy_(ours.weight)
    weight = torch.randn(3, 7, 16, generator=g, dtype=dtype)
    out, expected = ours(x), ref(x)
    grads = torch.autograd.grad((out * weight).sum(), (x, ours.weight))
    expected_grads = torch.autograd.grad((expected * weight).sum(), (x, ref.weight))
    tol = dict(atol=1e-12, rtol=1e-10) if dtype == torch.float64 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, expected, **tol)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, **tol)


def test_rmsnorm_gradcheck():
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: _RMSNormFunction.apply(x, w, 1e-5), (x, w))


def test_rope_rotates_pairs_by_position_times_frequency():
    """Pair j = (x[2j], x[2j+1]) turned by the angle pos * base^(-2j/hd), as a 2 x 2 rotation."""
    hd, base = 8, 10000.0
    x = torch.randn(1, 1, 5, hd, dtype=torch.float64)
    pos = torch.tensor([[0, 1, 2, 7, 100]])
    out = apply_rotation(x, rotation(pos, hd, base))
    for t, p in enumerate(pos[0].tolist()):
        for j in range(hd // 2):
            angle = p * base ** (-2 * j / hd)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[0, 0, t, 2 * j].item(), x[0, 0, t, 2 * j + 1].item()
            assert out[0, 0, t, 2 * j].item() == pytest.approx(a * c - b * s, abs=1e-5)
            assert out[0, 0, t, 2 * j + 1].item() == pytest.approx(a * s + b * c, abs=1e-5)


def test_rope_keeps_the_dtype_of_half_precision_inputs():
    x = torch.randn(2, 2, 4, 8).to(torch.bfloat16)
    out = apply_rotation(x, rotation(torch.arange(4).expand(2, 4), 8, 10000.0))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), apply_rotation(x.float(), rotation(torch.arange(4)[None], 8, 1e4)),
                               atol=1e-2, rtol=1e-2)


def test_one_rope_table_per_forward(monkeypatch):
    model = build_model({"family": "decoder", "vocab_size": 16, "d_model": 32, "n_layers": 3, "n_heads": 4,
                         "position": "rope"})
    calls = []
    real = position_rope.rotation
    monkeypatch.setattr(position_rope, "rotation", lambda *a: calls.append(1) or real(*a))
    tokens = torch.randint(0, 16, (2, 9))
    model(tokens)
    assert len(calls) == 1  # three layers, one table
    model(tokens)
    assert len(calls) == 2  # a new forward: new positions, a new table


@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_fused_gate_equals_chunk_act_multiply(name):
    from workbench.registry import get_variant

    cls = get_variant("ffn", name)
    ffn = cls(cls.Params(), d_model=8, bias=False).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)

    def reference(x):
        gate, up = ffn.gate_up(x).chunk(2, dim=-1)
        return ffn.down(ffn.act(gate) * up)

    weight = torch.randn(2, 5, 8, dtype=torch.float64)
    params = (x, ffn.gate_up.weight, ffn.down.weight)
    out, expected = ffn(x), reference(x)
    torch.testing.assert_close(out, expected)
    for got, want in zip(torch.autograd.grad((out * weight).sum(), params),
                         torch.autograd.grad((expected * weight).sum(), params)):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(lambda x: ffn(x), (x,))
