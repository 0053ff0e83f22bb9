"""The exact properties P1-P13 of CLAIMS.md, each checked numerically on tiny models.

Where a property should hold for every variant of an axis (causality, padding, caching),
the test is parametrized over the registry, so a new plugin is held to it automatically.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from conftest import (
    FAMILIES,
    GENERATIVE,
    build,
    check_causal,
    check_greedy_decoding,
    generate,
    incremental_logits,
    logits_of,
    build_or_refuse,
    registered,
    registered_kernels,
    tiny_spec,
    tokens,
)
from workbench.model.transformer import Positions, SelfAttention, record_attention
from workbench.model.position import INIT_STD

ATTENTION = registered("attention")
POSITIONS = registered("position")
TIGHT = dict(atol=1e-5, rtol=1e-5)  # "equal to float tolerance" for float32 logits of size ~0.1


def assert_differs(a: torch.Tensor, b: torch.Tensor, by: float = 1e-4) -> None:
    """Sanity half of each property: the change we make is visible where it should be."""
    assert (a - b).abs().max() > by, "the perturbation had no effect: the test would prove nothing"


def capture_qkv(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]]:
    """Record (q, k, v, kwargs) as each self-attention layer hands them to its variant."""
    calls = []
    for m in model.modules():
        if isinstance(m, SelfAttention):
            m.variant.register_forward_pre_hook(
                lambda _mod, args, kwargs: calls.append((*args, kwargs)), with_kwargs=True
            )
    return calls


# ---- P1: NoPE encoder is permutation-equivariant; every position scheme breaks it ---------


def encoder_rows_under_permutation(position: str, perm: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output of the permuted input, permuted output) of a 2-layer encoder; a random
    permutation of 10 tokens unless `perm` is given."""
    model = build(tiny_spec("encoder", position=position, n_layers=2))
    # At init the blocks add ~1% to a unit-RMS token stream with near-uniform attention, so a
    # scheme acting inside attention (RoPE) moves the output by ~1e-5; larger attention
    # weights make every scheme's effect plain (equivariance must hold for any weights).
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, SelfAttention):
                m.qkv.weight.mul_(10)
                m.out.weight.mul_(10)
    x = tokens(2, 10)
    if perm is None:
        perm = torch.randperm(10, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model.encode(x[:, perm]), model.encode(x)[:, perm]


def test_p1_nope_encoder_is_permutation_equivariant():
    permuted_output, output_permuted = encoder_rows_under_permutation("none")
    assert_close(permuted_output, output_permuted, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", [p for p in POSITIONS if p != "none"])
def test_p1_every_position_scheme_breaks_permutation_equivariance(position):
    permuted_output, output_permuted = encoder_rows_under_permutation(position)
    assert_differs(permuted_output, output_permuted, by=1e-3)


# ALiBi's penalty -slope * |i - j| is the same for a key on either side: an encoder with it is
# equivariant to reversing the input, so it cannot tell a left neighbour from a right one (the
# position-direction study's ALiBi group). Schemes that tell sides break the symmetry.
REVERSAL = torch.arange(9, -1, -1)


def test_alibi_encoder_is_reversal_equivariant():
    reversed_output, output_reversed = encoder_rows_under_permutation("alibi", REVERSAL)
    assert_close(reversed_output, output_reversed, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", [p for p in POSITIONS if p not in ("none", "alibi")])
def test_every_other_position_scheme_tells_left_from_right(position):
    reversed_output, output_reversed = encoder_rows_under_permutation(position, REVERSAL)
    assert_differs(reversed_output, output_reversed, by=1e-3)


# ---- P2: sinusoidal encoding is the formula; low dimensions change fast -------------------


def test_p2_sinusoidal_matches_the_formula_and_is_what_the_model_adds():
    d, n = 32, 40
    model = build(tiny_spec("encoder", position="sinusoidal", d_model=d))
    expected = torch.tensor(
        [
            [
                math.sin(p / 10000 ** (2 * (j // 2) / d)) if j % 2 == 0 else math.cos(p / 10000 ** (2 * (j // 2) / d))
                for j in range(d)
            ]
            for p in range(n)
        ]
    )
    # What the first block receives minus the token embedding is the encoding itself.
    seen = []
    model.encoder.blocks[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    x = tokens(1, n)
    with torch.no_grad():
        model.encode(x)
        added = seen[0][0] - model.embedding(x)[0]
    assert_close(added, INIT_STD * expected, atol=1e-7, rtol=1e-5)  # at the tokens' scale


def test_p2_per_dimension_change_between_neighbours_decreases_with_i():
    d = 32
    model = build(tiny_spec("encoder", position="sinusoidal", d_model=d))
    pos = torch.arange(1001)[None]
    pe = model.encoder.position.embed(torch.zeros(1, 1001, d), pos)[0].double() / INIT_STD  # [n, d], amplitude 1
    step = pe[1:] - pe[:-1]
    # Pair i = dimensions (2i, 2i+1) moves along a circle by the angle w_i = 10000^(-2i/d):
    # the step length is 2 sin(w_i / 2) at every position.
    pair_step = step.view(1000, d // 2, 2).norm(dim=-1).mean(0)  # [d/2]
    w = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    assert_close(pair_step, 2 * torch.sin(w / 2), atol=1e-5, rtol=1e-4)
    assert (pair_step[1:] < pair_step[:-1]).all(), pair_step
    # And per single dimension, averaged over positions: still decreasing with i.
    per_dim = step.abs().mean(0)[0::2]
    assert (per_dim[1:] < per_dim[:-1]).all(), per_dim


# ---- additive position signals start at the scale of the token embeddings ----------------


def position_and_token_parts(position: dict | str, d: int, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The first block's input of a model with `position` minus that of the same model with
    `none` (same weights: a learned table draws from the RNG, so it is copied, not re-seeded),
    and the latter (the token embeddings as the blocks see them)."""
    inputs = []
    for scheme in (position, "none"):
        model = build(tiny_spec("encoder", position=scheme, d_model=d, n_layers=1))
        if inputs:
            model.load_state_dict(weights, strict=False)  # all but the scheme's own table
        weights = model.state_dict()
        model.encoder.blocks[0].register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
        with torch.no_grad():
            model.encode(tokens(2, n))
    with_position, tokens_only = inputs
    return with_position - tokens_only, tokens_only


def rms(x: torch.Tensor) -> float:
    return float(x.pow(2).mean().sqrt())


@pytest.mark.parametrize("d", [32, 64, 256, 1024])
@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_additive_position_signal_is_at_the_token_scale_at_init(position, d):
    """The position part of the first block's input (scheme minus `none`, same seed, so the
    same token embeddings) has an RMS within 0.3x-3x of the token part, at every width."""
    position_part, token_part = position_and_token_parts(position, d)
    ratio = rms(position_part) / rms(token_part)
    assert 0.3 <= ratio <= 3, f"{position} at d_model {d}: position RMS / token RMS = {ratio:.3g}"


def test_the_unscaled_sinusoid_ablation_does_what_its_param_says():
    d = 256
    sinusoid, token_part = position_and_token_parts({"name": "sinusoidal", "scale": 50.0}, d)
    assert rms(sinusoid) / rms(token_part) == pytest.approx(50 / math.sqrt(2), rel=0.1)  # the old ~35x


# ---- P3: RoPE scores depend only on the offset ---------------------------------------------


def test_p3_rope_score_depends_only_on_relative_offset():
    model = build(tiny_spec(position="rope", d_model=32, n_heads=2))
    rope = model.decoder.position
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 1, 16, generator=g), torch.randn(1, 2, 1, 16, generator=g)

    def score(m: int, n: int) -> torch.Tensor:
        qr, kr = rope.rotate(q, k, torch.tensor([[m]]), torch.tensor([[n]]))
        return (qr * kr).sum(-1)  # [1, h, 1]

    for m, n in [(0, 0), (5, 2), (2, 5), (7, 0)]:
        for t in (1, 13, 200):
            assert_close(score(m + t, n + t), score(m, n), atol=1e-4, rtol=1e-4)
    assert_differs(score(5, 2), score(5, 3))


@pytest.mark.parametrize("position", ["rope", "alibi", "none"])
def test_p3_relative_schemes_ignore_a_shift_of_all_positions(position):
    """Model-level consequence: a decoder with a relative (or no) scheme computes the same
    logits whatever position the sequence starts at."""
    model = build(tiny_spec(position=position, n_layers=2))
    x = tokens(2, 8)
    pos = torch.arange(8).expand(2, 8)
    with torch.no_grad():
        at_zero = model.decoder(x, Positions(pos, None))
        shifted = model.decoder(x, Positions(pos + 37, None))
    assert_close(shifted, at_zero, atol=1e-4, rtol=1e-4)


def test_p3_absolute_schemes_see_a_shift():
    for position in ("sinusoidal", "learned"):
        model = build(tiny_spec(position=position, n_layers=2))
        x = tokens(2, 8)
        pos = torch.arange(8).expand(2, 8)
        with torch.no_grad():
            assert_differs(model.decoder(x, Positions(pos + 37, None)), model.decoder(x, Positions(pos, None)))


# ---- P4: ALiBi slopes and biases ----------------------------------------------------------


def press_reference_slopes(n: int) -> list[float]:
    """`get_slopes` from the ALiBi paper's reference code (ofirpress/attention_with_linear_biases)."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + press_reference_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def alibi_of(n_heads: int):
    return build(tiny_spec("encoder", position="alibi", n_heads=n_heads, d_model=4 * n_heads)).encoder.position


@pytest.mark.parametrize("h", [1, 2, 4, 8, 16])
def test_p4_alibi_slopes_are_the_geometric_sequence(h):
    expected = torch.tensor([2 ** (-8 * (k + 1) / h) for k in range(h)])
    assert_close(alibi_of(h).slopes, expected)


@pytest.mark.parametrize("h", [3, 5, 6, 12])
def test_p4_alibi_slopes_for_other_head_counts_follow_the_reference_code(h):
    assert_close(alibi_of(h).slopes, torch.tensor(press_reference_slopes(h)))


def test_p4_alibi_bias_is_minus_slope_times_distance():
    alibi = alibi_of(8)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    bias = alibi.score_bias((i - j)[None, None])[0]  # [h, 6, 6]
    slopes = torch.tensor([2 ** (-(k + 1)) for k in range(8)])
    assert_close(bias, -slopes[:, None, None] * (i - j).abs().float())


@pytest.mark.parametrize("family", ["encoder", "decoder"])
def test_p4_alibi_reaches_the_attention_weights(family):
    """With zero Q/K projections every content score is 0: the weights are softmax(bias)."""
    model = build(tiny_spec(family, position="alibi", n_heads=4))
    attn = next(m for m in model.modules() if isinstance(m, SelfAttention))
    with torch.no_grad():
        attn.qkv.weight.zero_()
    with record_attention(model) as records, torch.no_grad():
        model(tokens(1, 6))
    weights = next(iter(records.values()))[0][0]  # [h, 6, 6]
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    slopes = torch.tensor([2 ** (-2 * (k + 1)) for k in range(4)])[:, None, None]
    scores = -slopes * (i - j).abs().float()
    if family == "decoder":
        scores = scores.masked_fill(j > i, float("-inf"))
    assert_close(weights, torch.softmax(scores, -1), atol=1e-6, rtol=1e-5)


# ---- P5: tied Q/K gives symmetric pre-softmax scores ---------------------------------------


def pre_softmax_scores(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Scores q k^T * scale (+ the position scheme's bias) exactly as the first layer's
    variant receives q and k."""
    calls = capture_qkv(model)
    with torch.no_grad():
        model(x)
    q, k, _, kw = calls[0]
    variant = next(m for m in model.modules() if isinstance(m, SelfAttention)).variant
    scores = (q @ k.transpose(-2, -1)) * variant.scale  # [B, h, n, n]
    if kw["score_bias"] is not None:
        scores = scores + kw["score_bias"]((kw["q_pos"][:, :, None] - kw["k_pos"][:, None, :])[:, None])
    return scores


@pytest.mark.parametrize("position", ["none", "sinusoidal", "rope", "alibi"])
def test_p5_tied_qk_scores_are_symmetric_and_untied_are_not(position):
    x = tokens(2, 9)
    tied = pre_softmax_scores(build(tiny_spec("encoder", position=position, tie_qk=True)), x)
    assert_close(tied, tied.transpose(-2, -1), atol=1e-6, rtol=1e-5)
    untied = pre_softmax_scores(build(tiny_spec("encoder", position=position)), x)
    assert_differs(untied, untied.transpose(-2, -1), by=1e-3)


def test_p5_tied_qk_drops_the_key_projection():
    d = 16
    tied = build(tiny_spec(tie_qk=True)).num_parameters()
    untied = build(tiny_spec()).num_parameters()
    assert untied - tied == d * d  # one d x (h * head_dim) matrix per layer, one layer


# ---- P6: causal mask --------------------------------------------------------------------


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", GENERATIVE)
def test_p6_future_tokens_never_change_past_outputs(family, attention, position):
    check_causal(build(tiny_spec(family, attention=attention, position=position, n_layers=2)))


def test_p6_decoder_of_encoder_decoder_reads_the_whole_source():
    model = build(tiny_spec("encoder_decoder", n_layers=2))
    src, tgt = tokens(2, 7, seed=5), tokens(2, 5)
    other = src.clone()
    other[:, -1] = (src[:, -1] + 1) % 30 + 2  # only the last source token changes
    with torch.no_grad():
        assert_differs(model(other, tgt)[:, 0], model(src, tgt)[:, 0])


# ---- P7: padding changes nothing for real tokens -------------------------------------------


def padded(x: torch.Tensor, extra: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, n] with `extra` junk tokens (not the pad id: a mask must do the work) on one side."""
    junk = tokens(x.shape[0], extra, seed=77)
    mask = torch.cat([torch.zeros_like(junk, dtype=torch.bool), torch.ones_like(x, dtype=torch.bool)], 1)
    if left:
        return torch.cat([junk, x], 1), mask
    return torch.cat([x, junk], 1), mask.flip(1)


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family,left", [("encoder", False), ("decoder", False), ("decoder", True)])
def test_p7_padding_changes_nothing_for_real_tokens(family, left, attention, position):
    model = build(tiny_spec(family, attention=attention, position=position, n_layers=2))
    x = tokens(2, 9)
    xp, mask = padded(x, 4, left)
    with torch.no_grad():
        plain = model(x)
        with_pad = model(xp, padding_mask=mask)
        without_mask = model(xp)
    real = with_pad[:, 4:] if left else with_pad[:, :9]
    assert_close(real, plain, **TIGHT)
    unmasked = without_mask[:, 4:] if left else without_mask[:, :9]
    if family == "encoder" or left:  # only there can junk reach real tokens when unmasked
        assert_differs(unmasked, plain)


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("attention", ATTENTION)
def test_p7_encoder_decoder_source_and_target_padding(attention, position):
    model = build(tiny_spec("encoder_decoder", attention=attention, position=position))
    src, tgt = tokens(2, 8, seed=3), tokens(2, 6)
    src_p, src_mask = padded(src, 3, left=False)
    tgt_p, tgt_mask = padded(tgt, 3, left=False)
    with torch.no_grad():
        plain = model(src, tgt)
        with_pad = model(src_p, tgt_p, src_padding_mask=src_mask, tgt_padding_mask=tgt_mask)
        src_unmasked = model(src_p, tgt)
    assert_close(with_pad[:, :6], plain, **TIGHT)
    assert_differs(src_unmasked, plain)


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("attention", ATTENTION)
def test_p7_left_padded_batched_generation_equals_one_prompt_at_a_time(attention, position):
    model = build(tiny_spec(attention=attention, position=position, n_layers=2))
    prompts = [tokens(1, n, seed=n)[0] for n in (3, 7, 5)]
    width = max(len(p) for p in prompts)
    batch = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, p in enumerate(prompts):
        batch[row, width - len(p) :], mask[row, width - len(p) :] = p, True
    for use_cache in (True, False):
        together = generate(model, batch, 6, use_cache, padding_mask=mask)[:, width:]
        for row, p in enumerate(prompts):
            alone = generate(model, p[None], 6, use_cache)[0, len(p) :]
            assert torch.equal(together[row], alone), (row, use_cache, together[row], alone)


@pytest.mark.parametrize("attention", ATTENTION)
def test_p7_right_padded_sources_translate_like_one_source_at_a_time(attention):
    model = build(tiny_spec("encoder_decoder", attention=attention, position="rope"))
    sources = [tokens(1, n, seed=n)[0] for n in (4, 8, 6)]
    batch = torch.zeros(3, 8, dtype=torch.long)
    mask = torch.zeros(3, 8, dtype=torch.bool)
    for row, s in enumerate(sources):
        batch[row, : len(s)], mask[row, : len(s)] = s, True
    together = generate(model, batch, 5, True, src_padding_mask=mask)
    for row, s in enumerate(sources):
        assert torch.equal(together[row], generate(model, s[None], 5, True)[0])


# ---- P8: teacher forcing == incremental decoding -------------------------------------------


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", GENERATIVE)
def test_p8_full_forward_logits_equal_incremental_logits(family, attention, position):
    model = build(tiny_spec(family, attention=attention, position=position, n_layers=2))
    src, tgt = tokens(2, 7, seed=4), tokens(2, 11)
    with torch.no_grad():
        full = logits_of(model, src, tgt) if family == "encoder_decoder" else model(tgt)
        for prefill in (1, 4):
            step = incremental_logits(model, tgt, prefill, src if family == "encoder_decoder" else None)
            assert_close(step, full, **TIGHT)


# ---- P9: cached decode == uncached decode; cache bytes formula -----------------------------


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", GENERATIVE)
def test_p9_cached_decode_equals_uncached_and_teacher_forced(family, attention, position):
    model = build(tiny_spec(family, attention=attention, position=position, n_layers=2))
    check_greedy_decoding(model, tokens(3, 5), max_new_tokens=10)


def expected_cache_bytes(model, layers: int, tokens_seen: int, batch: int, element: int) -> int:
    spec = model.spec
    window = model.decoder.blocks[0].attn.cache_window
    held = min(tokens_seen, window) if window else tokens_seen
    return 2 * layers * spec.n_kv_heads * spec.head_dim * held * batch * element


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("attention", registered_kernels())
@pytest.mark.parametrize("family", GENERATIVE)
def test_p9_cache_bytes_follow_the_formula(family, attention, n_kv_heads, dtype):
    layers, B, n, new = 2, 3, 5, 7
    model = build(tiny_spec(family, attention=attention, n_layers=layers, n_kv_heads=n_kv_heads)).to(dtype)
    generate(model, tokens(B, n), new, use_cache=True)
    element = torch.empty((), dtype=dtype).element_size()
    prefix = 1 if family == "encoder_decoder" else n  # the decoder starts from BOS
    assert model.last_cache.nbytes == expected_cache_bytes(model, layers, prefix + new, B, element)
    if family == "encoder_decoder":  # cross-attention K/V: the whole source, once per layer
        assert model.last_cache.cross_nbytes == 2 * layers * n_kv_heads * 4 * n * B * element


@pytest.mark.parametrize("family", GENERATIVE)
def test_p9_cache_bytes_count_tokens_held_not_slots_reserved(family):
    """Stopping at EOS leaves reserved slots empty: only the tokens stored are counted."""
    model = build(tiny_spec(family, n_layers=2))
    x = tokens(1, 5)
    first = generate(model, x, 1, use_cache=True)[0, -1].item()
    out = generate(model, x, 8, use_cache=True, eos_id=first)
    assert out.shape[1] == (6 if family == "decoder" else 2)  # stopped after one token
    held = 5 if family == "decoder" else 1  # the prompt (decoder) or BOS; EOS is never fed back
    assert model.last_cache.nbytes == expected_cache_bytes(model, 2, held, 1, 4)


# ---- P10: GQA/MQA shrink the cache; GQA with g == h is MHA ---------------------------------


@pytest.mark.parametrize("family", GENERATIVE)
def test_p10_cache_shrinks_by_heads_over_kv_heads(family):
    sizes = {}
    for g in (4, 2, 1):
        model = build(tiny_spec(family, n_kv_heads=g, n_layers=2))
        generate(model, tokens(2, 6), 4, use_cache=True)
        sizes[g] = model.last_cache.nbytes
    assert sizes[4] == 2 * sizes[2] == 4 * sizes[1]


def expand_kv_heads(state: dict, h: int, g: int, hd: int) -> dict:
    """Weights of a GQA model (g K/V heads) rewritten for an MHA model: each K/V head copied
    to the h/g query heads of its group."""
    out = {}
    for name, w in state.items():
        if name.endswith("qkv.weight") or name.endswith("qkv.bias"):
            q, k, v = w.split([h * hd, g * hd, g * hd])
            k, v = (t.unflatten(0, (g, hd)).repeat_interleave(h // g, 0).flatten(0, 1) for t in (k, v))
            w = torch.cat([q, k, v])
        elif name.endswith("kv.weight") or name.endswith("kv.bias"):
            k, v = w.split([g * hd, g * hd])
            k, v = (t.unflatten(0, (g, hd)).repeat_interleave(h // g, 0).flatten(0, 1) for t in (k, v))
            w = torch.cat([k, v])
        out[name] = w
    return out


@pytest.mark.parametrize("g", [2, 1])
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", FAMILIES)
def test_p10_gqa_equals_mha_with_shared_kv_weights(family, attention, g):
    gqa = build_or_refuse(tiny_spec(family, attention=attention, n_kv_heads=g, n_layers=2, bias=True))
    if gqa is None:
        pytest.skip(f"{attention} refuses {g} K/V heads")
    mha = build(tiny_spec(family, attention=attention, n_layers=2, bias=True), seed=1)
    mha.load_state_dict(expand_kv_heads(gqa.state_dict(), h=4, g=g, hd=4))
    x = tokens(2, 10)
    with torch.no_grad():
        assert_close(logits_of(mha, x), logits_of(gqa, x), **TIGHT)


@pytest.mark.parametrize("family", FAMILIES)
def test_p10_n_kv_heads_equal_to_n_heads_is_plain_mha(family):
    mha = build(tiny_spec(family))
    explicit = build(tiny_spec(family, n_kv_heads=4), seed=1)
    explicit.load_state_dict(mha.state_dict())  # strict: same parameters, same shapes
    x = tokens(2, 10)
    with torch.no_grad():
        assert_close(logits_of(explicit, x), logits_of(mha, x), atol=0, rtol=0)


# ---- P11: sliding window -----------------------------------------------------------------

needs_window = pytest.mark.skipif(
    "sliding_window" not in ATTENTION, reason="attention variant 'sliding_window' is not registered"
)


@needs_window
def test_p11_a_token_reads_only_the_last_w_positions():
    """One layer, window 3: the output at t depends on tokens t-2..t and on nothing earlier."""
    w, n = 3, 10
    model = build(tiny_spec(attention={"name": "sliding_window", "window": w}, position="none"))
    x = tokens(1, n)
    with torch.no_grad():
        base = model(x)
        for s in range(n - 1):
            y = x.clone()
            y[0, s] = (x[0, s] + 1 - 2) % 30 + 2
            changed = (model(y) - base).abs().amax(-1)[0] > 1e-6  # [n]
            reads_s = [(0 <= t - s < w) for t in range(n)]
            assert changed.tolist() == reads_s, (s, changed.tolist())


@needs_window
@pytest.mark.parametrize("family", FAMILIES)
def test_p11_window_at_least_n_equals_full_attention(family):
    n = 9
    full = build(tiny_spec(family, n_layers=2, n_kv_heads=2))
    x = tokens(2, n)
    with torch.no_grad():
        reference = logits_of(full, x)
        for w in (n, n + 5):
            local = build(tiny_spec(family, n_layers=2, n_kv_heads=2,
                                    attention={"name": "sliding_window", "window": w}))
            local.load_state_dict(full.state_dict())
            assert_close(logits_of(local, x), reference, **TIGHT)


@needs_window
def test_p11_cache_holds_only_the_window():
    w = 3
    model = build(tiny_spec(attention={"name": "sliding_window", "window": w}, n_layers=2))
    generate(model, tokens(2, 5), 8, use_cache=True)
    assert model.last_cache.nbytes == 2 * 2 * 4 * 4 * w * 2 * 4


# ---- P12: one projection reshaped into heads -----------------------------------------------


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("head_dim", [None, 8])
def test_p12_one_projection_reshaped_into_heads(n_kv_heads, head_dim):
    d, h, B, n = 16, 4, 2, 7
    model = build(tiny_spec("encoder", n_kv_heads=n_kv_heads, head_dim=head_dim, position="none"))
    hd = head_dim or d // h
    attn = model.encoder.blocks[0].attn
    assert attn.qkv.weight.shape == ((h + 2 * n_kv_heads) * hd, d)
    assert attn.out.weight.shape == (d, h * hd)
    assert sum(p.numel() for p in attn.parameters()) == d * (h + 2 * n_kv_heads) * hd + h * hd * d

    calls = capture_qkv(model)
    x = torch.randn(B, n, d)
    seq = Positions.of(torch.zeros(B, n, dtype=torch.long), None)
    with torch.no_grad():
        attn(x, seq, causal=False)
        y = x.clone()
        y[..., -1] += 1.0  # change one input dimension only
        attn(y, seq, causal=False)
    (q, k, v, _), (q2, k2, _, _) = calls
    assert q.shape == (B, h, n, hd) and k.shape == v.shape == (B, n_kv_heads, n, hd)
    # Every head reads the whole embedding: the change reaches every query and key head,
    # which slicing x into heads would not do.
    assert ((q2 - q).abs().amax(dim=(0, 2, 3)) > 0).all()
    assert ((k2 - k).abs().amax(dim=(0, 2, 3)) > 0).all()


# ---- P13: residual structure of pre- and post-norm blocks ----------------------------------


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("family", FAMILIES)
def test_p13_block_is_residual_around_each_sublayer(family, placement, norm_type):
    model = build(tiny_spec(family, norm={"name": placement, "type": norm_type}, n_layers=1, bias=True))
    stack = model.decoder if family != "encoder" else model.encoder
    block = stack.blocks[0]
    B, n, m = 2, 6, 5
    x = torch.randn(B, n, 16)
    seq = Positions.of(torch.zeros(B, n, dtype=torch.long), None)
    memory, memory_seq = torch.randn(B, m, 16), Positions.of(torch.zeros(B, m, dtype=torch.long), None)

    def residual(norm: nn.Module, h: torch.Tensor, f) -> torch.Tensor:
        return h + f(norm(h)) if placement == "pre" else norm(h + f(h))

    norm_class = nn.LayerNorm if norm_type == "layernorm" else nn.RMSNorm
    with torch.no_grad():
        h = residual(block.attn_norm.norm, x, lambda u: block.attn(u, seq, block.causal))
        if block.cross is not None:
            h = residual(block.cross_norm.norm, h, lambda u: block.cross(u, seq, memory, memory_seq))
        expected = residual(block.ffn_norm.norm, h, block.ffn)
        actual = block(x, seq, memory, memory_seq)
    assert_close(actual, expected, atol=1e-6, rtol=1e-6)
    for norm in (block.attn_norm.norm, block.ffn_norm.norm):
        assert isinstance(norm, norm_class)
    # Pre-norm leaves the residual stream unnormalised, so the stack ends with a norm.
    if placement == "pre":
        assert isinstance(stack.final_norm, norm_class)
    else:
        assert isinstance(stack.final_norm, nn.Identity)


def test_p13_placements_differ_numerically():
    """Guard against a placement test passing for the wrong reason: pre and post disagree."""
    pre = build(tiny_spec(norm="pre"))
    post = build(tiny_spec(norm="post"))
    post.load_state_dict(pre.state_dict(), strict=False)  # post has no final norm
    x = torch.randn(2, 6, 16)
    seq = Positions.of(torch.zeros(2, 6, dtype=torch.long), None)
    with torch.no_grad():
        assert_differs(pre.decoder.blocks[0](x, seq), post.decoder.blocks[0](x, seq))
