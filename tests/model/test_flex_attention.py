"""FlexAttention path (CUDA): chosen for sliding-window, sparse and ALiBi attention on training
shapes only, its block mask equals each variant's `allowed` pattern bit for bit, and its output
equals the dense reference. On the CPU (FlexAttention has no backward there) forward equality
is checked through the eager kernel; values and gradients are checked when a GPU is present."""

from __future__ import annotations

import pytest
import torch
from test_attention_variants import H, alibi_bias, make

from workbench.model import attention, flex
from workbench.model.flex import block_mask_from_allowed, flex_applies

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
VARIANTS = {
    "sliding_window": dict(window=40),
    "sparse": dict(block=16, n_global_blocks=1, n_random_blocks=2, seed=3),
    "full": {},
}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
HD = flex.FLEX_MIN_HEAD_DIM  # the compiled kernel's smallest head (torch 2.11 - 2.13 on CUDA)


def qkv(B, n, n_kv_heads, device="cpu", dtype=torch.float32, grad=False):
    g = torch.Generator(device=device).manual_seed(0)
    shapes = [(B, H, n, HD), (B, n_kv_heads, n, HD), (B, n_kv_heads, n, HD)]
    return [torch.randn(s, generator=g, device=device, dtype=dtype).requires_grad_(grad) for s in shapes]


def dense_mask(block_mask, n):
    """Every (q, k) bit the BlockMask lets through: its tiles' layout with mask_mod inside."""
    from torch.nn.attention.flex_attention import create_mask

    heads = block_mask.kv_num_blocks.shape[1]  # 1, or n_heads for a per-head pattern (sparse)
    return create_mask(block_mask.mask_mod, 1, heads, n, n, device="cpu")[0] & block_tiles(block_mask, n)


def block_tiles(block_mask, n):
    dense = block_mask.to_dense()[0].bool()  # [heads, nb, nb]: partial or full tiles
    bs = block_mask.BLOCK_SIZE[0]
    return dense.repeat_interleave(bs, 1).repeat_interleave(bs, 2)[:, :n, :n]


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("n", [100, 300])
def test_block_mask_equals_allowed(name, causal, n):
    variant = make(name, head_dim=HD, **VARIANTS[name])
    mask = block_mask_from_allowed(lambda qp, kp: variant.allowed(qp, kp, causal), n, torch.device("cpu"))
    pos = torch.arange(n)
    expected = variant.allowed(pos[:, None], pos[None, :], causal)  # [n, n], or [h, n, n] per head
    got = dense_mask(mask, n)
    assert got.shape[0] == (expected.shape[0] if expected.dim() == 3 else 1)
    assert torch.equal(got, expected.expand(got.shape))
    if name == "sliding_window" and n == 300:  # the band leaves whole tiles out: skipped by the kernel
        assert not bool(block_tiles(mask, n).all())


def test_per_head_patterns_are_kept_apart():
    n = 130
    def allowed(qp, kp):  # head 0 reads only itself, head 1 everything before it
        return torch.stack([qp == kp, kp <= qp])
    mask = block_mask_from_allowed(allowed, n, torch.device("cpu"))
    from torch.nn.attention.flex_attention import create_mask

    bits = create_mask(mask.mask_mod, 1, 2, n, n, device="cpu")[0]
    pos = torch.arange(n)
    assert torch.equal(bits[0], pos[:, None] == pos) and torch.equal(bits[1], pos[None, :] <= pos[:, None])


