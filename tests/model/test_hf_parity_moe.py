"""The mixture-of-experts decoders against Hugging Face `transformers` (as tests/model/test_hf_parity.py
does the dense ones): OLMoE, Mixtral and Llama 4's text model, each built from a tiny config with
random weights in float64, copied into the workbench with `from_hf`: logits within 1e-4, the same
20 greedy tokens decoded with the KV cache, and back through `to_hf`, `save_pretrained` and the
Auto class with the same logits.

What is compared, and why it is well defined: a top-k router is a discontinuous function of its
logits, so two implementations that agree to 1e-15 in the router logits could still send a token
to different experts where two experts tie (and both round the router's softmax or sigmoid to
float32, as transformers does). Each test therefore reads transformers' router logits for every
token it compares (the prompt and every decoded token, every MoE layer) and asserts that the
k-th and (k+1)-th choices are apart by far more than float32 rounding: the weights drawn here
(seed 0, router rows at the scale of the other matrices) leave no tie, so equal logits mean
equal routing, not luck.

Llama 4's config is sized so that its features act on these lengths: chunks of 5 positions (12
prompt tokens and 26 decoded positions cross several chunk boundaries, in the full forward and
in cached decoding), the NoPE layer's temperature rising from position 3 (floor_scale 4), MoE
and dense layers interleaved; `test_llama4_features_change_the_logits` shows each of them moves
the logits by far more than the tolerance, so the parity test would see one mapped wrong.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_hf_parity import N_NEW, TOLERANCE, V, greedy_pair, logits_pair, tokens  # noqa: E402

from workbench.errors import SpecError  # noqa: E402
from workbench.model import hf  # noqa: E402
from workbench.model.spec import parse_spec  # noqa: E402
from workbench.model.transformer import build_model  # noqa: E402

D = 32
ROPE = {"rope_type": "default", "rope_theta": 500.0}
CONFIGS = {
    "olmoe": dict(vocab_size=V, hidden_size=D, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, num_experts=6, num_experts_per_tok=2, rope_parameters=ROPE,
                  tie_word_embeddings=False),
    "mixtral": dict(vocab_size=V, hidden_size=D, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
                    rope_parameters=ROPE, tie_word_embeddings=False),
    # four layers: RoPE + chunked attention on three, NoPE with temperature tuning on the fourth;
    # dense and MoE FFNs alternating (interleave_moe_layer_step 2)
    "llama4_text": dict(vocab_size=V, hidden_size=D, intermediate_size=24, intermediate_size_mlp=40,
                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                        num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                        attention_chunk_size=5, floor_scale=4, attn_scale=0.5, rope_parameters=ROPE,
                        tie_word_embeddings=False),
}
FLOAT32_ROUNDING = 1e-6  # what a float32 softmax or sigmoid of a float64 logit may move by, with room


def reference(model_type: str, **overrides):
    """The HF model of `model_type`, float64, every parameter drawn at random (matrices N(0, 0.3):
    logits of several units; norm weights near 1), experts computed by transformers' loop over
    experts (its default grouped_mm kernel takes no float64)."""
    config = transformers.AutoConfig.for_model(model_type, bos_token_id=1, eos_token_id=2,
                                               **{**CONFIGS[model_type], **overrides})
    config._attn_implementation = "sdpa"
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, hf.ARCHITECTURES[model_type].hf_class)(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def routing_margin(ref, ids: torch.Tensor) -> float:
    """The smallest gap, over every token of `ids` and every MoE layer, between the k-th and the
    (k+1)-th expert in what the router ranks as the workbench computes it: the float32 softmax
    (OLMoE, Mixtral) or sigmoid (Llama 4) of transformers' router logits."""
    config = ref.config
    k = config.num_experts_per_tok
    with torch.no_grad():
        router_logits = ref(input_ids=ids, output_router_logits=True).router_logits
    margins = []
    for logits in router_logits:
        ranked = logits.float().sigmoid() if config.model_type == "llama4_text" else logits.float().softmax(-1)
        top = ranked.topk(k + 1, dim=-1).values
        margins.append((top[:, k - 1] - top[:, k]).min())
    return float(torch.stack(margins).min())


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_logits_and_cached_greedy_decoding_equal_the_reference(model_type, tmp_path):
    ref = reference(model_type)
    ours = hf.from_hf(ref)
    assert ours.num_parameters() <= sum(p.numel() for p in ref.parameters())
    src = tokens(2, 12, seed=1)
    assert routing_margin(ref, src) > FLOAT32_ROUNDING  # no routing tie: equal logits are well defined
    theirs, mine = logits_pair(ref, ours, src, None)
    assert theirs.std() > 1.0  # logits of several units: the tolerance below is a tight one
    difference = (theirs - mine).abs().max()
    print(f"{model_type}: max |logit difference| {difference:.2g}, logit std {theirs.std():.2f}")
    assert difference < TOLERANCE

    theirs, mine = greedy_pair(ref, ours, src[:, :6])
    assert routing_margin(ref, theirs) > FLOAT32_ROUNDING  # nor on any decoded token
    assert theirs.tolist() == mine.tolist()
    assert theirs.shape[1] - 6 == N_NEW

    # and back: the export's mapping, saved and loaded by the Auto class it names, gives them again
    hf.to_hf(ours).save_pretrained(tmp_path)
    auto = getattr(transformers, hf.ARCHITECTURES[model_type].auto_class)
    back = auto.from_pretrained(tmp_path, dtype=torch.float64, experts_implementation="eager").eval()
    assert type(back).__name__ == type(ref).__name__
    again, mine = logits_pair(back, ours, src, None)
    assert (again - mine).abs().max() < TOLERANCE
    assert hf.from_hf(back).spec == ours.spec  # the spec survives the round trip


