"""The mixture-of-experts decoders of workbench.model.hf: OLMoE, Mixtral and Llama 4's text model,
each on the built-in MoE FFN (plugins/ffn_moe.py).

- OLMoE (Muennighoff et al. 2024; transformers' `OlmoeForCausalLM`): Llama's block with QK-norm
  over the whole query and key projections before RoPE (`attention: {qk_norm: projection}`) and
  an MoE FFN routed by a softmax over the experts, top-k, not renormalised (`norm_topk_prob`
  false by default).
- Mixtral (Jiang et al. 2024; `MixtralForCausalLM`): Mistral's block with an MoE FFN routed by a
  softmax, top-2, renormalised; a sliding window when the config has one.
- Llama 4 (Meta 2025; `Llama4ForCausalLM`, the text model): per layer, RoPE with a weightless QK
  L2-norm (`qk_norm: head, qk_norm_gain: false`) and chunked attention (plugins/attention_chunked.py),
  or NoPE with attention temperature tuning (plugins/position_nope_temperature.py), one layer of
  `no_rope_layer_interval`; dense SwiGLU layers and MoE layers interleaved (`moe_layers`), the MoE
  routed by a sigmoid of the top-k router logits that weighs each expert's *input*
  (`weight_inputs`), plus a shared expert every token reads.

Where the mapping is not the identity:
- transformers stores each layer's experts as one tensor per projection, experts on the leading
  axis: Mixtral's and OLMoE's `gate_up_proj` [E, 2 d_ff, d] (gate rows first) and `down_proj`
  [E, d, d_ff], Llama 4's transposed ([E, d, 2 d_ff], [E, d_ff, d]). Each expert of ours is one
  slice (`tensors` names the views `....gate_up_proj.<e>`).
- OLMoE's and Mixtral's RoPE pairs rotate half (Llama's permutation of q and k rows, which OLMoE's
  QK-norm gains follow); Llama 4's pairs (x[2j], x[2j+1]) as ours.
- Llama 4 normalises queries and keys after RoPE, the workbench before: a weightless RMS norm of
  a head commutes with RoPE (a rotation of pairs keeps the head's norm), so the two are one model.

What a spec must hold: exactly what an HF config of the architecture can say. `check` builds the
config a spec would export as, reads it back, and names the first field (per layer for the
variant axes) that came back different. Training-only fields are left out of that comparison
and of the export: dropout, and the MoE's `z_loss` and `capacity_factor` (no counterpart in
transformers; neither changes the evaluation forward). `balance_loss` exports as OLMoE's and
Mixtral's `router_aux_loss_coef` with `output_router_logits` on (the switch transformers adds the
loss with); transformers pools the router statistics over all layers before the product, the
workbench sums the loss per layer. Llama 4's model in transformers adds no balance loss: an
import sets 0.
"""

from __future__ import annotations

from typing import Any

from workbench.errors import SpecError
from workbench.model.hf_architecture import CHECKED_LATER, Architecture, later_options
from workbench.model.hf_decoders import rope_pairing
from workbench.model.spec import Choice, ModelSpec, parse_spec, resolve_choice
from workbench.model.state_links import Link, attention, linear, norm, rows, same, transposed
from workbench.variants import MODEL_AXES

MOE_TRAINING_ONLY = ("balance_loss", "z_loss", "capacity_factor")  # no effect on the evaluation forward
SCALAR_FIELDS = ("family", "vocab_size", "d_model", "decoder_layers", "n_heads", "n_kv_heads", "head_dim",
                 "embedding_norm", "tie_qk", "bias", "tie_embeddings", "n_classes", "logit_softcap")
STACKED = ("experts.gate_up_proj", "experts.down_proj")  # transformers' experts, one tensor per projection


def moe_architecture(spec: ModelSpec) -> str | None:
    """The model_type of this module a spec belongs to, or None: Llama 4 for its per-layer
    position schemes, chunked attention, weightless QK-norm or input-weighted MoE; OLMoE for an
    MoE with QK-norm over the projection; Mixtral for any other MoE."""
    if spec.family != "decoder":
        return None
    layers = range(spec.decoder_layers)
    ffns = [spec.at("ffn", i) for i in layers]
    attentions = [spec.at("attention", i) for i in layers]
    moes = [f.params for f in ffns if f.name == "moe"]
    if (len(spec.each("position")) > 1 or any(a.name == "chunked" for a in attentions)
            or any(p.router == "sigmoid" or p.weight_inputs or p.shared is not None for p in moes)
            or any(getattr(a.params, "qk_norm", "none") == "head" and not a.params.qk_norm_gain for a in attentions)):
        return "llama4_text"
    if not moes:
        return None
    return "olmoe" if getattr(attentions[0].params, "qk_norm", "none") == "projection" else "mixtral"


