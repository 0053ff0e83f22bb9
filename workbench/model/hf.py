"""Hugging Face `transformers` <-> workbench: the architectures both express, their configs, and
the weight mappings. One module for the parity tests (tests/model/test_hf_parity.py), `workbench
export RUN_DIR --to hf OUT` (`to_hf`) and `workbench.from_hf` (`from_hf`).

The architectures (GPT-2, Llama, Mistral, BLOOM, GPT-NeoX in workbench.model.hf_decoders; BERT,
BART, T5 in workbench.model.hf_encoders; OLMo 2, Qwen3, Gemma 2 and 3 in workbench.model.hf_qknorm;
DiffLlama and DeepSeek-V3 in workbench.model.hf_latent; OLMoE, Mixtral and Llama 4 in workbench.model.hf_moe;
Qwen3-Next in workbench.model.hf_qwen3_next)
and what each needs of a spec are classes
(`requirements`); docs/hf.md has them as a table.

Weight mappings (a `Link` ties one tensor of ours to one or more of theirs):
- Our fused projection `attn.qkv` holds the rows [q; k; v]. Llama, Mistral, BERT, BART and T5
  keep q, k, v apart; GPT-2's `c_attn` fuses them in our order but is a Conv1D (weights stored
  [in, out]: transposed, as are all of GPT-2's linear layers); BLOOM's and GPT-NeoX's
  `query_key_value` interleave them per head (rows [h, 3, hd]). Cross-attention's `kv` is [k; v].
- GPT-NeoX's MLP always has biases: a model without biases exports zeros there (`zeroed`).
- RoPE pairs: ours rotates (x[2j], x[2j+1]) as Meta's LLaMA reference; HF's `rotate_half` pairs
  (x[j], x[j + hd/2]). The same model up to a permutation of each head's q and k rows:
  ours[2j] = theirs[j], ours[2j+1] = theirs[j + hd/2] (`rope_pairing`; Llama, Mistral, GPT-NeoX).
- Gated FFNs: our `gate_up` is [gate; up] = Llama's [gate_proj; up_proj] = T5's [wi_0; wi_1].
- BART's learned positions start at row 2 of its table (its `offset`); ours at row 0.
- BERT adds a token type embedding; with one type it is a constant, folded into our position
  table on import (an export writes zeros there). BERT's masked-LM head (dense, GELU, LayerNorm)
  has no counterpart: an encoder exports as `BertModel`, whose logits are the last hidden state
  times the word embeddings, our tied head.

Deviations the parity tests measure, all below 1e-4 in logits: Llama's and T5's RMSNorm and
BLOOM's softmax compute in float32 even in a float64 model, and BLOOM's GELU rounds sqrt(2/pi)
to 0.79788456.
"""

from __future__ import annotations

import torch

from workbench.errors import SpecError
from workbench.model.hf_architecture import Architecture, import_transformers
from workbench.model.hf_decoders import GPT2, Bloom, GPTNeoX, Llama, Mistral
from workbench.model.hf_encoders import T5, Bart, Bert
from workbench.model.hf_qknorm import Gemma2, Gemma3, Olmo2, Qwen3, model_type_for
from workbench.model.hf_latent import LATENT_ATTENTION, DeepseekV3, DiffLlama
from workbench.model.hf_moe import Llama4, Mixtral, Olmoe, moe_architecture
from workbench.model.hf_qwen3_next import Qwen3Next, is_qwen3_next
from workbench.model.spec import ModelSpec, parse_spec
from workbench.model.state_links import check_coverage
from workbench.model.transformer import Transformer, build_model


ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (GPT2(), Llama(), Mistral(), Bloom(), GPTNeoX(),
                                                                     Bert(), Bart(), T5(),
                                                                     Olmo2(), Qwen3(), Gemma2(), Gemma3(),
                                                                     DiffLlama(), DeepseekV3(), Olmoe(), Mixtral(), Llama4(),
                                                                     Qwen3Next())}


