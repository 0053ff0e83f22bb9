"""The open block (issue 60): per-layer patterns, the mixer slot, the options of the standard
attention layer (QK-norm before RoPE, output gate, value residual), the forward's state, and the
built-in mixers (differential, latent attention) against the formulas of their papers. Every
mixer is also covered by the registry-parametrized contract tests (tests/test_model_contract.py,
tests/model/test_transformer_properties.py: causal, cached decoding == full forward)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from conftest import build, check_greedy_decoding, incremental_logits, installed_plugin, tiny_spec, tokens
from workbench.errors import SpecError
from workbench.model.attention import AttentionParams
from workbench.model.mixer import TokenMixer
from workbench.model.spec import LayerPattern, parse_spec
from workbench.model.transformer import Positions, SelfAttention
from workbench.registry import variants
from workbench.study.keys import digest
from workbench_plugins.position_rope import rotate

TIGHT = dict(atol=1e-5, rtol=1e-5)
SWA = {"name": "sliding_window", "window": 3}


# ---- per-layer patterns ----------------------------------------------------------------------


def test_a_repeating_pattern_gives_each_layer_its_variant():
    """Gemma 3's five local layers to one global, over 7 layers: the 6th is global, the 7th local again."""
    model = build(tiny_spec(n_layers=7, attention={"repeat": [SWA] * 5 + ["full"]}))
    windows = [block.attn.cache_window for block in model.decoder.blocks]
    assert windows == [3, 3, 3, 3, 3, None, 3]


def test_a_per_layer_position_pattern_rotates_only_where_it_says():
    """Llama 4: RoPE on three layers of four, none on the fourth; one scheme instance per kind."""
    model = build(tiny_spec(n_layers=4, position={"repeat": ["rope", "rope", "rope", "none"]}))
    names = [block.attn.position.name for block in model.decoder.blocks]
    assert names == ["rope", "rope", "rope", "none"]
    assert model.decoder.blocks[0].attn.position is model.decoder.blocks[2].attn.position


def test_a_list_gives_one_variant_per_layer_and_checks_its_length():
    model = build(tiny_spec(n_layers=3, ffn=["gelu", "swiglu", "relu"]))
    assert [b.ffn.name for b in model.decoder.blocks] == ["gelu", "swiglu", "relu"]
    with pytest.raises(SpecError) as err:
        parse_spec(tiny_spec(n_layers=3, ffn=["gelu", "swiglu"]))
    assert str(err.value).startswith("model.ffn: a list gives one FFN type per layer: 2 for 3 layers")
    assert "{repeat: [...]}" in str(err.value)


@pytest.mark.parametrize("value, field", [
    (["rope", "sinusoidal"], "model.position"),  # an embedding scheme enters once per stack
    (["rope", "ropee"], "model.position.1"),
    ({"repeat": ["rope"], "every": 2}, "model.position.every"),
    ({"repeat": "rope"}, "model.position.repeat"),
    ([], "model.position"),
])
def test_a_wrong_pattern_names_its_field(value, field):
    with pytest.raises(SpecError) as err:
        parse_spec(tiny_spec(n_layers=2, position=value))
    assert err.value.field == field, str(err.value)


def test_a_pattern_of_one_variant_is_that_variant_with_the_same_run_id():
    plain, listed = parse_spec(tiny_spec(n_layers=2)), parse_spec(tiny_spec(n_layers=2, attention=["full", "full"]))
    assert not isinstance(listed.attention, LayerPattern)
    assert digest(plain.resolved()) == digest(listed.resolved())


def test_a_pattern_is_stored_and_read_back_as_written_and_labelled_compactly():
    spec = parse_spec(tiny_spec(n_layers=4, attention={"repeat": [SWA, SWA, SWA, "full"]}))
    again = parse_spec(spec.resolved())
    assert again.resolved() == spec.resolved() and isinstance(again.attention, LayerPattern)
    assert spec.attention.name.startswith("repeat[sliding_window(") and "*3, full(" in spec.attention.name


