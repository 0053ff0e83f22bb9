"""Two architectures of workbench.model.hf whose attention is not the standard layer's: DiffLlama
(differential attention) and DeepSeek-V3 (multi-head latent attention, and a mixture of experts
after its first dense layers).

- DiffLlama (Hugging Face's DiffLlamaForCausalLM, after Ye et al. 2024) is Llama with
  `attention: differential` (plugins/attention_differential.py, laid out as DiffLlama lays it
  out: query heads i and i + h/2 form differential head i, the value heads' halves are V1 and
  V2), so its links are Llama's (RoPE's rotate-half rows paired as ours) and each layer's four
  lambda vectors.
- DeepSeek-V3 (DeepseekV3ForCausalLM; DeepSeek-AI 2024) is `attention: mla`
  (plugins/attention_mla.py: q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and
  v_head_dim are q_rank, kv_rank, nope_dim, rope_dim and v_dim; scores scaled by
  (qk_nope_head_dim + qk_rope_head_dim)^-0.5, as HF scales them without YaRN), its latent
  RMSNorms at eps 1e-6 as HF builds them (`latent_eps`), and a per-layer `ffn`: a SwiGLU of
  intermediate_size in the first first_k_dense_replace layers, then `moe`
  (plugins/ffn_moe.py: `router: sigmoid`, e_score_correction_bias our `selection_bias` buffer,
  n_group / topk_group our n_groups / top_groups, norm_topk_prob our `normalize`,
  routed_scaling_factor our `scale`, experts SwiGLUs of moe_intermediate_size, one shared SwiGLU
  of n_shared_experts * moe_intermediate_size). HF stacks the experts' weights
  ([experts, 2 * width, d_model] for gate and up, as our [gate; up]); `tensors` splits them into
  one view per expert. RoPE: `rope_interleave: true` (DeepSeek's and HF's default) rotates the
  pairs (x[2j], x[2j+1]) as ours, and its weights copy over unchanged; a rotate-half model
  (`rope_interleave: false`) reads in with its rotary rows paired as Llama's. An export writes
  `rope_interleave: true` and no multi-token-prediction module (`num_mtp_layers: 0`). Not mapped:
  YaRN (DeepSeek-V3's long-context RoPE) and num_key_value_heads other than the head count.

The balancing of DeepSeek-V3's training has no part in the forward: an import sets
`bias_update: 0.001` (its auxiliary-loss-free balancing, bias update speed gamma) and no balance
loss (its small sequence-wise one is not the batch-wise loss of plugins/ffn_moe.py); an export
takes any of them.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.errors import SpecError
from workbench.model.hf_architecture import Architecture
from workbench.model.hf_decoders import Llama, rope_pairing
from workbench.model.spec import Choice, ModelSpec, canonical, resolve_choice
from workbench.model.state_links import Link, gated_mlp, norm, same

LATENT_ATTENTION = {"differential": "diffllama", "mla": "deepseek_v3"}  # our attention variant -> its model_type


class DiffLlama(Llama):
    model_type, hf_class, auto_class = "diffllama", "DiffLlamaForCausalLM", "AutoModelForCausalLM"
    attention = "differential"

    def requirements(self, spec):
        return {**super().requirements(spec), "attention.qk_norm": "none", "attention.value_residual": "none",
                "logit_softcap": None}

    def check(self, spec):
        super().check(spec)
        kernel = spec.attention.params.kernel_choice()
        if (kernel.name, kernel.params.scaled) != ("full", True):
            raise SpecError("model.attention.kernel", f"{self.model_type} ({self.hf_class}) computes both maps with "
                            f"full attention, scaled: needs 'full', got {kernel.as_dict()}")

    def spec_attention(self, c) -> Any:
        return "differential"

    def links(self, spec):
        lambdas = [same(f"decoder.blocks.{i}.attn.lambda_{name}", f"model.layers.{i}.self_attn.lambda_{name}")
                   for i in range(spec.n_layers) for name in ("q1", "k1", "q2", "k2")]
        return super().links(spec) + lambdas


def gated_width(ffn: Choice | dict | str, d_model: int) -> int:
    """The hidden width of a gated FFN (a Choice, its mapping or name): its d_ff, or GatedMLP's default."""
    choice = ffn if isinstance(ffn, Choice) else resolve_choice("ffn", ffn, "model.ffn")
    return choice.params.d_ff or round(8 * d_model / 3)


