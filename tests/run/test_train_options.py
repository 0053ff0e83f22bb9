"""The trainer surface of `train:`: optimizer, gradient accumulation, early stopping and Lightning
callbacks by import path. Each is validated with one line, appears in --dry-run and in the run
id, and at its default leaves every existing run id and study hash as it was."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from pytorch_lightning.callbacks import Callback

from test_attention_entropy import PINNED, PINNED_HASH, PINNED_RUNS
from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.run.environment import check_packages
from workbench.model.optimizers import build_optimizer
from workbench.run.train import train_run
from workbench.study import load_study
from workbench.recipes.train.sweep import expand

TRAIN_LINE = "train: {steps: 20, batch_size: 8}"


def with_train(tmp_path, extra: str):
    path = tmp_path / "t.yaml"
    path.write_text(PINNED.replace(TRAIN_LINE, TRAIN_LINE[:-1] + ", " + extra + "}"))
    return load_study(path)


@pytest.mark.parametrize("default", [
    "optimizer: adamw", "optimizer: {name: adamw, betas: [0.9, 0.95], eps: 1.0e-8}", "grad_accumulation: 1",
    "early_stopping: null", "callbacks: []",
])
def test_settings_at_their_default_keep_run_ids_and_the_study_hash(tmp_path, default):
    study = with_train(tmp_path, default)
    assert study.study_hash == PINNED_HASH and [r.run_id for r in expand(study)] == PINNED_RUNS


@pytest.mark.parametrize("setting", [
    "optimizer: sgd", "optimizer: {name: adamw, betas: [0.9, 0.99]}", "grad_accumulation: 2",
    "early_stopping: {metric: loss@8, patience: 2}",
    "callbacks: [pytorch_lightning.callbacks.LearningRateMonitor]",
])
def test_each_setting_enters_the_run_id_and_the_dry_run(tmp_path, setting):
    study = with_train(tmp_path, setting)
    assert study.study_hash != PINNED_HASH and not {r.run_id for r in expand(study)} & set(PINNED_RUNS)
    key = setting.split(":")[0]
    dry = CliRunner().invoke(main, ["run", str(tmp_path / "t.yaml"), "--dry-run"])
    assert dry.exit_code == 0 and f"train.{key}" in dry.output, dry.output


@pytest.mark.parametrize("setting, message", [
    ("optimizer: adamq", "train.optimizer: unknown optimizer 'adamq'; did you mean 'adam'? (valid: adam, adamw, lion, muon, sgd)"),
    ("optimizer: {name: sgd, betas: [0.9, 0.9]}", "train.optimizer.betas: not an argument of sgd (valid: momentum, nesterov)"),
    ("optimizer: {name: adam, betas: [0.9, 1.5]}", "train.optimizer.betas.1: Input should be less than 1 (got 1.5)"),
    ("optimizer: {name: sgd, momentum: 0, nesterov: true}", "train.optimizer.nesterov: Nesterov momentum needs momentum > 0"),
    ("grad_accumulation: 3", "train.grad_accumulation: 3 micro-batches do not divide train.batch_size 8 evenly"),
    ("early_stopping: {metric: acuracy@8, patience: 2}", "train.early_stopping.metric: unknown metric 'acuracy'"),
    ("early_stopping: {metric: loss, patience: 2}", "give metric@length, e.g. loss@8"),
    ("early_stopping: {metric: loss@8}", "train.early_stopping.patience"),
])
def test_a_wrong_setting_names_its_field(tmp_path, setting, message):
    with pytest.raises(WorkbenchError) as err:
        with_train(tmp_path, setting)
    assert message in str(err.value)


@pytest.mark.parametrize("path, message", [
    ("no_such_package.Thing", "train.callbacks.0: cannot import 'no_such_package'"),
    ("pytorch_lightning.Trainer", "train.callbacks.0: 'pytorch_lightning.Trainer' is not a pytorch_lightning Callback"),
])
def test_a_callback_that_does_not_import_is_refused_before_training(tmp_path, path, message):
    study = with_train(tmp_path, f"callbacks: [{path}]")
    with pytest.raises(WorkbenchError, match=message):
        check_packages(expand(study)[0].config["train"])
    args = with_train(tmp_path, "callbacks: [{path: pytorch_lightning.callbacks.LearningRateMonitor, args: {every: 3}}]")
    with pytest.raises(WorkbenchError, match="does not take the arguments"):
        check_packages(expand(args)[0].config["train"])


@pytest.mark.parametrize("name, cls", [("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam),
                                       ("sgd", torch.optim.SGD), ("lion", None)])
def test_each_optimizer_is_built_with_its_arguments(tmp_path, name, cls):
    if name == "lion":
        cls = pytest.importorskip("lion_pytorch").Lion
    train = expand(with_train(tmp_path, f"optimizer: {name}"))[0].config["train"]
    optimizer = build_optimizer(train["optimizer"], torch.nn.Linear(2, 2), lr=0.01, weight_decay=0.0)
    assert type(optimizer) is cls and optimizer.param_groups[0]["lr"] == 0.01
    if name == "adamw":  # the optimizer every run used before the setting existed
        assert optimizer.defaults["betas"] == (0.9, 0.95) and optimizer.defaults["eps"] == 1e-8


class StepCounter(Callback):
    """A user's callback: counts optimizer steps (loaded by import path from this test module)."""

    calls = 0

    def __init__(self, start: int = 0):
        StepCounter.calls = start

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        StepCounter.calls += 1


def train(tmp_path, setting: str, name: str):
    run = expand(with_train(tmp_path, setting))[0]
    return train_run(run.run_id, run.config, tmp_path / name)


def test_gradient_accumulation_trains_the_same_batches_in_micro_batches(tmp_path):
    whole = train(tmp_path, "callbacks: [{path: test_train_options.StepCounter, args: {start: 0}}]", "whole")
    assert whole.status == "finished" and StepCounter.calls == 20  # a user callback by import path ran
    split = train(tmp_path, "grad_accumulation: 4, callbacks: [test_train_options.StepCounter]", "split")
    assert split.status == "finished" and StepCounter.calls == 20 and split.steps_done == 20  # 80 micro-batches
    assert split.tokens == whole.tokens  # the same sequences, in quarters
    assert split.train_flops == pytest.approx(whole.train_flops, rel=1e-9)  # counted per micro-batch
    losses = [v for s, split_, m, v in whole.curves if m == "loss" and split_ == "train"]
    split_losses = [v for s, split_, m, v in split.curves if m == "loss" and split_ == "train"]
    assert [s for s, sp, m, _ in split.curves if m == "loss" and sp == "train"] == [10, 20]  # one point per step
    assert split_losses == pytest.approx(losses, rel=0.05)  # the whole batch's mean, summed from its parts
    assert split.metrics["accuracy@8"] == pytest.approx(whole.metrics["accuracy@8"], abs=0.05)


def test_early_stopping_ends_a_run_that_stopped_improving(tmp_path):
    stopped = train(tmp_path, "lr: 1.0e-9, early_stopping: {metric: accuracy@8, patience: 2, min_delta: 0.5}", "stop")
    assert stopped.status == "finished"
    evaluated = sorted({s for s, split, m, _ in stopped.curves if split == "eval"})
    assert evaluated == [2, 4, 6] and stopped.steps_done == 6  # the first evaluation, then 2 without a gain
    assert stopped.metrics  # the final metrics are those of the last evaluation
