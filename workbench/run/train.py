"""Training one run with PyTorch Lightning (the run record is workbench.results).

    RunConfig --train_run--> RunResult (status, final metrics, curves, cost, environment)

    TaskDataModule  batch i of training = task.train_batch(i): a pure function of (seed, i),
                    so a run resumed at step k continues with batch k (StepSampler starts at
                    the restored global step; the whole budget is one epoch).
    RunModule       build_model(spec) + task.loss; AdamW; warmup + decay (LambdaLR); a NaN/inf
                    loss stops training and marks the run diverged.
    RunRecorder     train loss every `log_every` steps, evaluation on every eval length every
                    `eval_every` steps and at the end, training time and tokens; its state is
                    saved in checkpoints, so a resumed run keeps its whole history.

A run folder holds config.json, checkpoints/last.ckpt (resume), logs/ (Lightning CSV or
TensorBoard logger), final.safetensors (weights, with the config as metadata, for reports)
and result.json. Nothing read back from a run folder can execute code: checkpoints load with
`weights_only=True` (tensors and plain data only), final weights are safetensors
(workbench.weights, which reports read without loading Lightning).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import math
import os
import platform
import subprocess
import time
import traceback
import warnings
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.plugins.io import TorchCheckpointIO
from pytorch_lightning.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, Dataset, Sampler

from workbench import stopping
from workbench.errors import WorkbenchError
from workbench.hardware import Machine, train_needs
from workbench.cost.budget import BUDGET_STEP_CAP, StepCost, count_tokens, sequences_within, step_cost
from workbench.cost.measure import counted_forward
from workbench.cost.memory import LiveTensorBytes
from workbench.model import Transformer, attention_entropy, build_model, record_attention
from workbench.position import PositionLimitError
from workbench.registry import run_providers
from workbench.results import CONFIG_FILE, FINAL_WEIGHTS, LAST_CHECKPOINT, PROGRESS_FILE, RESULT_FILE
from workbench.results import ATTENTION_ENTROPY, PROGRESS, PROGRESS_MEASURES, RunResult, Status, flatten, write_json_atomic
from workbench.weights import make_task, refuse_or_explain, save_final_weights


def quiet_lightning() -> None:
    """Lightning's per-Trainer banners and tips, and warnings that do not apply here, off."""
    for name in ("pytorch_lightning", "lightning_fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in (
        r".*does not have many workers.*",  # batches are generated in-process on purpose
        r".*resuming from a checkpoint that ended before the epoch ended.*",  # our sampler resumes
        r".*isinstance\(treespec, LeafSpec\).*",
        r".*GPU available but not used.*",
        r".*The number of training batches .* is smaller than the logging interval.*",
        r".*Experiment logs directory .* exists and is not empty.*",
        r".*`training_step` returned `None`.*",  # how a diverged step skips its update
    ):
        warnings.filterwarnings("ignore", message=message)


# ---- data -----------------------------------------------------------------------------------


class StepBatches(Dataset):
    """Item i is training batch i (already batched)."""

    def __init__(self, task, batch_size: int, family: str, steps: int):
        self.task, self.batch_size, self.family, self.steps = task, batch_size, family, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.task.train_batch(index, self.batch_size, self.family)


class StepSampler(Sampler[int]):
    """Indices start() .. steps-1: the training budget is one epoch of `steps` batches.

    A resumed run restores Lightning's position in that epoch (k batches done) along with the
    global step k, and Lightning ends the epoch when its count reaches len(sampler). So the
    length stays the whole budget while iteration starts at k: the run continues with batch
    k and stops after batch steps-1, exactly as an uninterrupted run would (a sampler of
    length steps-k would end the restored epoch early and start a second one at k again)."""

    def __init__(self, steps: int, start):
        self.steps, self.start = steps, start

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        return iter(range(self.start(), self.steps))


