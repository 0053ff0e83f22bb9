"""Experiment trackers (`train.logger`): Lightning's own loggers, one tracker run per workbench run.

    csv          the run folder's logs/ (Lightning's CSVLogger; hparams.yaml holds the config)
    tensorboard  OUT/tensorboard/<study>/<run name>/: curves, the config as hparams, and the final
                 metrics against it in TensorBoard's HParams tab; TensorBoard names a run by its
                 folder, so `tensorboard --logdir OUT/tensorboard` lists `<study>/<run name>`
    mlflow       one MLflow experiment per study, one MLflow run per workbench run, finished when
                 the run ends; store: MLFLOW_TRACKING_URI, else OUT/mlflow.db (SQLite) for the sweep
    wandb        one W&B group per study, one W&B run per workbench run (wandb.finish at its end);
                 offline in the run folder unless WANDB_MODE=online or WANDB_API_KEY is set

Every tracker run is named `<variant> seed=<s>` (the run's line in the sweep display) and
carries the tags study, variant, seed and run_id. Metric names are the workbench's own
(`train/loss`, `eval/accuracy@16`) except in MLflow, which refuses `@`: there `@<length>` is
written `.len<length>` (`eval/accuracy.len16`), one-to-one since no metric name holds a dot.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.results import RunConfig, flatten, load_json, read_regular, write_json_atomic

# Modules an optional logger needs (any one of them), by `train.logger`.
LOGGER_MODULES = {"tensorboard": ("tensorboard", "tensorboardX"), "mlflow": ("mlflow",), "wandb": ("wandb",)}
MLFLOW_STORE = "mlflow.db"  # the sweep's own MLflow store in OUT, without MLFLOW_TRACKING_URI
TRACKER_FILE = "tracker.json"  # in a run folder: the MLflow run a resumed run continues
MAX_TRACKER_BYTES = 4096
TENSORBOARD_DIR = "tensorboard"  # in OUT: one folder per study, one per run, named as the run


@dataclass(frozen=True)
class TrackerRun:
    """What names a workbench run in a tracker: plain data, made by the driver for each job."""

    study: str
    variant: str  # the swept values, as the sweep display shows them ("model.position=rope")
    seed: int
    run_id: str
    mlflow_uri: str  # the sweep's MLflow store
    tensorboard_dir: str = ""  # the sweep's TensorBoard folder (OUT/tensorboard); "" outside a sweep

    @property
    def name(self) -> str:
        return f"{self.variant} seed={self.seed}".strip()

    @property
    def tags(self) -> dict[str, str]:
        return {"study": self.study, "variant": self.variant, "seed": str(self.seed), "run_id": self.run_id}


def mlflow_uri(out_dir: Path) -> str:
    """MLFLOW_TRACKING_URI when set, else one SQLite store for the whole sweep in its output folder."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(Path(out_dir) / MLFLOW_STORE).resolve()}"


def tracker_run(run: RunConfig, study: str, out_dir: Path) -> TrackerRun:
    variant = " ".join(f"{k}={v}" for k, v in run.swept.items())
    return TrackerRun(study=study, variant=variant, seed=run.seed, run_id=run.run_id, mlflow_uri=mlflow_uri(out_dir),
                      tensorboard_dir=str(Path(out_dir) / TENSORBOARD_DIR))


def check_logger(train: Mapping[str, Any]) -> None:
    """A WorkbenchError when `train.logger` names a logger whose package is not installed."""
    modules = LOGGER_MODULES.get(train["logger"], ())
    if modules and not any(importlib.util.find_spec(m) for m in modules):
        raise WorkbenchError(f"train.logger: {train['logger']!r} needs the {modules[0]} package: "
                             f"pip install 'transformer-workbench[{train['logger']}]', or use 'csv'")


def mlflow_metric_name(name: str) -> str:
    """`eval/accuracy@16` -> `eval/accuracy.len16` (MLflow allows no `@`)."""
    return name.replace("@", ".len")


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """An exclusive lock beside a SQLite store while it is created: MLflow creates its tables on
    first use, and two processes doing so at once fail ("table ... already exists")."""
    path = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None
    if path is None:
        yield
        return
    import fcntl  # POSIX only, as the output folder's writer lock

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def prepare_mlflow(uri: str, experiment: str) -> str:
    """Create the store (its tables) and the study's experiment once, under the store's lock;
    the experiment id. The driver calls it before the workers start, so they only add runs."""
    from mlflow.tracking import MlflowClient

    with store_lock(uri):
        client = MlflowClient(uri)
        found = client.get_experiment_by_name(experiment)
        if found is not None and found.lifecycle_stage != "deleted":
            return found.experiment_id
        return client.create_experiment(experiment)


