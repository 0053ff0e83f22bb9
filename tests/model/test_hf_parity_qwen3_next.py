"""Qwen3-Next's two token mixers against Hugging Face `transformers`, layer by layer, in float64
with random weights copied (as tests/model/test_hf_parity.py does for whole models): the gated
full-attention layer (Qwen3NextAttention: output gate fused into q_proj, per-head QK-norm with
the zero-centred RMSNorm, partial RoPE) is our SelfAttention with `gate: elementwise`,
`qk_norm: head` and rope `fraction: 0.25`; the linear-attention layer (Qwen3NextGatedDeltaNet)
is the gated_deltanet mixer. Outputs within 1e-4 (the reference runs the delta rule and its
norms in float32: its own error is about 1e-6 here). Then the whole Qwen3NextForCausalLM through
workbench.model.hf (workbench.model.hf_qwen3_next): three DeltaNet layers and one gated attention
layer, MoE FFNs (4 experts, top 2, a gated shared expert) with one dense layer among them; logits
within 1e-4, 20 greedy tokens decoded with both caches identical, routing without ties (as
tests/model/test_hf_parity_moe.py checks it), and back through `to_hf`. Also GPT-NeoX with
partial_rotary_factor, which the same RoPE `fraction` maps, as a whole model."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

from test_hf_parity import N_NEW, TOLERANCE, greedy_pair, logits_pair, reference, tokens  # noqa: E402
from test_hf_parity_moe import FLOAT32_ROUNDING, routing_margin  # noqa: E402
from workbench.errors import SpecError  # noqa: E402
from workbench.model import hf  # noqa: E402
from workbench.model.hf_decoders import rope_pairing  # noqa: E402
from workbench.model.spec import parse_spec  # noqa: E402
from workbench.model.transformer import Positions, build_model  # noqa: E402

D, H, G, HD, ROTARY = 32, 4, 2, 16, 4  # width; attention heads, K/V heads, head width, rotated dims (0.25)
KEY_HEADS, VALUE_HEADS, KEY_DIM, VALUE_DIM, CONV = 2, 4, 8, 12, 4  # the linear layers' (value heads 2x, as 16/32)
CONFIG = dict(vocab_size=96, hidden_size=D, num_hidden_layers=4, num_attention_heads=H, num_key_value_heads=G,
              head_dim=HD, rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25},
              linear_num_key_heads=KEY_HEADS, linear_num_value_heads=VALUE_HEADS, linear_key_head_dim=KEY_DIM,
              linear_value_head_dim=VALUE_DIM, linear_conv_kernel_dim=CONV, rms_norm_eps=1e-6, num_experts=0,
              intermediate_size=64)
OURS = dict(vocab_size=96, d_model=D, n_heads=H, n_kv_heads=G, head_dim=HD, n_layers=1,
            norm={"name": "pre", "type": "rmsnorm", "eps": 1e-6})
GATED_ATTENTION = dict(OURS, position={"name": "rope", "base": 500.0, "fraction": 0.25},
                       attention={"name": "full", "qk_norm": "head", "gate": "elementwise"})
DELTANET = dict(OURS, attention={"name": "gated_deltanet", "key_heads": KEY_HEADS, "value_heads": VALUE_HEADS,
                                 "key_dim": KEY_DIM, "value_dim": VALUE_DIM, "conv_size": CONV, "chunk_size": 4})

# the whole model: three DeltaNet layers, then a gated attention one; MoE FFNs but on layer 1 (dense)
WHOLE = dict(CONFIG, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
             shared_expert_intermediate_size=20, intermediate_size=40, mlp_only_layers=[1],
             layer_types=["linear_attention"] * 3 + ["full_attention"], bos_token_id=1, eos_token_id=None)


def qwen3_next_config():
    config = transformers.Qwen3NextConfig(**CONFIG)
    config._attn_implementation = "sdpa"
    return config


def randomised(layer: torch.nn.Module) -> torch.nn.Module:
    """float64, matrices at a scale that gives outputs of a few units, vectors near their init (the
    zero-centred norms' weights near 0, i.e. gains near 1)."""
    torch.manual_seed(0)
    layer = layer.double().eval()
    with torch.no_grad():
        for p in layer.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    return layer


def our_mixer(spec: dict) -> torch.nn.Module:
    return build_model(spec).double().eval().decoder.blocks[0].attn


@torch.no_grad()
def copy_gated_attention(ours, theirs) -> None:
    """Their q_proj rows are [query; gate] per head: the queries (paired for our RoPE within the
    rotated dimensions) go to our qkv, the gates to our gate; their zero-centred norm's w is our
    gain w + 1, permuted as the head's dimensions are."""
    query_gate = theirs.q_proj.weight.view(H, 2, HD, D)
    ours.qkv.weight.copy_(torch.cat([query_gate[:, 0].reshape(H * HD, D)[rope_pairing(H, HD, ROTARY)],
                                     theirs.k_proj.weight[rope_pairing(G, HD, ROTARY)], theirs.v_proj.weight]))
    ours.gate.weight.copy_(query_gate[:, 1].reshape(H * HD, D))
    within = rope_pairing(1, HD, ROTARY)
    ours.q_norm.weight.copy_(1 + theirs.q_norm.weight[within])
    ours.k_norm.weight.copy_(1 + theirs.k_norm.weight[within])
    ours.out.weight.copy_(theirs.o_proj.weight)


@torch.no_grad()
def copy_gated_deltanet(ours, theirs) -> None:
    """Their in_proj_qkvz rows are [q, k, v, z] per key head (v and z of its value heads), in_proj_ba
    [b, a] per key head: ours are [q; k; v] (in_proj), z (gate), b (beta) and a (decay)."""
    shared = VALUE_HEADS // KEY_HEADS
    q, k, v, z = theirs.in_proj_qkvz.weight.view(KEY_HEADS, -1, D).split(
        [KEY_DIM, KEY_DIM, shared * VALUE_DIM, shared * VALUE_DIM], dim=1)
    b, a = theirs.in_proj_ba.weight.view(KEY_HEADS, 2 * shared, D).split([shared, shared], dim=1)
    ours.in_proj.weight.copy_(torch.cat([t.reshape(-1, D) for t in (q, k, v)]))
    for mine, their in ((ours.gate, z), (ours.beta, b), (ours.decay, a)):
        mine.weight.copy_(their.reshape(-1, D))
    for mine, their in (("conv.weight", "conv1d.weight"), ("A_log", "A_log"), ("dt_bias", "dt_bias"),
                        ("norm.weight", "norm.weight"), ("out.weight", "out_proj.weight")):
        ours.get_parameter(mine).copy_(theirs.get_parameter(their))


def inputs(B: int = 2, n: int = 13) -> tuple[torch.Tensor, Positions]:
    x = torch.randn(B, n, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return x, Positions(torch.arange(n).expand(B, n), None)


def test_the_gated_attention_layer_equals_qwen3_next_attention():
    config = qwen3_next_config()
    theirs = randomised(qwen3_next.Qwen3NextAttention(config, layer_idx=3))
    ours = our_mixer(GATED_ATTENTION)
    copy_gated_attention(ours, theirs)
    x, seq = inputs()
    with torch.no_grad():
        expected, _ = theirs(x, position_embeddings=qwen3_next.Qwen3NextRotaryEmbedding(config)(x, seq.pos[:1]),
                             attention_mask=None)
        got = ours(x, seq, causal=True)
    assert expected.std() > 1.0  # outputs of a unit or more: 1e-4 is a tight tolerance
    assert (got - expected).abs().max() < TOLERANCE
    # each part is needed: without the gate, the +1 of the norm or the partial rotation it differs
    with torch.no_grad():
        for param in (ours.gate.weight, ours.q_norm.weight):
            saved = param.clone()
            param.mul_(0.5)
            assert (ours(x, seq, causal=True) - expected).abs().max() > 100 * TOLERANCE
            param.copy_(saved)
        whole = our_mixer(dict(GATED_ATTENTION, position={"name": "rope", "base": 500.0}))
        whole.load_state_dict(ours.state_dict())
        assert (whole(x, seq, causal=True) - expected).abs().max() > 100 * TOLERANCE


def test_the_gated_deltanet_layer_equals_qwen3_next_gated_deltanet():
    theirs = randomised(qwen3_next.Qwen3NextGatedDeltaNet(qwen3_next_config(), layer_idx=0))
    ours = our_mixer(DELTANET)  # chunks of 4: 13 tokens are three chunks and a padded tail
    copy_gated_deltanet(ours, theirs)
    x, seq = inputs()
    with torch.no_grad():
        expected, got = theirs(x), ours(x, seq, causal=True)
    assert expected.std() > 1.0
    assert (got - expected).abs().max() < TOLERANCE


def test_gated_deltanet_decoding_equals_the_reference_decoding_with_its_cache():
    """A prompt of 9 tokens, then 4 one at a time: their recurrent path with their cache (conv and
    recurrent states) against ours with ours."""
    config = qwen3_next_config()
    theirs = randomised(qwen3_next.Qwen3NextGatedDeltaNet(config, layer_idx=0))
    ours = our_mixer(DELTANET)
    copy_gated_deltanet(ours, theirs)
    x, seq = inputs()
    their_cache, our_cache = transformers.DynamicCache(config=config), ours.new_cache(13)
    with torch.no_grad():
        expected = [theirs(x[:, :9], cache=their_cache)]
        got = [ours(x[:, :9], Positions(seq.pos[:, :9], None), True, our_cache)]
        for t in range(9, 13):
            expected.append(theirs(x[:, t:t + 1], cache=their_cache))
            got.append(ours(x[:, t:t + 1], Positions(seq.pos[:, t:t + 1], None), True, our_cache))
    assert (torch.cat(got, 1) - torch.cat(expected, 1)).abs().max() < TOLERANCE


def test_gated_deltanet_left_padding_equals_the_reference_and_each_row_alone():
    theirs = randomised(qwen3_next.Qwen3NextGatedDeltaNet(qwen3_next_config(), layer_idx=0))
    ours = our_mixer(DELTANET)
    copy_gated_deltanet(ours, theirs)
    x, _ = inputs()
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[1, :6] = False  # row 1: six padding tokens, then seven real ones
    seq = Positions.of(torch.zeros(2, 13, dtype=torch.long), mask)
    with torch.no_grad():
        expected, got = theirs(x, attention_mask=mask.long()), ours(x, seq, causal=True)
        alone = ours(x[1:, 6:], Positions(torch.arange(7)[None], None), causal=True)
    assert (got[mask] - expected[mask]).abs().max() < TOLERANCE
    assert (got[1, 6:] - alone[0]).abs().max() < 1e-12


def test_gpt_neox_with_partial_rotary_factor_maps_both_ways(tmp_path):
    """GPT-NeoX-20B's partial_rotary_factor 0.25: 4 of each head's 16 dimensions rotate."""
    rope = {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25}
    ref = reference("gpt_neox", hidden_size=64, rope_parameters=rope, eos_token_id=None)  # never stops early
    ours = hf.from_hf(ref)
    assert ours.spec.position.params.fraction == 0.25 and ours.spec.head_dim == 16
    src = tokens(2, 12, seed=1)
    theirs, mine = logits_pair(ref, ours, src, None)
    assert theirs.std() > 1.0 and (theirs - mine).abs().max() < TOLERANCE
    theirs, mine = greedy_pair(ref, ours, src[:, :6])
    assert theirs.tolist() == mine.tolist()
    hf.to_hf(ours).save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert back.config.rope_parameters["partial_rotary_factor"] == 0.25
    again, mine = logits_pair(back, ours, src, None)
    assert (again - mine).abs().max() < TOLERANCE


def test_a_partial_rope_refuses_to_export_as_llama():
    spec = dict(vocab_size=96, d_model=D, n_heads=H, norm={"name": "pre", "type": "rmsnorm"}, ffn="swiglu",
                position={"name": "rope", "fraction": 0.5})
    with pytest.raises(SpecError) as err:
        hf.architecture_for(build_model(spec).spec)
    assert str(err.value).startswith("model.position.fraction")


def qwen3_next_model(**overrides):
    """A tiny Qwen3NextForCausalLM (WHOLE), float64, randomised as the layers above; experts by
    transformers' loop (its grouped_mm kernel takes no float64)."""
    config = transformers.Qwen3NextConfig(**{**WHOLE, **overrides})
    config._attn_implementation = "sdpa"
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    return randomised(transformers.Qwen3NextForCausalLM(config))


def test_qwen3_next_whole_model_maps_both_ways(tmp_path):
    ref = qwen3_next_model()
    ours = hf.from_hf(ref)
    assert hf.architecture_for(ours.spec).model_type == "qwen3_next"
    assert ours.num_parameters() == sum(p.numel() for p in ref.parameters())
    src = tokens(2, 12, seed=1)
    assert routing_margin(ref, src) > FLOAT32_ROUNDING  # no routing tie: equal logits are well defined
    theirs, mine = logits_pair(ref, ours, src, None)
    assert theirs.std() > 1.0
    difference = (theirs - mine).abs().max()
    print(f"qwen3_next: max |logit difference| {difference:.2g}, logit std {theirs.std():.2f}")
    assert difference < TOLERANCE

    theirs, mine = greedy_pair(ref, ours, src[:, :6])  # their DeltaNet and KV caches against ours
    assert routing_margin(ref, theirs) > FLOAT32_ROUNDING  # nor on any decoded token
    assert theirs.tolist() == mine.tolist()
    assert theirs.shape[1] - 6 == N_NEW

    hf.to_hf(ours).save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64,
                                                             experts_implementation="eager").eval()
    assert type(back).__name__ == "Qwen3NextForCausalLM"
    again, mine = logits_pair(back, ours, src, None)
    assert (again - mine).abs().max() < TOLERANCE
    assert hf.from_hf(back).spec == ours.spec  # the spec survives the round trip


def test_qwen3_next_spec_reads_as_its_config_says():
    spec = hf.from_hf(qwen3_next_model()).spec
    assert [spec.at("attention", i).name for i in range(4)] == ["gated_deltanet"] * 3 + ["full"]
    gated = spec.at("attention", 3).params
    assert (gated.qk_norm, gated.gate, spec.position.params.fraction) == ("head", "elementwise", 0.25)
    assert [spec.at("ffn", i).name for i in range(4)] == ["moe", "swiglu", "moe", "moe"]
    moe = spec.at("ffn", 0).params
    assert (moe.n_experts, moe.top_k, moe.shared["d_ff"], moe.shared_gate, moe.normalize) == (4, 2, 20, True, True)
    # every other layer sparse (decoder_sparse_step 2: layers 1 and 3), none dense by name
    spec = hf.from_hf(qwen3_next_model(decoder_sparse_step=2, mlp_only_layers=[])).spec
    assert [spec.at("ffn", i).name for i in range(4)] == ["swiglu", "moe"] * 2


def our_qwen3_next_spec(**changes) -> dict:
    deltanet = dict(DELTANET["attention"])  # chunks of 4: a speed setting, not a field of the config
    moe = {"name": "moe", "n_experts": 4, "top_k": 2, "expert": {"name": "swiglu", "d_ff": 24},
           "shared": {"name": "swiglu", "d_ff": 20}, "shared_gate": True}
    return {**OURS, "n_layers": 4, "position": GATED_ATTENTION["position"],
            "attention": {"repeat": [deltanet] * 3 + [GATED_ATTENTION["attention"]]}, "ffn": moe, **changes}


def test_a_workbench_qwen3_next_exports_and_imports_again():
    """A spec written here (DeltaNet chunks of 4, default init then randomised) exports as
    Qwen3-Next and imports back as the same function. Against transformers' logits the bound is
    1e-3: on these weights the reference's float32 delta rule disagrees with itself (its chunked
    prompt against its recurrent steps) by 1.6e-4, ours (float64, any chunk size) lies between."""
    torch.manual_seed(0)
    ours = randomised(build_model(our_qwen3_next_spec()))
    theirs = hf.to_hf(ours)
    assert type(theirs).__name__ == "Qwen3NextForCausalLM"
    assert theirs.config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert theirs.config.mlp_only_layers == [] and theirs.config.num_experts == 4
    src = tokens(2, 12, seed=1)
    assert routing_margin(theirs, src) > FLOAT32_ROUNDING
    their_logits, our_logits = logits_pair(theirs, ours, src, None)
    assert (their_logits - our_logits).abs().max() < 10 * TOLERANCE
    again = hf.from_hf(theirs)  # chunks of 64, the default: the same function
    assert again.spec.at("attention", 0).params.chunk_size == 64
    with torch.no_grad():
        assert (again(src) - our_logits).abs().max() < 1e-10


@pytest.mark.parametrize(("change", "field"), [
    ({"ffn": {"name": "moe", "n_experts": 4, "top_k": 2, "shared": "swiglu"}}, "model.ffn.shared_gate"),
    ({"ffn": {"name": "moe", "n_experts": 4, "top_k": 2, "router": "sigmoid", "shared": "swiglu",
              "shared_gate": True}}, "model.ffn.router"),
    ({"attention": {"repeat": [DELTANET["attention"], {"name": "full", "gate": "elementwise"}]}},
     "model.attention.qk_norm"),
    ({"norm": {"name": "pre", "type": "layernorm"}}, "model.norm.type"),
    ({"attention": {"repeat": [DELTANET["attention"], {"name": "sliding_window", "window": 4}]}},
     "model.attention.name"),
    ({"position": "alibi"}, "model.position.name"),
])
def test_a_qwen3_next_spec_the_config_cannot_say_names_its_field(change, field):
    with pytest.raises(SpecError) as err:
        hf.architecture_for(parse_spec(our_qwen3_next_spec(**change)))
    assert str(err.value).startswith(field)


@pytest.mark.parametrize(("change", "field"), [({"hidden_act": "gelu"}, "hidden_act"),
                                               ({"shared_expert_intermediate_size": 0}, "shared_expert_")])
def test_a_qwen3_next_the_workbench_cannot_compute_is_refused_by_field(change, field):
    with pytest.raises(SpecError) as err:
        hf.from_hf(qwen3_next_model(**change))
    assert str(err.value).startswith(field)