class TaskDataModule(pl.LightningDataModule):
    def __init__(self, task, family: str, batch_size: int, steps: int):
        super().__init__()
        self.dataset = StepBatches(task, batch_size, family, steps)

    def train_dataloader(self) -> DataLoader:
        # Lightning restores the global step before iterating: start there, so a resumed run
        # continues with the batch it would have seen next.
        sampler = StepSampler(len(self.dataset), lambda: self.trainer.global_step if self.trainer is not None else 0)
        # Its own generator: starting an iterator would otherwise draw from the global random
        # state that dropout uses, once more in a resumed session than in an uninterrupted run.
        return DataLoader(self.dataset, batch_size=None, sampler=sampler, generator=torch.Generator())


# ---- model and optimisation -----------------------------------------------------------------


def lr_factor(step: int, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak lr at `step`: linear warmup, then cosine / linear / no decay."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
    return min_ratio + (1 - min_ratio) * decay


def budget_factor(schedule: Callable[..., float], budget: float, spent: Callable[[], float], estimate: int,
                  step: int) -> float:
    """The schedule under a budget: its total is the step count the spending so far reaches
    at `budget` (re-projected at every step; `estimate` before the first), so the decay ends
    when the budget does."""
    so_far = spent()
    total = max(step + 1, round(step * budget / so_far)) if step > 0 and so_far > 0 else estimate
    return schedule(step, total=total)


def batch_size(inputs: dict[str, torch.Tensor]) -> int:
    return next(iter(inputs.values())).shape[0]


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only; norms, biases and 1-d parameters are not decayed."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


class RunModule(pl.LightningModule):
    def __init__(self, config: dict[str, Any], task):
        super().__init__()
        self.model: Transformer = build_model(config["model"])
        self.task = task
        self.family = config["model"]["family"]
        self.train_cfg = config["train"]
        self.diverged_step: int | None = None
        self.budget: dict[str, Any] | None = self.train_cfg.get("budget")
        self.budget_kind = next((k for k, v in (self.budget or {}).items() if v is not None), None)
        self.spent: Callable[[], float] = lambda: 0.0  # the recorder's spending in the budget's unit
        self.last_step: str | None = None  # a counted budget's last step: whole, partial or dropped
        self.flops_by_shape: dict[tuple, int] = {}  # see counted_loss

    def training_step(self, batch, batch_idx: int):
        inputs, flops = batch, None
        if self.budget_kind == "flops":
            inputs, loss, flops = self.flop_budgeted_loss(inputs)
        else:
            if self.budget_kind == "tokens":
                inputs = self.fit_budget(inputs, count_tokens(inputs))
            loss = None if inputs is None else self.task.loss(self.model, inputs, self.family)
        if loss is None:  # the budget's remainder was under half a sequence: dropped
            return None
        if not torch.isfinite(loss):
            # Returning None skips the optimizer step; the run stops as diverged at this step.
            self.diverged_step = self.global_step + 1
            self.trainer.should_stop = True
            return None
        return {"loss": loss, "tokens": count_tokens(inputs), "sequences": batch_size(inputs), "flops": flops}

    def flop_budgeted_loss(self, inputs):
        """(inputs, loss, training FLOPs) of a step; a step that would pass the budget is cut to
        the sequences it has left (`fit_budget`)."""
        loss, flops = self.counted_loss(inputs)
        fitted = self.fit_budget(inputs, flops)
        if fitted is None:
            return None, None, 0
        if fitted is not inputs:
            loss, flops = self.counted_loss(fitted)
        return fitted, loss, flops

    def counted_loss(self, inputs) -> tuple[torch.Tensor, int]:
        """The loss and the step's training FLOPs (forward x3), counted as the forward runs
        (workbench.cost.measure.counted_forward). A forward's FLOPs depend on the batch's shapes
        and masks only (which positions are real and may meet), not on the token values: a
        batch like one counted before reuses that count, so fixed-length tasks count once."""
        key = tuple((name, tuple(t.shape), t.cpu().numpy().tobytes() if t.dtype == torch.bool else b"")
                    for name, t in sorted(inputs.items()))
        if key in self.flops_by_shape:
            return self.task.loss(self.model, inputs, self.family), self.flops_by_shape[key]
        loss, forward = counted_forward(self.model, lambda: self.task.loss(self.model, inputs, self.family))
        self.flops_by_shape[key] = 3 * forward
        return loss, 3 * forward

    def fit_budget(self, inputs, cost: float):
        """`inputs`, or on the step that reaches the budget its first sequences that the budget
        still pays for (workbench.cost.budget.sequences_within); None when none: the run stops."""
        left = self.budget[self.budget_kind] - self.spent()
        if cost < left:
            return inputs
        self.trainer.should_stop = True
        keep = sequences_within(left, cost, batch_size(inputs))
        self.last_step = "dropped" if keep == 0 else "whole" if keep == batch_size(inputs) else "partial"
        if keep == 0:
            return None
        return inputs if keep == batch_size(inputs) else {key: value[:keep] for key, value in inputs.items()}

    def configure_optimizers(self):
        cfg = self.train_cfg
        optimizer = torch.optim.AdamW(param_groups(self.model, cfg["weight_decay"]), lr=cfg["lr"], betas=(0.9, 0.95))
        schedule = functools.partial(lr_factor, warmup=cfg["warmup_steps"], schedule=cfg["schedule"],
                                     min_ratio=cfg["min_lr_ratio"])
        if self.budget_kind is None:
            factor = functools.partial(schedule, total=cfg["steps"])
        else:
            factor = functools.partial(budget_factor, schedule, self.budget[self.budget_kind], self.spent, cfg["steps"])
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


# ---- measuring ------------------------------------------------------------------------------


class PeakMemory(Callback):
    """Peak memory of one run, with the instrument that measured it.

    cuda_max_allocated: torch.cuda.max_memory_allocated (tensors allocated by PyTorch on the
        GPU, reset at the start of the run; excludes the CUDA context and allocator caching).
    train_step_live_tensor_bytes (CPU): the peak of live tensor bytes (workbench.cost.memory) that
        one training step allocates on top of what is live when it starts (parameters,
        optimizer state, the batch): forward, backward and optimizer step. The step measured
        is the session's second (its first when only one runs), whose optimizer state already
        exists; the dispatch mode slows those two steps only. The process RSS, most of it the
        interpreter and libraries, is not a measurement of the run and is not reported.
    """

    MEASURED_STEPS = 2

    def __init__(self, on_cuda: bool):
        self.on_cuda = on_cuda
        self.session_steps = 0
        self.step_peak: int | None = None
        self._live: LiveTensorBytes | None = None
        if on_cuda:
            torch.cuda.reset_peak_memory_stats()
            self.instrument = "cuda_max_allocated"
        else:
            self.instrument = "train_step_live_tensor_bytes"

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self.on_cuda and self.session_steps < self.MEASURED_STEPS:
            self._live = LiveTensorBytes("cpu").__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.session_steps += 1
        self._stop()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._stop()

    def teardown(self, trainer, pl_module, stage) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self.step_peak, self._live = self._live.peak, None

    def peak_bytes(self) -> int | None:
        if self.on_cuda:
            return int(torch.cuda.max_memory_allocated())
        return self.step_peak


@functools.cache
def environment(device: str) -> dict[str, Any]:
    """Versions and device a run trained with (the same for every run of a process)."""
    try:
        project = version("transformer-workbench")
    except PackageNotFoundError:
        project = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": pl.__version__,
        "device": device,
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "workbench": project,
        "git_commit": git_commit(),
    }