def swiglu_width(mapping: Any, d_model: int) -> int:
    """The hidden width of an FFN given as a variant mapping (d_ff, or its default)."""
    choice = resolve_choice("ffn", mapping, "model.ffn")
    d_ff = getattr(choice.params, "d_ff", None)
    return d_ff or (round(8 * d_model / 3) if choice.name in ("swiglu", "geglu") else 4 * d_model)


def compared(axis: str, choice: Choice, d_model: int) -> dict[str, Any]:
    """A layer's variant as the round trip compares it: every parameter, FFN widths resolved,
    the MoE's training-only fields left out."""
    out = {"name": choice.name, **choice.params.model_dump()}
    if axis != "ffn":
        return out
    if choice.name == "moe":
        for key in ("expert", "shared"):
            if out[key] is not None:  # an expert given by name ("swiglu") or as {name: ..., d_ff: ...}
                given = {"name": out[key]} if isinstance(out[key], str) else out[key]
                out[key] = {**given, "d_ff": swiglu_width(given, d_model)}
        return {k: v for k, v in out.items() if k not in MOE_TRAINING_ONLY}
    return {**out, "d_ff": swiglu_width(out, d_model)} if "d_ff" in out else out


def as_pattern(items: list[Any]) -> Any:
    """One variant per layer, written as the shortest `{repeat: [...]}` that gives them (or the list)."""
    for period in range(1, len(items)):
        if all(items[i] == items[i % period] for i in range(len(items))):
            return {"repeat": items[:period]}
    return items


def gated_mlp(ours: str, theirs: str, d_ff: int) -> list[Link]:
    """Our SwiGLU (gate_up = [gate; up], down) from transformers' gate_proj, up_proj, down_proj."""
    return [rows(f"{ours}.gate_up.weight", [(f"{theirs}.gate_proj.weight", d_ff, None),
                                            (f"{theirs}.up_proj.weight", d_ff, None)]),
            *linear(f"{ours}.down", f"{theirs}.down_proj", False)]


def experts(ours: str, theirs: str, n_experts: int, link=same) -> list[Link]:
    """Each routed expert of ours from its slice of transformers' stacked experts."""
    return [link(f"{ours}.experts.{e}.{mine}.weight", f"{theirs}.experts.{stacked}.{e}")
            for e in range(n_experts) for mine, stacked in (("gate_up", "gate_up_proj"), ("down", "down_proj"))]


def checked_rope(c) -> float:
    rope = c.rope_parameters or {}
    if rope.get("rope_type", "default") != "default":
        raise SpecError("rope_parameters.rope_type", f"only the default RoPE maps to the workbench's, got "
                        f"{rope['rope_type']!r}")
    return rope.get("rope_theta", 10000.0)