def test_selection_cuda_training_shapes_only(monkeypatch):
    q = torch.zeros(2, H, 8, HD)
    pos = torch.arange(8).expand(2, 8)
    assert not flex_applies(q, pos, pos, None)  # the CPU keeps the tiled path
    monkeypatch.setattr(flex, "FLEX_DEVICES", ("cpu",))  # stand in for CUDA
    assert flex_applies(q, pos, pos, None)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, :2] = False
    assert not flex_applies(q, pos, pos, mask)  # padding
    assert not flex_applies(q, (mask.cumsum(-1) - 1).clamp(min=0), (mask.cumsum(-1) - 1).clamp(min=0), None)
    assert not flex_applies(q[:, :, :1], pos[:, -1:], pos, None)  # a decoding step reads a cache
    small_heads = torch.zeros(2, H, 8, flex.FLEX_MIN_HEAD_DIM // 2)
    assert not flex_applies(small_heads, pos, pos, None)  # the kernel refuses head_dim < 16: own path
    with flex.flex_disabled():  # while torch's FLOP counter runs (workbench.cost.flops)
        assert not flex_applies(q, pos, pos, None)
    assert flex_applies(q, pos, pos, None)


def test_model_positions_are_known_to_count_from_zero_without_reading_them():
    """A model's positions (no padding) are recognised as 0..n-1 from how they were made, so the
    FlexAttention check does not wait for the GPU in every layer; other tensors are read."""
    from workbench.model.flex import arange_positions, counts_from_zero

    assert counts_from_zero(arange_positions(2, 6, "meta"))  # a meta tensor has no values to read
    assert counts_from_zero(torch.arange(6).expand(2, 6))
    assert not counts_from_zero(torch.arange(1, 7).expand(2, 6))


@pytest.mark.filterwarnings("ignore:.*Profiler function.*")
def test_recompile_limit_clears_the_cache_with_a_warning_instead_of_falling_back(monkeypatch):
    """Past dynamo's recompile limit, compiled flex_attention would silently run eagerly (the n x n
    scores materialised). The CPU's compiled FlexAttention (forward) stands in for CUDA's, with a
    limit of 1: the second kind of call warns, compiles again and still equals the reference."""
    monkeypatch.setattr(flex, "FLEX_DEVICES", ("cpu",))
    monkeypatch.setattr(flex, "FLEX_COMPILED_DEVICES", ("cpu",))
    monkeypatch.setattr(flex, "FLEX_RECOMPILE_LIMIT", 1)
    monkeypatch.setattr(flex, "_compiled_flex", None)
    n = 128
    pos = torch.arange(n).expand(1, n)
    kwargs = dict(q_pos=pos, k_pos=pos, key_mask=None, causal=True, score_bias=None)
    outputs = []
    with torch.no_grad(), pytest.warns(UserWarning, match="compiled graphs in this process") as caught:
        for n_kv_heads in (H, 1):  # another head count: another graph
            variant = make("sliding_window", n_kv_heads=n_kv_heads, head_dim=HD, window=40)
            q, k, v = qkv(1, n, n_kv_heads)
            outputs.append((variant(q, k, v, **kwargs), variant.dense(q, k, v, **kwargs)))
    assert sum("compiled graphs" in str(w.message) for w in caught) == 1
    for out, expected in outputs:
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("n_kv_heads", [4, 1], ids=["mha", "mqa"])
def test_flex_forward_equals_dense_on_cpu(name, causal, n_kv_heads, monkeypatch):
    """The variant's own forward, with the CPU standing in for CUDA, goes through flex and
    returns the dense reference (eager FlexAttention: forward only on the CPU)."""
    variant = make(name, n_kv_heads=n_kv_heads, head_dim=HD, **VARIANTS[name])
    n = 150
    q, k, v = qkv(2, n, n_kv_heads)
    pos = torch.arange(n).expand(2, n)
    bias = alibi_bias(torch.float32)  # a function of offsets and heads only: any head_dim
    kwargs = dict(q_pos=pos, k_pos=pos, key_mask=None, causal=causal, score_bias=bias)
    calls = []
    monkeypatch.setattr(flex, "FLEX_DEVICES", ("cpu",))
    monkeypatch.setattr(type(variant), "flex", lambda self, *a, **kw: calls.append(1) or attention.AttentionVariant.flex(self, *a, **kw))
    with torch.no_grad():
        out = variant(q, k, v, **kwargs)
        expected = variant.dense(q, k, v, **kwargs)
    assert calls, "the FlexAttention path was not taken"
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_flex_with_scalable_softmax_equals_dense_on_cpu(causal, monkeypatch):
    """Full attention with a score bias goes through flex on CUDA; Scalable-Softmax scales its
    queries before that kernel as before the dense one (the CPU standing in for CUDA)."""
    variant = make("full", n_kv_heads=1, head_dim=HD, length_scaled=True)
    with torch.no_grad():
        variant.ssmax_scale.copy_(torch.linspace(0.3, 1.4, H))  # a mix-up of heads shows
    n = 150
    q, k, v = qkv(2, n, 1)
    pos = torch.arange(n).expand(2, n)
    kwargs = dict(q_pos=pos, k_pos=pos, key_mask=None, causal=causal, score_bias=alibi_bias(torch.float32))
    calls = []
    monkeypatch.setattr(flex, "FLEX_DEVICES", ("cpu",))
    monkeypatch.setattr(type(variant), "flex", lambda self, *a, **kw: calls.append(1) or attention.AttentionVariant.flex(self, *a, **kw))
    with torch.no_grad():
        out = variant(q, k, v, **kwargs)
        expected = variant.dense(q, k, v, **kwargs)
    assert calls, "the FlexAttention path was not taken"
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@needs_cuda
@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("n_kv_heads", [4, 1], ids=["mha", "mqa"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "alibi"])
def test_flex_equals_dense_on_cuda(name, causal, n_kv_heads, bias):
    if name == "full" and not bias:
        pytest.skip("full attention without a bias stays on the SDPA kernel")
    variant = make(name, n_kv_heads=n_kv_heads, head_dim=HD, **VARIANTS[name]).cuda()
    n = 300
    q, k, v = qkv(2, n, n_kv_heads, device="cuda", grad=True)
    pos = torch.arange(n, device="cuda").expand(2, n)
    kwargs = dict(q_pos=pos, k_pos=pos, key_mask=None, causal=causal,
                  score_bias=alibi_bias(torch.float32).__self__.cuda().score_bias if bias else None)
    assert flex_applies(q, pos, pos, None)
    weight = torch.randn(2, H, n, HD, device="cuda")
    out = variant(q, k, v, **kwargs)
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
    ref = variant.dense(q, k, v, **kwargs)
    ref_grads = torch.autograd.grad((ref * weight).sum(), (q, k, v))
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


def t5_bias(causal: bool, device: str = "cpu"):
    """T5's learned bias (its table drawn at random, so buckets differ visibly), as a stack makes it."""
    from workbench.registry import variants

    cls = variants("position")["t5_bias"]
    scheme = cls(cls.Params(num_buckets=16, max_distance=64), d_model=H * HD, n_heads=H, head_dim=HD, causal=causal)
    torch.nn.init.normal_(scheme.table.weight, std=1.0)
    return scheme.to(device)


@pytest.mark.parametrize("name", ["full", "sliding_window"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_flex_adds_a_learned_bias_as_the_dense_path_does_on_cpu(name, causal, monkeypatch):
    """T5's bias through flex's score_mod (a table of every offset) equals the dense path's."""
    variant = make(name, n_kv_heads=1, head_dim=HD, **VARIANTS[name])
    n = 150
    q, k, v = qkv(2, n, 1)
    pos = torch.arange(n).expand(2, n)
    kwargs = dict(q_pos=pos, k_pos=pos, key_mask=None, causal=causal, score_bias=t5_bias(causal).score_bias)
    monkeypatch.setattr(flex, "FLEX_DEVICES", ("cpu",))
    assert flex_applies(q, pos, pos, None)
    with torch.no_grad():
        torch.testing.assert_close(variant(q, k, v, **kwargs), variant.dense(q, k, v, **kwargs), atol=1e-5, rtol=1e-5)


@needs_cuda
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_flex_gradient_reaches_a_learned_bias_on_cuda(causal):
    """The score_mod's table is computed from T5's parameters: their gradient equals dense's."""
    scheme = t5_bias(causal, "cuda")
    variant = make("sliding_window", n_kv_heads=4, head_dim=HD, window=40).cuda()
    n = 300
    q, k, v = qkv(2, n, 4, device="cuda")
    pos = torch.arange(n, device="cuda").expand(2, n)
    kwargs = dict(q_pos=pos, k_pos=pos, key_mask=None, causal=causal, score_bias=scheme.score_bias)
    weight = torch.randn(2, H, n, HD, device="cuda")
    grads = [torch.autograd.grad((path(q, k, v, **kwargs) * weight).sum(), scheme.table.weight)[0]
             for path in (variant, variant.dense)]
    torch.testing.assert_close(grads[0], grads[1], atol=2e-3, rtol=2e-3)