def git_commit() -> str | None:
    """The commit of the workbench source tree, when it is a git checkout ("+dirty" if edited)."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if commit.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def resolve_accelerator(train: dict[str, Any]) -> str:
    """'cuda', 'mps' or 'cpu' that the study's accelerator setting picks on this machine."""
    return Machine.here().device_for(train["accelerator"])


def check_device(train: dict[str, Any], source_of: Callable[[str], str | None] = lambda key: None) -> str:
    """The device the runs will use; a WorkbenchError, before anything trains, when a setting
    needs hardware this machine lacks (workbench.hardware) or the chosen logger is not installed.
    `source_of(key)` names the option that set a key (StudyFile.source_of), for the advice."""
    machine = Machine.here()
    needs = train_needs(train, machine)
    if needs:
        raise WorkbenchError(needs[0].error(source_of(needs[0].field), machine))
    check_logger(train)
    return machine.device_for(train["accelerator"])


def check_logger(train: dict[str, Any]) -> None:
    """A WorkbenchError when `train.logger` names a logger whose package is not installed."""
    modules = LOGGER_MODULES.get(train["logger"], ())
    if modules and not any(importlib.util.find_spec(m) for m in modules):
        raise WorkbenchError(f"train.logger: {train['logger']!r} needs the {modules[0]} package: "
                             f"pip install 'transformer-workbench[{train['logger']}]', or use 'csv'")


