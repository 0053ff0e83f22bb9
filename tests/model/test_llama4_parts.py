"""Llama 4's two parts beyond the MoE: chunked attention (a query reads its own chunk; O(n * chunk)
by blocks; a decoding cache of one chunk) and NoPE with attention temperature tuning (queries
scaled by their position's log). The registry's contract tests cover both as every variant
(fast path equal to the dense reference, causality, cached decoding equal to the full forward);
these pin what only they do. Their parity with transformers: tests/model/test_hf_parity_moe.py."""

from __future__ import annotations

import math

import torch
from torch.testing import assert_close

from conftest import build, check_greedy_decoding, tiny_spec, tokens
from workbench.model.transformer import Positions
from workbench_plugins import attention_chunked  # as registered
from workbench_plugins.attention_chunked import ChunkedAttention, ChunkedParams
from workbench_plugins.position_nope_temperature import NopeTemperature, NopeTemperatureParams


def chunked(chunk: int, n_heads: int = 4, n_kv_heads: int = 2) -> ChunkedAttention:
    return ChunkedAttention(ChunkedParams(chunk=chunk), n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=8)


def test_a_query_reads_the_keys_of_its_own_chunk():
    pos = torch.arange(11)
    allowed = chunked(4).allowed(pos[:, None], pos[None, :], causal=True)
    expected = [[k <= q and k // 4 == q // 4 for k in range(11)] for q in range(11)]
    assert allowed.tolist() == expected  # 0-3, 4-7, 8-10: the first query of a chunk reads itself only
    both_ways = chunked(4).allowed(pos[:, None], pos[None, :], causal=False)
    assert both_ways.tolist() == [[k // 4 == q // 4 for k in range(11)] for q in range(11)]


def test_the_blocked_path_reads_one_block_per_query_block_when_chunks_align(monkeypatch):
    """O(n * chunk): each block of `chunk` queries reads its own block of keys; a left-padded row
    whose chunks start off the block grid makes every query block read the block before too."""
    read = []

    def recording(*args, **kwargs):
        read.append(kwargs["kv_blocks"].shape[1])
        return block_attention(*args, **kwargs)

    block_attention = attention_chunked.block_attention
    monkeypatch.setattr(attention_chunked, "block_attention", recording)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 16, 8, generator=g) for h in (4, 2, 2))
    variant = chunked(4)
    for mask in (None, torch.arange(16).expand(2, 16) >= torch.tensor([[0], [3]])):  # row 1: 3 padding tokens
        seq = Positions.of(torch.zeros(2, 16, dtype=torch.long), mask)
        kwargs = dict(q_pos=seq.pos, k_pos=seq.pos, key_mask=seq.mask, causal=True, score_bias=None)
        real = torch.ones(2, 16, dtype=torch.bool) if mask is None else mask
        assert_close(variant(q, k, v, **kwargs) * real[:, None, :, None],
                     variant.dense(q, k, v, **kwargs) * real[:, None, :, None], atol=1e-6, rtol=1e-6)
    assert read == [1, 2]


def test_decoding_keeps_one_chunk_of_keys_and_equals_the_full_forward():
    spec = tiny_spec("decoder", n_layers=2, n_kv_heads=2, attention={"name": "chunked", "chunk": 4})
    model = build(spec)
    check_greedy_decoding(model, tokens(2, 6), max_new_tokens=13)  # 19 positions: four chunk boundaries
    model.generate(tokens(2, 6), max_new_tokens=13)
    layer = model.last_cache.self_attn[0]
    assert layer.filled == 4
    attn = model.decoder.blocks[0].attn
    # K and V, 2 K/V heads of width 4, 4 positions (one chunk), 2 rows, float32
    assert layer.nbytes == attn.cache_bytes(19, 2, 4) == 2 * 2 * 4 * 4 * 2 * 4


def test_nope_temperature_scales_each_query_by_the_log_of_its_position():
    scheme = NopeTemperature(NopeTemperatureParams(floor_scale=4, attn_scale=0.5), d_model=32, n_heads=4, head_dim=8)
    q, k = torch.ones(1, 4, 12, 8, dtype=torch.float64), torch.ones(1, 2, 12, 8, dtype=torch.float64)
    pos = torch.arange(12)[None]
    scaled_q, same_k = scheme.rotate(q, k, pos, pos)
    assert same_k is k  # keys are left as they are
    factor = [1.0] * 3 + [1 + 0.5 * math.log(2)] * 4 + [1 + 0.5 * math.log(3)] * 4 + [1 + 0.5 * math.log(4)]
    assert_close(scaled_q[0, :, :, 0], torch.tensor(factor, dtype=torch.float64).expand(4, 12))
    one_step, _ = scheme.rotate(q[:, :, :1], k[:, :, :1], pos[:, 7:8], pos[:, 7:8])  # a decoding step at position 7
    assert_close(one_step[0, 0, 0, 0].item(), factor[7])


def test_llama4_layer_pattern_decodes_as_it_forwards():
    spec = tiny_spec("decoder", n_layers=4, n_kv_heads=2,
                     position={"repeat": ["rope", "rope", "rope", {"name": "nope_temperature", "floor_scale": 2}]},
                     attention={"repeat": [{"name": "chunked", "chunk": 3, "qk_norm": "head",
                                            "qk_norm_gain": False}] * 3 + ["full"]},
                     ffn={"repeat": ["swiglu", {"name": "moe", "n_experts": 4, "top_k": 1, "router": "sigmoid",
                                                "normalize": False, "weight_inputs": True, "shared": "swiglu"}]})
    check_greedy_decoding(build(spec), tokens(2, 5), max_new_tokens=10)