def test_a_per_layer_model_decodes_with_its_cache_as_it_computes_in_full():
    """A sliding-window layer's ring buffer beside a full layer's and a latent one's."""
    model = build(tiny_spec(n_layers=3, attention=[SWA, "full", {"name": "mla", "kv_rank": 8, "rope_dim": 2}]))
    target = tokens(2, 9)
    with torch.no_grad():
        assert_close(incremental_logits(model, target, prefill=2), model(target), **TIGHT)
    check_greedy_decoding(model, target[:, :4], 6)


# ---- the mixer slot: a third-party mixer -------------------------------------------------------


class CausalMeanMixer(TokenMixer):
    """Each token's output is a learned projection of the mean of the values up to it, plus a
    bias per layer index: a mixer with its own projections, cache and use of the layer index."""

    name = "causal_mean_test"
    seen: list = []

    def __init__(self, params, *, spec, layer, position):
        super().__init__(params, spec=spec, layer=layer, position=position)
        self.v = nn.Linear(spec.d_model, spec.d_model, bias=False)
        self.out = nn.Linear(spec.d_model, spec.d_model, bias=False)
        self.layer_bias = float(layer.index) / layer.count
        CausalMeanMixer.seen.append((layer.index, layer.count, position.name))

    def new_cache(self, capacity):
        return RunningSum()

    def cache_bytes(self, tokens, batch, element):
        return (self.out.in_features + 1) * batch * element  # a running sum and a count

    def forward(self, x, seq, causal, cache=None, state=None):
        v = self.v(x)  # (B, n, d)
        sums, counts = v.cumsum(1), torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[None, :, None]
        if cache is not None:
            sums, counts = sums + cache.total, counts + cache.count
            cache.total, cache.count = sums[:, -1:].detach(), counts[:, -1:]
        return self.out(sums / counts) + self.layer_bias


class RunningSum:
    def __init__(self):
        self.total, self.count = 0.0, 0

    @property
    def empty(self):
        return self.count == 0

    @property
    def nbytes(self):
        return 0 if self.empty else self.total.numel() * self.total.element_size() + self.total.shape[0] * self.total.element_size()


def test_a_plugin_mixer_gets_its_layer_its_position_and_its_own_cache():
    CausalMeanMixer.seen = []
    with installed_plugin("mixer_plugin", register_attention_variants=[CausalMeanMixer]):
        model = build(tiny_spec(n_layers=3, attention="causal_mean_test"))
        assert CausalMeanMixer.seen == [(0, 3, "rope"), (1, 3, "rope"), (2, 3, "rope")]
        target = tokens(2, 8)
        with torch.no_grad():
            assert_close(incremental_logits(model, target, prefill=3), model(target), **TIGHT)
        model.generate(target[:, :3], 4)
        assert isinstance(model.last_cache.self_attn[0], RunningSum)
        assert model.last_cache.nbytes == 3 * (16 + 1) * 2 * 4


# ---- the standard layer's options ------------------------------------------------------------


def captured_kernel_inputs(model):
    calls = []
    for m in model.modules():
        if isinstance(m, SelfAttention):
            m.variant.register_forward_pre_hook(lambda _m, args, kwargs: calls.append(args), with_kwargs=True)
    return calls


