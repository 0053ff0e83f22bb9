"""The residual slot (workbench.model.residual): each built-in's defining property at init, a
third-party connection and FFN registered as plugins with no edit of the core, and the init that
reads the `residual_outputs` role instead of parameter names. The generic contract (shapes,
gradients, decoding) is tests/test_model_contract.py's, over every registered connection."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import test_model_contract as contract
import torch
from conftest import FAMILIES, build, installed_plugin, logits_of, tiny_spec, tokens
from pydantic import Field
from torch import Tensor, nn
from torch.testing import assert_close

from workbench.errors import SpecError
from workbench.model.ffn import FeedForward
from workbench.model.hf import architecture_for
from workbench.model.position import INIT_STD
from workbench.model.residual import Residual
from workbench.model.spec import parse_spec
from workbench.model.transformer import Positions, build_model
from workbench.recipes.train.compare import setting_value
from workbench.registry import run_providers
from workbench.variants import Params


def blocks_of(model) -> list:
    return [b for stack in ("encoder", "decoder") if hasattr(model, stack) for b in getattr(model, stack).blocks]


@pytest.mark.parametrize("family", FAMILIES)
def test_rezero_blocks_are_the_identity_at_init(family):
    model = build(tiny_spec(family, n_layers=3, residual="rezero"))
    x = torch.randn(2, 7, 16)
    seq = Positions.of(tokens(2, 7), None)
    memory = torch.randn(2, 5, 16) if family == "encoder_decoder" else None
    memory_seq = Positions.of(tokens(2, 5), None) if memory is not None else None
    for block in blocks_of(model):
        assert torch.equal(block(x, seq, memory, memory_seq), x)


def test_rezero_learns_away_from_the_identity():
    """alpha = 0 stops no gradient from reaching alpha itself: one step moves every block."""
    model = build(tiny_spec(residual="rezero"))
    logits_of(model, tokens(2, 7)).logsumexp(-1).mean().backward()
    alphas = [p for name, p in model.named_parameters() if name.endswith("residual.alpha")]
    assert alphas and all(float(a.grad.abs()) > 0 for a in alphas)


@pytest.mark.parametrize(("residual", "layers", "expected"), [
    ({"name": "layerscale", "init_scale": 0.3}, 2, 0.3),
    ("layerscale", 2, 0.1),  # CaiT's rule: 0.1 up to 18 blocks ...
    ("layerscale", 24, 1e-5),  # ... 1e-5 at 24 ...
    ("layerscale", 25, 1e-6),  # ... 1e-6 deeper
])
def test_layerscale_scales_the_branch_by_init_scale_at_init(residual, layers, expected):
    model = build(tiny_spec(n_layers=layers, residual=residual))
    x, y = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    for block in blocks_of(model):
        for _, connection in block.branches():
            assert_close(connection.add(x, y), x + expected * y)


@pytest.mark.parametrize(("family", "layers", "expected"), [
    # one stack of N layers: alpha = (2N)^(1/4), beta = (8N)^(-1/4)
    ("decoder", {"n_layers": 2}, {"decoder": (math.sqrt(2), 0.5)}),
    ("encoder", {"n_layers": 2}, {"encoder": (math.sqrt(2), 0.5)}),
    # N = 2 encoder, M = 16 decoder layers: (N^4 M)^(1/16) = sqrt(2); decoder (3M)^(1/4), (12M)^(-1/4)
    ("encoder_decoder", {"n_encoder_layers": 2, "n_decoder_layers": 16},
     {"encoder": (0.81 * math.sqrt(2), 0.87 / math.sqrt(2)), "decoder": (48**0.25, 192**-0.25)}),
])
def test_deepnorm_alpha_and_beta_follow_the_stack_depths(family, layers, expected):
    spec = tiny_spec(family, residual="deepnorm", **layers)
    model, plain = build_model(spec, init_seed=3), build_model({**spec, "residual": "plain"}, init_seed=3)
    plain_params = dict(plain.named_parameters())
    depth_scale = 1 / math.sqrt(2 * max(model.spec.encoder_layers, model.spec.decoder_layers))
    x, y = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    for stack, (alpha, beta) in expected.items():
        for i, block in enumerate(getattr(model, stack).blocks):
            for _, connection in block.branches():
                assert_close(connection.add(x, y), alpha * x + y)
            # The same draws as the plain model (one generator per parameter name): beta on the
            # values, the output projections (instead of GPT-2's depth scale) and the FFN.
            ref = {n: p for n, p in plain_params.items() if n.startswith(f"{stack}.blocks.{i}.")}
            qk_rows = block.attn.qkv.weight.shape[0] - block.attn.value_projection().shape[0]
            assert_close(block.attn.qkv.weight[:qk_rows], ref[f"{stack}.blocks.{i}.attn.qkv.weight"][:qk_rows])
            assert_close(block.attn.value_projection(), beta * ref[f"{stack}.blocks.{i}.attn.qkv.weight"][qk_rows:])
            assert_close(block.attn.out.weight, beta / depth_scale * ref[f"{stack}.blocks.{i}.attn.out.weight"])
            assert_close(block.ffn.up.weight, beta * ref[f"{stack}.blocks.{i}.ffn.up.weight"])
            assert_close(block.ffn.down.weight, beta / depth_scale * ref[f"{stack}.blocks.{i}.ffn.down.weight"])
            if block.cross is not None:
                assert_close(block.cross.out.weight, beta / depth_scale * ref[f"{stack}.blocks.{i}.cross.out.weight"])


def test_deepnorm_scales_latent_attentions_value_decoding_not_its_keys():
    """Multi-head latent attention's values are c W_UV: beta scales W_UV's rows of kv_up (and
    the output), the key rows beside them keep the plain model's draws."""
    attention = {"name": "mla", "kv_rank": 8, "rope_dim": 2}  # nope and v dims: head_dim 4
    spec = tiny_spec(residual="deepnorm", attention=attention, n_layers=2)
    model, plain = build_model(spec, init_seed=3), build_model({**spec, "residual": "plain"}, init_seed=3)
    beta = 0.5  # (8N)^(-1/4), N = 2
    for mine, ref in zip(model.decoder.blocks, plain.decoder.blocks):
        rows, ref_rows = (b.attn.kv_up.weight.view(4, 8, 8) for b in (mine, ref))  # [heads, nope + v, kv_rank]
        assert_close(rows[:, :4], ref_rows[:, :4])
        assert_close(rows[:, 4:], beta * ref_rows[:, 4:])
        assert_close(mine.attn.value_projection(), rows[:, 4:])