class MoEDecoder(Architecture):
    """What the MoE decoders share: their experts stacked, a check by round trip, SwiGLU experts."""

    auto_class = "AutoModelForCausalLM"
    per_layer = MODEL_AXES  # `check`'s round trip compares every layer

    def requirements(self, spec):
        """The whole-model fields every MoE decoder here needs. Llama 4 and Qwen3-Next choose the
        position, attention and FFN per layer (their configs read each layer); OLMoE and Mixtral
        require theirs as well."""
        return {"family": "decoder", "norm.name": "pre", "norm.type": "rmsnorm", "embedding_norm": "none",
                "bias": False}

    def layer_requirements(self, spec: ModelSpec, layer: int) -> dict[str, Any]:
        """Every later option (QK-norm, gate, ...) as the spec has it at `layer`: the round trip in
        `check` compares each with what the config can say, naming the first that differs."""
        return {f"{axis}.{name}": getattr(spec.at(axis, layer).params, name)
                for axis in CHECKED_LATER for name in later_options(spec.at(axis, layer).params)}

    def tensors(self, model) -> dict[str, Any]:
        out = {}
        for name, p in super().tensors(model).items():
            if name.endswith(STACKED):
                out.update({f"{name}.{e}": p[e] for e in range(p.shape[0])})
            else:
                out[name] = p
        return out

    def hf_config(self, spec: ModelSpec):
        config = super().hf_config(spec)
        config._experts_implementation = "eager"  # transformers' default, grouped_mm, takes no float64
        return config

    def check(self, spec: ModelSpec) -> None:
        super().check(spec)
        expected = parse_spec(self.spec(self.hf_config(spec)))
        for field in SCALAR_FIELDS:
            wanted, got = getattr(expected, field), getattr(spec, field)
            if wanted != got:
                raise SpecError(f"model.{field}", f"{self.model_type} ({self.hf_class}) needs {wanted!r}, got {got!r}")
        patterned = [axis for axis in MODEL_AXES
                     if len(spec.each(axis)) > 1 or len(expected.each(axis)) > 1]
        for layer in range(spec.decoder_layers):
            for axis in MODEL_AXES:
                wanted = compared(axis, expected.at(axis, layer), spec.d_model)
                got = compared(axis, spec.at(axis, layer), spec.d_model)
                key = next((k for k in ("name", *wanted) if wanted.get(k) != got.get(k)), None)
                if key is not None:
                    at = f" at layer {layer}" if axis in patterned else ""
                    raise SpecError(f"model.{axis}.{key}", f"{self.model_type} ({self.hf_class}) needs "
                                    f"{wanted.get(key)!r}{at}, got {got.get(key)!r}")

    def links(self, spec):
        """Llama's layout (model.layers.<i>: input_layernorm, self_attn, post_attention_layernorm),
        each architecture's FFN and extras in `layer_links`."""
        q_order, k_order = self.rope_orders(spec)
        out = [same("embedding.weight", "model.embed_tokens.weight")]
        for i in range(spec.decoder_layers):
            ours, theirs = f"decoder.blocks.{i}", f"model.layers.{i}"
            att = f"{theirs}.self_attn"
            out += norm(f"{ours}.attn_norm.norm", f"{theirs}.input_layernorm", spec)
            out += attention(f"{ours}.attn", (f"{att}.q_proj", f"{att}.k_proj", f"{att}.v_proj", f"{att}.o_proj"),
                             spec, False, (q_order, k_order))
            out += norm(f"{ours}.ffn_norm.norm", f"{theirs}.post_attention_layernorm", spec)
            out += self.layer_links(spec, i, ours, theirs)
        out += norm("decoder.final_norm", "model.norm", spec)
        return out + ([] if spec.tie_embeddings else [same("head.weight", "lm_head.weight")])

    def rope_orders(self, spec: ModelSpec) -> tuple[Any, Any]:
        """q's and k's row orders: rotate-half pairs taken to ours (OLMoE, Mixtral)."""
        return rope_pairing(spec.n_heads, spec.head_dim), rope_pairing(spec.n_kv_heads, spec.head_dim)

    def layer_links(self, spec: ModelSpec, layer: int, ours: str, theirs: str) -> list[Link]:
        """Layer `layer`'s FFN (and what else it has beyond Llama's layout)."""
        return [same(f"{ours}.ffn.router.weight", f"{theirs}.mlp.gate.weight"),
                *experts(f"{ours}.ffn", f"{theirs}.mlp", spec.at("ffn", layer).params.n_experts)]

    def moe_config(self, moe) -> dict[str, Any]:
        """The config fields of an MoE FFN's router and experts (OLMoE's and Mixtral's)."""
        p = moe.params
        return dict(num_experts_per_tok=p.top_k, router_aux_loss_coef=p.balance_loss,
                    output_router_logits=p.balance_loss > 0)

    def balance_loss(self, c) -> float:
        return c.router_aux_loss_coef if c.output_router_logits else 0.0