@pytest.mark.parametrize("scope", ["head", "projection"])
def test_qk_norm_normalises_before_the_rotation(scope):
    """Qwen3 (per head) and OLMo 2 (whole projection): RMSNorm(q) then RoPE, not the reverse."""
    model = build(tiny_spec(n_layers=1, attention={"name": "full", "qk_norm": scope}))
    attn = model.decoder.blocks[0].attn
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 2.0)
        attn.k_norm.weight.uniform_(0.5, 2.0)
    calls = captured_kernel_inputs(model)
    x = tokens(2, 6)
    with torch.no_grad():
        model(x)
        hidden = model.decoder.blocks[0].attn_norm.before(model.embedding(x))
        q, k, _ = attn.qkv(hidden).split([16, 16, 16], dim=-1)
        if scope == "projection":
            q, k = F.rms_norm(q, (16,), attn.q_norm.weight, 1e-5), F.rms_norm(k, (16,), attn.k_norm.weight, 1e-5)
        q, k = (t.view(2, 6, 4, 4).transpose(1, 2) for t in (q, k))
        if scope == "head":
            q, k = F.rms_norm(q, (4,), attn.q_norm.weight, 1e-5), F.rms_norm(k, (4,), attn.k_norm.weight, 1e-5)
        pos = torch.arange(6)[None].expand(2, 6)
        assert_close(calls[0][0], rotate(q, pos, 10000.0), **TIGHT)
        assert_close(calls[0][1], rotate(k, pos, 10000.0), **TIGHT)


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_a_gate_of_zero_weights_halves_each_head(gate):
    """sigmoid(x W) with W = 0 is 1/2 for every head and unit: the gated layer's output is half the
    ungated one's (same other weights), so the gate multiplies before the output projection."""
    plain = build(tiny_spec(n_layers=1, bias=False))
    gated = build(tiny_spec(n_layers=1, bias=False, attention={"name": "full", "gate": gate}))
    gated.load_state_dict({**plain.state_dict(), **{k: v for k, v in gated.state_dict().items() if "gate" in k}})
    attn = gated.decoder.blocks[0].attn
    assert attn.gate.out_features == (4 if gate == "headwise" else 16)
    with torch.no_grad():
        attn.gate.weight.zero_()
        x = torch.randn(2, 5, 16)
        pos = Positions.of(torch.zeros(2, 5, dtype=torch.long), None)
        halved = attn(x, pos, True)
        full = plain.decoder.blocks[0].attn(x, pos, True)
    assert_close(halved, 0.5 * full, **TIGHT)


def test_value_residual_mixes_the_first_layers_values_into_every_later_layer():
    model = build(tiny_spec(n_layers=3, attention={"name": "full", "value_residual": "learned"}))
    blocks = model.decoder.blocks
    assert blocks[0].attn.value_mix is None and isinstance(blocks[1].attn.value_mix, nn.Parameter)
    seen = []
    for block in blocks:
        block.attn.variant.register_forward_pre_hook(lambda _m, args, kwargs: seen.append(args[2]), with_kwargs=True)
    state, raw = {}, []
    x = tokens(2, 6)
    with torch.no_grad():
        model(x)
        hidden = model.embedding(x)
        pos = torch.arange(6)[None].expand(2, 6)
        for block in blocks:  # each layer's own values, from its own input
            h = block.attn_norm.before(hidden)
            raw.append(block.attn.qkv(h)[..., 32:].view(2, 6, 4, 4).transpose(1, 2))
            hidden = block(hidden, Positions(pos, None), state=state)
    assert_close(seen[0], raw[0], **TIGHT)
    for layer in (1, 2):
        assert_close(seen[layer], 0.5 * raw[layer] + 0.5 * raw[0], **TIGHT)
    fixed = build(tiny_spec(n_layers=2, attention={"name": "full", "value_residual": "fixed"}))
    assert "decoder.blocks.1.attn.value_mix" in fixed.state_dict()
    assert all("value_mix" not in name for name, _ in fixed.named_parameters())


def test_value_residual_is_refused_where_the_first_layer_leaves_no_values():
    with pytest.raises(SpecError, match="model.attention"):
        parse_spec(tiny_spec(n_layers=2, attention=["full", {"name": "full", "value_residual": "fixed"}]))


# ---- differential attention (Ye et al. 2024) ---------------------------------------------------


def test_differential_attention_is_the_difference_of_two_maps_with_its_layer_lambda():
    model = build(tiny_spec(n_layers=3, attention="differential", n_kv_heads=2)).double()
    inits = [block.attn.lambda_init for block in model.decoder.blocks]
    assert inits == pytest.approx([0.8 - 0.6 * math.exp(-0.3 * layer) for layer in range(3)])
    attn = model.decoder.blocks[2].attn
    B, n, d, h, g, hd = 2, 6, 16, 4, 2, 4
    x = torch.randn(B, n, d, dtype=torch.float64)
    seq = Positions.of(torch.zeros(B, n, dtype=torch.long), None)
    with torch.no_grad():
        q, k, v = attn.qkv(x).split([h * hd, g * hd, g * hd], dim=-1)
        q = rotate(q.view(B, n, h, hd).transpose(1, 2), seq.pos, 10000.0)
        k = rotate(k.view(B, n, g, hd).transpose(1, 2), seq.pos, 10000.0).repeat_interleave(h // g, 1)
        v = v.view(B, n, g, hd).transpose(1, 2)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        maps = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~causal, -math.inf), -1)
        values = torch.cat([v[:, :1], v[:, 1:]], dim=-1)  # V1 = K/V head 0, V2 = K/V head 1: [B, 1, n, 2 hd]
        lam = (torch.exp((attn.lambda_q1 * attn.lambda_k1).sum()) - torch.exp((attn.lambda_q2 * attn.lambda_k2).sum())
               + attn.lambda_init)
        heads = (maps[:, :2] - lam * maps[:, 2:]) @ values  # (B, 2, n, 2 hd): heads i and i + h/2 paired
        heads = (1 - attn.lambda_init) * F.rms_norm(heads, (2 * hd,), eps=1e-5)
        expected = attn.out(heads.transpose(1, 2).reshape(B, n, h * hd))
        assert_close(attn(x, seq, True), expected, atol=1e-8, rtol=1e-8)