@pytest.mark.parametrize("change", [{"attention_chunk_size": None}, {"attn_temperature_tuning": False},
                                    {"use_qk_norm": False}, {"no_rope_layers": [1, 1, 1, 1]},
                                    {"interleave_moe_layer_step": 1}])
def test_llama4_features_change_the_logits(change):
    """Each Llama 4 feature the parity test maps moves the logits of its inputs by far more than
    the tolerance (the same weights, the feature turned off in transformers' config), so a
    feature mapped wrong, or not at all, would fail it."""
    src = tokens(2, 12, seed=1)
    base = reference("llama4_text")
    changed = reference("llama4_text", **change)
    if change == {"interleave_moe_layer_step": 1}:  # every layer an MoE: copy the weights both have
        changed.load_state_dict(base.state_dict(), strict=False)
    with torch.no_grad():
        assert (base(input_ids=src).logits - changed(input_ids=src).logits).abs().max() > 100 * TOLERANCE


def test_llama4_spec_reads_as_its_config_says():
    spec = hf.from_hf(reference("llama4_text")).spec
    assert [spec.at("position", i).name for i in range(4)] == ["rope", "rope", "rope", "nope_temperature"]
    assert [spec.at("attention", i).name for i in range(4)] == ["chunked", "chunked", "chunked", "full"]
    assert [getattr(spec.at("attention", i).params, "qk_norm") for i in range(4)] == ["head"] * 3 + ["none"]
    assert [spec.at("ffn", i).name for i in range(4)] == ["swiglu", "moe", "swiglu", "moe"]
    moe = spec.at("ffn", 1).params
    assert (moe.router, moe.normalize, moe.weight_inputs, moe.shared["name"]) == ("sigmoid", False, True, "swiglu")


MIXTRAL = dict(family="decoder", vocab_size=V, d_model=D, n_heads=4, n_kv_heads=2, position="rope",
               norm={"name": "pre", "type": "rmsnorm"},
               ffn={"name": "moe", "n_experts": 4, "top_k": 2, "expert": {"name": "swiglu", "d_ff": 24}})