def test_deepnorm_with_pre_norm_is_one_line_naming_the_field():
    with pytest.raises(SpecError, match=r"^model\.residual: deepnorm is defined with norm: post.*set model\.norm: post"):
        build_model(tiny_spec(residual="deepnorm", norm="pre"))


def test_the_default_is_left_out_of_the_stored_model_and_read_back_as_plain():
    plain = build_model(tiny_spec()).spec.resolved()
    assert "residual" not in plain  # runs stored before the axis keep their ids
    assert build_model(plain).spec.residual.name == "plain"
    assert build_model(tiny_spec(residual="rezero")).spec.resolved()["residual"] == {"name": "rezero"}
    # the readers of stored configs: a run's providers, `workbench compare`'s labels
    config = {"model": plain, "task": {"name": "copy"}}
    assert run_providers(config)["variant.residual"].startswith("plain (transformer-workbench ")
    assert setting_value("model.residual", config) == "plain"


# ---- a third-party connection: registered by a plugin, no edit of the core ----------------


class GateParams(Params):
    init_gate: float = Field(0.0, description="the gate's initial logit (0: half skip, half branch)")


class Gate(Residual):
    """(1 - g) x + g f(x), g = sigmoid(w) a learned scalar (a highway-style mix)."""

    name = "test_gate"
    Params = GateParams

    def __init__(self, params: GateParams, *, d_model: int, depth):
        super().__init__(params, d_model=d_model, depth=depth)
        self.logit = nn.Parameter(torch.full((1,), params.init_gate))

    def skip(self, x: Tensor) -> Tensor:
        return (1 - torch.sigmoid(self.logit)) * x

    def branch(self, y: Tensor) -> Tensor:
        return torch.sigmoid(self.logit) * y