def test_differential_attention_refuses_an_odd_number_of_kv_heads():
    with pytest.raises(SpecError, match="must be even"):
        build(tiny_spec(attention="differential", n_kv_heads=1))


# ---- multi-head latent attention (DeepSeek-V2) ----------------------------------------------


def test_latent_attention_caches_the_latent_and_the_rotary_key_only():
    """DeepSeek-V2's cache: (kv_rank + rope_dim) numbers per token and layer, at its ratio
    kv_rank = 4 head_dim and rope_dim = head_dim / 2 below GQA with n_heads / 2 groups."""
    spec = dict(d_model=64, n_heads=8, n_layers=2, vocab_size=32)
    mla = build(tiny_spec(**spec, attention={"name": "mla", "kv_rank": 32, "rope_dim": 4}))
    gqa = build(tiny_spec(**spec, n_kv_heads=4))
    B, n, new = 2, 5, 6
    per_token = {}
    for name, model in (("mla", mla), ("gqa", gqa)):
        model.generate(tokens(B, n), max_new_tokens=new)
        per_token[name] = model.last_cache.nbytes / (2 * B * (n + new))  # per layer, per token (each new one fed back)
    assert per_token["mla"] == (32 + 4) * 4  # float32
    assert per_token["gqa"] == 2 * 4 * 8 * 4
    assert per_token["mla"] < per_token["gqa"]
    assert mla.last_cache.nbytes == sum(b.attn.cache_bytes(n + new, B, 4) for b in mla.decoder.blocks)


def test_latent_attention_decodes_keys_and_values_from_the_latent():
    model = build(tiny_spec(n_layers=1, attention={"name": "mla", "kv_rank": 6, "rope_dim": 2})).double()
    attn = model.decoder.blocks[0].attn
    B, n, h = 2, 5, 4
    x = torch.randn(B, n, 16, dtype=torch.float64)
    seq = Positions.of(torch.zeros(B, n, dtype=torch.long), None)
    with torch.no_grad():
        q = attn.q(x).view(B, n, h, 6).transpose(1, 2)  # nope 4 + rope 2 per head
        latent, k_rope = attn.kv_down(x).split([6, 2], dim=-1)
        kv = attn.kv_up(F.rms_norm(latent, (6,), attn.kv_norm.weight, 1e-5)).view(B, n, h, 8).transpose(1, 2)
        k_nope, v = kv.split([4, 4], dim=-1)
        q = torch.cat([q[..., :4], rotate(q[..., 4:], seq.pos, 10000.0)], -1)
        k = torch.cat([k_nope, rotate(k_rope[:, None], seq.pos, 10000.0).expand(B, h, n, 2)], -1)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        weights = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(6)).masked_fill(~causal, -math.inf), -1)
        expected = attn.out((weights @ v).transpose(1, 2).reshape(B, n, 16))
        assert_close(attn(x, seq, True), expected, atol=1e-8, rtol=1e-8)


def test_every_kernel_takes_the_layer_options():
    """QK-norm, gate and value residual are the standard layer's, so every kernel's Params have them."""
    for name, cls in variants("attention").items():
        if not issubclass(cls, TokenMixer):
            assert issubclass(cls.Params, AttentionParams), name