# Modules an optional logger needs (any one of them), by `train.logger`.
LOGGER_MODULES = {"tensorboard": ("tensorboard", "tensorboardX"), "mlflow": ("mlflow",), "wandb": ("wandb",)}


def device_name(device: str) -> str:
    if device == "cuda":
        return f"cuda: {torch.cuda.get_device_name()}"
    return device if device != "cpu" else f"cpu: {platform.processor() or platform.machine()}"


# ---- recording ------------------------------------------------------------------------------


class RunRecorder(Callback):
    """Learning curves, evaluations, training time and tokens; all restored on resume."""

    def __init__(self, task, family: str, train: dict[str, Any], cost: StepCost):
        self.task, self.family, self.train = task, family, train
        self.curves: list[tuple[int, str, str, float]] = []  # (step, split, metric, value)
        self.last_eval: dict[str, Any] = {"step": None, "metrics": {}, "not_applicable": {}}
        self.tokens = 0
        self.flops = 0  # counted training FLOPs spent (workbench.cost.budget)
        self.cost = cost  # batch 0's, for the FLOPs of steps that are not counted as they run
        self.fixed_steps = train["steps"] if not train.get("budget") else None  # else the budget stops the run
        self.prior_train_time = 0.0  # training time of earlier sessions (from the checkpoint)
        self.session_start: float | None = None
        self.start_step = 0  # the global step this session started at (> 0: resumed)
        self.session_eval_time = 0.0
        self._eval_batches: dict[int, list] = {}

    # -- time: training time excludes evaluation; both need a GPU sync to be true
    def _sync(self, module: pl.LightningModule) -> None:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)

    def train_time(self) -> float:
        if self.session_start is None:
            return self.prior_train_time
        return self.prior_train_time + time.perf_counter() - self.session_start - self.session_eval_time

    def on_train_start(self, trainer, pl_module) -> None:
        self.session_start = time.perf_counter()
        self.start_step = trainer.global_step

    def spent(self, kind: str) -> float:
        return {"flops": self.flops, "tokens": self.tokens, "seconds": self.train_time()}[kind]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if not outputs:  # diverged, or a budget's dropped remainder: no optimizer step was taken
            if pl_module.last_step == "dropped" and step and self.last_eval["step"] != step:
                self.evaluate(trainer, pl_module, step)  # the step before was the last
            return
        self.tokens += outputs["tokens"]
        self.flops += (outputs["flops"] if outputs["flops"] is not None
                       else self.cost.flops * outputs["sequences"] // self.cost.sequences)
        if pl_module.budget_kind == "seconds" and self.train_time() >= pl_module.budget["seconds"]:
            trainer.should_stop = True
        last = step == self.fixed_steps or trainer.should_stop
        if step % self.train["log_every"] == 0 or last:
            lr = trainer.optimizers[0].param_groups[0]["lr"]
            loss = float(outputs["loss"])
            self.curves += [(step, "train", "loss", loss), (step, "train", "lr", lr), *self.progress(step)]
            self._log(trainer, {"train/loss": loss, "train/lr": lr}, step)
        if step % self.train["eval_every"] == 0 or last:
            self.evaluate(trainer, pl_module, step)

    def progress(self, step: int) -> list[tuple[int, str, str, float]]:
        """What the run has spent by `step` (split "progress"): training tokens, counted FLOPs and
        seconds, so that curves can be drawn against any of them."""
        return [(step, PROGRESS, name, float(value))
                for name, value in zip(PROGRESS_MEASURES, (self.tokens, self.flops, self.train_time()))]

    def evaluate(self, trainer, pl_module, step: int) -> None:
        self._sync(pl_module)
        start = time.perf_counter()
        metrics, not_applicable = evaluate_lengths(
            self.task, pl_module.model, self.family, self.train["eval_batch_size"], self._eval_batches,
            trainer.precision_plugin.forward_context, self.train["attention_entropy"],
        )
        self._sync(pl_module)
        self.session_eval_time += time.perf_counter() - start
        self.curves += [(step, "eval", name, value) for name, value in metrics.items()] + self.progress(step)
        self.last_eval = {"step": step, "metrics": metrics, "not_applicable": not_applicable}
        self._log(trainer, {f"eval/{k}": v for k, v in metrics.items()}, step)

    @staticmethod
    def _log(trainer, metrics: dict[str, float], step: int) -> None:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
            logger.save()

    def state_dict(self) -> dict[str, Any]:
        # The CPU random state too (dropout draws from it): a resumed run continues the stream.
        return {"curves": self.curves, "last_eval": self.last_eval, "tokens": self.tokens, "flops": self.flops,
                "train_time": self.train_time(), "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curves = [tuple(c) for c in state["curves"]]
        self.last_eval = state["last_eval"]
        self.tokens = state["tokens"]
        self.flops = state.get("flops", 0)
        self.prior_train_time = state["train_time"]
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])


