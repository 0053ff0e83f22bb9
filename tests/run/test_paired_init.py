"""`train.init: paired`: common random numbers for the arms of a seed.

Each matrix draws from a generator of its own, seeded by (seed, init_stream, name, shape), so
two arms of one seed start with identical values wherever they share a parameter, and with
independent draws elsewhere; the distributions (GPT-2's N(0, 0.02), output projections scaled by
depth) are those of the default init. At its default the option leaves run ids as they were.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from click.testing import CliRunner

from test_attention_entropy import PINNED, PINNED_HASH, PINNED_RUNS
from workbench.cli import main
from workbench.model.position import INIT_STD
from workbench.model.weights import make_task
from workbench.run.run_module import RunModule
from workbench.study import load_study
from workbench.recipes.train.sweep import expand

STUDY = """\
name: crn
task: {name: copy, train_length: 8, n_eval: 16, alphabet_size: 8}
model: {family: decoder, d_model: 64, n_layers: 2, n_heads: 4, position: rope, ffn: gelu, attention: {name: full}}
train: {steps: 20, batch_size: 8, init_stream: STREAM, init: INIT}
seeds: [0, 1]
sweep: {SWEEP}
"""
POSITIONS = "model.position: [rope, alibi, learned]"


def run_modules(tmp_path, init: str, seed: int = 0, init_stream: int = 0,
                sweep: str = POSITIONS) -> Iterator[tuple[str, RunModule]]:
    """(swept value, its run's RunModule) for each arm at `seed`, each built as a run builds it."""
    path = tmp_path / f"{init}.yaml"
    path.write_text(STUDY.replace("INIT", init).replace("STREAM", str(init_stream)).replace("SWEEP", sweep))
    key = sweep.split(":")[0].split(".")[1]
    for run in expand(load_study(path)):
        if run.config["seed"] == seed:
            torch.manual_seed(seed)  # as the runner's seed_everything
            yield run.config["model"][key]["name"], RunModule(run.config, make_task(run.config))


def initial_weights(tmp_path, init: str, **options) -> dict[str, dict[str, torch.Tensor]]:
    """The swept value -> the initial parameters of its run's model."""
    return {arm: {n: p.detach().clone() for n, p in module.model.named_parameters()}
            for arm, module in run_modules(tmp_path, init, **options)}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> set[str]:
    """Parameters of both, equal in shape and every value."""
    return {name for name in a.keys() & b.keys() if a[name].shape == b[name].shape and torch.equal(a[name], b[name])}


def matrices(weights: dict[str, torch.Tensor]) -> set[str]:
    return {name for name, t in weights.items() if t.dim() >= 2}


def test_rope_and_alibi_start_bit_identical(tmp_path):
    # The default init starts them equal too (the same list of matrices, drawn in turn): the
    # tests below show what only paired init shares.
    paired = initial_weights(tmp_path, "paired")
    assert paired["rope"].keys() == paired["alibi"].keys()  # neither scheme has parameters of its own
    assert same(paired["rope"], paired["alibi"]) == set(paired["rope"])
    layers = [paired["rope"][f"decoder.blocks.{i}.attn.qkv.weight"] for i in (0, 1)]
    assert not torch.equal(*layers)  # one shape, two names: two draws


@pytest.mark.parametrize("init, equal", [("paired", True), ("sequential", False)])
def test_dropout_draws_alike_in_arms_of_other_sizes_under_paired_init_only(tmp_path, init, equal):
    # What each arm's global stream draws after its model is built (dropout's masks): the learned
    # table's draws advance it in the default init.
    after = {arm: torch.rand(16) for arm, _ in run_modules(tmp_path, init)}
    assert torch.equal(after["learned"], after["rope"]) == equal


def test_a_learned_position_table_is_drawn_apart_and_shifts_nothing(tmp_path):
    paired = initial_weights(tmp_path, "paired")
    assert set(paired["learned"]) - set(paired["rope"]) == {"decoder.position.table.weight"}
    assert same(paired["learned"], paired["rope"]) == set(paired["rope"])
    sequential = initial_weights(tmp_path, "sequential")
    # Sequentially, the table's draws (at construction and at init) shift those of every matrix.
    assert not same(sequential["learned"], sequential["rope"]) & matrices(sequential["rope"])


def test_another_ffn_shares_the_attention_and_draws_its_own_ffn(tmp_path):
    ffns = "model.ffn: [gelu, swiglu]"
    paired = initial_weights(tmp_path, "paired", sweep=ffns)
    attention = {name for name in paired["gelu"] if ".attn." in name}
    assert same(paired["gelu"], paired["swiglu"]) & matrices(paired["gelu"]) == attention | {"embedding.weight"}
    sequential = initial_weights(tmp_path, "sequential", sweep=ffns)
    # Sequentially, layer 0's FFN of another shape shifts layer 1's attention.
    assert not same(sequential["gelu"], sequential["swiglu"]) >= attention


def test_another_seed_or_init_stream_draws_other_values(tmp_path):
    base = initial_weights(tmp_path, "paired")["rope"]
    for other in (initial_weights(tmp_path, "paired", seed=1)["rope"],
                  initial_weights(tmp_path, "paired", init_stream=1)["rope"]):
        assert not same(base, other) & matrices(base)


def test_each_matrix_keeps_the_default_distribution_and_the_rest_its_values(tmp_path):
    paired, sequential = (initial_weights(tmp_path, init)["learned"] for init in ("paired", "sequential"))
    depth_scaled = INIT_STD / math.sqrt(2 * 2)  # 2 layers: residual outputs at 0.02 / sqrt(2 n_layers)
    for name, t in paired.items():
        if t.dim() < 2:  # norms' ones and zeros, biases' zeros: as the default init sets them
            assert torch.equal(t, sequential[name]), name
            continue
        std = depth_scaled if name.endswith(("out.weight", "down.weight")) else INIT_STD
        for weights in (paired, sequential):  # the sample's mean and SD within 4 and 6 of their standard errors
            assert abs(float(weights[name].mean())) < 4 * std / math.sqrt(t.numel()), name
            assert float(weights[name].std()) == pytest.approx(std, rel=6 / math.sqrt(2 * t.numel())), name


def test_the_option_enters_the_run_id_only_when_set(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(PINNED.replace("batch_size: 8}", "batch_size: 8, init: sequential}"))
    assert load_study(path).study_hash == PINNED_HASH and [r.run_id for r in expand(load_study(path))] == PINNED_RUNS
    path.write_text(PINNED.replace("batch_size: 8}", "batch_size: 8, init: paired}"))
    paired = load_study(path)
    assert paired.study_hash != PINNED_HASH and not {r.run_id for r in expand(paired)} & set(PINNED_RUNS)


def test_an_unknown_init_is_one_line_naming_the_choices(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(PINNED.replace("batch_size: 8}", "batch_size: 8, init: pairs}"))
    result = CliRunner().invoke(main, ["run", str(path), "--dry-run"])
    assert result.exit_code == 2 and "train.init" in result.output and "paired" in result.output, result.output
    assert "Traceback" not in result.output