class Olmoe(MoEDecoder):
    model_type, hf_class = "olmoe", "OlmoeForCausalLM"

    def requirements(self, spec):
        return {"family": "decoder", "position.name": "rope", "attention.name": "full", "norm.name": "pre",
                "norm.type": "rmsnorm", "ffn.name": "moe"}

    def config(self, spec):
        moe = spec.at("ffn", 0)
        return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, num_hidden_layers=spec.decoder_layers,
                    num_attention_heads=spec.n_heads, num_key_value_heads=spec.n_kv_heads,
                    intermediate_size=swiglu_width(moe.params.expert, spec.d_model), num_experts=moe.params.n_experts,
                    norm_topk_prob=moe.params.normalize, rms_norm_eps=spec.norm.params.eps,
                    rope_parameters={"rope_type": "default", "rope_theta": spec.position.params.base},
                    tie_word_embeddings=spec.tie_embeddings, attention_bias=False, attention_dropout=0.0,
                    clip_qkv=None, hidden_act="silu", **self.moe_config(moe))

    def spec(self, c):
        if c.clip_qkv is not None:
            raise SpecError("clip_qkv", f"the workbench does not clip queries, keys and values: needs null, got "
                            f"{c.clip_qkv}")
        if c.hidden_act != "silu" or c.attention_bias:
            raise SpecError("hidden_act", "the workbench's SwiGLU experts need silu and no biases")
        return dict(family="decoder", vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                    n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads,
                    position={"name": "rope", "base": checked_rope(c)},
                    attention={"name": "full", "qk_norm": "projection"},
                    norm={"name": "pre", "type": "rmsnorm", "eps": c.rms_norm_eps},
                    ffn={"name": "moe", "n_experts": c.num_experts, "top_k": c.num_experts_per_tok,
                         "expert": {"name": "swiglu", "d_ff": c.intermediate_size}, "router": "softmax",
                         "normalize": c.norm_topk_prob, "balance_loss": self.balance_loss(c)},
                    bias=False, tie_embeddings=c.tie_word_embeddings)

    def layer_links(self, spec, layer, ours, theirs):
        # QK-norm over the whole projection: one gain per row, in the rows' (RoPE-paired) order
        (q_order, k_order), att = self.rope_orders(spec), f"{theirs}.self_attn"
        h, g, hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
        return [rows(f"{ours}.attn.q_norm.weight", [(f"{att}.q_norm.weight", h * hd, q_order)]),
                rows(f"{ours}.attn.k_norm.weight", [(f"{att}.k_norm.weight", g * hd, k_order)]),
                *super().layer_links(spec, layer, ours, theirs)]


class Mixtral(MoEDecoder):
    model_type, hf_class = "mixtral", "MixtralForCausalLM"
    any_head_dim = True

    def requirements(self, spec):
        return {"family": "decoder", "position.name": "rope", "norm.name": "pre", "norm.type": "rmsnorm",
                "ffn.name": "moe"}

    def config(self, spec):
        moe, attn = spec.at("ffn", 0), spec.at("attention", 0)
        return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, num_hidden_layers=spec.decoder_layers,
                    num_attention_heads=spec.n_heads, num_key_value_heads=spec.n_kv_heads, head_dim=spec.head_dim,
                    intermediate_size=swiglu_width(moe.params.expert, spec.d_model),
                    num_local_experts=moe.params.n_experts, rms_norm_eps=spec.norm.params.eps,
                    sliding_window=attn.params.window if attn.name == "sliding_window" else None,
                    rope_parameters={"rope_type": "default", "rope_theta": spec.position.params.base},
                    tie_word_embeddings=spec.tie_embeddings, attention_dropout=0.0, hidden_act="silu",
                    router_jitter_noise=0.0, **self.moe_config(moe))

    def spec(self, c):
        if c.hidden_act != "silu":
            raise SpecError("hidden_act", f"the workbench's SwiGLU experts need silu, got {c.hidden_act!r}")
        if c.router_jitter_noise:
            raise SpecError("router_jitter_noise", f"the workbench's router has no input jitter: needs 0, got "
                            f"{c.router_jitter_noise}")
        window = c.sliding_window
        return dict(family="decoder", vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                    n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads,
                    head_dim=c.head_dim or c.hidden_size // c.num_attention_heads,
                    position={"name": "rope", "base": checked_rope(c)},
                    attention="full" if window is None else {"name": "sliding_window", "window": window},
                    norm={"name": "pre", "type": "rmsnorm", "eps": c.rms_norm_eps},
                    ffn={"name": "moe", "n_experts": c.num_local_experts, "top_k": c.num_experts_per_tok,
                         "expert": {"name": "swiglu", "d_ff": c.intermediate_size}, "router": "softmax",
                         "normalize": True, "balance_loss": self.balance_loss(c)},
                    bias=False, tie_embeddings=c.tie_word_embeddings)


