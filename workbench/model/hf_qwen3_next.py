"""Qwen3-Next (Qwen Team 2025; transformers' `Qwen3NextForCausalLM`) as a whole model, for
workbench.model.hf: a hybrid decoder whose layers are, as `layer_types` says, Gated DeltaNet
layers (`linear_attention`: our `gated_deltanet`, plugins/attention_gated_deltanet.py) or gated
full-attention layers (`full_attention`: our `full` with `qk_norm: head` and `gate: elementwise`,
RoPE on `partial_rotary_factor` of each head: our rope `fraction`); pre-norm with transformers'
zero-centred RMSNorm everywhere (it scales by 1 + w: ours holds w + 1); per layer a dense SwiGLU
(`intermediate_size`) or, where `decoder_sparse_step` and `mlp_only_layers` say, an MoE: a softmax
router over `num_experts`, top `num_experts_per_tok` (renormalised when `norm_topk_prob`), SwiGLU
experts of `moe_intermediate_size`, and a shared SwiGLU expert (`shared_expert_intermediate_size`)
scaled by sigmoid(x w) (`shared_gate: true`).

Where the mapping is not the identity (tests/model/test_hf_parity_qwen3_next.py):
- q_proj's rows are [query; gate] per head: the queries (rotate-half pairs taken to ours within
  the rotated dimensions, `rope_pairing`) go to our `qkv`, the gates to our `gate`; the QK-norm
  gains follow the same pairing. `tensors` names the two halves as views of q_proj
  (`....q_proj.weight.query`, `.gate`), so each of their tensors is linked once.
- in_proj_qkvz's rows are [q, k, v, z] per key head, in_proj_ba's [b, a]: ours are `in_proj`
  [q; k; v], `gate` (z), `beta` (b) and `decay` (a), each from views of theirs (`....q`, ...).
- the experts are stacked as Mixtral's (workbench.model.hf_moe).

What a spec must hold: what a Qwen3-Next config can say, checked (as hf_moe's architectures are)
by the round trip spec -> config -> spec, layer by layer; the DeltaNet's `chunk_size` (a speed
setting, one function at any size) and the MoE's training-only fields are left out of it.
Refused by name on import: another `hidden_act` than silu, `attention_bias`, a layer type but
the two, a RoPE type but the default, no shared expert.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from workbench.errors import SpecError
from workbench.model.hf_architecture import Architecture
from workbench.model.hf_decoders import rope_pairing, rope_position
from workbench.model.hf_moe import (SCALAR_FIELDS, MoEDecoder, as_pattern, checked_rope, compared, experts, gated_mlp,
                                   swiglu_width)
from workbench.model.hf_qknorm import gain
from workbench.model.spec import Choice, ModelSpec, parse_spec
from workbench.model.state_links import Link, linear, same
from workbench.variants import MODEL_AXES

LAYER_TYPES = {"gated_deltanet": "linear_attention", "full": "full_attention"}  # our attention -> their layer type
GATED_ATTENTION = {"name": "full", "qk_norm": "head", "gate": "elementwise"}
SPEED_SETTINGS = ("chunk_size",)  # DeltaNet options that leave the function unchanged: not compared
QKVZ, BA = ("q", "k", "v", "z"), ("b", "a")  # their fused DeltaNet projections' parts, per key head


def is_qwen3_next(spec: ModelSpec) -> bool:
    """A decoder with Qwen3-Next's marks: a Gated DeltaNet layer, an output-gated attention or a
    gated shared expert."""
    if spec.family != "decoder":
        return False
    layers = range(spec.decoder_layers)
    attentions = [spec.at("attention", i) for i in layers]
    ffns = [spec.at("ffn", i) for i in layers]
    return (any(a.name == "gated_deltanet" or getattr(a.params, "gate", "none") != "none" for a in attentions)
            or any(f.name == "moe" and f.params.shared_gate for f in ffns))


def stacked_rows(ours: str, parts: list[tuple[str, tuple[int, ...], Tensor | None]]) -> Link:
    """Ours stacks the rows of several views of theirs, each (name, its shape, a row order or None),
    every view flattened to rows of its last axis; ours_part = rows(theirs_part)[order]."""
    sizes = [torch.Size(shape[:-1]).numel() for _, shape, _ in parts]

    def split(t: Tensor) -> list[Tensor]:
        return [(p if o is None else p[o.argsort()]).reshape(shape)
                for p, (_, shape, o) in zip(t.split(sizes), parts)]

    def join(ts: list[Tensor]) -> Tensor:
        flat = [t.reshape(-1, t.shape[-1]) for t in ts]
        return torch.cat([f if o is None else f[o] for f, (_, _, o) in zip(flat, parts)])

    return Link(ours, tuple(name for name, _, _ in parts), split, join)


def deltanet_sizes(params, spec: ModelSpec) -> tuple[int, int, int, int]:
    """(key heads, value heads, key width, value width) of a gated_deltanet layer, defaults resolved."""
    key_heads = params.key_heads or spec.n_heads
    return (key_heads, params.value_heads or key_heads, params.key_dim or spec.head_dim,
            params.value_dim or spec.head_dim)


def compared_layer(axis: str, choice: Choice, spec: ModelSpec) -> dict[str, Any]:
    """A layer's variant as the round trip compares it (hf_moe's `compared`), a DeltaNet's sizes
    resolved and its speed settings left out."""
    out = compared(axis, choice, spec.d_model)
    if choice.name != "gated_deltanet":
        return out
    sizes = dict(zip(("key_heads", "value_heads", "key_dim", "value_dim"), deltanet_sizes(choice.params, spec)))
    return {k: v for k, v in {**out, **sizes}.items() if k not in SPEED_SETTINGS}


class Qwen3Next(MoEDecoder):
    """Qwen3-Next's causal LM: per layer a Gated DeltaNet or a gated attention (`layer_types`), a
    dense SwiGLU or an MoE with a gated shared expert; what transformers holds once per model (the
    DeltaNet's sizes, the experts, the RoPE) is read from the first layer that has it."""

    model_type, hf_class = "qwen3_next", "Qwen3NextForCausalLM"
    any_head_dim = True

    def config(self, spec):
        layers = range(spec.decoder_layers)
        attentions = [spec.at("attention", i) for i in layers]
        ffns = [spec.at("ffn", i) for i in layers]
        deltanet = next((a for a in attentions if a.name == "gated_deltanet"), None)
        key_heads, value_heads, key_dim, value_dim = (deltanet_sizes(deltanet.params, spec) if deltanet else
                                                      (spec.n_heads, spec.n_heads, spec.head_dim, spec.head_dim))
        attended = next((i for i in layers if attentions[i].name != "gated_deltanet"), 0)
        rope = spec.at("position", attended).params
        moe = next((f for f in ffns if f.name == "moe"), None)
        dense = next((f for f in ffns if f.name != "moe"), None)
        return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, num_hidden_layers=spec.decoder_layers,
                    num_attention_heads=spec.n_heads, num_key_value_heads=spec.n_kv_heads, head_dim=spec.head_dim,
                    layer_types=[LAYER_TYPES.get(a.name, a.name) for a in attentions],
                    linear_num_key_heads=key_heads, linear_num_value_heads=value_heads, linear_key_head_dim=key_dim,
                    linear_value_head_dim=value_dim,
                    linear_conv_kernel_dim=deltanet.params.conv_size if deltanet else 4,
                    rope_parameters={"rope_type": "default", "rope_theta": getattr(rope, "base", 10000.0),
                                     "partial_rotary_factor": getattr(rope, "fraction", 1.0)},
                    intermediate_size=swiglu_width(dense.as_dict() if dense else moe.params.expert, spec.d_model),
                    **(self.moe_config(moe, [i for i in layers if ffns[i].name != "moe"], spec.d_model) if moe
                       else {"num_experts": 0}),
                    rms_norm_eps=spec.at("norm", 0).params.eps, tie_word_embeddings=spec.tie_embeddings,
                    attention_bias=False, attention_dropout=0.0, hidden_act="silu")

    def moe_config(self, moe, dense_layers: list[int] | None = None, d_model: int = 0) -> dict[str, Any]:
        p = moe.params
        return dict(super().moe_config(moe), num_experts=p.n_experts, norm_topk_prob=p.normalize,
                    moe_intermediate_size=swiglu_width(p.expert, d_model),
                    shared_expert_intermediate_size=swiglu_width(p.shared, d_model) if p.shared is not None else 0,
                    decoder_sparse_step=1, mlp_only_layers=dense_layers or [])

    def spec(self, c):
        if c.hidden_act != "silu" or c.attention_bias:
            raise SpecError("hidden_act", "the workbench's SwiGLU and Gated DeltaNet need silu and no attention "
                            f"biases, got hidden_act {c.hidden_act!r}, attention_bias {c.attention_bias}")
        layers = range(c.num_hidden_layers)
        kinds = list(c.layer_types[: len(layers)])
        unknown = sorted(set(kinds) - set(LAYER_TYPES.values()))
        if unknown:
            raise SpecError("layer_types", f"Qwen3-Next's layers are {sorted(LAYER_TYPES.values())}, got {unknown}")
        checked_rope(c)
        deltanet = {"name": "gated_deltanet", "key_heads": c.linear_num_key_heads,
                    "value_heads": c.linear_num_value_heads, "key_dim": c.linear_key_head_dim,
                    "value_dim": c.linear_value_head_dim, "conv_size": c.linear_conv_kernel_dim}
        attention = [deltanet if kind == "linear_attention" else GATED_ATTENTION for kind in kinds]
        return dict(family="decoder", vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                    n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads,
                    head_dim=c.head_dim or c.hidden_size // c.num_attention_heads,
                    position=rope_position(c.rope_parameters), attention=as_pattern(attention),
                    norm={"name": "pre", "type": "rmsnorm", "eps": c.rms_norm_eps}, ffn=as_pattern(self.spec_ffns(c)),
                    bias=False, tie_embeddings=c.tie_word_embeddings)

    def spec_ffns(self, c) -> list[dict[str, Any]]:
        """Each layer's FFN: an MoE where transformers builds Qwen3NextSparseMoeBlock (not in
        mlp_only_layers, num_experts > 0, every decoder_sparse_step-th layer), else a SwiGLU."""
        sparse = [i not in c.mlp_only_layers and c.num_experts > 0 and (i + 1) % c.decoder_sparse_step == 0
                  for i in range(c.num_hidden_layers)]
        if any(sparse) and not c.shared_expert_intermediate_size:
            raise SpecError("shared_expert_intermediate_size", "the workbench's gated shared expert needs a width "
                            f"above 0, got {c.shared_expert_intermediate_size}")
        moe = {"name": "moe", "n_experts": c.num_experts, "top_k": c.num_experts_per_tok,
               "expert": {"name": "swiglu", "d_ff": c.moe_intermediate_size},
               "shared": {"name": "swiglu", "d_ff": c.shared_expert_intermediate_size}, "shared_gate": True,
               "router": "softmax", "normalize": c.norm_topk_prob, "balance_loss": self.balance_loss(c)}
        return [moe if s else {"name": "swiglu", "d_ff": c.intermediate_size} for s in sparse]

    def check(self, spec: ModelSpec) -> None:
        """The spec's fields (Architecture.check), a gated shared expert in every MoE layer, then the
        round trip spec -> config -> spec compared field by field and layer by layer."""
        Architecture.check(self, spec)
        for layer in range(spec.decoder_layers):
            attention, ffn = spec.at("attention", layer).name, spec.at("ffn", layer)
            if attention not in LAYER_TYPES:
                raise SpecError("model.attention.name", f"{self.model_type} ({self.hf_class}) needs one of "
                                f"{sorted(LAYER_TYPES)} at layer {layer}, got {attention!r}")
            if ffn.name == "moe" and (ffn.params.shared is None or not ffn.params.shared_gate):
                field = "shared" if ffn.params.shared is None else "shared_gate"
                raise SpecError(f"model.ffn.{field}", f"{self.model_type} ({self.hf_class}) needs a shared expert "
                                f"scaled by its sigmoid gate in every MoE layer (layer {layer})")
        expected = parse_spec(self.spec(self.hf_config(spec)))
        for field in SCALAR_FIELDS:
            wanted, got = getattr(expected, field), getattr(spec, field)
            if wanted != got:
                raise SpecError(f"model.{field}", f"{self.model_type} ({self.hf_class}) needs {wanted!r}, got {got!r}")
        self.check_layers(spec, expected)

    def check_layers(self, spec: ModelSpec, expected: ModelSpec) -> None:
        patterned = [axis for axis in MODEL_AXES if len(spec.each(axis)) > 1 or len(expected.each(axis)) > 1]
        for layer in range(spec.decoder_layers):
            for axis in MODEL_AXES:
                if axis == "position" and spec.at("attention", layer).name == "gated_deltanet":
                    continue  # a DeltaNet layer reads no position scheme
                wanted = compared_layer(axis, expected.at(axis, layer), spec)
                got = compared_layer(axis, spec.at(axis, layer), spec)
                key = next((k for k in ("name", *wanted) if wanted.get(k) != got.get(k)), None)
                if key is not None:
                    at = f" at layer {layer}" if axis in patterned else ""
                    raise SpecError(f"model.{axis}.{key}", f"{self.model_type} ({self.hf_class}) needs "
                                    f"{wanted.get(key)!r}{at}, got {got.get(key)!r}")

    def tensors(self, model) -> dict[str, Any]:
        """Ours as they are; theirs with the experts split (MoEDecoder) and each fused projection
        that feeds several of ours split into views: q_proj into `.query` and `.gate` [heads,
        head_dim, d], in_proj_qkvz into `.q` `.k` `.v` `.z` and in_proj_ba into `.b` `.a`
        [key heads, rows, d]."""
        out = super().tensors(model)
        for name in [n for n in out if n.endswith(("self_attn.q_proj.weight", "in_proj_qkvz.weight",
                                                   "in_proj_ba.weight"))]:
            c, weight = model.config, out.pop(name)
            if name.endswith("q_proj.weight"):
                halves = weight.view(c.num_attention_heads, 2, c.head_dim, c.hidden_size).unbind(1)
                out.update({f"{name}.query": halves[0], f"{name}.gate": halves[1]})
                continue
            per_key_head = c.linear_num_value_heads // c.linear_num_key_heads
            widths = ([c.linear_key_head_dim] * 2 + [per_key_head * c.linear_value_head_dim] * 2
                      if name.endswith("qkvz.weight") else [per_key_head] * 2)
            parts = weight.view(c.linear_num_key_heads, sum(widths), c.hidden_size).split(widths, dim=1)
            out.update({f"{name}.{x}": p for x, p in zip(QKVZ if len(widths) == 4 else BA, parts)})
        return out

    def links(self, spec):
        out = [same("embedding.weight", "model.embed_tokens.weight")]
        for i in range(spec.decoder_layers):
            ours, theirs = f"decoder.blocks.{i}", f"model.layers.{i}"
            out += [gain(f"{ours}.attn_norm.norm.weight", f"{theirs}.input_layernorm.weight", None, 1.0),
                    gain(f"{ours}.ffn_norm.norm.weight", f"{theirs}.post_attention_layernorm.weight", None, 1.0)]
            if spec.at("attention", i).name == "gated_deltanet":
                out += self.deltanet_links(spec, i, f"{ours}.attn", f"{theirs}.linear_attn")
            else:
                out += self.attention_links(spec, i, f"{ours}.attn", f"{theirs}.self_attn")
            out += self.layer_links(spec, i, ours, theirs)
        out.append(gain("decoder.final_norm.weight", "model.norm.weight", None, 1.0))
        return out + ([] if spec.tie_embeddings else [same("head.weight", "lm_head.weight")])

    def attention_links(self, spec: ModelSpec, layer: int, ours: str, theirs: str) -> list[Link]:
        """The gated attention: queries (RoPE-paired within the rotated dimensions) and gates from
        q_proj's halves, the QK-norm gains (1 + w) in the same pairing."""
        h, g, hd, d = spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.d_model
        rotary = int(hd * spec.at("position", layer).params.fraction)
        q_proj = f"{theirs}.q_proj.weight"
        return [stacked_rows(f"{ours}.qkv.weight", [(f"{q_proj}.query", (h, hd, d), rope_pairing(h, hd, rotary)),
                                                    (f"{theirs}.k_proj.weight", (g * hd, d), rope_pairing(g, hd, rotary)),
                                                    (f"{theirs}.v_proj.weight", (g * hd, d), None)]),
                stacked_rows(f"{ours}.gate.weight", [(f"{q_proj}.gate", (h, hd, d), None)]),
                *[gain(f"{ours}.{x}_norm.weight", f"{theirs}.{x}_norm.weight", rope_pairing(1, hd, rotary), 1.0)
                  for x in "qk"],
                *linear(f"{ours}.out", f"{theirs}.o_proj", False)]

    def deltanet_links(self, spec: ModelSpec, layer: int, ours: str, theirs: str) -> list[Link]:
        """The Gated DeltaNet: in_proj [q; k; v], gate (z), beta (b), decay (a) from the views of
        their fused projections, the rest one to one (its output norm is a plain RMSNorm)."""
        key_heads, value_heads, key_dim, value_dim = deltanet_sizes(spec.at("attention", layer).params, spec)
        per_key_head, d = value_heads // key_heads, spec.d_model
        widths = dict(q=key_dim, k=key_dim, v=per_key_head * value_dim, z=per_key_head * value_dim,
                      b=per_key_head, a=per_key_head)

        def view(fused: str, x: str) -> tuple[str, tuple[int, ...], None]:
            return f"{theirs}.{fused}.weight.{x}", (key_heads, widths[x], d), None

        return [stacked_rows(f"{ours}.in_proj.weight", [view("in_proj_qkvz", x) for x in "qkv"]),
                stacked_rows(f"{ours}.gate.weight", [view("in_proj_qkvz", "z")]),
                stacked_rows(f"{ours}.beta.weight", [view("in_proj_ba", "b")]),
                stacked_rows(f"{ours}.decay.weight", [view("in_proj_ba", "a")]),
                *[same(f"{ours}.{mine}", f"{theirs}.{their}") for mine, their in (
                    ("conv.weight", "conv1d.weight"), ("A_log", "A_log"), ("dt_bias", "dt_bias"),
                    ("norm.weight", "norm.weight"), ("out.weight", "out_proj.weight"))]]

    def layer_links(self, spec, layer, ours, theirs):
        """Layer `layer`'s FFN: a SwiGLU, or the router, experts, shared expert and its gate."""
        ffn = spec.at("ffn", layer)
        if ffn.name != "moe":
            return gated_mlp(f"{ours}.ffn", f"{theirs}.mlp", swiglu_width(ffn.as_dict(), spec.d_model))
        p = ffn.params
        return [same(f"{ours}.ffn.router.weight", f"{theirs}.mlp.gate.weight"),
                *experts(f"{ours}.ffn", f"{theirs}.mlp", p.n_experts),
                *gated_mlp(f"{ours}.ffn.shared", f"{theirs}.mlp.shared_expert", swiglu_width(p.shared, spec.d_model)),
                same(f"{ours}.ffn.shared_gate.weight", f"{theirs}.mlp.shared_expert_gate.weight")]
