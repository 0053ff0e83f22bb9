"""Training budgets in compute (train.budget): step derivation, validation, what runs spend."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workbench.cost.budget import StepCost, estimated_steps, sequences_within
from workbench.cost.flops import train_step_flops
from workbench.cost.measure import measure_point
from workbench.cost.workload import Point
from workbench.errors import WorkbenchError
from workbench.model.transformer import build_model
from workbench.api import run_study
from workbench.run.store import load_curves, load_results
from workbench.study import load_study
from workbench.study.train_section import TrainConfig
from workbench.recipes.train.sweep import expand, run_identity

from conftest import tiny_spec, tokens

COST = StepCost(flops=1000, tokens=64, sequences=8)  # 125 FLOPs and 8 tokens per sequence


@pytest.mark.parametrize("left, keep", [
    (1000, 8),  # the whole step is paid for
    (500, 4),  # half of it: 4 of 8 sequences (125 FLOPs each)
    (560, 4), (570, 5),  # the nearest whole number of sequences
    (50, 0),  # under half a sequence: the step is dropped
])
def test_the_last_step_trains_the_sequences_the_budget_still_pays_for(left, keep):
    assert sequences_within(left, 1000, 8) == keep


@pytest.mark.parametrize("budget, steps", [(10_000, 10), (10_500, 11), (10_050, 10), (100, 1)])
def test_estimated_steps_at_batch_zeros_cost(budget, steps):
    assert estimated_steps(budget, "flops", COST) == steps


def test_token_budget_counts_tokens_per_step():
    assert estimated_steps(64 * 3 + 16, "tokens", COST) == 4


def test_a_budget_under_half_a_sequence_is_refused():
    with pytest.raises(ValueError, match="one training sequence costs 125 flops"):
        estimated_steps(50, "flops", COST)


@pytest.mark.parametrize("train, field", [
    ({"steps": 10, "budget": {"flops": 1e9}}, "train.steps"),
    ({"budget": {"flops": 1e9, "tokens": 100}}, "train.budget"),
    ({"budget": {}}, "train.budget"),
    ({"budget": {"seconds": 30}}, "train.eval_every"),
    # the step that reaches a budget is cut as one process's whole batch: no micro-batches, no ranks
    ({"budget": {"flops": 1e9}, "batch_size": 8, "grad_accumulation": 2}, "train.grad_accumulation"),
    ({"budget": {"tokens": 1000}, "batch_size": 8, "devices": 2}, "train.devices"),
    ({"budget": {"tokens": 1000}, "devices": "auto"}, "train.devices"),
])
def test_budget_validation_names_the_field(train, field):
    from workbench.errors import SpecError
    from pydantic import ValidationError

    with pytest.raises((SpecError, ValidationError)) as err:
        TrainConfig.model_validate(train)
    assert field in str(err.value)


def test_train_step_flops_is_three_forwards_as_the_cost_study_counts_a_train_step():
    """The budget's accounting (forward x3) equals the measured forward + backward of the
    cost studies (FlopCounterMode on the backward, allowed pairs x3) for the whole model."""
    spec = tiny_spec(vocab_size=32, d_model=32, n_heads=2)
    model = build_model(spec)
    x = tokens(2, 16)
    measured = measure_point(Point(model=spec, scope="model", mode="train_step", length=16, batch_size=2,
                                   warmup=0, repeats=1))
    assert train_step_flops(model, lambda: model(x)) == measured["flops"]


@pytest.mark.parametrize("attention", ["full", {"name": "sliding_window", "window": 4}])
def test_an_unpadded_batch_costs_its_size_times_one_sequence_and_a_padded_one_is_counted_whole(attention):
    """step_cost counts an unpadded batch on its first sequence (cheap at a GPU profile's size):
    the figure equals counting every sequence; a padded batch is counted as it is."""
    from workbench.cost.budget import step_cost

    model = build_model(tiny_spec(vocab_size=32, d_model=32, n_heads=2, attention=attention))
    batch = {"tokens": tokens(4, 16), "padding_mask": torch.ones(4, 16, dtype=torch.bool)}
    loss = lambda b: model(b["tokens"], b["padding_mask"]).sum()
    whole = train_step_flops(model, lambda: loss(batch))
    assert step_cost(model, loss, batch) == StepCost(flops=whole, tokens=64, sequences=4)
    batch["padding_mask"][1:, 12:] = False  # three shorter rows
    padded = step_cost(model, loss, batch)
    assert padded.flops == train_step_flops(model, lambda: loss(batch)) and padded.tokens == 16 + 3 * 12
    if attention == "full":  # its pairs differ per row here: the first row alone would overcount
        assert padded.flops < 4 * train_step_flops(model, lambda: loss({k: v[:1] for k, v in batch.items()}))


def test_counting_changes_nothing_a_run_computes():
    spec = tiny_spec(dropout=0.1)
    model = build_model(spec).train()
    before = torch.get_rng_state()
    train_step_flops(model, lambda: model(tokens(2, 8)))
    assert torch.equal(before, torch.get_rng_state()) and model.training


STUDY = """\
name: budget
task: {{name: copy, train_length: 8, n_eval: 16, alphabet_size: 6}}
model: {{family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope}}
train: {{{train}, batch_size: 8, lr: 3.0e-3, log_every: 5}}
seeds: [0]
sweep: {{model.ffn: [none, gelu, swiglu]}}
"""


def write(tmp_path: Path, train: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(STUDY.format(train=train))
    return path


def test_each_variant_buys_its_own_steps_and_defaults_keep_their_ids(tmp_path):
    runs = expand(load_study(write(tmp_path, "budget: {flops: 1.0e+9}")))
    steps = {r.swept["model.ffn"]: r.config["train"]["steps"] for r in runs}
    assert steps["none"] > steps["swiglu"] and len(set(steps.values())) >= 2
    plain = expand(load_study(write(tmp_path, "steps: 20")))[0]
    assert "budget" not in run_identity(plain.config)["train"]  # a study without a budget keeps its run ids


def test_a_budget_too_small_for_one_sequence_names_the_field(tmp_path):
    with pytest.raises(WorkbenchError, match=r"train\.budget\.flops.*one training sequence costs"):
        expand(load_study(write(tmp_path, "budget: {flops: 10}")))


@pytest.mark.slow
def test_runs_spend_their_flop_budget_and_record_progress(tmp_path):
    torch.set_num_threads(1)
    budget = 3.0e8
    run_study(write(tmp_path, f"budget: {{flops: {budget}}}"), tmp_path / "out", quiet=True)
    results = load_results(tmp_path / "out")
    assert (results["status"] == "finished").all()
    assert ((results["train_flops"] - budget).abs() <= 0.03 * budget).all()
    assert results["steps_done"].nunique() >= 2 and (results["train_tokens"] > 0).all()
    assert set(results["last_step"]) <= {"whole", "partial", "dropped"}
    curves = load_curves(tmp_path / "out")
    progress = curves[curves["split"] == "progress"]
    assert set(progress["metric"]) == {"tokens", "flops", "seconds"}
    last = progress[progress["metric"] == "flops"].groupby("run_id")["value"].max()
    assert (last.sort_index().to_numpy() == results.set_index("run_id")["train_flops"].sort_index().to_numpy()).all()


@pytest.mark.slow
@pytest.mark.parametrize("train", ["budget: {tokens: 600}", "budget: {seconds: 1.0}, eval_every: 5"])
def test_token_and_time_budgets_stop_the_run(tmp_path, train):
    torch.set_num_threads(1)
    path = tmp_path / "study.yaml"
    path.write_text(STUDY.format(train=train).replace("[none, gelu, swiglu]", "[gelu]"))
    run_study(path, tmp_path / "out", quiet=True)
    row = load_results(tmp_path / "out").iloc[0]
    assert row["status"] == "finished" and row["steps_done"] > 0
    if "tokens" in train:
        assert abs(row["train_tokens"] - 600) <= 8 / 2 + 8  # within half a sequence (copy: up to 9 tokens each)
        assert row["last_step"] in ("whole", "partial", "dropped")
    else:
        assert 1.0 <= row["train_time_s"] < 30
    curves = load_curves(tmp_path / "out")
    assert curves.loc[curves["split"] == "eval", "step"].max() == row["steps_done"]  # evaluated where the budget stopped it
