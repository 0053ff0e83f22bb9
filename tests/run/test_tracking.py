"""Experiment trackers through Lightning's own loggers (workbench.run.tracking): one tracker run
per workbench run, named `<variant> seed=<s>`, one MLflow experiment / W&B group per study. The
tracker packages are in the dev extra, so these run in CI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from workbench.errors import WorkbenchError
from workbench.results import RunConfig
from workbench.api import run_study
from workbench.run.tracking import TrackerRun, check_logger, mlflow_metric_name, tracker_run
from workbench.run.train import train_run
from workbench.study import load_study
from workbench.recipes.train.sweep import expand

STUDY = """\
name: tracked
task: {{name: copy, train_length: 4, n_eval: 8, alphabet_size: 4}}
model: {{family: decoder, d_model: 16, n_layers: 1, n_heads: 2}}
train: {{steps: 4, batch_size: 4, log_every: 2, logger: {logger}}}
sweep: {{model.position: [rope, none]}}
seeds: [0, 1]
"""


@pytest.fixture(autouse=True)
def no_tracker_settings(monkeypatch):
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def study_file(tmp_path: Path, logger: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(STUDY.format(logger=logger))
    return path


def train_one(tmp_path: Path, logger: str, run: RunConfig | None = None) -> tuple[RunConfig, TrackerRun, object]:
    run = run or expand(load_study(study_file(tmp_path, logger)))[0]
    tracker = tracker_run(run, "tracked", tmp_path / "out")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run, tracker, train_run(run.run_id, run.config, tmp_path / "out" / "runs" / run.run_id, tracker)
    finally:
        torch.set_num_threads(before)


def mlflow_runs(uri: str, experiment: str = "tracked"):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return client, client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def test_tracker_runs_are_named_by_variant_and_seed_and_tagged():
    run = RunConfig("abc123", 0, 2, {"model.position": "rope"}, {})
    tracker = tracker_run(run, "positions", Path("/data/out"))
    assert tracker.name == "model.position=rope seed=2"
    assert tracker.tags == {"study": "positions", "variant": "model.position=rope", "seed": "2", "run_id": "abc123"}
    assert tracker.mlflow_uri == "sqlite:////data/out/mlflow.db"  # one store for the sweep, in OUT


def test_mlflow_metric_names_map_one_to_one():
    names = ["train/loss", "eval/accuracy@16", "eval/accuracy@160", "eval/accuracy_16", "eval/bpc_tail@256"]
    mapped = [mlflow_metric_name(n) for n in names]
    assert mapped[1] == "eval/accuracy.len16" and mapped[0] == "train/loss"
    assert len(set(mapped)) == len(names)
    assert all(c.isalnum() or c in "_/. -" for name in mapped for c in name)  # what MLflow accepts


@pytest.mark.slow
def test_a_sweep_with_two_workers_gives_one_finished_mlflow_run_per_workbench_run(tmp_path):
    pytest.importorskip("mlflow")
    out = tmp_path / "out"
    summary = run_study(study_file(tmp_path, "mlflow"), out, jobs=2, quiet=True)  # a fresh store, two workers
    assert summary.statuses == {"finished": 4}
    client, logged = mlflow_runs(f"sqlite:///{out / 'mlflow.db'}")
    assert sorted(r.info.run_name for r in logged) == [
        "model.position=none seed=0", "model.position=none seed=1", "model.position=rope seed=0", "model.position=rope seed=1"]
    assert {r.info.status for r in logged} == {"FINISHED"}
    run_ids = {r.data.tags["run_id"] for r in logged}
    assert len(run_ids) == 4 and all((out / "runs" / i).is_dir() for i in run_ids)
    for r in logged:
        assert r.data.tags["study"] == "tracked" and r.data.tags["workbench.status"] == "finished"
        assert r.info.run_name == f"{r.data.tags['variant']} seed={r.data.tags['seed']}"
        assert r.data.params["model.position.name"] == r.data.tags["variant"].split("=")[1]
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")] == [2, 4]
        assert "eval/accuracy.len4" in r.data.metrics
    assert not list(out.glob("runs/*/mlflow.db"))  # no store per run folder


def test_mlflow_honours_the_tracking_uri_and_a_resumed_run_continues_its_mlflow_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'shared' / 'tracking.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    run, tracker, result = train_one(tmp_path, "mlflow")
    assert result.status == "finished", result.error
    assert tracker.mlflow_uri == uri and not (tmp_path / "out" / "mlflow.db").exists()
    _, [logged] = mlflow_runs(uri)
    assert logged.info.run_name == "model.position=rope seed=0" and logged.info.status == "FINISHED"
    run_folder = tmp_path / "out" / "runs" / run.run_id
    assert json.loads((run_folder / "tracker.json").read_text())["mlflow_run_id"] == logged.info.run_id
    (run_folder / "result.json").unlink()
    train_one(tmp_path, "mlflow", run)  # the same run again (as a resumed one would): the same MLflow run
    _, again = mlflow_runs(uri)
    assert [r.info.run_id for r in again] == [logged.info.run_id]


def test_tensorboard_gets_the_config_as_hparams_and_the_final_metrics(tmp_path):
    pytest.importorskip("tensorboard")
    run, _, result = train_one(tmp_path, "tensorboard")
    assert result.status == "finished", result.error
    # TensorBoard names a run by its folder: the study, then the run's name (as in MLflow and W&B)
    run_folder = tmp_path / "out" / "tensorboard" / "tracked" / "model.position=rope seed=0"
    assert list(run_folder.glob("events.out.tfevents.*"))
    hparams = yaml.safe_load((run_folder / "hparams.yaml").read_text())
    assert hparams["train.steps"] == 4 and hparams["model.d_model"] == 16
    assert hparams["workbench.variant"] == "model.position=rope" and hparams["workbench.seed"] == "0"


def test_wandb_finishes_each_run_so_the_next_one_in_the_process_is_its_own(tmp_path):
    wandb = pytest.importorskip("wandb")
    runs = expand(load_study(study_file(tmp_path, "wandb")))[:2]
    for run in runs:
        _, _, result = train_one(tmp_path, "wandb", run)
        assert result.status == "finished", result.error
        assert wandb.run is None  # finished: the next WandbLogger in this worker starts a new run
    offline = sorted((tmp_path / "out" / "runs").glob("*/wandb/offline-run-*"))
    assert len(offline) == 2 and all(list(folder.glob("run-*.wandb")) for folder in offline)


def test_a_missing_logger_package_is_named_before_training(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    train = {"logger": "wandb"}
    with pytest.raises(WorkbenchError, match=r"'wandb' needs the wandb package: pip install 'transformer-workbench\[wandb\]'"):
        check_logger(train)
