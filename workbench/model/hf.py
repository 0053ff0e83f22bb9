"""Hugging Face `transformers` <-> workbench: the architectures both express, their configs, and
the weight mappings. One module for the parity tests (tests/model/test_hf_parity.py), `workbench
export RUN_DIR --to hf OUT` (`to_hf`) and `workbench.from_hf` (`from_hf`).

The architectures (GPT-2, Llama, Mistral, BLOOM, BERT, BART, T5) and what each needs of a spec
are the classes below (`requirements`); docs/hf.md has them as a table.

Weight mappings (a `Link` ties one tensor of ours to one or more of theirs):
- Our fused projection `attn.qkv` holds the rows [q; k; v]. Llama, Mistral, BERT, BART and T5
  keep q, k, v apart; GPT-2's `c_attn` fuses them in our order but is a Conv1D (weights stored
  [in, out]: transposed, as are all of GPT-2's linear layers); BLOOM's `query_key_value`
  interleaves them per head (rows [h, 3, hd]). Cross-attention's `kv` is [k; v].
- RoPE pairs: ours rotates (x[2j], x[2j+1]) as Meta's LLaMA reference; HF's `rotate_half` pairs
  (x[j], x[j + hd/2]). The same model up to a permutation of each head's q and k rows:
  ours[2j] = theirs[j], ours[2j+1] = theirs[j + hd/2] (`rope_pairing`).
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

from typing import Any

import torch
from torch import Tensor

from workbench.errors import SpecError, WorkbenchError
from workbench.model.spec import ModelSpec, parse_spec
from workbench.model.state_links import (Link, attention, check_coverage, cross_kv, linear, mlp, norm, rows, same,
                                         transposed)
from workbench.model.transformer import Transformer, build_model


def rope_pairing(heads: int, head_dim: int) -> Tensor:
    """Row order taking HF's rotate-half q/k rows to ours: ours[2j] = theirs[j],
    ours[2j + 1] = theirs[j + hd/2], within each head."""
    within = torch.arange(head_dim).view(2, head_dim // 2).T.reshape(-1)  # 0, hd/2, 1, hd/2 + 1, ...
    return (torch.arange(heads)[:, None] * head_dim + within).reshape(-1)


def bloom_interleaving(heads: int, head_dim: int) -> Tensor:
    """Row order taking BLOOM's query_key_value rows [h, 3, hd] to ours [3, h, hd]."""
    return torch.arange(3 * heads * head_dim).view(heads, 3, head_dim).transpose(0, 1).reshape(-1)


# ---- what must hold for a spec to be an architecture --------------------------------------------


def value_at(spec: ModelSpec, field: str) -> Any:
    """'norm.type' -> spec.norm.params.type; 'norm.name' -> spec.norm.name; 'bias' -> spec.bias."""
    axis, _, key = field.partition(".")
    value = getattr(spec, axis)
    if not key:
        return value
    return value.name if key == "name" else getattr(value.params, key)


class Architecture:
    """One HF architecture: what a spec must hold, the config both ways, the weight links."""

    model_type: str
    hf_class: str  # the transformers class export writes and from_hf reads
    auto_class: str  # the transformers Auto class that loads an export
    unmapped: tuple[str, ...] = ()  # prefixes of their parameters outside what ours computes (left out)
    build_kwargs: dict[str, Any] = {}  # for hf_class(config, ...) in an export
    any_head_dim = False  # HF derives head_dim = d_model / n_heads (True: the config holds its own)

    def requirements(self, spec: ModelSpec) -> dict[str, Any]:
        """Dotted spec field -> the value the architecture needs, in the order they are checked."""
        raise NotImplementedError

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        raise NotImplementedError

    def spec(self, config) -> dict[str, Any]:
        raise NotImplementedError

    def links(self, spec: ModelSpec) -> list[Link]:
        raise NotImplementedError

    def check(self, spec: ModelSpec) -> None:
        """SpecError naming the first field whose value the architecture cannot hold."""
        needed = {**self.requirements(spec), "tie_qk": False, "n_classes": None}
        for field, wanted in needed.items():
            got = value_at(spec, field)
            if got != wanted:
                raise SpecError(f"model.{field}", f"{self.model_type} ({self.hf_class}) needs {wanted!r}, got {got!r}")
        if spec.head_dim * spec.n_heads != spec.d_model and not self.any_head_dim:
            raise SpecError("model.head_dim", f"{self.model_type} needs head_dim = d_model / n_heads = "
                            f"{spec.d_model // spec.n_heads}, got {spec.head_dim}")

    def hf_config(self, spec: ModelSpec):
        transformers = import_transformers()
        return transformers.AutoConfig.for_model(self.model_type, **self.config(spec))