@pytest.mark.parametrize("family", FAMILIES)
def test_a_third_party_connection_passes_the_contract_with_no_core_edit(family):
    with installed_plugin("gate_residual_plugin", register_residual_connections=[Gate]):
        contract.test_variant_forward_backward_finite_with_documented_shapes("residual", "test_gate", family)
        model = build(tiny_spec(family, residual={"name": "test_gate", "init_gate": 2.0}))
        gates = [connection for block in blocks_of(model) for _, connection in block.branches()]
        assert gates and all(isinstance(g, Gate) and g.logit.item() == 2.0 for g in gates)
        with pytest.raises(SpecError, match=r"model\.residual\.init_gat"):
            build_model(tiny_spec(residual={"name": "test_gate", "init_gat": 1.0}))


# ---- init by role: an FFN whose output projection is named w2 -----------------------------


class W2MLP(FeedForward):
    """W2 relu(W1 x), named as in Vaswani et al. (2017) eq. 2."""

    name = "test_w2"
    residual_outputs = ("w2.weight",)

    def __init__(self, params, *, d_model: int, bias: bool):
        super().__init__(params, d_model=d_model, bias=bias)
        self.w1 = nn.Linear(d_model, 4 * d_model, bias=bias)
        self.w2 = nn.Linear(4 * d_model, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(torch.relu(self.w1(x)))


class UndeclaredW2MLP(W2MLP):
    """The same FFN without its declaration: `down.weight`, inherited, names nothing it has."""

    name = "test_w2_undeclared"
    residual_outputs = FeedForward.residual_outputs


def test_an_ffn_naming_its_output_w2_gets_the_depth_scaled_init():
    with installed_plugin("w2_ffn_plugin", register_ffn_types=[W2MLP, UndeclaredW2MLP]):
        model = build(tiny_spec(d_model=64, n_layers=2, ffn="test_w2"))
        ffn = model.decoder.blocks[0].ffn
        # 64 x 256 draws each: the sample std is within ~1% of the std it was drawn with
        assert ffn.w2.weight.std().item() == pytest.approx(INIT_STD / math.sqrt(4), rel=0.05)
        assert ffn.w1.weight.std().item() == pytest.approx(INIT_STD, rel=0.05)
        with pytest.raises(TypeError, match="UndeclaredW2MLP.residual_outputs names a parameter it does not have"):
            build_model(tiny_spec(ffn="test_w2_undeclared"))


def test_a_model_with_a_residual_connection_does_not_export_to_hugging_face():
    """No mapped architecture scales its residual branches: the export refuses, naming the field."""
    gpt2 = tiny_spec(position={"name": "learned", "max_len": 64}, bias=True)
    assert architecture_for(parse_spec(gpt2)).model_type == "gpt2"
    with pytest.raises(SpecError, match=r"^model\.residual\.name: gpt2 \(GPT2LMHeadModel\) needs 'plain', got 'layerscale'"):
        architecture_for(parse_spec({**gpt2, "residual": "layerscale"}))


@pytest.mark.slow
def test_a_study_sweeping_the_residual_built_ins_runs(tmp_path):
    from workbench.api import run_study  # Lightning and the runner: only this test needs them
    from workbench.run.store import load_results

    tiny = (Path(__file__).resolve().parents[2] / "studies" / "tiny.yaml").read_text()
    study = tmp_path / "residuals.yaml"
    study.write_text(tiny.replace("name: tiny", "name: residuals").replace(
        "  model.position: [none, rope]\nbaseline: none",
        "  model.residual: [plain, {name: layerscale, init_scale: 0.1}, rezero, deepnorm]\nbaseline: plain").replace(
        "  norm: pre", "  norm: post").replace("steps: 30", "steps: 10").split("expect:")[0])  # DeepNorm is post-norm
    summary = run_study(study, tmp_path / "out", quiet=True)
    assert summary.statuses == {"finished": 4}
    runs = load_results(tmp_path / "out")
    assert sorted(runs["model.residual"].astype(str).str.split("(").str[0]) == ["deepnorm", "layerscale", "plain",
                                                                                "rezero"]
    assert runs["steps_done"].eq(10).all() and runs["loss@8"].notna().all()