class DeepseekV3(Architecture):
    model_type, hf_class, auto_class = "deepseek_v3", "DeepseekV3ForCausalLM", "AutoModelForCausalLM"
    any_head_dim = True
    per_layer = ("ffn",)  # dense in the first first_k_dense_replace layers, then MoE (ffn_layers checks it)
    LATENT_EPS = 1e-6  # HF's DeepseekV3RMSNorm default, which its q_a_layernorm and kv_a_layernorm keep
    STACKED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")  # [experts, ...]: one view each
    BUFFERS = ("selection_bias", "e_score_correction_bias")  # the router's selection bias, ours and theirs

    def requirements(self, spec):
        return {"family": "decoder", "position.name": "rope", "attention.name": "mla", "attention.scaled": True,
                "norm.name": "pre", "norm.type": "rmsnorm", "embedding_norm": "none", "bias": False,
                "logit_softcap": None,
                "attention.latent_eps": spec.attention.params.latent_eps}  # any: `check` reads the eps it gives

    def check(self, spec):
        super().check(spec)
        eps = spec.attention.params.latent_eps or spec.norm.params.eps
        if eps != self.LATENT_EPS:
            raise SpecError("model.attention.latent_eps", f"{self.model_type} normalises its latents at eps "
                            f"{self.LATENT_EPS}, got {eps}")
        self.ffn_layers(spec)

    def ffn_layers(self, spec: ModelSpec) -> tuple[int, Choice | None, Choice | None]:
        """(first_k_dense_replace, the dense FFN, the MoE): DeepSeek-V3's first layers' SwiGLU, then
        one mixture of experts in every later layer; SpecError naming the field otherwise."""
        layers = [spec.at("ffn", i) for i in range(spec.n_layers)]
        first_k = next((i for i, c in enumerate(layers) if c.name == "moe"), len(layers))
        dense, moe = layers[:first_k], layers[first_k:]
        for group in (dense, moe):
            if any(canonical(c) != canonical(group[0]) for c in group):
                raise SpecError("model.ffn", f"{self.model_type} has one dense FFN in its first layers, then one "
                                f"mixture of experts in every later layer, got {[c.name for c in layers]}")
        if dense and dense[0].name != "swiglu":
            raise SpecError("model.ffn", f"{self.model_type}'s dense layers are swiglu, got {dense[0].name!r}")
        if moe:
            p = moe[0].params
            at = f"model.ffn.{first_k}" if first_k else "model.ffn"  # the first MoE of a list, or the one FFN
            needed = {"router": "sigmoid", "shared_gate": False, "weight_inputs": False}
            for key, wanted in needed.items():
                if getattr(p, key) != wanted:
                    raise SpecError(f"{at}.{key}", f"{self.model_type} needs {wanted!r}, got {getattr(p, key)!r}")
            expert = resolve_choice("ffn", p.expert, f"{at}.expert")  # a name or a mapping
            if expert.name != "swiglu":
                raise SpecError(f"{at}.expert", f"{self.model_type}'s experts are swiglu, got {expert.name!r}")
            width = gated_width(expert, spec.d_model)
            shared = None if p.shared is None else resolve_choice("ffn", p.shared, f"{at}.shared")
            if shared is None or shared.name != "swiglu" or gated_width(shared, spec.d_model) % width:
                raise SpecError(f"{at}.shared", f"{self.model_type} has a shared swiglu of n_shared_experts times the "
                                f"experts' d_ff ({width}), got {p.shared!r}")
        return first_k, dense[0] if dense else None, moe[0] if moe else None

    def config(self, spec):
        first_k, dense, moe = self.ffn_layers(spec)
        mla, d = spec.attention.params, spec.d_model
        out = dict(vocab_size=spec.vocab_size, hidden_size=d, num_hidden_layers=spec.n_layers,
                   num_attention_heads=spec.n_heads, num_key_value_heads=spec.n_heads,
                   q_lora_rank=mla.q_rank, kv_lora_rank=mla.kv_rank, qk_rope_head_dim=mla.rope_dim,
                   qk_nope_head_dim=mla.nope_dim or spec.head_dim, v_head_dim=mla.v_dim or spec.head_dim,
                   first_k_dense_replace=first_k, rms_norm_eps=spec.norm.params.eps, hidden_act="silu",
                   rope_parameters={"rope_type": "default", "rope_theta": spec.position.params.base},
                   rope_interleave=True, attention_bias=False, attention_dropout=0.0,
                   tie_word_embeddings=spec.tie_embeddings, num_mtp_layers=0)
        if dense is not None:
            out["intermediate_size"] = gated_width(dense, d)
        if moe is not None:
            p = moe.params
            width = gated_width(p.expert, d)
            out |= dict(n_routed_experts=p.n_experts, num_experts_per_tok=p.top_k, moe_intermediate_size=width,
                        n_shared_experts=gated_width(p.shared, d) // width, n_group=p.n_groups,
                        topk_group=p.top_groups, norm_topk_prob=p.normalize, routed_scaling_factor=p.scale)
        return out

    def spec(self, c):
        rope = c.rope_parameters or {}
        if rope.get("rope_type", "default") != "default":
            raise SpecError("rope_parameters.rope_type", f"only the default RoPE maps to the workbench's, got "
                            f"{rope['rope_type']!r}")
        if c.hidden_act != "silu" or c.attention_bias:
            raise SpecError("hidden_act", "the workbench's SwiGLU needs silu, and its latent attention no biases")
        if c.num_key_value_heads != c.num_attention_heads:
            raise SpecError("num_key_value_heads", f"latent attention decodes keys and values for every head: "
                            f"needs {c.num_attention_heads}, got {c.num_key_value_heads}")
        first_k = min(c.first_k_dense_replace or 0, c.num_hidden_layers)
        if first_k < c.num_hidden_layers and not c.n_shared_experts:
            raise SpecError("n_shared_experts", "the workbench maps DeepSeek-V3's MoE with its shared experts: "
                            "needs at least 1")
        moe = {"name": "moe", "n_experts": c.n_routed_experts, "top_k": c.num_experts_per_tok,
               "expert": {"name": "swiglu", "d_ff": c.moe_intermediate_size},
               "shared": {"name": "swiglu", "d_ff": c.n_shared_experts * c.moe_intermediate_size},
               "router": "sigmoid", "normalize": bool(c.norm_topk_prob), "scale": c.routed_scaling_factor,
               "n_groups": c.n_group, "top_groups": c.topk_group, "bias_update": 0.001, "balance_loss": 0.0}
        ffn = [{"name": "swiglu", "d_ff": c.intermediate_size}] * first_k + [moe] * (c.num_hidden_layers - first_k)
        attention = {"name": "mla", "kv_rank": c.kv_lora_rank, "q_rank": c.q_lora_rank, "rope_dim": c.qk_rope_head_dim,
                     "nope_dim": c.qk_nope_head_dim, "v_dim": c.v_head_dim, "latent_eps": self.LATENT_EPS}
        return dict(family="decoder", vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                    n_heads=c.num_attention_heads, head_dim=c.v_head_dim,
                    position={"name": "rope", "base": rope.get("rope_theta", 10000.0)}, attention=attention,
                    norm={"name": "pre", "type": "rmsnorm", "eps": c.rms_norm_eps}, ffn=ffn, bias=False,
                    tie_embeddings=c.tie_word_embeddings)

    def links(self, spec):
        first_k, dense, moe = self.ffn_layers(spec)
        q_rank = spec.attention.params.q_rank
        out = [same("embedding.weight", "model.embed_tokens.weight")]
        for i in range(spec.n_layers):
            ours, theirs = f"decoder.blocks.{i}", f"model.layers.{i}"
            att = f"{theirs}.self_attn"
            out += norm(f"{ours}.attn_norm.norm", f"{theirs}.input_layernorm", spec)
            query = [("q", "q_proj")] if q_rank is None else [("q_down", "q_a_proj"), ("q_norm", "q_a_layernorm"),
                                                              ("q", "q_b_proj")]
            out += [same(f"{ours}.attn.{mine}.weight", f"{att}.{name}.weight") for mine, name in query + [
                ("kv_down", "kv_a_proj_with_mqa"), ("kv_norm", "kv_a_layernorm"), ("kv_up", "kv_b_proj"),
                ("out", "o_proj")]]
            out += norm(f"{ours}.ffn_norm.norm", f"{theirs}.post_attention_layernorm", spec)
            if i < first_k:
                out += gated_mlp(f"{ours}.ffn", f"{theirs}.mlp", gated_width(dense, spec.d_model))
            else:
                out += self.moe_links(f"{ours}.ffn", f"{theirs}.mlp", moe, spec.d_model)
        out += norm("decoder.final_norm", "model.norm", spec)
        return out + ([] if spec.tie_embeddings else [same("head.weight", "lm_head.weight")])

    def moe_links(self, ours: str, theirs: str, moe: Choice, d_model: int) -> list[Link]:
        out = [same(f"{ours}.router.weight", f"{theirs}.gate.weight"),
               same(f"{ours}.selection_bias", f"{theirs}.gate.e_score_correction_bias")]
        for e in range(moe.params.n_experts):
            out += [same(f"{ours}.experts.{e}.gate_up.weight", f"{theirs}.experts.gate_up_proj.{e}"),
                    same(f"{ours}.experts.{e}.down.weight", f"{theirs}.experts.down_proj.{e}")]
        return out + gated_mlp(f"{ours}.shared", f"{theirs}.shared_experts", gated_width(moe.params.shared, d_model))

    def tensors(self, model):
        """Parameters, the routers' selection biases (buffers), each expert's slice of HF's stacked
        weights (a view: an export writes through it); a rotate-half model's rotary rows in our
        pairing (copies: read by an import only, an export writes rope_interleave: true)."""
        out = super().tensors(model) | {name: b for name, b in model.named_buffers() if name.endswith(self.BUFFERS)}
        for name in [name for name in out if name.endswith(self.STACKED)]:
            stacked = out.pop(name).detach()
            out |= {f"{name}.{e}": stacked[e] for e in range(stacked.shape[0])}
        config = getattr(model, "config", None)
        if config is not None and not config.rope_interleave:
            out |= self.interleaved_rows(out, config)
        return out

    def interleaved_rows(self, tensors: dict[str, Any], c) -> dict[str, Any]:
        """A rotate-half model's query and rotary key rows, each head's rotary part paired as ours."""
        nope, rope, h = c.qk_nope_head_dim, c.qk_rope_head_dim, c.num_attention_heads
        head = torch.cat([torch.arange(nope), nope + rope_pairing(1, rope)])
        query = (torch.arange(h)[:, None] * (nope + rope) + head).reshape(-1)
        key = torch.cat([torch.arange(c.kv_lora_rank), c.kv_lora_rank + rope_pairing(1, rope)])
        out = {}
        for i in range(c.num_hidden_layers):
            att = f"model.layers.{i}.self_attn"
            q = f"{att}.q_proj.weight" if c.q_lora_rank is None else f"{att}.q_b_proj.weight"
            out[q] = tensors[q][query]
            out[f"{att}.kv_a_proj_with_mqa.weight"] = tensors[f"{att}.kv_a_proj_with_mqa.weight"][key]
        return out