def ffn_width(spec: ModelSpec) -> int:
    return spec.ffn.params.d_ff or (round(8 * spec.d_model / 3) if spec.ffn.name in ("swiglu", "geglu")
                                    else 4 * spec.d_model)


GELU_ACT = {"none": "gelu", "tanh": "gelu_new"}  # transformers' ACT2FN names
GELU_APPROXIMATE = {v: k for k, v in GELU_ACT.items()} | {"gelu_pytorch_tanh": "tanh"}


class GPT2(Architecture):
    model_type, hf_class, auto_class = "gpt2", "GPT2LMHeadModel", "AutoModelForCausalLM"

    def requirements(self, spec):
        return {"family": "decoder", "position.name": "learned", "attention.name": "full", "attention.scaled": True,
                "norm.name": "pre", "norm.type": "layernorm", "ffn.name": "gelu", "embedding_norm": "none",
                "n_kv_heads": spec.n_heads, "bias": True, "tie_embeddings": True}

    def config(self, spec):
        return dict(vocab_size=spec.vocab_size, n_positions=spec.position.params.max_len, n_embd=spec.d_model,
                    n_layer=spec.n_layers, n_head=spec.n_heads, n_inner=ffn_width(spec),
                    activation_function=GELU_ACT[spec.ffn.params.approximate],
                    layer_norm_epsilon=spec.norm.params.eps, resid_pdrop=spec.dropout, embd_pdrop=spec.dropout,
                    attn_pdrop=0.0, tie_word_embeddings=True)

    def spec(self, c):
        return dict(family="decoder", vocab_size=c.vocab_size, d_model=c.n_embd, n_layers=c.n_layer, n_heads=c.n_head,
                    position={"name": "learned", "max_len": c.n_positions}, attention="full",
                    norm={"name": "pre", "type": "layernorm", "eps": c.layer_norm_epsilon},
                    ffn={"name": "gelu", "d_ff": c.n_inner or 4 * c.n_embd,
                         "approximate": GELU_APPROXIMATE[c.activation_function]},
                    bias=True, tie_embeddings=True)

    def links(self, spec):
        out = [same("embedding.weight", "transformer.wte.weight"),
               same("decoder.position.table.weight", "transformer.wpe.weight")]
        for i in range(spec.n_layers):
            ours, theirs = f"decoder.blocks.{i}", f"transformer.h.{i}"
            out += norm(f"{ours}.attn_norm.norm", f"{theirs}.ln_1", spec)
            out += linear(f"{ours}.attn.qkv", f"{theirs}.attn.c_attn", True, transposed)
            out += linear(f"{ours}.attn.out", f"{theirs}.attn.c_proj", True, transposed)
            out += norm(f"{ours}.ffn_norm.norm", f"{theirs}.ln_2", spec)
            out += linear(f"{ours}.ffn.up", f"{theirs}.mlp.c_fc", True, transposed)  # GPT-2: Conv1D
            out += linear(f"{ours}.ffn.down", f"{theirs}.mlp.c_proj", True, transposed)
        return out + norm("decoder.final_norm", "transformer.ln_f", spec)


