"""OLMo 2, Qwen3, Gemma 3 and Gemma 2 against Hugging Face `transformers` (workbench.model.hf_qknorm),
as tests/model/test_hf_parity.py does the first eight: a tiny config with random weights in
float64, copied into the workbench with `from_hf`, gives the same logits (max difference 1e-4)
and the same 20 greedy tokens decoded with the KV cache; exported back with `to_hf`, saved and
loaded by the Auto class, the same logits again. The sequences are longer than the sliding
windows, and each feature of Gemma's is shown to move the logits far beyond the tolerance, so
none of them can pass unmapped."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

transformers = pytest.importorskip("transformers")

from test_hf_parity import D, N_NEW, TOLERANCE, V, greedy_pair, logits_pair, tokens  # noqa: E402

from workbench.errors import SpecError  # noqa: E402
from workbench.model import hf  # noqa: E402
from workbench.model.spec import parse_spec  # noqa: E402
from workbench.model.transformer import Positions, build_model  # noqa: E402
from workbench.model.weights import load_final_model  # noqa: E402

WINDOW = 4  # local layers' window: the 12-token logits and the 6 + 20 decoded tokens run past it
GEMMA3_TYPES = ["sliding_attention"] * 3 + ["full_attention"]  # three local to one global (Gemma 3: five to one)
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},  # as Gemma 3 4B's, smaller
               "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 5000.0}}

CONFIGS = {
    "olmo2": dict(vocab_size=V, hidden_size=D, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                  rms_norm_eps=1e-6, tie_word_embeddings=False),
    "qwen3": dict(vocab_size=V, hidden_size=D, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                  rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=True, sliding_window=WINDOW,
                  max_window_layers=1),  # layers 1 and 2 slide
    "gemma3_text": dict(vocab_size=V, hidden_size=D, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW,
                        layer_types=GEMMA3_TYPES, rope_parameters=GEMMA3_ROPE, final_logit_softcapping=5.0),
    "gemma2": dict(vocab_size=V, hidden_size=D, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW,
                   final_logit_softcapping=5.0, attn_logit_softcapping=3.0,
                   rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
}


def reference(model_type: str, **overrides):
    """The HF model of `model_type`, float64, every parameter drawn at random as test_hf_parity's
    `reference` draws them (seed 0: the same weights whatever the overrides, when the shapes are
    the same). Gemma 2 runs transformers' eager attention, the only one that softcaps scores."""
    arch = hf.ARCHITECTURES[model_type]
    config = transformers.AutoConfig.for_model(model_type, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                               **{**CONFIGS[model_type], **overrides})
    config._attn_implementation = "eager" if model_type == "gemma2" else "sdpa"
    torch.manual_seed(0)
    model = getattr(transformers, arch.hf_class)(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_logits_and_cached_greedy_decoding_equal_the_reference(model_type, tmp_path):
    ref = reference(model_type)
    ours = hf.from_hf(ref)
    assert ours.num_parameters() == sum(p.numel() for p in ref.parameters())
    src = tokens(2, 12, seed=1)
    theirs, mine = logits_pair(ref, ours, src, None)
    assert theirs.std() > 1.0  # logits of several units: the tolerance below is a tight one
    assert (theirs - mine).abs().max() < TOLERANCE
    theirs, mine = greedy_pair(ref, ours, src[:, :6])
    assert theirs.tolist() == mine.tolist() and theirs.shape[1] == 6 + N_NEW

    hf.to_hf(ours).save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert type(back).__name__ == type(ref).__name__
    again, mine = logits_pair(back, ours, src, None)
    assert (again - mine).abs().max() < TOLERANCE
    home = hf.from_hf(back)  # and home again: the same spec
    assert home.spec == ours.spec


def test_the_imported_specs_are_what_a_study_would_write():
    """The mapping says what each family is in the workbench's own terms."""
    olmo, qwen, gemma3, gemma2 = (hf.from_hf(reference(t)).spec for t in ("olmo2", "qwen3", "gemma3_text", "gemma2"))
    assert (olmo.norm.name, olmo.attention.params.qk_norm, olmo.ffn.name) == ("reordered", "projection", "swiglu")
    assert qwen.norm.name == "pre"
    assert [qwen.at("attention", i).name for i in range(3)] == ["full", "sliding_window", "sliding_window"]
    assert {qwen.at("attention", i).params.qk_norm for i in range(3)} == {"head"}
    local, glob = gemma3.attention.items[0], gemma3.attention.items[3]
    assert gemma3.attention.repeat and len(gemma3.attention.items) == 4
    assert (local.name, local.params.window, glob.name) == ("sliding_window", WINDOW, "full")
    assert (local.params.qk_norm, local.params.scale_dim, local.params.softcap) == ("head", 24, None)
    assert [gemma3.at("position", i).params.base for i in range(4)] == [100.0, 100.0, 100.0, 5000.0]
    assert [gemma3.at("position", i).params.interpolation for i in range(4)] == [1.0, 1.0, 1.0, 8.0]
    assert (gemma3.norm.name, gemma3.ffn.name, gemma3.ffn.params.approximate) == ("sandwich", "geglu", "tanh")
    assert (gemma3.embedding_scale, gemma3.logit_softcap, gemma3.tie_embeddings) == ("sqrt_d_model", 5.0, True)
    assert gemma2.at("attention", 0).params.softcap == 3.0 and gemma2.at("attention", 0).params.qk_norm == "none"
    assert [gemma2.at("attention", i).name for i in range(3)] == ["sliding_window", "full", "sliding_window"]


@pytest.mark.parametrize(("model_type", "change"), [
    ("gemma3_text", {"sliding_window": 64}),  # the local layers' windows
    ("gemma3_text", {"rope_parameters": {t: {"rope_type": "default", "rope_theta": 100.0} for t in GEMMA3_ROPE}}),
    ("gemma3_text", {"rope_parameters": {**GEMMA3_ROPE, "full_attention": {"rope_type": "default", "rope_theta": 5000.0}}}),
    ("gemma3_text", {"query_pre_attn_scalar": 16}),  # = head_dim: the usual scale
    ("gemma3_text", {"final_logit_softcapping": None}),
    ("gemma2", {"attn_logit_softcapping": None}),
    ("qwen3", {"use_sliding_window": False}),
])
def test_each_feature_moves_the_logits_far_beyond_the_tolerance(model_type, change):
    """The same weights without one feature give other logits: the parity above covers it."""
    src = tokens(2, 12, seed=1)
    with torch.no_grad():
        moved = reference(model_type)(input_ids=src).logits - reference(model_type, **change)(input_ids=src).logits
    assert moved.abs().max() > 1000 * TOLERANCE


def qknorm_spec(**change):
    base = dict(family="decoder", vocab_size=V, d_model=D, n_heads=4, n_layers=2, position="rope",
                norm={"name": "pre", "type": "rmsnorm"}, ffn="swiglu", attention={"name": "full", "qk_norm": "head"})
    return parse_spec({**base, **change})


GEMMA = dict(norm={"name": "sandwich", "type": "rmsnorm"}, ffn={"name": "geglu", "approximate": "tanh"},
             embedding_scale="sqrt_d_model")
LOCAL = {"name": "sliding_window", "window": 4, "qk_norm": "head"}


@pytest.mark.parametrize(("change", "field"), [
    ({"norm": {"name": "reordered", "type": "rmsnorm"}, "attention": {"name": "sliding_window", "qk_norm": "projection"}},
     "model.attention.name"),  # OLMo 2 has full attention only
    ({"norm": {"name": "reordered", "type": "layernorm"}}, "model.norm.type"),
    ({"norm": {"name": "post", "type": "rmsnorm"}}, "model.norm.name"),  # QK-norm per head: Qwen3, pre-norm
    ({"norm": {"name": "reordered", "type": "rmsnorm"}, "attention": {"name": "full", "qk_norm": "projection", "qk_norm_gain": False}},
     "model.attention.qk_norm_gain"),  # OLMo 2's QK-norm has its gain (Llama 4's per head has none: it maps)
    ({"attention": {"name": "full", "qk_norm": "head", "gate": "headwise"}}, "model.attention.gate"),
    ({"attention": [LOCAL, {**LOCAL, "window": 8}]}, "model.attention.window"),  # Qwen3: one window
    ({"attention": {"name": "full", "qk_norm": "head", "scale_dim": 64}}, "model.attention.scale_dim"),
    ({**GEMMA, "attention": {"repeat": [LOCAL, {"name": "full", "qk_norm": "head", "softcap": 50.0}]}},
     "model.attention.softcap"),  # Gemma 3 never softcaps scores
    ({**GEMMA, "n_layers": 3, "attention": {"repeat": [LOCAL, LOCAL, {"name": "full", "qk_norm": "head"}]},
      "position": {"repeat": [{"name": "rope", "base": 10.0}, {"name": "rope", "base": 20.0},
                              {"name": "rope", "base": 30.0}]}}, "model.position.base"),  # one base per layer type
    ({**GEMMA, "embedding_scale": "none"}, "model.embedding_scale"),
    ({**GEMMA, "ffn": "swiglu"}, "model.ffn.name"),
    ({"norm": [{"name": "pre", "type": "rmsnorm"}, {"name": "post", "type": "rmsnorm"}]}, "model.norm:"),
    # the architectures without these options refuse them rather than drop them
    ({"attention": {"name": "full", "softcap": 30.0}}, "model.attention.softcap"),  # Llama
    ({"attention": {"name": "full", "value_residual": "fixed"}}, "model.attention.value_residual"),
    ({"attention": "full", "logit_softcap": 30.0}, "model.logit_softcap"),
    ({"attention": "full", "position": {"name": "rope", "interpolation": 4.0}}, "model.position.interpolation"),
    ({"attention": {"repeat": [LOCAL, LOCAL]}, "position": [{"name": "rope", "interpolation": 2.0}, "rope"]},
     "model.position"),  # Qwen3: one RoPE for every layer; Llama 4 (RoPE and NoPE layers): no interpolation
    ({"attention": "full", "position": {"name": "learned", "max_len": 64}, "norm": "pre", "ffn": "gelu", "bias": True,
      "embedding_scale": "sqrt_d_model"}, "model.norm.name"),  # the embedding scale is Gemma's (sandwich)
])
def test_a_spec_that_does_not_map_names_its_field(change, field):
    with pytest.raises(SpecError) as err:
        hf.architecture_for(qknorm_spec(**change))
    assert str(err.value).startswith(field), str(err.value)


@pytest.mark.parametrize(("model_type", "change", "field"), [
    ("gemma3_text", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma3_text", {"rope_parameters": {**GEMMA3_ROPE, "full_attention": {"rope_type": "dynamic", "factor": 2.0,
                                                                          "rope_theta": 5000.0}}},
     "rope_parameters.full_attention.rope_type"),
    ("qwen3", {"attention_bias": True}, "attention_bias"),
    ("olmo2", {"hidden_act": "gelu"}, "hidden_act"),
])
def test_a_config_the_workbench_cannot_compute_is_refused_by_field(model_type, change, field):
    with pytest.raises(SpecError) as err:
        hf.from_hf(reference(model_type, **change))
    assert str(err.value).startswith(field), str(err.value)


