"""Qwen3-Next's two token mixers against Hugging Face `transformers`, layer by layer, in float64
with random weights copied (as tests/model/test_hf_parity.py does for whole models): the gated
full-attention layer (Qwen3NextAttention: output gate fused into q_proj, per-head QK-norm with
the zero-centred RMSNorm, partial RoPE) is our SelfAttention with `gate: elementwise`,
`qk_norm: head` and rope `fraction: 0.25`; the linear-attention layer (Qwen3NextGatedDeltaNet)
is the gated_deltanet mixer. Outputs within 1e-4 (the reference runs the delta rule and its
norms in float32: its own error is about 1e-6 here). Also GPT-NeoX with partial_rotary_factor,
which the same RoPE `fraction` maps, as a whole model."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

from test_hf_parity import TOLERANCE, greedy_pair, logits_pair, reference, tokens  # noqa: E402
from workbench.errors import SpecError  # noqa: E402
from workbench.model import hf  # noqa: E402
from workbench.model.hf_decoders import rope_pairing  # noqa: E402
from workbench.model.transformer import Positions, build_model  # noqa: E402

D, H, G, HD, ROTARY = 32, 4, 2, 16, 4  # width; attention heads, K/V heads, head width, rotated dims (0.25)
KEY_HEADS, VALUE_HEADS, KEY_DIM, VALUE_DIM, CONV = 2, 4, 8, 12, 4  # the linear layers' (value heads 2x, as 16/32)
CONFIG = dict(vocab_size=96, hidden_size=D, num_hidden_layers=4, num_attention_heads=H, num_key_value_heads=G,
              head_dim=HD, rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25},
              linear_num_key_heads=KEY_HEADS, linear_num_value_heads=VALUE_HEADS, linear_key_head_dim=KEY_DIM,
              linear_value_head_dim=VALUE_DIM, linear_conv_kernel_dim=CONV, rms_norm_eps=1e-6, num_experts=0,
              intermediate_size=64)
OURS = dict(vocab_size=96, d_model=D, n_heads=H, n_kv_heads=G, head_dim=HD, n_layers=1,
            norm={"name": "pre", "type": "rmsnorm", "eps": 1e-6})
GATED_ATTENTION = dict(OURS, position={"name": "rope", "base": 500.0, "fraction": 0.25},
                       attention={"name": "full", "qk_norm": "head", "gate": "elementwise"})
DELTANET = dict(OURS, attention={"name": "gated_deltanet", "key_heads": KEY_HEADS, "value_heads": VALUE_HEADS,
                                 "key_dim": KEY_DIM, "value_dim": VALUE_DIM, "conv_size": CONV, "chunk_size": 4})


def qwen3_next_config():
    config = transformers.Qwen3NextConfig(**CONFIG)
    config._attn_implementation = "sdpa"
    return config


def randomised(layer: torch.nn.Module) -> torch.nn.Module:
    """float64, matrices at a scale that gives outputs of a few units, vectors near their init (the
    zero-centred norms' weights near 0, i.e. gains near 1)."""
    torch.manual_seed(0)
    layer = layer.double().eval()
    with torch.no_grad():
        for p in layer.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    return layer


def our_mixer(spec: dict) -> torch.nn.Module:
    return build_model(spec).double().eval().decoder.blocks[0].attn


@torch.no_grad()
def copy_gated_attention(ours, theirs) -> None:
    """Their q_proj rows are [query; gate] per head: the queries (paired for our RoPE within the
    rotated dimensions) go to our qkv, the gates to our gate; their zero-centred norm's w is our
    gain w + 1, permuted as the head's dimensions are."""
    query_gate = theirs.q_proj.weight.view(H, 2, HD, D)
    ours.qkv.weight.copy_(torch.cat([query_gate[:, 0].reshape(H * HD, D)[rope_pairing(H, HD, ROTARY)],
                                     theirs.k_proj.weight[rope_pairing(G, HD, ROTARY)], theirs.v_proj.weight]))
    ours.gate.weight.copy_(query_gate[:, 1].reshape(H * HD, D))
    within = rope_pairing(1, HD, ROTARY)
    ours.q_norm.weight.copy_(1 + theirs.q_norm.weight[within])
    ours.k_norm.weight.copy_(1 + theirs.k_norm.weight[within])
    ours.out.weight.copy_(theirs.o_proj.weight)


@torch.no_grad()
def copy_gated_deltanet(ours, theirs) -> None:
    """Their in_proj_qkvz rows are [q, k, v, z] per key head (v and z of its value heads), in_proj_ba
    [b, a] per key head: ours are [q; k; v] (in_proj), z (gate), b (beta) and a (decay)."""
    shared = VALUE_HEADS // KEY_HEADS
    q, k, v, z = theirs.in_proj_qkvz.weight.view(KEY_HEADS, -1, D).split(
        [KEY_DIM, KEY_DIM, shared * VALUE_DIM, shared * VALUE_DIM], dim=1)
    b, a = theirs.in_proj_ba.weight.view(KEY_HEADS, 2 * shared, D).split([shared, shared], dim=1)
    ours.in_proj.weight.copy_(torch.cat([t.reshape(-1, D) for t in (q, k, v)]))
    for mine, their in ((ours.gate, z), (ours.beta, b), (ours.decay, a)):
        mine.weight.copy_(their.reshape(-1, D))
    for mine, their in (("conv.weight", "conv1d.weight"), ("A_log", "A_log"), ("dt_bias", "dt_bias"),
                        ("norm.weight", "norm.weight"), ("out.weight", "out_proj.weight")):
        ours.get_parameter(mine).copy_(theirs.get_parameter(their))


def inputs(B: int = 2, n: int = 13) -> tuple[torch.Tensor, Positions]:
    x = torch.randn(B, n, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return x, Positions(torch.arange(n).expand(B, n), None)


def test_the_gated_attention_layer_equals_qwen3_next_attention():
    config = qwen3_next_config()
    theirs = randomised(qwen3_next.Qwen3NextAttention(config, layer_idx=3))
    ours = our_mixer(GATED_ATTENTION)
    copy_gated_attention(ours, theirs)
    x, seq = inputs()
    with torch.no_grad():
        expected, _ = theirs(x, position_embeddings=qwen3_next.Qwen3NextRotaryEmbedding(config)(x, seq.pos[:1]),
                             attention_mask=None)
        got = ours(x, seq, causal=True)
    assert expected.std() > 1.0  # outputs of a unit or more: 1e-4 is a tight tolerance
    assert (got - expected).abs().max() < TOLERANCE
    # each part is needed: without the gate, the +1 of the norm or the partial rotation it differs
    with torch.no_grad():
        for param in (ours.gate.weight, ours.q_norm.weight):
            saved = param.clone()
            param.mul_(0.5)
            assert (ours(x, seq, causal=True) - expected).abs().max() > 100 * TOLERANCE
            param.copy_(saved)
        whole = our_mixer(dict(GATED_ATTENTION, position={"name": "rope", "base": 500.0}))
        whole.load_state_dict(ours.state_dict())
        assert (whole(x, seq, causal=True) - expected).abs().max() > 100 * TOLERANCE


def test_the_gated_deltanet_layer_equals_qwen3_next_gated_deltanet():
    theirs = randomised(qwen3_next.Qwen3NextGatedDeltaNet(qwen3_next_config(), layer_idx=0))
    ours = our_mixer(DELTANET)  # chunks of 4: 13 tokens are three chunks and a padded tail
    copy_gated_deltanet(ours, theirs)
    x, seq = inputs()
    with torch.no_grad():
        expected, got = theirs(x), ours(x, seq, causal=True)
    assert expected.std() > 1.0
    assert (got - expected).abs().max() < TOLERANCE


def test_gated_deltanet_decoding_equals_the_reference_decoding_with_its_cache():
    """A prompt of 9 tokens, then 4 one at a time: their recurrent path with their cache (conv and
    recurrent states) against ours with ours."""
    config = qwen3_next_config()
    theirs = randomised(qwen3_next.Qwen3NextGatedDeltaNet(config, layer_idx=0))
    ours = our_mixer(DELTANET)
    copy_gated_deltanet(ours, theirs)
    x, seq = inputs()
    their_cache, our_cache = transformers.DynamicCache(config=config), ours.new_cache(13)
    with torch.no_grad():
        expected = [theirs(x[:, :9], cache=their_cache)]
        got = [ours(x[:, :9], Positions(seq.pos[:, :9], None), True, our_cache)]
        for t in range(9, 13):
            expected.append(theirs(x[:, t:t + 1], cache=their_cache))
            got.append(ours(x[:, t:t + 1], Positions(seq.pos[:, t:t + 1], None), True, our_cache))
    assert (torch.cat(got, 1) - torch.cat(expected, 1)).abs().max() < TOLERANCE


def test_gated_deltanet_left_padding_equals_the_reference_and_each_row_alone():
    theirs = randomised(qwen3_next.Qwen3NextGatedDeltaNet(qwen3_next_config(), layer_idx=0))
    ours = our_mixer(DELTANET)
    copy_gated_deltanet(ours, theirs)
    x, _ = inputs()
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[1, :6] = False  # row 1: six padding tokens, then seven real ones
    seq = Positions.of(torch.zeros(2, 13, dtype=torch.long), mask)
    with torch.no_grad():
        expected, got = theirs(x, attention_mask=mask.long()), ours(x, seq, causal=True)
        alone = ours(x[1:, 6:], Positions(torch.arange(7)[None], None), causal=True)
    assert (got[mask] - expected[mask]).abs().max() < TOLERANCE
    assert (got[1, 6:] - alone[0]).abs().max() < 1e-12


def test_gpt_neox_with_partial_rotary_factor_maps_both_ways(tmp_path):
    """GPT-NeoX-20B's partial_rotary_factor 0.25: 4 of each head's 16 dimensions rotate."""
    rope = {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25}
    ref = reference("gpt_neox", hidden_size=64, rope_parameters=rope, eos_token_id=None)  # never stops early
    ours = hf.from_hf(ref)
    assert ours.spec.position.params.fraction == 0.25 and ours.spec.head_dim == 16
    src = tokens(2, 12, seed=1)
    theirs, mine = logits_pair(ref, ours, src, None)
    assert theirs.std() > 1.0 and (theirs - mine).abs().max() < TOLERANCE
    theirs, mine = greedy_pair(ref, ours, src[:, :6])
    assert theirs.tolist() == mine.tolist()
    hf.to_hf(ours).save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert back.config.rope_parameters["partial_rotary_factor"] == 0.25
    again, mine = logits_pair(back, ours, src, None)
    assert (again - mine).abs().max() < TOLERANCE


def test_a_partial_rope_refuses_to_export_as_llama():
    spec = dict(vocab_size=96, d_model=D, n_heads=H, norm={"name": "pre", "type": "rmsnorm"}, ffn="swiglu",
                position={"name": "rope", "fraction": 0.5})
    with pytest.raises(SpecError) as err:
        hf.architecture_for(build_model(spec).spec)
    assert str(err.value).startswith("model.position.fraction")