class Llama(Architecture):
    model_type, hf_class, auto_class = "llama", "LlamaForCausalLM", "AutoModelForCausalLM"
    any_head_dim = True
    attention = "full"

    def requirements(self, spec):
        return {"family": "decoder", "position.name": "rope", "attention.name": self.attention,
                "attention.scaled": True, "norm.name": "pre", "norm.type": "rmsnorm", "ffn.name": "swiglu",
                "embedding_norm": "none", "bias": False}

    def config(self, spec):
        return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=ffn_width(spec),
                    num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
                    num_key_value_heads=spec.n_kv_heads, head_dim=spec.head_dim, rms_norm_eps=spec.norm.params.eps,
                    rope_parameters={"rope_type": "default", "rope_theta": spec.position.params.base},
                    tie_word_embeddings=spec.tie_embeddings, attention_dropout=0.0, hidden_act="silu")

    def spec(self, c):
        rope = c.rope_parameters or {}
        if rope.get("rope_type", "default") != "default":
            raise SpecError("rope_parameters.rope_type", f"only the default RoPE maps to the workbench's, got "
                            f"{rope['rope_type']!r}")
        if c.hidden_act != "silu" or getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
            raise SpecError("hidden_act", "the workbench's SwiGLU needs silu and no biases")
        return dict(family="decoder", vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                    n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads,
                    head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
                    position={"name": "rope", "base": rope.get("rope_theta", 10000.0)}, attention=self.spec_attention(c),
                    norm={"name": "pre", "type": "rmsnorm", "eps": c.rms_norm_eps},
                    ffn={"name": "swiglu", "d_ff": c.intermediate_size}, bias=False,
                    tie_embeddings=c.tie_word_embeddings)

    def spec_attention(self, c) -> Any:
        return "full"

    def links(self, spec):
        h, g, hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
        out = [same("embedding.weight", "model.embed_tokens.weight")]
        for i in range(spec.n_layers):
            ours, theirs = f"decoder.blocks.{i}", f"model.layers.{i}"
            att = f"{theirs}.self_attn"
            out += norm(f"{ours}.attn_norm.norm", f"{theirs}.input_layernorm", spec)
            out += attention(f"{ours}.attn", (f"{att}.q_proj", f"{att}.k_proj", f"{att}.v_proj", f"{att}.o_proj"),
                             spec, False, (rope_pairing(h, hd), rope_pairing(g, hd)))
            out += norm(f"{ours}.ffn_norm.norm", f"{theirs}.post_attention_layernorm", spec)
            d_ff = ffn_width(spec)
            out.append(rows(f"{ours}.ffn.gate_up.weight", [(f"{theirs}.mlp.gate_proj.weight", d_ff, None),
                                                          (f"{theirs}.mlp.up_proj.weight", d_ff, None)]))
            out += linear(f"{ours}.ffn.down", f"{theirs}.mlp.down_proj", False)
        out += norm("decoder.final_norm", "model.norm", spec)
        return out + ([] if spec.tie_embeddings else [same("head.weight", "lm_head.weight")])


class Mistral(Llama):
    model_type, hf_class, auto_class = "mistral", "MistralForCausalLM", "AutoModelForCausalLM"
    attention = "sliding_window"

    def config(self, spec):
        return {**super().config(spec), "sliding_window": spec.attention.params.window}

    def spec_attention(self, c) -> Any:
        if c.sliding_window is None:
            return "full"
        return {"name": "sliding_window", "window": c.sliding_window}


