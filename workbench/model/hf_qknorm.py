"""The decoder architectures of workbench.model.hf with QK-norm or a norm around the sublayer's
output: OLMo 2, Qwen3, Gemma 2 and Gemma 3, as transformers 5 computes them (modeling_olmo2.py,
modeling_qwen3.py, modeling_gemma2.py, modeling_gemma3.py).

    OLMo 2   norm: reordered (x + norm(f(x)), no input norm), QK-norm over the whole q and k
             projections (qk_norm: projection), SwiGLU, RoPE
    Qwen3    norm: pre, QK-norm per head (qk_norm: head, one gain of head_dim), SwiGLU, RoPE; the
             sliding-window layers `layer_types` names (use_sliding_window), one window
    Gemma 3  norm: sandwich, QK-norm per head, local (sliding-window) and global layers as
             `layer_types` says, each type with its own RoPE base (rope_parameters per layer type;
             transformers 5 moved rope_local_base_freq to rope_parameters.sliding_attention), GeGLU
             (tanh GELU), embeddings times sqrt(hidden_size), scores times
             query_pre_attn_scalar^-1/2 (attention.scale_dim), final_logit_softcapping (logit_softcap)
    Gemma 2  as Gemma 3 without QK-norm, with one RoPE base and attn_logit_softcapping
             (attention.softcap: the explicit score path)

On import a per-layer pattern is `layer_types`' shortest period as `{repeat: [...]}` (Gemma 3's
five local to one global: six items), for the attention and, in Gemma 3, the position scheme.

Weight mappings beyond Llama's (workbench.model.hf's docstring): QK-norm gains follow the q and
k rows' RoPE pairing (per head: one permutation of head_dim; over the whole projection: each
head's); Gemma's RMSNorm scales by (1 + w) with w from 0, ours by w from 1, so ours holds their
w + 1 (`gain`).

Deviations the parity tests measure (tests/model/test_hf_parity_qknorm.py): transformers computes
these four's RMSNorms and RoPE tables in float32 even in a float64 model, and Gemma 3's embedding
scale is a float32 constant. RoPE maps as the default one or linear (`rope_type: linear`, its
`factor` our `interpolation`: Gemma 3's global layers from 4B up). Refused by name: attention_bias
(the workbench's `bias` would give the MLP biases too), another RoPE type (YaRN, dynamic, ...),
Gemma's use_bidirectional_attention,
Gemma 3's attn_logit_softcapping (transformers' Gemma3Attention reads it and never applies it: a
model that sets it is not one function).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from workbench.errors import SpecError
from workbench.model.hf_architecture import GELU_APPROXIMATE, Architecture, ffn_width, value_at
from workbench.model.hf_decoders import rope_pairing
from workbench.model.spec import ModelSpec
from workbench.model.state_links import Link, attention, linear, rows, same

LAYER_TYPES = {"sliding_window": "sliding_attention", "full": "full_attention"}  # our attention -> HF's layer type
ATTENTION = {v: k for k, v in LAYER_TYPES.items()}
GEMMA_ACT = {"tanh": "gelu_pytorch_tanh", "none": "gelu"}


def gain(ours: str, theirs: str, order: Tensor | None = None, offset: float = 0.0) -> Link:
    """An RMSNorm's gain: ours = theirs[order] + offset (Gemma's norms scale by 1 + w: offset 1)."""
    back = None if order is None else order.argsort()
    return Link(ours, (theirs,), lambda t: [(t if back is None else t[back]) - offset],
                lambda ts: (ts[0] if order is None else ts[0][order]) + offset)


def rope_spec(rope: dict | None, field: str) -> dict[str, Any]:
    """Our RoPE of one of their `rope_parameters`: the default one, or linear (our interpolation)."""
    rope = rope or {}
    kind = rope.get("rope_type", "default")
    if kind not in ("default", "linear"):
        raise SpecError(f"{field}.rope_type", f"the workbench's RoPE maps the default and linear ones, got {kind!r}")
    ours = {"name": "rope", "base": rope.get("rope_theta", 10000.0)}
    return ours if kind == "default" else {**ours, "interpolation": rope["factor"]}


def rope_config(params) -> dict[str, Any]:
    """Their `rope_parameters` of our RoPE's params."""
    rope = {"rope_type": "default", "rope_theta": params.base}
    return rope if params.interpolation == 1.0 else {**rope, "rope_type": "linear", "factor": params.interpolation}


