"""Sliding-window, block-sparse (BigBird) and naive attention: each blocked fast path equals the
dense reference `dense()` (values and gradients), the patterns match their definitions, models
decode identically with and without a KV cache, and memory grows linearly in n."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import build, check_greedy_decoding, incremental_logits, tiny_spec, tokens

from workbench.model.transformer import SelfAttention
from workbench.registry import get_variant
from workbench_plugins.attention_sparse import random_blocks
from workbench_plugins.position_alibi import Alibi

H, HD = 4, 8


def make(name: str, n_kv_heads: int = H, head_dim: int = HD, **params):
    cls = get_variant("attention", name)
    return cls(cls.Params.model_validate(params), n_heads=H, n_kv_heads=n_kv_heads, head_dim=head_dim)


def inputs(B: int, n: int, n_kv_heads: int, padding: str, seed: int = 0, dtype=torch.float64):
    """q, k, v (requiring grad) and the positions / key mask a model gives a padded batch:
    row 1 is padded (left: 3 pads, right: 2 pads); with 'right', row 2 is all padding."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, HD, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(B, n_kv_heads, n, HD, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(B, n_kv_heads, n, HD, generator=g, dtype=dtype).requires_grad_()
    mask = None
    if padding != "none":
        mask = torch.ones(B, n, dtype=torch.bool)
        if padding == "left":
            mask[1, :3] = False
        else:
            mask[1, -2:] = False
            mask[2] = False
    pos = torch.arange(n).expand(B, n) if mask is None else (mask.cumsum(-1) - 1).clamp(min=0)
    return q, k, v, pos, mask


def alibi_bias(dtype=torch.float64):
    return Alibi(None, d_model=H * HD, n_heads=H, head_dim=HD).to(dtype).score_bias


def output_and_grads(fn, q, k, v, rows, **kwargs):
    """Output on real query rows, and gradients of a random projection of those rows."""
    out = fn(q, k, v, **kwargs) * rows[:, None, :, None]
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    return out, torch.autograd.grad((out * weight).sum(), (q, k, v))


# Sizes chosen so that n is not a multiple of the window / block, and windows cover 1, a few
# blocks and more than the whole sequence.
CONFIGS = {
    "sliding_window": [dict(window=1), dict(window=3), dict(window=5), dict(window=40)],
    "sparse": [dict(block=2), dict(block=3, n_global_blocks=2, n_random_blocks=2, seed=7),
               dict(block=2, n_global_blocks=0, n_random_blocks=3), dict(block=4, n_random_blocks=0),
               dict(block=1, n_random_blocks=2)],
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "alibi"])
def test_blocked_path_equals_dense(name, causal, n_kv_heads, padding, bias):
    for (i, params), n in itertools.product(enumerate(CONFIGS[name]), (13, 4)):
        attention = make(name, n_kv_heads, scaled=i % 2 == 0, **params)  # both, across configs
        q, k, v, pos, mask = inputs(3, n, n_kv_heads, padding)
        kwargs = dict(q_pos=pos, k_pos=pos, key_mask=mask, causal=causal,
                      score_bias=alibi_bias() if bias else None)
        # Padding queries are zeros on the blocked path (nothing reads them): compare real rows.
        rows = torch.ones(3, n, dtype=torch.bool) if mask is None else mask
        fast, fast_grads = output_and_grads(attention.forward, q, k, v, rows, **kwargs)
        ref, ref_grads = output_and_grads(attention.dense, q, k, v, rows, **kwargs)
        torch.testing.assert_close(fast, ref, atol=1e-10, rtol=1e-10, msg=f"{params} n={n}")
        for a, b in zip(fast_grads, ref_grads):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=f"grad {params} n={n}")
            assert torch.isfinite(a).all()