def prepare_trackers(runs: list[RunConfig], study: str, out_dir: Path) -> None:
    """Before any worker starts: the shared stores the runs' trackers write to."""
    if any(run.config["train"]["logger"] == "mlflow" for run in runs):
        prepare_mlflow(mlflow_uri(out_dir), experiment_name(study))


def experiment_name(study: str) -> str:
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or study


def make_logger(kind: str, run_dir: Path, config: dict[str, Any], tracker: TrackerRun | None = None):
    """Lightning's logger of this kind for one run, with the flattened run config as its
    hyperparameters. Without `tracker` (a run trained outside a sweep) the run is named by
    its folder and MLflow and TensorBoard write into the folder."""
    tracker = tracker or TrackerRun(study="workbench", variant=run_dir.name, seed=config.get("seed", 0),
                                    run_id=run_dir.name, mlflow_uri=mlflow_uri(run_dir),
                                    tensorboard_dir=str(run_dir / TENSORBOARD_DIR))
    if kind == "tensorboard":
        from pytorch_lightning.loggers import TensorBoardLogger

        # A fixed version (the run's name, a path separator aside) instead of version_N: a resumed
        # session appends to its run's folder, so TensorBoard shows one run per workbench run.
        logger = TensorBoardLogger(save_dir=tracker.tensorboard_dir or run_dir / TENSORBOARD_DIR, name=tracker.study,
                                   version=tracker.name.replace(os.sep, "_"), default_hp_metric=False)
    elif kind == "mlflow":
        logger = mlflow_logger(run_dir, tracker)
    elif kind == "wandb":
        from pytorch_lightning.loggers import WandbLogger

        online = os.environ.get("WANDB_MODE") == "online" or (
            bool(os.environ.get("WANDB_API_KEY")) and os.environ.get("WANDB_MODE") != "offline")
        logger = WandbLogger(name=tracker.name, project=os.environ.get("WANDB_PROJECT", "workbench"),
                             group=tracker.study, tags=[f"{k}={v}"[:64] for k, v in tracker.tags.items()],
                             save_dir=run_dir, offline=not online)
    else:
        from pytorch_lightning.loggers import CSVLogger

        logger = CSVLogger(save_dir=run_dir, name="logs")  # a resumed session logs to the next version_N
    params = {**flatten(config), **{f"workbench.{k}": v for k, v in tracker.tags.items()}}
    logger.log_hyperparams(json.loads(json.dumps(params, default=str)))  # plain data: hparams.yaml reads back safely
    return logger


def mlflow_logger(run_dir: Path, tracker: TrackerRun):
    """MLflow run of this workbench run; a resumed run continues the MLflow run it started
    (its id is kept in the run folder's tracker.json, for the same store)."""
    from pytorch_lightning.loggers import MLFlowLogger

    class WorkbenchMLFlowLogger(MLFlowLogger):
        def log_metrics(self, metrics, step=None):
            super().log_metrics({mlflow_metric_name(k): v for k, v in metrics.items()}, step)

    experiment = experiment_name(tracker.study)
    prepare_mlflow(tracker.mlflow_uri, experiment)  # a run trained alone (no driver prepared it)
    kept = run_dir / TRACKER_FILE
    try:  # never through a link, never blocked on a FIFO planted there
        earlier = load_json(read_regular(kept, MAX_TRACKER_BYTES), TRACKER_FILE)
    except (OSError, ValueError, WorkbenchError):
        earlier = {}
    earlier = earlier if isinstance(earlier, dict) else {}
    resumed = earlier.get("mlflow_run_id") if earlier.get("mlflow_uri") == tracker.mlflow_uri else None
    logger = WorkbenchMLFlowLogger(experiment_name=experiment, run_name=tracker.name, tags=tracker.tags,
                                   tracking_uri=tracker.mlflow_uri, run_id=resumed)
    write_json_atomic(kept, {"mlflow_uri": tracker.mlflow_uri, "mlflow_run_id": logger.run_id})
    return logger


def close_logger(logger, status: str, metrics: Mapping[str, float]) -> None:
    """At the end of a run, whatever its outcome (an interrupted one too): the final metrics
    against the config (TensorBoard's HParams tab), the workbench status as a tag, and the
    tracker run ended. Lightning ends an MLflow run itself (FINISHED, or FAILED on an
    exception); a W&B run stays the process's current run until wandb.finish."""
    from pytorch_lightning.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger

    if isinstance(logger, TensorBoardLogger) and metrics:
        logger.log_hyperparams(logger.hparams, metrics={f"final/{k}": v for k, v in metrics.items()})
    elif isinstance(logger, MLFlowLogger):
        logger.experiment.set_tag(logger.run_id, "workbench.status", status)
    elif isinstance(logger, WandbLogger):
        import wandb

        if wandb.run is not None:
            wandb.run.summary["workbench.status"] = status
        wandb.finish(exit_code=0 if status in ("finished", "diverged") else 1)
    logger.save()