def by_period(items: list, period: int) -> Any:
    """One item per layer as a spec field: the first `period` of them cycled ({repeat: [...]})."""
    return items[0] if period == 1 else {"repeat": items[:period]}


def period_of(layer_types: list[str]) -> int:
    n = len(layer_types)
    return next(p for p in range(1, n + 1) if all(layer_types[i] == layer_types[i % p] for i in range(n)))


def model_type_for(spec: ModelSpec) -> str | None:
    """The model_type of this module a decoder spec is written as, by its marks (QK-norm, the
    reordered or sandwich norm, Gemma's embedding scale); None when it has none of them."""
    if spec.family != "decoder":
        return None
    norm = spec.at("norm", 0).name
    qk_norm = getattr(spec.at("attention", 0).params, "qk_norm", "none")
    if norm == "sandwich" or spec.embedding_scale != "none":
        return "gemma3_text" if qk_norm != "none" else "gemma2"
    if norm == "reordered" or qk_norm == "projection":
        return "olmo2"
    return "qwen3" if qk_norm == "head" else None


class QKNormDecoder(Architecture):
    """What the four share: Llama's projections and RoPE pairing, an RMSNorm placement, a gated FFN."""

    auto_class = "AutoModelForCausalLM"
    any_head_dim = True
    norm: str  # our norm placement
    layer_norms: tuple[tuple[str, str], ...]  # (our norm in a block, theirs in a layer)
    qk_norm = "head"
    ffn = "swiglu"
    attention_names: tuple[str, ...] = ("full", "sliding_window")  # the kernels its layer types map to
    norm_offset = 0.0

    def requirements(self, spec):
        return {"family": "decoder", "norm.name": self.norm, "norm.type": "rmsnorm", "ffn.name": self.ffn,
                "embedding_norm": "none", "bias": False}

    def layer_requirements(self, spec, layer):
        name = value_at(spec, "attention.name", layer)
        rope = self.rope_layer(spec, layer)
        needed = {"position.name": "rope", "position.base": value_at(spec, "position.base", rope),
                  "position.interpolation": value_at(spec, "position.interpolation", rope),
                  "attention.name": name if name in self.attention_names else "full",
                  "attention.scaled": True, "attention.qk_norm": self.qk_norm}
        if name == "sliding_window":  # one window for every local layer
            needed["attention.window"] = self.window(spec)
        return needed

    def rope_layer(self, spec: ModelSpec, layer: int) -> int:
        """The layer whose RoPE layer `layer`'s must equal (one for all: the first)."""
        return 0

    def window(self, spec: ModelSpec) -> int | None:
        """The window of the first sliding-window layer (None: no such layer)."""
        return next((spec.at("attention", i).params.window for i in range(spec.n_layers)
                     if spec.at("attention", i).name == "sliding_window"), None)

    def layer_types(self, spec: ModelSpec) -> list[str]:
        return [LAYER_TYPES[spec.at("attention", i).name] for i in range(spec.n_layers)]

    def config(self, spec):
        return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=ffn_width(spec),
                    num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
                    num_key_value_heads=spec.n_kv_heads, head_dim=spec.head_dim, rms_norm_eps=spec.norm.params.eps,
                    tie_word_embeddings=spec.tie_embeddings, attention_bias=False, attention_dropout=0.0)

    def spec(self, c):
        if c.attention_bias:
            raise SpecError("attention_bias", f"{self.model_type}: the workbench's `bias` would put biases in the "
                            "MLP too; needs false")
        return dict(family="decoder", vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                    n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads,
                    head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
                    norm={"name": self.norm, "type": "rmsnorm", "eps": c.rms_norm_eps}, bias=False,
                    tie_embeddings=c.tie_word_embeddings)

    def spec_attention(self, c, options: dict[str, Any]) -> list[dict[str, Any]]:
        """Each layer's attention from `layer_types` (a sliding layer with the config's window)."""
        out = []
        for i, kind in enumerate(c.layer_types):
            if kind not in ATTENTION:
                raise SpecError(f"layer_types.{i}", f"the workbench maps {sorted(ATTENTION)}, got {kind!r}")
            if kind == "sliding_attention" and c.sliding_window is None:
                raise SpecError("sliding_window", f"layer {i} is a sliding_attention layer: needs a window, got null")
            window = {"window": c.sliding_window} if kind == "sliding_attention" else {}
            out.append({"name": ATTENTION[kind], **window, **options})
        return out

    def links(self, spec):
        h, g, hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
        q_order, k_order = rope_pairing(h, hd), rope_pairing(g, hd)
        gain_orders = (rope_pairing(1, hd),) * 2 if self.qk_norm == "head" else (q_order, k_order)
        d_ff = ffn_width(spec)
        out = [same("embedding.weight", "model.embed_tokens.weight")]
        for i in range(spec.n_layers):
            ours, theirs = f"decoder.blocks.{i}", f"model.layers.{i}"
            att = f"{theirs}.self_attn"
            out += attention(f"{ours}.attn", (f"{att}.q_proj", f"{att}.k_proj", f"{att}.v_proj", f"{att}.o_proj"),
                             spec, False, (q_order, k_order))
            if self.qk_norm != "none":
                out += [gain(f"{ours}.attn.{x}_norm.weight", f"{att}.{x}_norm.weight", order, self.norm_offset)
                        for x, order in zip("qk", gain_orders)]
            out += [gain(f"{ours}.{mine}.weight", f"{theirs}.{their}.weight", None, self.norm_offset)
                    for mine, their in self.layer_norms]
            out.append(rows(f"{ours}.ffn.gate_up.weight", [(f"{theirs}.mlp.gate_proj.weight", d_ff, None),
                                                          (f"{theirs}.mlp.up_proj.weight", d_ff, None)]))
            out += linear(f"{ours}.ffn.down", f"{theirs}.mlp.down_proj", False)
        out.append(gain("decoder.final_norm.weight", "model.norm.weight", None, self.norm_offset))
        return out + ([] if spec.tie_embeddings else [same("head.weight", "lm_head.weight")])