class ProgressFile(Callback):
    """The run's step, steps, last training loss and training seconds in run_dir/progress.json,
    rewritten at most every `every_s` seconds (and at the last step): the sweep display reads
    it from the driver, whichever process or machine trains the run."""

    def __init__(self, run_dir: Path, steps: int, every_s: float = 0.5):
        self.path, self.steps, self.every_s = run_dir / PROGRESS_FILE, steps, every_s
        self.last_write = -math.inf
        self.started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, now = trainer.global_step, time.perf_counter()
        if not outputs or (now - self.last_write < self.every_s and step < self.steps):
            return
        self.last_write = now
        write_json_atomic(self.path, {"step": step, "steps": self.steps, "loss": float(outputs["loss"]),
                                      "seconds": now - self.started})


def evaluate_lengths(task, model, family: str, batch_size: int, cache: dict[int, list],
                     context=None, entropy: bool = False) -> tuple[dict[str, float], dict[str, str]]:
    """Every metric at every eval length (`accuracy@64`); a length the position scheme cannot
    represent is recorded as not applicable, with the reason. With `entropy`, also
    `attention_entropy@<train_length>` (see `measure_attention_entropy`), on the evaluation set
    at train_length; when eval_lengths leave that length out, the set drawn there is not held
    out from training (a descriptive measure of the attention, not a score)."""
    metrics: dict[str, float] = {}
    not_applicable: dict[str, str] = {}
    context = context or contextlib.nullcontext
    for length in task.eval_lengths:
        try:
            with context():
                scores = task.evaluate(model, eval_batches(task, length, batch_size, family, cache), family)
        except PositionLimitError as err:
            not_applicable[str(length)] = f"not applicable: {err}"
            continue
        metrics.update({f"{name}@{length}": float(value) for name, value in scores.items()})
    if entropy:
        length = task.params.train_length
        with context():
            value = measure_attention_entropy(task, model, family, eval_batches(task, length, batch_size, family, cache))
        metrics[f"{ATTENTION_ENTROPY}@{length}"] = value
    return metrics, not_applicable


def eval_batches(task, length: int, batch_size: int, family: str, cache: dict[int, list]) -> list:
    """The held-out batches at one length, made once per run."""
    if length not in cache:
        cache[length] = task.eval_batches(length, batch_size, family)
    return cache[length]


# Attention weights held at once by the entropy pass: [rows, h, nq, nk] per attention layer.
ENTROPY_WEIGHTS_PER_FORWARD = 2**24