class Bloom(Architecture):
    model_type, hf_class, auto_class = "bloom", "BloomForCausalLM", "AutoModelForCausalLM"

    def requirements(self, spec):
        return {"family": "decoder", "position.name": "alibi", "attention.name": "full", "attention.scaled": True,
                "norm.name": "pre", "norm.type": "layernorm", "ffn.name": "gelu", "ffn.approximate": "tanh",
                "ffn.d_ff": spec.ffn.params.d_ff if spec.ffn.params.d_ff in (None, 4 * spec.d_model) else 4 * spec.d_model,
                "embedding_norm": "layernorm", "n_kv_heads": spec.n_heads, "bias": True, "tie_embeddings": True}

    def config(self, spec):
        return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, n_layer=spec.n_layers, n_head=spec.n_heads,
                    layer_norm_epsilon=spec.norm.params.eps, hidden_dropout=spec.dropout, attention_dropout=0.0,
                    apply_residual_connection_post_layernorm=False, tie_word_embeddings=True)

    def spec(self, c):
        if c.apply_residual_connection_post_layernorm:
            raise SpecError("apply_residual_connection_post_layernorm", "has no workbench counterpart (needs false)")
        return dict(family="decoder", vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.n_layer,
                    n_heads=c.n_head, position="alibi", attention="full",
                    norm={"name": "pre", "type": "layernorm", "eps": c.layer_norm_epsilon},
                    ffn={"name": "gelu", "approximate": "tanh"}, embedding_norm="layernorm", bias=True,
                    tie_embeddings=True)

    def links(self, spec):
        h, hd = spec.n_heads, spec.head_dim
        out = [same("embedding.weight", "transformer.word_embeddings.weight")]
        out += norm("decoder.embedding_norm", "transformer.word_embeddings_layernorm", spec)
        for i in range(spec.n_layers):
            ours, theirs = f"decoder.blocks.{i}", f"transformer.h.{i}"
            qkv = f"{theirs}.self_attention.query_key_value"
            order = bloom_interleaving(h, hd)
            out += norm(f"{ours}.attn_norm.norm", f"{theirs}.input_layernorm", spec)
            out += [rows(f"{ours}.attn.qkv.weight", [(f"{qkv}.weight", 3 * h * hd, order)]),
                    rows(f"{ours}.attn.qkv.bias", [(f"{qkv}.bias", 3 * h * hd, order)])]
            out += linear(f"{ours}.attn.out", f"{theirs}.self_attention.dense", True)
            out += norm(f"{ours}.ffn_norm.norm", f"{theirs}.post_attention_layernorm", spec)
            out += mlp(f"{ours}.ffn", f"{theirs}.mlp.dense_h_to_4h", f"{theirs}.mlp.dense_4h_to_h", True)
        return out + norm("decoder.final_norm", "transformer.ln_f", spec)


class Bert(Architecture):
    model_type, hf_class, auto_class = "bert", "BertModel", "AutoModel"
    unmapped = ("pooler.",)  # BertModel's [CLS] pooler: not part of the hidden states (an export has none)
    build_kwargs = {"add_pooling_layer": False}

    def requirements(self, spec):
        return {"family": "encoder", "position.name": "learned", "attention.name": "full", "attention.scaled": True,
                "norm.name": "post", "norm.type": "layernorm", "ffn.name": "gelu", "embedding_norm": "layernorm",
                "n_kv_heads": spec.n_heads, "bias": True, "tie_embeddings": True}

    def config(self, spec):
        return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, num_hidden_layers=spec.n_layers,
                    num_attention_heads=spec.n_heads, intermediate_size=ffn_width(spec),
                    hidden_act=GELU_ACT[spec.ffn.params.approximate], max_position_embeddings=spec.position.params.max_len,
                    type_vocab_size=1, layer_norm_eps=spec.norm.params.eps, hidden_dropout_prob=spec.dropout,
                    attention_probs_dropout_prob=0.0, pad_token_id=0)

    def spec(self, c):
        return dict(family="encoder", vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                    n_heads=c.num_attention_heads, position={"name": "learned", "max_len": c.max_position_embeddings},
                    attention="full", norm={"name": "post", "type": "layernorm", "eps": c.layer_norm_eps},
                    ffn={"name": "gelu", "d_ff": c.intermediate_size, "approximate": GELU_APPROXIMATE[c.hidden_act]},
                    embedding_norm="layernorm", bias=True, tie_embeddings=True)

    def links(self, spec):
        positions = Link("encoder.position.table.weight", ("embeddings.position_embeddings.weight",
                                                           "embeddings.token_type_embeddings.weight"),
                         lambda t: [t, torch.zeros_like(t[:1])], lambda ts: ts[0] + ts[1][0])
        out = [same("embedding.weight", "embeddings.word_embeddings.weight"), positions]
        out += norm("encoder.embedding_norm", "embeddings.LayerNorm", spec)
        for i in range(spec.n_layers):
            ours, theirs = f"encoder.blocks.{i}", f"encoder.layer.{i}"
            att = f"{theirs}.attention"
            out += attention(f"{ours}.attn", (f"{att}.self.query", f"{att}.self.key", f"{att}.self.value",
                                              f"{att}.output.dense"), spec, True)
            out += norm(f"{ours}.attn_norm.norm", f"{att}.output.LayerNorm", spec)
            out += mlp(f"{ours}.ffn", f"{theirs}.intermediate.dense", f"{theirs}.output.dense", True)
            out += norm(f"{ours}.ffn_norm.norm", f"{theirs}.output.LayerNorm", spec)
        return out


