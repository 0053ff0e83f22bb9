"""The parts that reference models need (issue 39): tanh-approximate GELU, an embedding norm,
T5's bucketed relative bias, and float64 position tables in a float64 model. Their agreement
with the reference implementations themselves is tests/model/test_hf_parity.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from conftest import build, tiny_spec, tokens
from workbench.errors import SpecError
from workbench.model.spec import parse_spec
from workbench_plugins.position_alibi import alibi_slopes
from workbench_plugins.position_t5_bias import relative_position_bucket

X = torch.linspace(-4, 4, 101, dtype=torch.float64)


@pytest.mark.parametrize("ffn", ["gelu", "geglu"])
def test_gelu_is_exact_by_default_and_tanh_on_request(ffn):
    exact = build(tiny_spec(ffn=ffn)).decoder.blocks[0].ffn.act
    tanh = build(tiny_spec(ffn={"name": ffn, "approximate": "tanh"})).decoder.blocks[0].ffn.act
    assert_close(exact(X), X / 2 * (1 + torch.erf(X / math.sqrt(2))), rtol=0, atol=1e-15)
    formula = X / 2 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (X + 0.044715 * X**3)))
    assert_close(tanh(X), formula, rtol=0, atol=1e-15)
    assert (tanh(X) - exact(X)).abs().max() > 1e-4  # two different functions


def test_gated_gelu_tanh_output_is_the_formula():
    model = build(tiny_spec(ffn={"name": "geglu", "approximate": "tanh"})).double()
    ffn = model.decoder.blocks[0].ffn
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    gate, up = ffn.gate_up(x).chunk(2, dim=-1)
    assert_close(ffn(x), ffn.down(F.gelu(gate, approximate="tanh") * up))


def test_parameters_added_later_keep_earlier_run_ids():
    """A spec that does not use them resolves to the mapping it resolved to before they existed."""
    plain = parse_spec(tiny_spec(ffn="gelu")).resolved()
    assert "embedding_norm" not in plain and plain["ffn"] == {"name": "gelu", "d_ff": None}
    used = parse_spec(tiny_spec(ffn={"name": "gelu", "approximate": "tanh"}, embedding_norm="rmsnorm")).resolved()
    assert used["embedding_norm"] == "rmsnorm" and used["ffn"]["approximate"] == "tanh"
    assert parse_spec(used).resolved() == used


@pytest.mark.parametrize(("field", "value", "named"), [
    ("ffn", {"name": "gelu", "approximate": "fast"}, "model.ffn.approximate"),
    ("embedding_norm", "batchnorm", "model.embedding_norm"),
    ("position", {"name": "t5_bias", "num_buckets": 32, "max_distance": 16}, "model.position"),
])
def test_bad_values_name_their_field(field, value, named):
    with pytest.raises(SpecError) as err:
        parse_spec(tiny_spec(**{field: value}))
    assert str(err.value).startswith(named)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("family", ["encoder", "decoder", "encoder_decoder"])
def test_embedding_norm_normalises_what_the_first_block_reads(kind, family):
    spec = tiny_spec(family, position={"name": "learned", "max_len": 64}, embedding_norm=kind,
                     norm={"name": "pre", "eps": 1e-6})
    model = build(spec)
    stacks = [getattr(model, s) for s in ("encoder", "decoder") if hasattr(model, s)]
    assert len({id(s.embedding_norm) for s in stacks}) == len(stacks)  # one per stack, as in BART
    stack = stacks[0]
    seen = []
    stack.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    x = tokens(2, 7)
    with torch.no_grad():
        model(x, x) if family == "encoder_decoder" else model(x)
        embedded = model.embedding(x) + stack.position.table(torch.arange(7))
    if kind == "layernorm":
        expected = F.layer_norm(embedded, (16,), eps=1e-6)
    else:
        expected = embedded * (embedded.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()
    assert_close(seen[0], expected)


def test_relative_position_buckets_follow_t5():
    """T5's defaults: 32 buckets, 128 max distance. Offset = key position - query position."""
    offsets = torch.tensor([0, 1, 7, 8, 127, 128, 1000, -1, -7, -8, -128, -1000])
    bidirectional = relative_position_bucket(offsets, True, 32, 128)
    # later keys take the upper 16 buckets; 0..7 are exact, 8..127 logarithmic, 128+ the last
    assert bidirectional.tolist() == [0, 17, 23, 24, 31, 31, 31, 1, 7, 8, 15, 15]
    causal = relative_position_bucket(offsets, False, 32, 128)
    assert causal.tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 7, 8, 31, 31]  # later keys (masked) share bucket 0
    distance = -torch.arange(300)
    assert (relative_position_bucket(distance, False, 32, 128).diff() >= 0).all()  # farther, never earlier


@pytest.mark.parametrize("family", ["encoder", "decoder", "encoder_decoder"])
def test_t5_bias_is_one_table_per_stack_bidirectional_in_encoders(family):
    model = build(tiny_spec(family, position={"name": "t5_bias", "num_buckets": 8, "max_distance": 16}))
    tables = [n for n, _ in model.named_parameters() if "position" in n]
    stacks = [s for s in ("encoder", "decoder") if hasattr(model, s)]
    assert tables == [f"{s}.position.table.weight" for s in stacks]  # shared by every layer
    for s in stacks:
        scheme = getattr(model, s).position
        assert scheme.causal == (s == "decoder")
        bias = scheme.score_bias(torch.tensor([[[2, -2]]]))  # [1, h, 2]: key 2 before, key 2 after
        table = scheme.table.weight.T  # [h, buckets]
        later = 0 if scheme.causal else 4 + 2
        assert_close(bias[0], table[:, [2, later]])


def test_float64_models_compute_position_tables_in_float64():
    pos = torch.arange(40)[None]
    rope = build(tiny_spec(position="rope", n_heads=1)).double().decoder.position
    q = torch.ones(1, 1, 40, 16, dtype=torch.float64)
    rotated, _ = rope.rotate(q, q.clone(), pos, pos)
    angles = pos[0, :, None].double() * 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    assert_close(rotated[0, 0, :, 0::2], angles.cos() - angles.sin(), rtol=0, atol=1e-13)
    alibi = build(tiny_spec(position="alibi", n_heads=12, d_model=24)).double().decoder.position
    assert alibi.slopes.tolist() == alibi_slopes(12)  # computed in float64, not cast from float32
    sinusoidal = build(tiny_spec(position="sinusoidal")).double().decoder.position
    added = sinusoidal.embed(torch.zeros(1, 40, 16, dtype=torch.float64), pos)[0] / 0.02
    assert_close(added[:, 0], torch.sin(pos[0].double()), rtol=0, atol=1e-13)