def test_softcapped_attention_equals_the_formula_on_every_kernel():
    """attention.softcap takes the explicit score path whatever the kernel and whoever calls it
    (no fused kernel caps): cap * tanh(q k^T / sqrt(scale_dim) / cap), then the mask and the softmax."""
    torch.manual_seed(0)
    x = torch.randn(2, 7, D, dtype=torch.float64) * 3
    seq = Positions.of(x[..., 0].long(), None)
    offset = seq.pos[0][:, None] - seq.pos[0][None, :]
    for attention, visible in (({"name": "full"}, offset >= 0),
                               ({"name": "sliding_window", "window": 3}, (offset >= 0) & (offset < 3))):
        spec = qknorm_spec(attention={**attention, "softcap": 2.0, "scale_dim": 6})
        layer = build_model(spec).double().decoder.blocks[0].attn
        with torch.no_grad():
            layer.qkv.weight.normal_(0.0, 0.5)  # scores of several units: the cap bites
        q, k, v = layer.project(x, {})
        q, k = layer.position.rotate(q, k, seq.pos, seq.pos)
        scores = q @ k.transpose(-1, -2) / 6**0.5
        assert scores.abs().max() > 4.0
        weights = torch.softmax((2.0 * torch.tanh(scores / 2.0)).masked_fill(~visible, -torch.inf), -1)
        with torch.no_grad():
            torch.testing.assert_close(layer(x, seq, True), layer.output(weights @ v, x), atol=1e-12, rtol=1e-12)
            kernel = layer.variant(q, k, v, q_pos=seq.pos, k_pos=seq.pos, key_mask=None, causal=True, score_bias=None)
            torch.testing.assert_close(kernel, weights @ v, atol=1e-12, rtol=1e-12)  # called directly too