LLAMA4 = dict(MIXTRAL, n_layers=4, position={"repeat": ["rope", "rope", "rope", "nope_temperature"]},
              attention={"repeat": [{"name": "chunked", "chunk": 8, "qk_norm": "head", "qk_norm_gain": False}] * 3
                         + ["full"]},
              ffn={"name": "moe", "n_experts": 4, "top_k": 1, "router": "sigmoid", "normalize": False,
                   "weight_inputs": True, "expert": {"name": "swiglu", "d_ff": 24},
                   "shared": {"name": "swiglu", "d_ff": 24}})


@pytest.mark.parametrize(("spec", "field"), [
    ({**MIXTRAL, "ffn": {**MIXTRAL["ffn"], "normalize": False}}, "model.ffn.normalize"),  # Mixtral renormalises
    ({**MIXTRAL, "ffn": {**MIXTRAL["ffn"], "bias_update": 0.001}}, "model.ffn.bias_update"),
    ({**MIXTRAL, "attention": "sparse"}, "model.attention.name"),
    ({**MIXTRAL, "attention": {"name": "full", "qk_norm": "projection", "qk_norm_gain": False}},
     "model.attention.qk_norm_gain"),  # OLMoE's QK-norm has gains
    ({**MIXTRAL, "attention": {"name": "full", "qk_norm": "projection"}, "head_dim": 16}, "model.head_dim"),
    ({**MIXTRAL, "ffn": {**MIXTRAL["ffn"], "expert": {"name": "gelu", "d_ff": 24}}}, "model.ffn.expert"),
    ({**LLAMA4, "position": {"repeat": ["rope", "rope", "rope", "alibi"]}}, "model.position.name"),
    ({**LLAMA4, "ffn": {**LLAMA4["ffn"], "shared": None}}, "model.ffn.shared"),
    ({**LLAMA4, "attention": {"repeat": [{"name": "chunked", "chunk": 8, "qk_norm": "head", "qk_norm_gain": True}]
                             * 3 + ["full"]}}, "model.attention.qk_norm_gain"),  # Llama 4's QK-norm has no gain
    ({**LLAMA4, "norm": "post"}, "model.norm.name"),
])
def test_a_spec_that_does_not_map_names_its_first_field(spec, field):
    with pytest.raises(SpecError) as err:
        hf.architecture_for(parse_spec(spec))
    assert str(err.value).startswith(field)


def test_specs_written_by_hand_map_to_their_family():
    assert hf.architecture_for(parse_spec(MIXTRAL)).model_type == "mixtral"
    olmoe = {**MIXTRAL, "attention": {"name": "full", "qk_norm": "projection"},
             "ffn": {**MIXTRAL["ffn"], "normalize": False}}
    assert hf.architecture_for(parse_spec(olmoe)).model_type == "olmoe"
    assert hf.architecture_for(parse_spec(LLAMA4)).model_type == "llama4_text"
    # an expert named as a string (the moe FFN's default form), not only as a mapping
    by_name = {**MIXTRAL, "ffn": {"name": "moe", "n_experts": 4, "top_k": 2, "expert": "swiglu"}}
    assert hf.architecture_for(parse_spec(by_name)).model_type == "mixtral"


def test_training_only_moe_fields_export_without_blocking_it():
    """z_loss and capacity change training, not the evaluation forward: the export leaves them out;
    balance_loss is OLMoE's and Mixtral's router_aux_loss_coef, on."""
    spec = {**MIXTRAL, "ffn": {**MIXTRAL["ffn"], "z_loss": 0.001, "capacity_factor": 1.25, "balance_loss": 0.02}}
    config = hf.to_hf(build_model(spec).double().eval()).config
    assert (config.router_aux_loss_coef, config.output_router_logits) == (0.02, True)


@pytest.mark.parametrize(("model_type", "change", "field"), [
    ("olmoe", {"clip_qkv": 1.0}, "clip_qkv"),
    ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise"),
    ("llama4_text", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 64}}, "rope_parameters.rope_type"),
])
def test_a_config_the_workbench_cannot_compute_is_refused_by_field(model_type, change, field):
    with pytest.raises(SpecError) as err:
        hf.from_hf(reference(model_type, **change))
    assert str(err.value).startswith(field)