@torch.no_grad()
def measure_attention_entropy(task, model, family: str, batches: list[dict[str, torch.Tensor]]) -> float:
    """Mean normalised attention entropy (workbench.model.attention_entropy) over every row of
    the held-out batches: 1 = uniform over the visible keys, 0 = a saturated softmax; NaN when
    no row sees two keys. A separate teacher-forced pass through the explicit-weights path, so
    the other metrics are computed exactly as without it; batches are cut into pieces small
    enough that the recorded weights stay under ENTROPY_WEIGHTS_PER_FORWARD per layer."""
    spec = model.spec
    was_training = model.training
    model.eval()
    total, rows = 0.0, 0
    try:
        for batch in batches:
            widest = max(v.shape[-1] for v in batch.values() if v.dim() == 2)
            step = max(1, ENTROPY_WEIGHTS_PER_FORWARD // (spec.n_heads * widest * widest))
            size = next(iter(batch.values())).shape[0]
            for start in range(0, size, step):
                piece = {k: v[start: start + step] for k, v in batch.items()}
                with record_attention(model) as recorded:
                    task.scored(model, piece, family)
                piece_total, piece_rows = attention_entropy(recorded)
                total, rows = total + piece_total, rows + piece_rows
    finally:
        model.train(was_training)
    return total / rows if rows else math.nan


# ---- checkpoints: atomic, and never code ---------------------------------------------------


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoints, written atomically (a temporary file renamed over the old
    one: a kill leaves the old checkpoint or the new one, never half) and loaded with
    weights_only=True whatever the caller asks (a crafted checkpoint cannot run code)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        super().save_checkpoint(checkpoint, tmp, storage_options)
        os.replace(tmp, path)

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None) -> dict[str, Any]:
        try:
            return torch.load(path, map_location=map_location or "cpu", weights_only=True)
        except Exception as err:
            raise refuse_or_explain(Path(path), err, "delete it to train this run from the start") from None


class StopOnRequest(Callback):
    """On SIGTERM/SIGINT (workbench.stopping): the step in progress finishes, a checkpoint of it
    is written, and the run ends with RunInterrupted; no result is written."""

    def __init__(self, path: Path):
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if stopping.stop_requested():
            if outputs and trainer.global_step < trainer.max_steps:  # nothing to keep otherwise
                trainer.save_checkpoint(self.path)
            raise stopping.RunInterrupted(f"stopped at step {trainer.global_step}")


# ---- one run --------------------------------------------------------------------------------