class Bart(Architecture):
    model_type, hf_class, auto_class = "bart", "BartForConditionalGeneration", "AutoModelForSeq2SeqLM"

    def requirements(self, spec):
        return {"family": "encoder_decoder", "position.name": "learned", "attention.name": "full",
                "attention.scaled": True, "norm.name": "post", "norm.type": "layernorm", "norm.eps": 1e-5,
                "ffn.name": "gelu", "embedding_norm": "layernorm", "n_kv_heads": spec.n_heads, "bias": True,
                "tie_embeddings": True}

    def config(self, spec):
        d_ff = ffn_width(spec)
        return dict(vocab_size=spec.vocab_size, d_model=spec.d_model, encoder_layers=spec.encoder_layers,
                    decoder_layers=spec.decoder_layers, encoder_attention_heads=spec.n_heads,
                    decoder_attention_heads=spec.n_heads, encoder_ffn_dim=d_ff, decoder_ffn_dim=d_ff,
                    activation_function=GELU_ACT[spec.ffn.params.approximate],
                    max_position_embeddings=spec.position.params.max_len, dropout=spec.dropout, attention_dropout=0.0,
                    activation_dropout=0.0, scale_embedding=False, tie_word_embeddings=True, **SEQ2SEQ_IDS,
                    forced_bos_token_id=None, forced_eos_token_id=None)

    def spec(self, c):
        if c.scale_embedding or c.encoder_attention_heads != c.decoder_attention_heads or \
                c.encoder_ffn_dim != c.decoder_ffn_dim:
            raise SpecError("scale_embedding", "the workbench needs scale_embedding false and equal encoder and "
                            "decoder heads and FFN widths")
        return dict(family="encoder_decoder", vocab_size=c.vocab_size, d_model=c.d_model, n_layers=c.encoder_layers,
                    n_encoder_layers=c.encoder_layers, n_decoder_layers=c.decoder_layers,
                    n_heads=c.encoder_attention_heads, position={"name": "learned", "max_len": c.max_position_embeddings},
                    attention="full", norm={"name": "post", "type": "layernorm", "eps": 1e-5},
                    ffn={"name": "gelu", "d_ff": c.encoder_ffn_dim,
                         "approximate": GELU_APPROXIMATE[c.activation_function]},
                    embedding_norm="layernorm", bias=True, tie_embeddings=True)

    def links(self, spec):
        out = [same("embedding.weight", "model.shared.weight")]
        for stack, n_layers in (("encoder", spec.encoder_layers), ("decoder", spec.decoder_layers)):
            # BART's position p reads row p + 2; rows 0 and 1 are never read (an export writes zeros)
            out.append(Link(f"{stack}.position.table.weight", (f"model.{stack}.embed_positions.weight",),
                            lambda t: [torch.cat([torch.zeros_like(t[:2]), t])], lambda ts: ts[0][2:]))
            out += norm(f"{stack}.embedding_norm", f"model.{stack}.layernorm_embedding", spec)
            for i in range(n_layers):
                ours, theirs = f"{stack}.blocks.{i}", f"model.{stack}.layers.{i}"
                att = f"{theirs}.self_attn"
                out += attention(f"{ours}.attn", (f"{att}.q_proj", f"{att}.k_proj", f"{att}.v_proj", f"{att}.out_proj"),
                                 spec, True)
                out += norm(f"{ours}.attn_norm.norm", f"{theirs}.self_attn_layer_norm", spec)
                if stack == "decoder":
                    cross = f"{theirs}.encoder_attn"
                    out += linear(f"{ours}.cross.q", f"{cross}.q_proj", True)
                    out += cross_kv(f"{ours}.cross.kv", f"{cross}.k_proj", f"{cross}.v_proj", spec, True)
                    out += linear(f"{ours}.cross.out", f"{cross}.out_proj", True)
                    out += norm(f"{ours}.cross_norm.norm", f"{theirs}.encoder_attn_layer_norm", spec)
                out += mlp(f"{ours}.ffn", f"{theirs}.fc1", f"{theirs}.fc2", True)
                out += norm(f"{ours}.ffn_norm.norm", f"{theirs}.final_layer_norm", spec)
        return out