def architecture_for(spec: ModelSpec) -> Architecture:
    """The architecture a spec maps to, or a SpecError naming the first field that does not map.
    The family and position scheme (and for RoPE the attention and norm) pick the candidate; then
    every other field is checked. A decoder with differential or latent attention is one of
    workbench.model.hf_latent's; with the sandwich norm or Gemma's embedding scale, Gemma's
    (workbench.model.hf_qknorm); with a mixture of experts (or Llama 4's per-layer patterns), one
    of workbench.model.hf_moe's; with QK-norm or the reordered norm, OLMo 2 or Qwen3. One with a
    Gated DeltaNet layer, an output-gated attention or a gated shared expert is Qwen3-Next."""
    model_type = None
    if is_qwen3_next(spec):
        model_type = "qwen3_next"
    elif spec.attention.name not in LATENT_ATTENTION:
        model_type = model_type_for(spec)
        if model_type not in ("gemma2", "gemma3_text"):
            model_type = moe_architecture(spec) or model_type
    if model_type is not None:
        ARCHITECTURES[model_type].check(spec)
        return ARCHITECTURES[model_type]
    rope = LATENT_ATTENTION.get(spec.attention.name) or (
        "mistral" if spec.attention.name == "sliding_window" else
        "gpt_neox" if spec.at("norm", 0).params.type == "layernorm" else "llama")
    by_position = {
        "decoder": {"learned": "gpt2", "rope": rope, "alibi": "bloom"},
        "encoder": {"learned": "bert"},
        "encoder_decoder": {"learned": "bart", "t5_bias": "t5"},
    }[spec.family]
    if spec.position.name not in by_position:
        raise SpecError("model.position", f"no Hugging Face architecture here has a {spec.family} with position "
                        f"{spec.position.name!r}", by_position)
    arch = ARCHITECTURES[by_position[spec.position.name]]
    arch.check(spec)
    return arch


# ---- moving weights -----------------------------------------------------------------------------


def linked(arch: Architecture, ours: Transformer, theirs) -> tuple[list, dict, dict]:
    """(links, our parameters, theirs) by name, every parameter on both sides linked or zeroed."""
    links = arch.links(ours.spec)
    mine, their = arch.tensors(ours), arch.tensors(theirs)
    check_coverage(links, mine, their, arch.model_type, (*arch.unmapped, *arch.zeroed(ours.spec)))
    return links, mine, their


def to_hf(model: Transformer):
    """A transformers model (`architecture_for(model.spec).hf_class`) holding our weights, in our
    dtype, eval mode. SpecError naming the first field that does not map."""
    transformers = import_transformers()
    arch = architecture_for(model.spec)
    dtype = next(model.parameters()).dtype
    hf = getattr(transformers, arch.hf_class)(arch.hf_config(model.spec), **arch.build_kwargs).to(dtype).eval()
    links, ours, theirs = linked(arch, model, hf)
    with torch.no_grad():
        for link in links:
            for name, value in zip(link.theirs, link.split(ours[link.ours].detach())):
                theirs[name].copy_(value)
        for name in arch.zeroed(model.spec):
            theirs[name].zero_()
    return hf


def from_hf(hf_model) -> Transformer:
    """A workbench model equal to a transformers model of a mapped architecture (the classes of
    ARCHITECTURES, or their bare models for BERT), in its dtype, eval mode. SpecError naming the
    first config field (or parameter) that does not map."""
    model_type = hf_model.config.model_type
    if model_type not in ARCHITECTURES:
        raise SpecError("model_type", f"no workbench mapping for {model_type!r}", ARCHITECTURES)
    arch = ARCHITECTURES[model_type]
    if type(hf_model).__name__ != arch.hf_class:
        raise SpecError("model", f"{model_type} maps as {arch.hf_class}, got {type(hf_model).__name__}")
    logits_bias = getattr(hf_model, "final_logits_bias", None)  # BART's, a buffer our head has no room for
    if logits_bias is not None and bool(logits_bias.any()):
        raise SpecError("final_logits_bias", "must be zero: the workbench's output head has no bias")
    spec = parse_spec(arch.spec(hf_model.config))
    dtype = next(hf_model.parameters()).dtype
    model = build_model(spec).to(dtype).eval()
    links, ours, theirs = linked(arch, model, hf_model)
    for name in arch.zeroed(spec):
        if bool(theirs[name].any()):
            raise SpecError(name, "must be zero: the workbench's model of this config has no biases there")
    with torch.no_grad():
        for link in links:
            ours[link.ours].copy_(link.join([theirs[name].detach() for name in link.theirs]))
    return model