class Llama4(MoEDecoder):
    """Llama 4's text model. Each layer's position scheme says whether it is a RoPE layer
    (`no_rope_layers`), its attention whether it is chunked (`layer_types`), its FFN whether it is
    an MoE layer (`moe_layers`); what transformers holds once per model (the chunk, the
    temperature, the QK-norm, the experts) is read from the first layer that has it."""

    model_type, hf_class = "llama4_text", "Llama4ForCausalLM"
    any_head_dim = True

    def config(self, spec):
        layers = range(spec.decoder_layers)
        positions = [spec.at("position", i) for i in layers]
        attentions = [spec.at("attention", i) for i in layers]
        ffns = [spec.at("ffn", i) for i in layers]
        rope = next((p for p in positions if p.name == "rope"), None)
        nope = next((p for p in positions if p.name != "rope"), None)
        chunked = next((a for a in attentions if a.name == "chunked"), None)
        roped = next((a for a, p in zip(attentions, positions) if p.name == "rope"), None)
        moe = next((f for f in ffns if f.name == "moe"), None)
        dense = next((f for f in ffns if f.name != "moe"), None)
        d_ff = swiglu_width(moe.params.expert, spec.d_model) if moe else swiglu_width(dense.as_dict(), spec.d_model)
        return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, num_hidden_layers=spec.decoder_layers,
                    num_attention_heads=spec.n_heads, num_key_value_heads=spec.n_kv_heads, head_dim=spec.head_dim,
                    intermediate_size=d_ff,
                    intermediate_size_mlp=swiglu_width(dense.as_dict(), spec.d_model) if dense else d_ff,
                    **(dict(num_local_experts=moe.params.n_experts, num_experts_per_tok=moe.params.top_k) if moe
                       else {}),
                    moe_layers=[i for i in layers if ffns[i].name == "moe"],
                    no_rope_layers=[int(p.name == "rope") for p in positions],
                    rope_parameters={"rope_type": "default", "rope_theta": rope.params.base if rope else 500000.0},
                    use_qk_norm=roped is not None and getattr(roped.params, "qk_norm", "none") != "none",
                    attention_chunk_size=chunked.params.chunk if chunked else None,
                    layer_types=["chunked_attention" if a.name == "chunked" else "full_attention" for a in attentions],
                    attn_temperature_tuning=nope is not None and nope.name == "nope_temperature",
                    **({"floor_scale": nope.params.floor_scale, "attn_scale": nope.params.attn_scale}
                       if nope is not None and nope.name == "nope_temperature" else {}),
                    rms_norm_eps=spec.norm.params.eps, tie_word_embeddings=spec.tie_embeddings, attention_bias=False,
                    attention_dropout=0.0, hidden_act="silu")

    def spec(self, c):
        if c.hidden_act != "silu" or c.attention_bias:
            raise SpecError("hidden_act", "the workbench's SwiGLU needs silu and no biases")
        layers = range(c.num_hidden_layers)
        unknown = sorted(set(c.layer_types[: len(layers)]) - {"full_attention", "chunked_attention"})
        if unknown:
            raise SpecError("layer_types", f"Llama 4's layers are full_attention or chunked_attention, got {unknown}")
        theta = checked_rope(c)
        uses_rope = [bool(c.no_rope_layers[i]) for i in layers]
        nope = ({"name": "nope_temperature", "floor_scale": c.floor_scale, "attn_scale": c.attn_scale}
                if c.attn_temperature_tuning else {"name": "none"})
        qk_norm = {"qk_norm": "head", "qk_norm_gain": False}
        attention = [{"name": "chunked", "chunk": c.attention_chunk_size} if c.layer_types[i] == "chunked_attention"
                     else {"name": "full"} for i in layers]
        attention = [{**a, **qk_norm} if c.use_qk_norm and uses_rope[i] else a for i, a in enumerate(attention)]
        swiglu = {"name": "swiglu", "d_ff": c.intermediate_size}
        moe = {"name": "moe", "n_experts": c.num_local_experts, "top_k": c.num_experts_per_tok, "expert": swiglu,
               "shared": swiglu, "router": "sigmoid", "normalize": False, "weight_inputs": True, "balance_loss": 0.0}
        ffn = [moe if i in c.moe_layers else {"name": "swiglu", "d_ff": c.intermediate_size_mlp} for i in layers]
        return dict(family="decoder", vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                    n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads,
                    head_dim=c.head_dim or c.hidden_size // c.num_attention_heads,
                    position=as_pattern([{"name": "rope", "base": theta} if r else nope for r in uses_rope]),
                    attention=as_pattern(attention), norm={"name": "pre", "type": "rmsnorm", "eps": c.rms_norm_eps},
                    ffn=as_pattern(ffn), bias=False, tie_embeddings=c.tie_word_embeddings)

    def rope_orders(self, spec):
        return None, None  # Meta's RoPE pairs, as ours

    def layer_links(self, spec, layer, ours, theirs):
        ffn = spec.at("ffn", layer)
        if ffn.name != "moe":
            return gated_mlp(f"{ours}.ffn", f"{theirs}.feed_forward", swiglu_width(ffn.as_dict(), spec.d_model))
        p = ffn.params
        return [same(f"{ours}.ffn.router.weight", f"{theirs}.feed_forward.router.weight"),
                *experts(f"{ours}.ffn", f"{theirs}.feed_forward", p.n_experts, transposed),
                *gated_mlp(f"{ours}.ffn.shared", f"{theirs}.feed_forward.shared_expert",
                           swiglu_width(p.shared, spec.d_model))]