def test_scale_dim_needs_scaled_scores():
    with pytest.raises(SpecError, match=r"^model\.attention\.scale_dim"):
        qknorm_spec(attention={"name": "full", "scaled": False, "scale_dim": 24})


GEMMA3_STUDY = """\
name: tiny-gemma3
task: {name: copy, train_length: 6, n_eval: 8, alphabet_size: 4}
model:
  family: decoder
  d_model: 16
  n_layers: 3
  n_heads: 4
  n_kv_heads: 2
  norm: {name: sandwich, type: rmsnorm}
  ffn: {name: geglu, approximate: tanh}
  embedding_scale: sqrt_d_model
  logit_softcap: 10.0
  attention: {repeat: [{name: sliding_window, window: 3, qk_norm: head, scale_dim: 8},
                       {name: sliding_window, window: 3, qk_norm: head, scale_dim: 8},
                       {name: full, qk_norm: head, scale_dim: 8}]}
  position: {repeat: [{name: rope, base: 100}, {name: rope, base: 100}, {name: rope, base: 10000}]}
train: {steps: 3, batch_size: 4, log_every: 1}
"""


def test_a_gemma3_study_exports_with_workbench_export(tmp_path, monkeypatch):
    """A study declares Gemma 3's block in YAML; `workbench export` writes a Gemma3ForCausalLM
    that transformers loads alone and that computes the run's logits."""
    from workbench.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(GEMMA3_STUDY)
    assert CliRunner().invoke(main, ["run", "tiny.yaml", "--quiet"]).exit_code == 0
    (run,) = (tmp_path / "runs" / "tiny-gemma3" / "runs").iterdir()
    result = CliRunner().invoke(main, ["export", str(run), "--to", "hf", "exported"])
    assert result.exit_code == 0, result.output
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    assert type(loaded).__name__ == "Gemma3ForCausalLM"
    assert loaded.config.layer_types == ["sliding_attention", "sliding_attention", "full_attention"]
    ours, _ = load_final_model(run)
    x = torch.randint(2, ours.spec.vocab_size, (3, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mine, theirs = ours(x), loaded(input_ids=x).logits
    assert mine.abs().max() > 0.1
    assert (mine - theirs).abs().max() < 1e-4