class SwiGLUDecoder(QKNormDecoder):
    """OLMo 2 and Qwen3: SwiGLU (silu) and one RoPE base."""

    def config(self, spec):
        return {**super().config(spec), "hidden_act": "silu", "rope_parameters": rope_config(spec.position.params)}

    def spec(self, c):
        if c.hidden_act != "silu":
            raise SpecError("hidden_act", f"the workbench's SwiGLU needs silu, got {c.hidden_act!r}")
        return {**super().spec(c), "position": rope_spec(c.rope_parameters, "rope_parameters"),
                "ffn": {"name": "swiglu", "d_ff": c.intermediate_size}}


class Olmo2(SwiGLUDecoder):
    """OLMo 2 (Team OLMo 2024, "2 OLMo 2 Furious"): the reordered norm, QK-norm over the projections."""

    model_type, hf_class = "olmo2", "Olmo2ForCausalLM"
    any_head_dim = False  # Olmo2Config has no head_dim
    norm, qk_norm, attention_names = "reordered", "projection", ("full",)
    layer_norms = (("attn_norm.norm", "post_attention_layernorm"), ("ffn_norm.norm", "post_feedforward_layernorm"))

    def config(self, spec):
        config = super().config(spec)
        del config["head_dim"]
        return config

    def spec(self, c):
        return {**super().spec(c), "attention": {"name": "full", "qk_norm": "projection"}}


class Qwen3(SwiGLUDecoder):
    """Qwen3 (Qwen Team 2025): pre-norm, QK-norm per head, sliding-window layers where configured."""

    model_type, hf_class = "qwen3", "Qwen3ForCausalLM"
    per_layer = ("attention",)
    norm = "pre"
    layer_norms = (("attn_norm.norm", "input_layernorm"), ("ffn_norm.norm", "post_attention_layernorm"))

    def config(self, spec):
        window = self.window(spec)
        return {**super().config(spec), "use_sliding_window": window is not None, "sliding_window": window,
                "layer_types": self.layer_types(spec)}

    def spec(self, c):
        return {**super().spec(c), "attention": by_period(self.spec_attention(c, {"qk_norm": "head"}),
                                                          period_of(c.layer_types))}


