"""The workbench against Hugging Face `transformers` (litgpt's `test_against_hf_*`): each
reference architecture built from a tiny config with random weights in float64 (nothing is
downloaded), copied into the workbench through workbench.model.hf, gives the same logits (max
difference 1e-4) and the same 20 greedy tokens decoded with the KV cache; and back (`to_hf`)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from workbench.errors import SpecError  # noqa: E402
from workbench.model import hf  # noqa: E402
from workbench.model.hf_decoders import rope_pairing  # noqa: E402
from workbench.model.spec import parse_spec  # noqa: E402
from workbench.model.transformer import EncoderDecoderModel, build_model  # noqa: E402
from workbench.tasks import SPECIALS  # noqa: E402

V, D, L, N_NEW = 96, 32, 2, 20  # vocabulary, width, layers, tokens decoded
TOLERANCE = 1e-4
SEQ2SEQ = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)

CONFIGS = {
    "gpt2": dict(vocab_size=V, n_embd=D, n_layer=L, n_head=4, n_positions=64, activation_function="gelu_new",
                 bos_token_id=1, eos_token_id=2),
    "llama": dict(vocab_size=V, hidden_size=D, intermediate_size=80, num_hidden_layers=L, num_attention_heads=4,
                  num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                  rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    "mistral": dict(vocab_size=V, hidden_size=D, intermediate_size=64, num_hidden_layers=L, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=16, sliding_window=5, rms_norm_eps=1e-5,
                    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    "bloom": dict(vocab_size=V, hidden_size=48, n_layer=L, n_head=6, bos_token_id=1, eos_token_id=2),
    "gpt_neox": dict(vocab_size=V, hidden_size=D, intermediate_size=64, num_hidden_layers=L, num_attention_heads=4,
                     use_parallel_residual=False, hidden_act="gelu_new", tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 1.0},
                     bos_token_id=1, eos_token_id=2),
    "bert": dict(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=64, type_vocab_size=2, pad_token_id=0),
    "bart": dict(vocab_size=V, d_model=D, encoder_layers=L, decoder_layers=L, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                 forced_bos_token_id=None, forced_eos_token_id=None, **SEQ2SEQ),
    "t5": dict(vocab_size=V, d_model=D, d_kv=8, d_ff=64, num_layers=L, num_decoder_layers=L, num_heads=4,
               relative_attention_num_buckets=8, relative_attention_max_distance=20, tie_word_embeddings=False,
               **SEQ2SEQ),
}


def reference(model_type: str, **overrides):
    """The HF model of `model_type`, float64, with every parameter drawn at random (`randomized`)."""
    arch = hf.ARCHITECTURES[model_type]
    config = transformers.AutoConfig.for_model(model_type, **{**CONFIGS[model_type], **overrides})
    config._attn_implementation = "eager" if model_type == "bloom" else "sdpa"
    torch.manual_seed(0)
    return randomized(getattr(transformers, arch.hf_class)(config).double().eval())


def randomized(model):
    """`model` with every parameter drawn at random (norm weights near 1, biases near 0, matrices
    at a scale that gives logits of several units, so a wrong mapping cannot hide below the
    tolerance)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def tokens(B: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, V, (B, n), generator=torch.Generator().manual_seed(seed))


def logits_pair(ref, ours, src: torch.Tensor, tgt: torch.Tensor | None):
    """(theirs, ours) logits; BERT's are its last hidden state times the word embeddings."""
    with torch.no_grad():
        if tgt is not None:
            return ref(input_ids=src, decoder_input_ids=tgt).logits, ours(src, tgt)
        out = ref(input_ids=src)
        theirs = out.logits if hasattr(out, "logits") else out.last_hidden_state @ ref.get_input_embeddings().weight.T
        return theirs, ours(src)


def greedy_pair(ref, ours, prompt: torch.Tensor):
    settings = transformers.GenerationConfig(do_sample=False, max_new_tokens=N_NEW,
                                             use_cache=True, eos_token_id=None, pad_token_id=0,
                                             decoder_start_token_id=1)
    theirs = ref.generate(prompt, generation_config=settings)
    if isinstance(ours, EncoderDecoderModel):
        return theirs, ours.generate(prompt, max_new_tokens=N_NEW, bos_id=1, use_cache=True)
    return theirs, ours.generate(prompt, max_new_tokens=N_NEW, use_cache=True)


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_logits_and_cached_greedy_decoding_equal_the_reference(model_type, tmp_path):
    ref = reference(model_type)
    ours = hf.from_hf(ref)
    assert ours.num_parameters() <= sum(p.numel() for p in ref.parameters())
    src = tokens(2, 12, seed=1)
    tgt = tokens(2, 9, seed=2) if ours.spec.family == "encoder_decoder" else None
    theirs, mine = logits_pair(ref, ours, src, tgt)
    assert theirs.std() > 1.0  # logits of several units: the tolerance below is a tight one
    assert (theirs - mine).abs().max() < TOLERANCE
    if ours.spec.family != "encoder":
        theirs, mine = greedy_pair(ref, ours, src[:, :6])
        assert theirs.tolist() == mine.tolist()
        assert theirs.shape[1] - (1 if tgt is not None else 6) == N_NEW

    # and back: the export's mapping, saved and loaded by the Auto class it names, gives them again
    hf.to_hf(ours).save_pretrained(tmp_path)
    auto = getattr(transformers, hf.ARCHITECTURES[model_type].auto_class)
    back = auto.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert type(back).__name__ == type(ref).__name__
    again, mine = logits_pair(back, ours, src, tgt)
    assert (again - mine).abs().max() < TOLERANCE


