"""Experiment trackers through Lightning's own loggers, offline: `train.logger: mlflow` writes
a file-store run in the run folder, `wandb` an offline run there. Skipped without the extra."""

from __future__ import annotations

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.study import load_study
from workbench.sweep import expand
from workbench.run.train import check_logger, train_run

STUDY = """\
name: tracked
task: {{name: copy, train_length: 4, n_eval: 8, alphabet_size: 4}}
model: {{family: decoder, d_model: 16, n_layers: 1, n_heads: 2}}
train: {{steps: 4, batch_size: 4, log_every: 2, logger: {logger}}}
"""


def train_with(tmp_path, logger: str):
    (tmp_path / "s.yaml").write_text(STUDY.format(logger=logger))
    run = expand(load_study(tmp_path / "s.yaml"))[0]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run, train_run(run.run_id, run.config, tmp_path / "run")
    finally:
        torch.set_num_threads(before)


def test_mlflow_logs_metrics_and_the_config_to_a_local_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    run, result = train_with(tmp_path, "mlflow")
    assert result.status == "finished", result.error
    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{(tmp_path / 'run' / 'mlflow.db').resolve()}")
    [logged] = client.search_runs([client.get_experiment_by_name("workbench").experiment_id])
    assert logged.info.run_name == run.run_id
    assert logged.data.params["model.d_model"] == "16" and logged.data.params["train.steps"] == "4"
    assert [m.step for m in client.get_metric_history(logged.info.run_id, "train/loss")] == [2, 4]


def test_wandb_runs_offline_in_the_run_folder(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run, result = train_with(tmp_path, "wandb")
    assert result.status == "finished", result.error
    offline = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("run-*.wandb"))


def test_a_missing_logger_package_is_named_before_training(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    train = {"logger": "wandb"}
    with pytest.raises(WorkbenchError, match=r"'wandb' needs the wandb package: pip install 'transformer-workbench\[wandb\]'"):
        check_logger(train)
