"""DiffLlama and DeepSeek-V3 (workbench.model.hf_latent) against Hugging Face `transformers`, as
tests/model/test_hf_parity.py does the first eight: a tiny config with random weights in float64
(nothing downloaded), copied into the workbench with `from_hf`, gives the same logits (max
difference 1e-4) and the same 20 greedy tokens decoded with the KV cache; exported back with
`to_hf`, saved and loaded by the Auto class, the same logits again.

What is compared for DeepSeek-V3's mixture of experts: routing picks experts by comparing sigmoid
scores (in float32, in both), so a token whose k-th and (k+1)-th best experts (or whose last kept
and first dropped groups) score within rounding of each other could go to different experts in
the two implementations and make the logits differ by whole units for a reason that is not a
mapping error. The weights here are drawn so that no decision is that close: the test measures,
for every token of the prompt and of the decoded sequences, the margin of each decision (above
1e-4, against differences of ~1e-6 between the two implementations' hidden states) and checks
that both chose the same experts; only then are the logits and tokens compared. The selection
bias and the group limit each change some token's experts, so both are exercised.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_hf_parity import N_NEW, TOLERANCE, V, greedy_pair, logits_pair, randomized, tokens  # noqa: E402

from workbench.errors import SpecError  # noqa: E402
from workbench.model import hf  # noqa: E402
from workbench.model.spec import parse_spec, resolve_choice  # noqa: E402
from workbench.model.transformer import build_model  # noqa: E402

ROUTING_MARGIN = 1e-4  # the smallest gap a routing decision may have for the comparison to be well defined

CONFIGS = {
    # GQA (4 query heads over 2 K/V heads): differential head i pairs query heads i and i + 2, and
    # reads the value halves of K/V heads 0 and 1; 3 layers, three values of lambda_init
    "diffllama": dict(vocab_size=V, hidden_size=32, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                      rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    # DeepSeek-V3's ratios at width 32: kv_lora_rank 4 head widths, qk_rope_head_dim half of one
    # (512, 64 and 128 in DeepSeek-V3); one dense layer, then MoE layers of 8 experts in 2 groups
    # (a token's experts from its best group), 2 per token, 2 shared experts' width
    "deepseek_v3": dict(vocab_size=V, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                        num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
                        q_lora_rank=16, kv_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=2,
                        routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-6,
                        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, tie_word_embeddings=False,
                        num_mtp_layers=0, bos_token_id=1, eos_token_id=2),
}


def prepared(model):
    """A transformers model made ready to compare: experts looped in plain torch (the default
    grouped_mm has no float64 kernel), and greedy decoding that stops at no token (generate
    otherwise takes eos_token_id from the model's generation config and pads after it)."""
    if hasattr(model, "set_experts_implementation") and model.config.model_type == "deepseek_v3":
        model.set_experts_implementation("eager")
    model.generation_config.eos_token_id = None
    return model


def reference(model_type: str, **overrides):
    """The HF model, float64, every parameter drawn at random as test_hf_parity draws them, and
    DeepSeek-V3's selection biases (buffers) from N(0, 0.1)."""
    arch = hf.ARCHITECTURES[model_type]
    config = transformers.AutoConfig.for_model(model_type, **{**CONFIGS[model_type], **overrides})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = randomized(getattr(transformers, arch.hf_class)(config).double().eval())
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.1)
    return prepared(model)


def reload(model, path):
    model.save_pretrained(path)
    auto = getattr(transformers, hf.ARCHITECTURES[model.config.model_type].auto_class)
    return prepared(auto.from_pretrained(path, dtype=torch.float64).eval())


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_logits_and_cached_greedy_decoding_equal_the_reference(model_type, tmp_path):
    ref = reference(model_type)
    ours = hf.from_hf(ref)
    assert ours.num_parameters() <= sum(p.numel() for p in ref.parameters())
    src = tokens(2, 12, seed=1)
    theirs, mine = logits_pair(ref, ours, src, None)
    assert theirs.std() > 1.0  # logits of several units: the tolerance below is a tight one
    assert (theirs - mine).abs().max() < TOLERANCE
    theirs, mine = greedy_pair(ref, ours, src[:, :6])
    assert theirs.tolist() == mine.tolist()
    assert theirs.shape[1] - 6 == N_NEW

    back = reload(hf.to_hf(ours), tmp_path)  # the export's mapping, saved and loaded by its Auto class
    assert type(back).__name__ == type(ref).__name__
    again, mine = logits_pair(back, ours, src, None)
    assert (again - mine).abs().max() < TOLERANCE
    home = hf.from_hf(back)  # and read in again: the same spec
    assert home.spec.resolved() == ours.spec.resolved()