# Our tasks' ids (workbench.tasks.base): padding 0, BOS 1 (the decoder's start), EOS 2
SEQ2SEQ_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
T5_FFN = {"relu": "relu", "geglu": "gated-gelu"}


class T5(Architecture):
    model_type, hf_class, auto_class = "t5", "T5ForConditionalGeneration", "AutoModelForSeq2SeqLM"
    any_head_dim = True

    def requirements(self, spec):
        ffn = {"ffn.name": spec.ffn.name if spec.ffn.name in T5_FFN else "relu"}
        if spec.ffn.name == "geglu":
            ffn["ffn.approximate"] = "tanh"  # T5 v1.1's gated-gelu is gelu_new
        # transformers 5 always ties T5's head to the embeddings (as ours is tied)
        return {"family": "encoder_decoder", "position.name": "t5_bias", "attention.name": "full",
                "attention.scaled": False, "norm.name": "pre", "norm.type": "rmsnorm", **ffn,
                "embedding_norm": "none", "bias": False, "tie_embeddings": True}

    def config(self, spec):
        return dict(vocab_size=spec.vocab_size, d_model=spec.d_model, d_kv=spec.head_dim, d_ff=ffn_width(spec),
                    num_layers=spec.encoder_layers, num_decoder_layers=spec.decoder_layers, num_heads=spec.n_heads,
                    relative_attention_num_buckets=spec.position.params.num_buckets,
                    relative_attention_max_distance=spec.position.params.max_distance,
                    layer_norm_epsilon=spec.norm.params.eps, feed_forward_proj=T5_FFN[spec.ffn.name],
                    # in transformers 5, tie_word_embeddings=False means: no d_model^-0.5 rescaling of the
                    # decoder output before the (tied) head, which ours does not have
                    dropout_rate=spec.dropout, tie_word_embeddings=False, **SEQ2SEQ_IDS)

    def spec(self, c):
        ffn = {"relu": {"name": "relu"}, "gated-gelu": {"name": "geglu", "approximate": "tanh"}}
        if c.feed_forward_proj not in ffn:
            raise SpecError("feed_forward_proj", f"the workbench maps relu or gated-gelu, got {c.feed_forward_proj!r}")
        if getattr(c, "scale_decoder_outputs", True):  # the original T5's rescaling before the head (T5 v1.1: none)
            raise SpecError("scale_decoder_outputs", "the workbench's head reads the decoder output unscaled: "
                            "needs false (a config made with tie_word_embeddings=False)")
        return dict(family="encoder_decoder", vocab_size=c.vocab_size, d_model=c.d_model, n_layers=c.num_layers,
                    n_encoder_layers=c.num_layers, n_decoder_layers=c.num_decoder_layers, n_heads=c.num_heads,
                    head_dim=c.d_kv, position={"name": "t5_bias", "num_buckets": c.relative_attention_num_buckets,
                                               "max_distance": c.relative_attention_max_distance},
                    attention={"name": "full", "scaled": False},
                    norm={"name": "pre", "type": "rmsnorm", "eps": c.layer_norm_epsilon},
                    ffn={**ffn[c.feed_forward_proj], "d_ff": c.d_ff}, bias=False, tie_embeddings=True)

    def links(self, spec):
        out = [same("embedding.weight", "shared.weight")]
        for stack, n_layers in (("encoder", spec.encoder_layers), ("decoder", spec.decoder_layers)):
            out.append(same(f"{stack}.position.table.weight",
                            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"))
            for i in range(n_layers):
                ours, theirs = f"{stack}.blocks.{i}", f"{stack}.block.{i}.layer"
                att = f"{theirs}.0.SelfAttention"
                out += norm(f"{ours}.attn_norm.norm", f"{theirs}.0.layer_norm", spec)
                out += attention(f"{ours}.attn", (f"{att}.q", f"{att}.k", f"{att}.v", f"{att}.o"), spec, False)
                ffn = f"{theirs}.1"
                if stack == "decoder":
                    cross, ffn = f"{theirs}.1.EncDecAttention", f"{theirs}.2"
                    out += norm(f"{ours}.cross_norm.norm", f"{theirs}.1.layer_norm", spec)
                    out += linear(f"{ours}.cross.q", f"{cross}.q", False)
                    out += cross_kv(f"{ours}.cross.kv", f"{cross}.k", f"{cross}.v", spec, False)
                    out += linear(f"{ours}.cross.out", f"{cross}.o", False)
                out += norm(f"{ours}.ffn_norm.norm", f"{ffn}.layer_norm", spec)
                if spec.ffn.name == "geglu":
                    d_ff = ffn_width(spec)
                    out.append(rows(f"{ours}.ffn.gate_up.weight", [(f"{ffn}.DenseReluDense.wi_0.weight", d_ff, None),
                                                                  (f"{ffn}.DenseReluDense.wi_1.weight", d_ff, None)]))
                else:
                    out += linear(f"{ours}.ffn.up", f"{ffn}.DenseReluDense.wi", False)
                out += linear(f"{ours}.ffn.down", f"{ffn}.DenseReluDense.wo", False)
            out += norm(f"{stack}.final_norm", f"{stack}.final_layer_norm", spec)
        return out


ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (GPT2(), Llama(), Mistral(), Bloom(), Bert(),
                                                                     Bart(), T5())}


def architecture_for(spec: ModelSpec) -> Architecture:
    """The architecture a spec maps to, or a SpecError naming the first field that does not map.
    The family and position scheme pick the candidate; then every other field is checked."""
    by_position = {
        "decoder": {"learned": "gpt2", "rope": "mistral" if spec.attention.name == "sliding_window" else "llama",
                    "alibi": "bloom"},
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


def import_transformers():
    try:
        import transformers
    except ImportError:
        raise WorkbenchError("Hugging Face export and import need transformers: pip install 'transformers>=5,<6'") from None
    return transformers


def to_hf(model: Transformer):
    """A transformers model (`architecture_for(model.spec).hf_class`) holding our weights, in our
    dtype, eval mode. SpecError naming the first field that does not map."""
    transformers = import_transformers()
    arch = architecture_for(model.spec)
    dtype = next(model.parameters()).dtype
    hf = getattr(transformers, arch.hf_class)(arch.hf_config(model.spec), **arch.build_kwargs).to(dtype).eval()
    links = arch.links(model.spec)
    ours, theirs = dict(model.named_parameters()), dict(hf.named_parameters())
    check_coverage(links, ours, theirs, arch.model_type, arch.unmapped)
    with torch.no_grad():
        for link in links:
            for name, value in zip(link.theirs, link.split(ours[link.ours].detach())):
                theirs[name].copy_(value)
    return hf


def from_hf(hf_model) -> Transformer:
    """A workbench model equal to a transformers model of a mapped architecture (the classes of
    ARCHITECTURES, or their bare models for BERT), in its dtype, eval mode. SpecError naming the
    first config field that does not map."""
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
    links = arch.links(spec)
    ours, theirs = dict(model.named_parameters()), dict(hf_model.named_parameters())
    check_coverage(links, ours, theirs, arch.model_type, arch.unmapped)
    with torch.no_grad():
        for link in links:
            ours[link.ours].copy_(link.join([theirs[name].detach() for name in link.theirs]))
    return model