@pytest.mark.parametrize("padding", ["none", "left"])
def test_sparse_decode_step_gathers_only_its_blocks(padding):
    """A decoding step (one query against a cache of all positions) equals dense attention
    over the whole cache, and never touches the values of keys outside its pattern (NaN there
    would poison a computation over the whole cache)."""
    attention = make("sparse", 2, block=2, n_global_blocks=1, n_random_blocks=2)
    q, k, v, pos, mask = inputs(3, 15, 2, padding)
    q, k, v = q.detach(), k.detach(), v.detach()
    real = torch.ones(3, 15, dtype=torch.bool) if mask is None else mask
    for t in (0, 5, 14):
        kwargs = dict(q_pos=pos[:, t : t + 1].clone(), k_pos=pos[:, : t + 1], key_mask=None if mask is None else mask[:, : t + 1],
                      causal=True, score_bias=alibi_bias())
        step = attention(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], **kwargs)
        ref = attention.dense(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], **kwargs)
        rows = real[:, t : t + 1, None]  # [B, 1, 1]: real query rows
        torch.testing.assert_close(step * rows[:, None], ref * rows[:, None])
        unread = ~attention.allowed(pos[:, None, t : t + 1, None], pos[:, None, None, : t + 1], causal=True)[:, :, 0]
        unread = unread.view(3, 2, H // 2, t + 1).all(2)  # [B, h_kv, t+1]: no query head of the group reads it
        poisoned = v[:, :, : t + 1].masked_fill(unread[..., None], float("nan"))
        step = attention(q[:, :, t : t + 1], k[:, :, : t + 1], poisoned, **kwargs)
        assert torch.isfinite(step[real[:, t]]).all()


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_at_least_n_equals_full(causal):
    q, k, v, pos, mask = inputs(3, 11, 2, "right", dtype=torch.float32)
    kwargs = dict(q_pos=pos, k_pos=pos, key_mask=mask, causal=causal, score_bias=None)
    full = make("full", 2)(q, k, v, **kwargs)
    for window in (11, 12, 100):
        local = make("sliding_window", 2, window=window)(q, k, v, **kwargs)
        torch.testing.assert_close(local * mask[:, None, :, None], full * mask[:, None, :, None])


def test_naive_equals_full():
    q, k, v, pos, mask = inputs(3, 9, 1, "left", dtype=torch.float32)
    for causal, bias in itertools.product((True, False), (None, alibi_bias(torch.float32))):
        kwargs = dict(q_pos=pos, k_pos=pos, key_mask=mask, causal=causal, score_bias=bias)
        torch.testing.assert_close(make("naive", 1)(q, k, v, **kwargs), make("full", 1)(q, k, v, **kwargs))


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_locality(causal):
    """Changing a key/value outside the window leaves a query's output unchanged; inside, it changes."""
    window, n, t = 4, 20, 10
    attention = make("sliding_window", 2, window=window)
    q, k, v, pos, _ = inputs(1, n, 2, "none", dtype=torch.float32)
    kwargs = dict(q_pos=pos, k_pos=pos, key_mask=None, causal=causal, score_bias=None)
    base = attention(q, k, v, **kwargs)[:, :, t]
    inside = range(t - window + 1, t + 1) if causal else range(t - window + 1, t + window)
    for s in range(n):
        k2, v2 = k.detach().clone(), v.detach().clone()
        k2[:, :, s] += 1.0
        v2[:, :, s] += 1.0
        changed = not torch.allclose(attention(q, k2, v2, **kwargs)[:, :, t], base)
        assert changed == (s in inside), f"key {s} for query {t}: changed={changed}"


def test_sparse_pattern_by_hand():
    """block 2, one global block, no random block, n = 8 (blocks 0..3)."""
    attention = make("sparse", block=2, n_global_blocks=1, n_random_blocks=0)
    p = torch.arange(8)
    causal = [  # query block i reads blocks 0 (global), i-1, i; causal inside
        "1.......",
        "11......",
        "111.....",
        "1111....",
        "11111...",  # block 2 reads blocks 0 (global), 1, 2
        "111111..",
        "11..111.",  # block 3 reads 0, 2, 3: not block 1
        "11..1111",
    ]
    bidirectional = [  # block 0 is global: its queries read everything
        "11111111",
        "11111111",
        "111111..",  # block 1 reads 0, 1, 2
        "111111..",
        "11111111",  # block 2 reads 0 (global), 1, 2, 3
        "11111111",
        "11..1111",  # block 3 reads 0, 2, 3
        "11..1111",
    ]
    for is_causal, rows in ((True, causal), (False, bidirectional)):
        expected = torch.tensor([[c == "1" for c in row] for row in rows])
        assert torch.equal(attention.allowed(p[:, None], p[None, :], is_causal), expected.expand(H, 8, 8))


def test_sparse_random_blocks_follow_their_definition():
    """Causal: query block i draws min(r, candidates) distinct blocks among g .. i-2, depending
    only on (key, i): the same for any sequence length, different for another key.
    Bidirectional: among g .. N-1 except i-1, i, i+1, from both sides of i."""
    g, r, N = 1, 2, 40
    blocks = torch.arange(N)
    drawn, valid = random_blocks(blocks, r, g, key=0)
    for i in range(N):
        chosen = drawn[i][valid[i]].tolist()
        assert len(chosen) == min(r, max(0, i - 1 - g)) == len(set(chosen))
        assert all(g <= j <= i - 2 for j in chosen)
    prefix, prefix_valid = random_blocks(blocks[:15], r, g, key=0)
    assert torch.equal(prefix[prefix_valid], drawn[:15][valid[:15]])
    other, _ = random_blocks(blocks, r, g, key=1)
    assert not torch.equal(other[valid], drawn[valid])

    both, both_valid = random_blocks(blocks, r, g, key=0, n_blocks=N)
    later = 0
    for i in range(N):
        candidates = {j for j in range(g, N) if abs(j - i) >= 2}
        chosen = both[i][both_valid[i]].tolist()
        assert len(chosen) == min(r, len(candidates)) == len(set(chosen)) and set(chosen) <= candidates
        later += sum(j > i for j in chosen)
    assert 0.25 * r * N < later < 0.75 * r * N  # both sides, not only the past

    # allowed() reads exactly each head's drawn blocks besides local and global ones
    attention = make("sparse", block=1, n_global_blocks=g, n_random_blocks=r)
    for causal in (True, False):
        reads = attention.allowed(blocks[:, None], blocks[None, :], causal=causal)  # [h, N, N]
        assert reads.shape == (H, N, N)
        for head, key in enumerate(attention.head_keys()):
            mine, mine_valid = random_blocks(blocks, r, g, key=key, n_blocks=None if causal else N)
            for i in range(g if not causal else 0, N):  # bidirectional global rows read every key
                far = {j for j in range(g, N) if abs(j - i) >= 2 and reads[head, i, j]}
                assert far == set(mine[i][mine_valid[i]].tolist()), (causal, head, i)


def sparse_patterns(model, n: int, causal: bool) -> list[torch.Tensor]:
    """allowed() of every layer's variant at positions 0..n-1: [h, n, n] each."""
    p = torch.arange(n)
    layers = [m.variant for m in model.modules() if isinstance(m, SelfAttention)]
    return [variant.allowed(p[:, None], p[None, :], causal) for variant in layers]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_sparse_random_blocks_differ_per_layer_and_head_and_stay_fixed(causal):
    """BigBird draws random blocks per layer and per head; the draw never changes during the
    model's life (calls, train/eval) and comes back with a checkpoint."""
    spec = tiny_spec("decoder" if causal else "encoder", n_layers=2,
                     attention={"name": "sparse", "block": 2, "n_global_blocks": 1, "n_random_blocks": 2})
    model = build(spec)
    first, second = sparse_patterns(model, 48, causal)
    assert any(not torch.equal(first[0], first[h]) for h in range(1, first.shape[0])), "heads share one draw"
    assert not torch.equal(first, second), "layers share one draw"
    model.train()
    assert all(torch.equal(a, b) for a, b in zip(sparse_patterns(model, 48, causal), (first, second)))
    other = build(spec, seed=1)
    assert not torch.equal(sparse_patterns(other, 48, causal)[0], first)  # another run, another graph
    other.load_state_dict(model.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(sparse_patterns(other, 48, causal), (first, second)))


ATTENTIONS = {
    "sliding_window": {"name": "sliding_window", "window": 3},
    "sparse": {"name": "sparse", "block": 2, "n_global_blocks": 1, "n_random_blocks": 1},
}


@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_cached_decoding_equals_uncached(attention, family, position):
    model = build(tiny_spec(family, attention=ATTENTIONS[attention], position=position, n_kv_heads=2))
    x = tokens(2, 7)
    check_greedy_decoding(model, x, max_new_tokens=9)  # past the window and several blocks
    # teacher-forced logits == logits of step-by-step decoding through the cache
    target = tokens(2, 12, seed=1)
    with torch.no_grad():
        if family == "decoder":
            full, steps = model(target), incremental_logits(model, target, prefill=3)
        else:
            full, steps = model(x, target), incremental_logits(model, target, prefill=3, src=x)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
def test_left_padded_prompts_decode_as_alone(attention):
    model = build(tiny_spec("decoder", attention=ATTENTIONS[attention], position="alibi", n_kv_heads=1))
    short, long = tokens(1, 4, seed=2), tokens(1, 9, seed=3)
    batch = torch.cat([torch.cat([torch.zeros(1, 5, dtype=torch.long), short], 1), long])
    mask = batch != 0
    for use_cache in (True, False):
        out = model.generate(batch, max_new_tokens=6, use_cache=use_cache, padding_mask=mask)
        alone = model.generate(short, max_new_tokens=6, use_cache=use_cache)
        assert torch.equal(out[0, 5:], alone[0])


def test_sliding_window_cache_keeps_window_positions():
    window = 4
    spec = tiny_spec("decoder", attention={"name": "sliding_window", "window": window}, n_kv_heads=2)
    model = build(spec)
    model.generate(tokens(3, 3), max_new_tokens=8, strategy="greedy", use_cache=True)
    layer = model.last_cache.self_attn[0]
    head_dim = spec["d_model"] // spec["n_heads"]
    assert layer.filled == window
    assert layer.nbytes == 2 * 3 * 2 * window * head_dim * 4  # K and V, B=3, 2 KV heads, float32


def saved_bytes(attention, n: int, causal: bool) -> int:
    """Bytes of the tensors autograd saves for backward in one attention call."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    q, k, v, pos, _ = inputs(1, n, 1, "none", dtype=torch.float32)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        attention(q, k, v, q_pos=pos, k_pos=pos, key_mask=None, causal=causal, score_bias=alibi_bias(torch.float32))
    return total


@pytest.mark.parametrize("causal", [True, False])
def test_memory_grows_linearly(causal):
    """n x4 -> saved bytes x4 for the blocked variants (O(n * w)), x16 for naive (O(n^2))."""
    linear = [make("sliding_window", 1, window=64), make("sparse", 1, block=32, n_global_blocks=1, n_random_blocks=1)]
    for attention in linear:
        ratio = saved_bytes(attention, 2048, causal) / saved_bytes(attention, 512, causal)
        assert 3.5 < ratio < 4.5, f"{attention.name}: saved bytes x{ratio:.1f} for n x4"
    naive = make("naive", 1)
    assert saved_bytes(naive, 2048, causal) / saved_bytes(naive, 512, causal) > 12