def make_logger(kind: str, run_dir: Path, run_id: str = "", config: dict[str, Any] | None = None):
    """Lightning's own logger of each kind. Experiment trackers get the run id as the run name
    and the flattened run config as parameters; they stay on this machine unless configured."""
    if kind == "tensorboard":
        from pytorch_lightning.loggers import TensorBoardLogger

        return TensorBoardLogger(save_dir=run_dir, name="logs", default_hp_metric=False)
    if kind in ("mlflow", "wandb"):
        if kind == "mlflow":
            from pytorch_lightning.loggers import MLFlowLogger

            logger = MLFlowLogger(experiment_name=os.environ.get("MLFLOW_EXPERIMENT_NAME", "workbench"), run_name=run_id,
                                  tracking_uri=os.environ.get("MLFLOW_TRACKING_URI", f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"))
        else:
            from pytorch_lightning.loggers import WandbLogger

            online = os.environ.get("WANDB_MODE") == "online" or (
                bool(os.environ.get("WANDB_API_KEY")) and os.environ.get("WANDB_MODE") != "offline")
            logger = WandbLogger(name=run_id, project=os.environ.get("WANDB_PROJECT", "workbench"),
                                 save_dir=run_dir, offline=not online)
        logger.log_hyperparams(flatten(config or {}))
        return logger
    from pytorch_lightning.loggers import CSVLogger

    return CSVLogger(save_dir=run_dir, name="logs")  # a resumed session logs to the next version_N


def train_run(run_id: str, config: dict[str, Any], run_dir: Path) -> RunResult:
    """Train one run to completion (or divergence / error) and write its result.json and
    final weights. Continues from checkpoints/last.ckpt when an earlier attempt left one.
    Never raises for a run's own failure: outcomes are data."""
    quiet_lightning()
    start = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
    train = config["train"]
    device = resolve_accelerator(train)
    memory = PeakMemory(on_cuda=device == "cuda")
    result = RunResult(run_id=run_id, status=Status.FAILED, peak_memory_instrument=memory.instrument,
                       environment={**environment(device_name(device)), **run_providers(config)})
    recorder = None
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    try:
        pl.seed_everything(config["seed"], workers=True, verbose=False)
        task = make_task(config)
        module = RunModule(config, task)
        result.n_params = module.model.num_parameters()
        batch = task.train_batch(0, train["batch_size"], module.family)
        cost = step_cost(module.model, lambda b: task.loss(module.model, b, module.family), batch)
        recorder = RunRecorder(task, module.family, train, cost)
        if module.budget_kind is not None:
            module.spent = functools.partial(recorder.spent, module.budget_kind)
        checkpoint = ModelCheckpoint(dirpath=run_dir / "checkpoints", save_last=True, save_top_k=0,
                                     every_n_train_steps=train["checkpoint_every"])
        ckpt = run_dir / LAST_CHECKPOINT
        ckpt.with_name(ckpt.name + ".tmp").unlink(missing_ok=True)  # a save cut short by a kill
        max_steps = train["steps"] if module.budget_kind is None else BUDGET_STEP_CAP  # a budget stops the run
        trainer = pl.Trainer(
            max_steps=max_steps, max_epochs=-1, limit_val_batches=0, num_sanity_val_steps=0,
            accelerator=train["accelerator"], devices=train["devices"], strategy=train["strategy"],
            num_nodes=train["num_nodes"], precision=train["precision"],
            gradient_clip_val=train["grad_clip"], gradient_clip_algorithm="norm",
            deterministic=device == "cpu", logger=make_logger(train["logger"], run_dir, run_id, config),
            callbacks=[recorder, StopOnRequest(ckpt), checkpoint, memory, ProgressFile(run_dir, train["steps"])],
            log_every_n_steps=train["log_every"], plugins=[SafeCheckpointIO()],
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=run_dir,
        )
        datamodule = TaskDataModule(task, module.family, train["batch_size"], max_steps)
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt if ckpt.exists() else None, weights_only=True)
        result.resumed_from_step = recorder.start_step or None
        result.steps_done = trainer.global_step
        result.last_step = module.last_step
        if module.diverged_step is not None:
            result.status, result.diverged_step = Status.DIVERGED, module.diverged_step
        else:
            result.status = Status.FINISHED
            result.metrics = recorder.last_eval["metrics"]
            result.not_applicable = recorder.last_eval["not_applicable"]
            save_final_weights(module.model, config, trainer.global_step, run_dir / FINAL_WEIGHTS)
    except (stopping.RunInterrupted, SIGTERMException) as err:
        # Stopped by a signal: the checkpoint holds the run; nothing is recorded for it.
        raise stopping.RunInterrupted(str(err) or "stopped") from None
    except (torch.OutOfMemoryError, MemoryError) as err:
        result.status, result.error = Status.OOM, f"{type(err).__name__}: {err}".splitlines()[0]
    except Exception as err:  # any other error is this run's outcome; the sweep goes on
        result.status, result.error = Status.FAILED, f"{type(err).__name__}: {err}".splitlines()[0]
        (run_dir / "error.txt").write_text(traceback.format_exc())
    finally:
        torch.use_deterministic_algorithms(deterministic_before)  # Trainer(deterministic=True) sets it globally
    if recorder is not None:
        result.curves = recorder.curves
        result.tokens = recorder.tokens
        result.train_flops = recorder.flops
        result.train_time_s = recorder.train_time()
        result.eval_time_s = recorder.session_eval_time
        result.tokens_per_s = result.tokens / result.train_time_s if result.tokens and result.train_time_s > 0 else None
    result.peak_memory_bytes = memory.peak_bytes()
    result.wall_time_s = time.perf_counter() - start
    try:
        write_json_atomic(run_dir / RESULT_FILE, result.to_json())
    except OSError as err:  # a full disk, a folder made read-only: the sweep cannot go on
        raise WorkbenchError(f"{run_dir / RESULT_FILE}: cannot write it ({err.strerror}); free some space (or make "
                             "the folder writable) and run again: finished runs are kept") from None
    return result
