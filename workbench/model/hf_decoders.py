"""The decoder-only architectures of workbench.model.hf: GPT-2, Llama, Mistral, BLOOM and GPT-NeoX
(the weight mappings that are not the identity: workbench.model.hf's docstring)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from workbench.errors import SpecError
from workbench.model.hf_architecture import GELU_ACT, GELU_APPROXIMATE, Architecture, ffn_width
from workbench.model.state_links import attention, gated_mlp, linear, mlp, norm, rows, same, transposed


def rope_pairing(heads: int, head_dim: int, rotary_dim: int | None = None) -> Tensor:
    """Row order taking HF's rotate-half q/k rows to ours: ours[2j] = theirs[j],
    ours[2j + 1] = theirs[j + r/2] for the r = rotary_dim (default head_dim) dimensions that rotate,
    the rest in place, within each head."""
    r = rotary_dim or head_dim
    within = torch.cat([torch.arange(r).view(2, r // 2).T.reshape(-1), torch.arange(r, head_dim)])  # 0, r/2, 1, ...
    return (torch.arange(heads)[:, None] * head_dim + within).reshape(-1)


def rope_position(rope: dict[str, Any]) -> dict[str, Any]:
    """Our rope (base, and fraction where partial) of a config's `rope_parameters`."""
    fraction = rope.get("partial_rotary_factor", 1.0)
    return {"name": "rope", "base": rope.get("rope_theta", 10000.0), **({"fraction": fraction} if fraction != 1 else {})}


def bloom_interleaving(heads: int, head_dim: int) -> Tensor:
    """Row order taking BLOOM's (and GPT-NeoX's) query_key_value rows [h, 3, hd] to ours [3, h, hd]."""
    return torch.arange(3 * heads * head_dim).view(heads, 3, head_dim).transpose(0, 1).reshape(-1)


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
        return {"family": "decoder", "position.name": "rope", "position.fraction": 1.0, "attention.name": self.attention,
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
            out += gated_mlp(f"{ours}.ffn", f"{theirs}.mlp", ffn_width(spec))
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


class GPTNeoX(Architecture):
    """GPT-NeoX (Black et al. 2022) with `use_parallel_residual` off: a pre-norm block, LayerNorm,
    RoPE on a share of each head (`partial_rotary_factor` = our rope `fraction`: GPT-NeoX-20B's 0.25)
    and a plain MLP: the workbench's default decoder."""

    model_type, hf_class, auto_class = "gpt_neox", "GPTNeoXForCausalLM", "AutoModelForCausalLM"

    def requirements(self, spec):
        return {"family": "decoder", "position.name": "rope", "attention.name": "full", "attention.scaled": True,
                "norm.name": "pre", "norm.type": "layernorm",
                "ffn.name": spec.ffn.name if spec.ffn.name == "relu" else "gelu",
                "embedding_norm": "none", "n_kv_heads": spec.n_heads,
                # any share rotates (partial_rotary_factor); named here, so not held to the default 1
                "position.fraction": getattr(spec.position.params, "fraction", 1.0)}

    def config(self, spec):
        act = "relu" if spec.ffn.name == "relu" else GELU_ACT[spec.ffn.params.approximate]
        return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=ffn_width(spec),
                    num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads, hidden_act=act,
                    layer_norm_eps=spec.norm.params.eps, use_parallel_residual=False, attention_bias=spec.bias,
                    rope_parameters={"rope_type": "default", "rope_theta": spec.position.params.base,
                                     "partial_rotary_factor": spec.position.params.fraction},
                    hidden_dropout=spec.dropout, attention_dropout=0.0, tie_word_embeddings=spec.tie_embeddings)

    def spec(self, c):
        rope = c.rope_parameters or {}
        if c.use_parallel_residual:
            raise SpecError("use_parallel_residual", "the workbench's block adds attention, then the MLP: needs false")
        if rope.get("rope_type", "default") != "default":
            raise SpecError("rope_parameters", f"the workbench's RoPE is the default one: needs rope_type default, "
                            f"got {rope}")
        if c.hidden_act == "relu":
            ffn = {"name": "relu"}
        elif c.hidden_act in GELU_APPROXIMATE:
            ffn = {"name": "gelu", "approximate": GELU_APPROXIMATE[c.hidden_act]}
        else:
            raise SpecError("hidden_act", f"the workbench maps relu, gelu, gelu_new or gelu_pytorch_tanh, got "
                            f"{c.hidden_act!r}")
        return dict(family="decoder", vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                    n_heads=c.num_attention_heads, position=rope_position(rope),
                    attention="full", norm={"name": "pre", "type": "layernorm", "eps": c.layer_norm_eps},
                    ffn={**ffn, "d_ff": c.intermediate_size}, bias=c.attention_bias,
                    tie_embeddings=c.tie_word_embeddings)

    def links(self, spec):
        h, hd = spec.n_heads, spec.head_dim
        # their rows [h, 3, hd] to ours [3, h, hd], with q's and k's halves paired as our RoPE pairs them
        order = bloom_interleaving(h, hd).view(3, h, hd)
        within = rope_pairing(1, hd, int(hd * spec.position.params.fraction))
        order = torch.cat([order[:2, :, within], order[2:]]).reshape(-1)
        out = [same("embedding.weight", "gpt_neox.embed_in.weight")]
        for i in range(spec.n_layers):
            ours, theirs = f"decoder.blocks.{i}", f"gpt_neox.layers.{i}"
            qkv = f"{theirs}.attention.query_key_value"
            out += norm(f"{ours}.attn_norm.norm", f"{theirs}.input_layernorm", spec)
            out.append(rows(f"{ours}.attn.qkv.weight", [(f"{qkv}.weight", 3 * h * hd, order)]))
            if spec.bias:
                out.append(rows(f"{ours}.attn.qkv.bias", [(f"{qkv}.bias", 3 * h * hd, order)]))
            out += linear(f"{ours}.attn.out", f"{theirs}.attention.dense", spec.bias)
            out += norm(f"{ours}.ffn_norm.norm", f"{theirs}.post_attention_layernorm", spec)
            out += mlp(f"{ours}.ffn", f"{theirs}.mlp.dense_h_to_4h", f"{theirs}.mlp.dense_4h_to_h", spec.bias)
        out += norm("decoder.final_norm", "gpt_neox.final_layer_norm", spec)
        return out + ([] if spec.tie_embeddings else [same("head.weight", "lm_head.weight")])

    def zeroed(self, spec):
        # GPT-NeoX's MLP always has biases; `attention_bias` covers only the attention's
        if spec.bias:
            return []
        return [f"gpt_neox.layers.{i}.mlp.{name}.bias" for i in range(spec.n_layers)
                for name in ("dense_h_to_4h", "dense_4h_to_h")]