def test_bloom_alibi_with_a_head_count_that_is_not_a_power_of_two():
    """6 heads: slopes interleave the 4- and 8-head sequences (Press et al.; BLOOM's build_alibi_tensor)."""
    ours = hf.from_hf(reference("bloom"))
    assert ours.spec.n_heads == 6 and ours.spec.position.name == "alibi"


def test_t5_buckets_are_hf_transformers_buckets():
    from transformers.models.t5.modeling_t5 import T5Attention

    from workbench_plugins.position_t5_bias import relative_position_bucket

    offsets = torch.arange(-300, 301)
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 20), (6, 7)):
            expected = T5Attention._relative_position_bucket(offsets, bidirectional, buckets, distance)
            assert torch.equal(relative_position_bucket(offsets, bidirectional, buckets, distance), expected)


def test_rope_pairing_permutation_is_a_permutation_of_each_head():
    order = rope_pairing(3, 8)
    assert sorted(order.tolist()) == list(range(24))
    assert order[:8].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]  # ours[2j] = theirs[j], ours[2j+1] = theirs[j + 4]


@pytest.mark.parametrize(("change", "field"), [
    ({"position": "sinusoidal"}, "model.position"),
    ({"position": {"name": "learned", "max_len": 64}, "norm": "post"}, "model.norm.name"),
    ({"position": "rope", "attention": {"name": "sliding_window", "window": 4}}, "model.norm.type"),
    ({"position": "rope", "ffn": "swiglu"}, "model.ffn.name"),  # GPT-NeoX: RoPE with LayerNorm
    ({"position": "rope", "n_kv_heads": 2}, "model.n_kv_heads"),
    ({"position": "rope", "norm": {"name": "pre", "type": "rmsnorm"}, "ffn": "swiglu", "tie_qk": True}, "model.tie_qk"),
    ({"position": "alibi", "ffn": "gelu", "bias": True, "embedding_norm": "layernorm"}, "model.ffn.approximate"),
    # Scalable-Softmax: no Hugging Face attention scales scores by log n (was an assertion in state_links)
    ({"attention": {"name": "full", "length_scaled": True}}, "model.attention.length_scaled: gpt_neox"),
    ({"position": {"name": "learned", "max_len": 64}, "bias": True, "ffn": "gelu",
      "attention": {"name": "full", "length_scaled": True}}, "model.attention.length_scaled: gpt2"),
])
def test_a_spec_that_does_not_map_names_its_first_field(change, field):
    spec = parse_spec({"family": "decoder", "vocab_size": V, "d_model": D, "n_heads": 4, **change})
    with pytest.raises(SpecError) as err:
        hf.architecture_for(spec)
    assert str(err.value).startswith(field)


def test_the_default_decoder_is_gpt_neox_without_parallel_residual(tmp_path):
    """RoPE + LayerNorm, pre-norm, GELU, no biases, tied (ModelSpec's defaults): GPT-NeoX with
    `use_parallel_residual` off, its MLP biases (which GPT-NeoX always has) exported as zeros."""
    torch.manual_seed(0)
    ours = build_model({"family": "decoder", "vocab_size": V, "d_model": D, "n_heads": 4, "n_layers": L}).double()
    with torch.no_grad():  # weights large enough that the logits spread over several units
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() >= 2 else 0.1))
    assert hf.architecture_for(ours.spec).model_type == "gpt_neox"
    theirs = hf.to_hf(ours)
    assert type(theirs).__name__ == "GPTNeoXForCausalLM" and theirs.config.use_parallel_residual is False
    src = tokens(2, 12, seed=1)
    mine, their = logits_pair(theirs, ours, src, None)
    assert mine.std() > 1.0 and (mine - their).abs().max() < TOLERANCE
    their, mine = greedy_pair(theirs, ours, src[:, :6])
    assert their.tolist() == mine.tolist()

    theirs.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert (logits_pair(back, ours, src, None)[0] - ours(src)).abs().max() < TOLERANCE
    again = hf.from_hf(back)  # and home again: no biases, tied, the same logits
    assert (again.spec.bias, again.spec.tie_embeddings, again.spec.norm.params.type) == (False, True, "layernorm")
    with torch.no_grad():
        assert (again(src) - ours(src)).abs().max() < TOLERANCE
    with torch.no_grad():
        back.gpt_neox.layers[1].mlp.dense_4h_to_h.bias.add_(0.5)  # a bias the workbench's model has no room for
    with pytest.raises(SpecError, match="gpt_neox.layers.1.mlp.dense_4h_to_h.bias"):
        hf.from_hf(back)


@pytest.mark.parametrize(("change", "field"), [
    ({"use_parallel_residual": True}, "use_parallel_residual"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}}, "rope_parameters"),
    ({"hidden_act": "silu"}, "hidden_act"),
])
def test_a_gpt_neox_the_workbench_cannot_compute_is_refused_by_field(change, field):
    with pytest.raises(SpecError) as err:
        hf.from_hf(reference("gpt_neox", **change))
    assert str(err.value).startswith(field)


def test_every_export_declares_special_ids_inside_its_vocabulary():
    """pad 0, bos 1, eos 2: the tasks' <pad>, <bos>, <eos> (GPT-2's own 50256 would lie outside)."""
    for model_type in CONFIGS:
        config = hf.to_hf(hf.from_hf(reference(model_type))).config
        ids = (config.pad_token_id, config.bos_token_id, config.eos_token_id)
        assert ids == (SPECIALS.index("<pad>"), SPECIALS.index("<bos>"), SPECIALS.index("<eos>")), model_type