class Gemma2(QKNormDecoder):
    """Gemma 2 (Gemma Team 2024): sandwich norm, local and global layers, GeGLU, scaled embeddings,
    attention and final logit softcapping."""

    model_type, hf_class = "gemma2", "Gemma2ForCausalLM"
    per_layer = ("attention",)
    norm, ffn, qk_norm, norm_offset = "sandwich", "geglu", "none", 1.0
    layer_norms = (("attn_norm.norm", "input_layernorm"), ("attn_norm.output_norm", "post_attention_layernorm"),
                   ("ffn_norm.norm", "pre_feedforward_layernorm"), ("ffn_norm.output_norm", "post_feedforward_layernorm"))
    softcapped_attention = True  # Gemma 3 reads attn_logit_softcapping and never applies it

    def requirements(self, spec):
        return {**super().requirements(spec), "embedding_scale": "sqrt_d_model", "logit_softcap": spec.logit_softcap}

    def layer_requirements(self, spec, layer):
        needed = {**super().layer_requirements(spec, layer), "attention.scale_dim": value_at(spec, "attention.scale_dim", 0)}
        if self.softcapped_attention:  # one cap for every layer, as one scale
            needed["attention.softcap"] = value_at(spec, "attention.softcap", 0)
        return needed

    def config(self, spec):
        first = spec.at("attention", 0).params
        window = self.window(spec)
        return {**super().config(spec), "hidden_activation": GEMMA_ACT[spec.ffn.params.approximate],
                "query_pre_attn_scalar": first.scale_dim or spec.head_dim, "layer_types": self.layer_types(spec),
                **({"sliding_window": window} if window else {}), "final_logit_softcapping": spec.logit_softcap,
                "attn_logit_softcapping": first.softcap if self.softcapped_attention else None,
                "rope_parameters": self.rope_config(spec)}

    def rope_config(self, spec: ModelSpec) -> dict[str, Any]:
        return rope_config(spec.position.params)

    def spec(self, c):
        if c.use_bidirectional_attention:
            raise SpecError("use_bidirectional_attention", f"{self.model_type} as a decoder: needs false")
        if c.hidden_activation not in ("gelu", "gelu_pytorch_tanh", "gelu_new"):
            raise SpecError("hidden_activation", f"the workbench's GeGLU maps gelu, gelu_pytorch_tanh or gelu_new, "
                            f"got {c.hidden_activation!r}")
        head_dim = c.head_dim or c.hidden_size // c.num_attention_heads
        options = {"scale_dim": None if c.query_pre_attn_scalar == head_dim else c.query_pre_attn_scalar,
                   **({"qk_norm": self.qk_norm} if self.qk_norm != "none" else {}),
                   **({"softcap": c.attn_logit_softcapping} if self.softcapped_attention else {})}
        return {**super().spec(c), "attention": by_period(self.spec_attention(c, options), period_of(c.layer_types)),
                "position": self.spec_position(c),
                "ffn": {"name": "geglu", "d_ff": c.intermediate_size,
                        "approximate": GELU_APPROXIMATE[c.hidden_activation]},
                "embedding_scale": "sqrt_d_model", "logit_softcap": c.final_logit_softcapping}

    def spec_position(self, c) -> Any:
        return rope_spec(c.rope_parameters, "rope_parameters")


class Gemma3(Gemma2):
    """Gemma 3 (Gemma Team 2025): Gemma 2 with QK-norm per head in place of attention softcapping,
    and a RoPE base per layer type."""

    model_type, hf_class = "gemma3_text", "Gemma3ForCausalLM"
    per_layer = ("attention", "position")
    qk_norm = "head"
    softcapped_attention = False

    def rope_layer(self, spec, layer):
        # one RoPE per layer type: its first layer's
        kind = value_at(spec, "attention.name", layer)
        return next(i for i in range(spec.n_layers) if value_at(spec, "attention.name", i) == kind)

    def rope_config(self, spec):
        return {LAYER_TYPES[spec.at("attention", i).name]: rope_config(spec.at("position", i).params)
                for i in reversed(range(spec.n_layers))}  # reversed: each type's first layer's

    def spec(self, c):
        if c.attn_logit_softcapping is not None:
            raise SpecError("attn_logit_softcapping", "transformers' Gemma 3 reads it and never applies it, so the "
                            "model it describes is not one function: needs null")
        return super().spec(c)

    def spec_position(self, c):
        positions = [rope_spec(c.rope_parameters.get(kind), f"rope_parameters.{kind}") for kind in c.layer_types]
        return by_period(positions, period_of(c.layer_types))
