"""Scalable-Softmax (`full` attention with `length_scaled: true`, Nakanishi 2025): each query's
scores times s * log(n), n the keys it reads. The fused path, the dense reference (heatmaps),
padding, causality and cached decoding must all count n the same way."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from conftest import build, check_causal, check_greedy_decoding, incremental_logits, tiny_spec, tokens
from workbench_plugins.attention_full import SSMAX_INIT, FullAttention, FullAttentionParams  # as registered

SSMAX = {"name": "full", "length_scaled": True}
TIGHT = dict(atol=1e-5, rtol=1e-5)


def variant(n_heads=4, n_kv_heads=2, head_dim=8) -> FullAttention:
    attention = FullAttention(FullAttentionParams(length_scaled=True), n_heads=n_heads, n_kv_heads=n_kv_heads,
                              head_dim=head_dim)
    with torch.no_grad():  # heads with different s, so a mix-up of heads shows
        attention.ssmax_scale.copy_(torch.linspace(0.2, 1.5, n_heads))
    return attention


def test_s_starts_at_the_papers_value_and_is_learned_per_head():
    model = build(tiny_spec("decoder", attention=SSMAX, n_heads=4))
    scales = [p for name, p in model.named_parameters() if name.endswith("ssmax_scale")]
    assert len(scales) == model.spec.n_layers and all(p.requires_grad for p in scales)
    assert all(torch.equal(p, torch.full((4,), SSMAX_INIT)) for p in scales)


@pytest.mark.parametrize("causal", [False, True])
def test_scores_are_s_log_n_times_the_plain_ones(causal):
    """Against a softmax computed by hand: n = 9 keys for every encoder row, n = t + 1 for the
    causal row of position t."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 8, generator=g) for _ in range(3))
    attention = variant(n_kv_heads=4)
    pos = torch.arange(9).expand(2, 9)
    out = attention(q, k, v, q_pos=pos, k_pos=pos, key_mask=None, causal=causal, score_bias=None)
    n = torch.arange(1, 10.0).view(1, 1, 9, 1) if causal else torch.tensor(9.0)
    factor = attention.ssmax_scale.view(1, 4, 1, 1) * n.log()
    scores = factor * (q @ k.transpose(-2, -1)) / math.sqrt(8)
    if causal:
        scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    assert_close(out, torch.softmax(scores, -1) @ v, **TIGHT)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("left_padding", [0, 3])
def test_the_fused_path_equals_the_dense_reference(causal, left_padding):
    g = torch.Generator().manual_seed(1)
    B, n = 2, 10
    q = torch.randn(B, 4, n, 8, generator=g)
    k, v = (torch.randn(B, 2, n, 8, generator=g) for _ in range(2))
    key_mask = None
    pos = torch.arange(n).expand(B, n)
    if left_padding:
        key_mask = torch.ones(B, n, dtype=torch.bool)
        key_mask[1, :left_padding] = False
        pos = (pos - torch.tensor([[0], [left_padding]])).clamp_min(0)
    attention = variant()
    kw = dict(q_pos=pos, k_pos=pos, key_mask=key_mask, causal=causal, score_bias=None)
    fused, dense = attention(q, k, v, **kw), attention.dense(q, k, v, **kw)
    real = slice(left_padding, None)  # padding queries read nothing: their rows are not compared
    assert_close(fused[1, :, real], dense[1, :, real], **TIGHT)
    assert_close(fused[0], dense[0], **TIGHT)


def test_a_longer_input_does_not_flatten_attention_as_plain_softmax_does():
    """One key matches the query (score a = 3), n - 1 score 0: the plain softmax's weight on it,
    e^a / (e^a + n - 1), falls towards 0 as n grows; scaled, it is n^(s a) / (n^(s a) + n - 1),
    which grows with n when s a > 1 (here s = 1 / log 8, equal to the plain one at n = 8)."""
    def weight_on_match(length_scaled: bool, n: int) -> float:
        attention = FullAttention(FullAttentionParams(length_scaled=length_scaled), n_heads=1, n_kv_heads=1,
                                  head_dim=4)
        if length_scaled:
            with torch.no_grad():
                attention.ssmax_scale.fill_(1 / math.log(8))
        q = torch.tensor([[[[6.0, 0, 0, 0]]]])  # score 6 / sqrt(4) = 3
        k = torch.zeros(1, 1, n, 4)
        k[0, 0, 0, 0] = 1.0
        v = torch.zeros(1, 1, n, 4)
        v[0, 0, 0, 1] = 1.0  # the output's dimension 1 is the weight on the matching key
        pos_k = torch.arange(n)[None]
        out = attention(q, k, v, q_pos=torch.zeros(1, 1, dtype=torch.long), k_pos=pos_k, key_mask=None,
                        causal=False, score_bias=None)
        return float(out[0, 0, 0, 1].detach())

    plain = [weight_on_match(False, n) for n in (8, 64, 512)]
    scaled = [weight_on_match(True, n) for n in (8, 64, 512)]
    assert plain[0] > plain[1] > plain[2] and plain[2] < 0.1
    assert scaled[0] == pytest.approx(plain[0]) and scaled[0] < scaled[1] < scaled[2]


@pytest.mark.parametrize("position", ["rope", "alibi", "learned"])
def test_a_decoder_with_it_is_causal_and_decodes_from_its_cache_as_it_trains(position):
    model = build(tiny_spec("decoder", attention=SSMAX, position=position, n_layers=2))
    with torch.no_grad():
        scaled = [m for m in model.modules() if isinstance(m, FullAttention)]
        assert len(scaled) == 2  # the heads get different s, so a mix-up of heads shows
        for m in scaled:
            m.ssmax_scale.copy_(torch.linspace(0.3, 1.2, m.n_heads))
        check_causal(model)
        tgt = tokens(2, 11)
        for prefill in (1, 4):
            assert_close(incremental_logits(model, tgt, prefill), model(tgt), **TIGHT)
    check_greedy_decoding(model, tokens(3, 5), max_new_tokens=10)


def test_padding_changes_nothing_for_real_tokens():
    model = build(tiny_spec("encoder", attention=SSMAX, n_layers=2))
    x = tokens(2, 9)
    junk = tokens(2, 4, seed=77)
    mask = torch.cat([torch.ones(2, 9, dtype=torch.bool), torch.zeros(2, 4, dtype=torch.bool)], 1)
    with torch.no_grad():
        assert_close(model(torch.cat([x, junk], 1), padding_mask=mask)[:, :9], model(x), **TIGHT)