# ---- DeepSeek-V3's routing ---------------------------------------------------------------------


def routing(ref, ours, ids: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Per MoE layer, from one forward of each model on `ids`: HF's router logits and chosen
    experts, ours, and HF's selection bias."""
    layers = [(layer.mlp.gate, block.ffn) for layer, block in zip(ref.model.layers, ours.decoder.blocks)
              if hasattr(layer.mlp, "gate")]
    seen: list[dict[str, torch.Tensor]] = [{} for _ in layers]
    handles = []
    for record, (gate, moe) in zip(seen, layers):
        def theirs(module, args, out, record=record):
            record["logits"], record["theirs"] = out[0], out[2]
            record["bias"] = module.e_score_correction_bias

        def mine(module, args, out, record=record, moe=moe):
            record["ours"] = moe.route(out)[1]

        handles += [gate.register_forward_hook(theirs), moe.router.register_forward_hook(mine)]
    with torch.no_grad():
        ref(input_ids=ids)
        ours(ids)
    for handle in handles:
        handle.remove()
    return seen


def decide(logits: torch.Tensor, bias: torch.Tensor | float, groups: int, top_groups: int,
           k: int) -> tuple[torch.Tensor, float, float]:
    """DeepseekV3TopkRouter's decision from its router logits [T, E]: the experts chosen (sorted
    per token), and the smallest gap over tokens between the last group kept and the first one
    dropped, and between the k-th expert chosen and the best one not chosen (inf: no such choice)."""
    choice = logits.float().sigmoid() + bias  # [T, E]
    grouped = choice.view(len(choice), groups, -1)  # [T, G, E / G]
    ranked = grouped.topk(2, dim=-1).values.sum(-1).sort(-1, descending=True)  # a group scores as its best two
    values = ranked.values
    group_gap = (values[:, top_groups - 1] - values[:, top_groups]).min() if top_groups < groups else torch.inf
    kept = ranked.indices[:, :top_groups, None].expand(-1, -1, grouped.shape[-1])
    experts = torch.arange(choice.shape[1]).view(1, groups, -1).expand_as(grouped)
    candidates, ids = grouped.gather(1, kept).flatten(1), experts.gather(1, kept).flatten(1)
    best = candidates.sort(-1, descending=True)
    expert_gap = (best.values[:, k - 1] - best.values[:, k]).min() if k < candidates.shape[1] else torch.inf
    return ids.gather(1, best.indices[:, :k]).sort(-1).values, float(group_gap), float(expert_gap)


def test_deepseek_v3_routes_every_token_to_the_same_experts_far_from_any_tie():
    ref = reference("deepseek_v3")
    ours = hf.from_hf(ref)
    c = ref.config
    src = tokens(2, 12, seed=1)
    decoded = greedy_pair(ref, ours, src[:, :6])[0]  # every token cached decoding routes
    bias_matters = groups_matter = False
    for ids in (src, decoded):
        for layer in routing(ref, ours, ids):
            theirs, ours_chosen = layer["theirs"].sort(-1).values, layer["ours"].sort(-1).values
            chosen, group_gap, expert_gap = decide(layer["logits"], layer["bias"], c.n_group, c.topk_group,
                                                   c.num_experts_per_tok)
            assert torch.equal(chosen, theirs)  # `decide` is HF's rule
            assert min(group_gap, expert_gap) > ROUTING_MARGIN  # no decision within rounding of a tie
            assert torch.equal(ours_chosen, theirs)
            unbiased = decide(layer["logits"], 0.0, c.n_group, c.topk_group, c.num_experts_per_tok)[0]
            ungrouped = decide(layer["logits"], layer["bias"], 1, 1, c.num_experts_per_tok)[0]
            bias_matters |= not torch.equal(unbiased, theirs)
            groups_matter |= not torch.equal(ungrouped, theirs)
    assert bias_matters and groups_matter


def test_a_negative_selection_bias_never_chooses_outside_the_kept_groups():
    """With every expert's bias at -1 each choice score is negative: experts of a dropped group
    are masked to -inf as HF's DeepseekV3TopkRouter masks them (a mask of 0 would choose them all)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = transformers.AutoConfig.for_model("deepseek_v3", **CONFIGS["deepseek_v3"])
    gate = DeepseekV3TopkRouter(config)
    moe = resolve_choice("ffn", {"name": "moe", "n_experts": 8, "top_k": 2, "router": "sigmoid", "n_groups": 2,
                                 "top_groups": 1, "scale": 2.5}, "model.ffn")
    moe = moe.cls(moe.params, d_model=32, bias=False)
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gate.weight.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(1))
        moe.router.weight.copy_(gate.weight)
        gate.e_score_correction_bias.fill_(-1.0)
        moe.selection_bias.fill_(-1.0)
        _, their_weights, theirs = gate(x)
        weights, chosen, _ = moe.route(moe.router(x))
    order, their_order = chosen.argsort(-1), theirs.argsort(-1)
    assert torch.equal(chosen.gather(1, order), theirs.gather(1, their_order))
    assert torch.allclose(weights.gather(1, order) * 2.5, their_weights.gather(1, their_order))
    assert bool(((chosen // 4)[:, 0] == (chosen // 4)[:, 1]).all())  # both experts from the one kept group


def test_deepseek_v3_with_rotate_half_rope_reads_in_with_its_rotary_rows_paired():
    """`rope_interleave: false` rotates (x[j], x[j + r/2]) of each head's rotary part: the same
    model up to a permutation of those rows of q_b_proj and kv_a_proj_with_mqa."""
    ref = reference("deepseek_v3", rope_interleave=False)
    ours = hf.from_hf(ref)
    theirs, mine = logits_pair(ref, ours, tokens(2, 12, seed=1), None)
    assert theirs.std() > 1.0 and (theirs - mine).abs().max() < TOLERANCE
    interleaved = hf.from_hf(reference("deepseek_v3"))  # the same weights read as interleaved pairs differ
    assert (interleaved(tokens(2, 12, seed=1)) - mine).abs().max() > 0.1


# ---- a workbench spec exported ----------------------------------------------------------------

SPECS = {
    # multi-head (4 K/V heads: V1 and V2 are heads 0-1 and 2-3), a tied head
    "diffllama": dict(family="decoder", vocab_size=V, d_model=32, n_layers=3, n_heads=4, position={"name": "rope"},
                      attention="differential", norm={"name": "pre", "type": "rmsnorm"}, ffn="swiglu"),
    # queries projected directly (no q_lora_rank), every layer a MoE of one group, the latent eps
    # from model.norm's (1e-6 as DeepSeek-V3's), a tied head
    "deepseek_v3": dict(family="decoder", vocab_size=V, d_model=32, n_layers=2, n_heads=2, position={"name": "rope"},
                        attention={"name": "mla", "kv_rank": 16, "rope_dim": 8, "nope_dim": 8, "v_dim": 12},
                        norm={"name": "pre", "type": "rmsnorm", "eps": 1e-6},
                        ffn={"name": "moe", "n_experts": 4, "top_k": 1, "router": "sigmoid", "normalize": False,
                             "expert": {"name": "swiglu", "d_ff": 24}, "shared": {"name": "swiglu", "d_ff": 24}}),
}


@pytest.mark.parametrize("model_type", sorted(SPECS))
def test_a_workbench_spec_exports_to_the_reference(model_type, tmp_path):
    torch.manual_seed(0)
    ours = build_model(SPECS[model_type]).double().eval()
    with torch.no_grad():  # weights large enough that the logits spread over several units
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() >= 2 else 0.1))
    assert hf.architecture_for(ours.spec).model_type == model_type
    theirs = prepared(hf.to_hf(ours))
    src = tokens(2, 12, seed=1)
    their, mine = logits_pair(theirs, ours, src, None)
    assert mine.std() > 1.0 and (mine - their).abs().max() < TOLERANCE
    their, mine = greedy_pair(theirs, ours, src[:, :6])
    assert their.tolist() == mine.tolist()
    back = reload(theirs, tmp_path)
    assert (logits_pair(back, ours, src, None)[0] - ours(src)).abs().max() < TOLERANCE


# ---- what does not map -------------------------------------------------------------------------

MLA = {"name": "mla", "kv_rank": 16, "rope_dim": 4, "latent_eps": 1e-6}
MOE = {"name": "moe", "n_experts": 4, "router": "sigmoid", "shared": "swiglu"}


@pytest.mark.parametrize(("change", "field"), [
    ({"attention": {"name": "differential", "kernel": {"name": "sliding_window", "window": 4}}},
     "model.attention.kernel"),
    ({"attention": {"name": "differential", "qk_norm": "head"}}, "model.attention.qk_norm"),
    ({"attention": "differential", "logit_softcap": 30.0}, "model.logit_softcap"),
    ({"attention": {"name": "mla", "kv_rank": 16, "rope_dim": 4}}, "model.attention.latent_eps"),  # norm eps 1e-5
    ({"attention": MLA, "ffn": ["swiglu", {**MOE, "router": "softmax"}]}, "model.ffn.1.router"),
    ({"attention": MLA, "ffn": [MOE, "swiglu"]}, "model.ffn"),  # dense layers come first
    ({"attention": MLA, "ffn": {**MOE, "shared": None}}, "model.ffn.shared"),
    ({"attention": MLA, "ffn": {**MOE, "shared": {"name": "swiglu", "d_ff": 50}}}, "model.ffn.shared"),
    ({"attention": MLA, "ffn": "gelu"}, "model.ffn"),
])
def test_a_spec_that_does_not_map_names_its_first_field(change, field):
    spec = parse_spec({"family": "decoder", "vocab_size": V, "d_model": 32, "n_heads": 4, "n_layers": 2,
                       "position": "rope", "norm": {"name": "pre", "type": "rmsnorm"}, "ffn": "swiglu", **change})
    with pytest.raises(SpecError) as err:
        hf.architecture_for(spec)
    assert err.value.field == field, str(err.value)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")  # HF's shared experts of width 0
@pytest.mark.parametrize(("change", "field"), [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
                          "original_max_position_embeddings": 64}}, "rope_parameters.rope_type"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"n_shared_experts": 0}, "n_shared_experts"),
])
def test_a_deepseek_v3_the_workbench_cannot_compute_is_refused_by_field(change, field):
    config = transformers.AutoConfig.for_model("deepseek_v3", **{**CONFIGS["deepseek_v3"], **change})
    with pytest.raises(SpecError) as err:
        hf.from_hf(transformers.DeepseekV3ForCausalLM(config))
    assert err.value.field == field, str(err.value)


# ---- the latent cache --------------------------------------------------------------------------


def test_the_latent_cache_holds_what_deepseek_v3_caches():
    """Per token and layer: the latent and the rotary key, kv_lora_rank + qk_rope_head_dim
    numbers (32 + 4 here), as HF's DynamicCache holds them (its keys the latent, its values the
    rotary key)."""
    ref = reference("deepseek_v3")
    ours = hf.from_hf(ref)
    c = ref.config
    B, n = 2, 6
    ours.generate(tokens(B, n, seed=1), max_new_tokens=N_NEW)
    held = ours.last_cache.nbytes / (c.num_hidden_layers * B * (n + N_NEW) * 8)  # numbers per token and layer
    assert held == c.kv_lora_rank + c.qk_rope_head_dim
    with torch.no_grad():
        cache = ref(input_ids=tokens(B, n, seed=1), use_cache=True).cache
    theirs = sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers) / (c.num_hidden_layers * B * n)
    assert theirs == held


def test_at_deepseek_v3s_own_widths_the_latent_cache_is_below_gqa_from_three_groups():
    """DeepSeek-V3's kv_lora_rank 512 and qk_rope_head_dim 64 at its head width 128: 576 numbers
    per token and layer, whatever the head count, against GQA's 2 * groups * 128: below GQA with
    3 groups (768) and more, above it with 2 (512): DeepSeek-V2's Table 1 puts MLA at GQA with
    2.25 groups. Measured from generation, float32."""
    mla = {"name": "mla", "kv_rank": 512, "rope_dim": 64, "nope_dim": 128, "v_dim": 128}
    per_token = {}
    for name, change in (("mla", {"n_heads": 2, "attention": mla}), ("gqa3", {"n_heads": 6, "n_kv_heads": 3}),
                         ("gqa2", {"n_heads": 6, "n_kv_heads": 2})):
        torch.manual_seed(0)
        model = build_model({"family": "decoder", "vocab_size": V, "d_model": 32, "n_layers": 1, "head_dim": 128,
                             "position": "rope", **change}).eval()
        model.generate(tokens(1, 3, seed=1), max_new_tokens=2)
        per_token[name] = model.last_cache.nbytes / (5 * 4)
    assert per_token == {"mla": 512 + 64, "gqa3": 2 * 3 * 128, "gqa2": 2 * 2 * 128}
