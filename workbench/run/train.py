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
import importlib
import importlib.util
import inspect
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
from workbench.hardware import Machine, cpu_seconds, machine_load, train_needs
from workbench.cost.budget import BUDGET_STEP_CAP, StepCost, count_tokens, sequences_within, step_cost
from workbench.cost.measure import counted_forward
from workbench.cost.memory import LiveTensorBytes
from workbench.model import Transformer, attention_entropy, build_model, record_attention
from workbench.position import PositionLimitError
from workbench.registry import run_providers
from workbench.results import CONFIG_FILE, FINAL_WEIGHTS, LAST_CHECKPOINT, PROGRESS_FILE, RESULT_FILE
from workbench.results import ATTENTION_ENTROPY, PROGRESS, PROGRESS_MEASURES, RunResult, Status
from workbench.results import write_json_atomic, write_text_atomic
from workbench.run.distributed import lightning_strategy, needs_processes, rank_zero, shard, train_in_processes
from workbench.run.tracking import TrackerRun, check_logger, close_logger, make_logger
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
    """Item j is micro-batch j % k of training batch j // k (k = micro-batches per step, 1 by
    default: item i is batch i), with its token count. With several processes (DDP), each rank
    gets its share of that micro-batch, with the whole micro-batch's count."""

    def __init__(self, task, batch_size: int, family: str, steps: int, micro_batches: int = 1,
                 rank: int = 0, world: int = 1):
        self.task, self.batch_size, self.family, self.steps = task, batch_size, family, steps
        self.micro_batches, self.rank, self.world = micro_batches, rank, world

    def __len__(self) -> int:
        return self.steps * self.micro_batches

    def __getitem__(self, index: int) -> tuple[dict[str, torch.Tensor], int]:
        step, part = divmod(index, self.micro_batches)
        batch = self.task.train_batch(step, self.batch_size, self.family)
        if self.micro_batches > 1:  # rows part*m .. (part+1)*m - 1 of every batch-first tensor
            size = self.batch_size // self.micro_batches
            batch = {k: v[part * size:(part + 1) * size] for k, v in batch.items()}
        tokens = count_tokens(batch)
        return (batch if self.world == 1 else shard(batch, self.rank, self.world)), tokens


class StepSampler(Sampler[int]):
    """Indices start() .. length-1: the training budget is one epoch of `length` items (steps x
    micro-batches per step).

    A resumed run restores Lightning's position in that epoch (k items done) along with the
    global step, and Lightning ends the epoch when its count reaches len(sampler). So the
    length stays the whole budget while iteration starts at the restored position: the run
    continues with the batch it would have seen next and stops after the last one, exactly as an
    uninterrupted run would (a shorter sampler would end the restored epoch early and start a
    second one)."""

    def __init__(self, length: int, start):
        self.length, self.start = length, start

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return iter(range(self.start(), self.length))


class TaskDataModule(pl.LightningDataModule):
    def __init__(self, task, family: str, batch_size: int, steps: int, micro_batches: int = 1):
        super().__init__()
        self.task, self.family, self.batch_size, self.steps = task, family, batch_size, steps
        self.micro_batches = micro_batches

    def train_dataloader(self) -> DataLoader:
        trainer, micro = self.trainer, self.micro_batches
        world = trainer.world_size if trainer is not None else 1
        if self.batch_size % (world * micro):
            raise WorkbenchError(f"train.batch_size: {self.batch_size} rows cannot be shared equally by {world} "
                                 f"processes x {micro} micro-batches; use a multiple of {world * micro}")
        rank = trainer.global_rank if trainer is not None else 0
        dataset = StepBatches(self.task, self.batch_size, self.family, self.steps, micro, rank, world)
        # Lightning restores the global step before iterating: start at its first micro-batch, so a
        # resumed run continues with the batch it would have seen next. Every rank steps through the
        # same indices (its share of each batch), so Lightning's distributed sampler stays off.
        sampler = StepSampler(len(dataset), lambda: trainer.global_step * micro if trainer is not None else 0)
        # Its own generator: starting an iterator would otherwise draw from the global random
        # state that dropout uses, once more in a resumed session than in an uninterrupted run.
        # Pinned host memory: Lightning copies the batch to a GPU without blocking.
        pin = trainer is not None and trainer.strategy.root_device.type == "cuda"
        return DataLoader(dataset, batch_size=None, sampler=sampler, generator=torch.Generator(), pin_memory=pin)


def step_done(trainer: pl.Trainer, batch_idx: int) -> bool:
    """Whether this batch ended an optimizer step (with train.grad_accumulation, only every k-th)."""
    return (batch_idx + 1) % trainer.accumulate_grad_batches == 0


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


def make_optimizer(spec: dict[str, Any], groups: list[dict[str, Any]], lr: float) -> torch.optim.Optimizer:
    """The optimizer `train.optimizer` names, with its validated arguments (workbench.study.sections)."""
    args = {k: v for k, v in spec.items() if k != "name"}
    if "betas" in args:
        args["betas"] = tuple(args["betas"])
    if spec["name"] == "lion":
        from lion_pytorch import Lion  # an optional package (the `lion` extra), checked before any run

        return Lion(groups, lr=lr, **args)
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}[spec["name"]]
    return cls(groups, lr=lr, **args)


class RunModule(pl.LightningModule):
    def __init__(self, config: dict[str, Any], task):
        super().__init__()
        self.model: Transformer = build_model(config["model"])
        self.task = task
        self.family = config["model"]["family"]
        self.train_cfg = config["train"]
        self.diverged_step: int | None = None
        self.divergence: DivergenceCheck | None = None
        self.budget: dict[str, Any] | None = self.train_cfg.get("budget")
        self.budget_kind = next((k for k, v in (self.budget or {}).items() if v is not None), None)
        self.spent: Callable[[], float] = lambda: 0.0  # the recorder's spending in the budget's unit
        self.last_step: str | None = None  # a counted budget's last step: whole, partial or dropped
        self.flops_by_shape: dict[tuple, int] = {}  # see counted_loss

    def training_step(self, batch, batch_idx: int):
        inputs, tokens = batch  # tokens: the whole micro-batch's real tokens, every rank's share (StepBatches)
        flops = None
        if self.budget_kind == "flops":
            inputs, loss, flops = self.flop_budgeted_loss(inputs)
        else:
            if self.budget_kind == "tokens":
                inputs = self.fit_budget(inputs, tokens)
            loss = None if inputs is None else self.task.loss(self.model, inputs, self.family)
        if loss is None:  # the budget's remainder was under half a sequence: dropped
            return None
        if self.divergence is None:
            self.divergence = DivergenceCheck(self.trainer)
        diverged_step = self.divergence.check(loss, self.global_step + 1)
        if diverged_step is not None:
            self.diverged_step = diverged_step
            self.trainer.should_stop = True
            if diverged_step == self.global_step + 1:
                return None  # skips the optimizer step: the weights stay those before the bad step
        if inputs is not batch[0]:  # a budget's last step kept fewer sequences (budgets train in one process)
            tokens = count_tokens(inputs)
        # Every rank holds an equal share (train.batch_size is a multiple of the processes): the
        # step's sequences are this rank's times their number, so FLOPs estimated from them count all.
        return {"loss": loss, "tokens": tokens, "sequences": batch_size(inputs) * self.trainer.world_size,
                "flops": flops}

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

    def on_train_end(self) -> None:
        if self.divergence is not None and (step := self.divergence.flush()) is not None:
            self.diverged_step = step

    def configure_optimizers(self):
        cfg = self.train_cfg
        optimizer = make_optimizer(cfg["optimizer"], param_groups(self.model, cfg["weight_decay"]), cfg["lr"])
        schedule = functools.partial(lr_factor, warmup=cfg["warmup_steps"], schedule=cfg["schedule"],
                                     min_ratio=cfg["min_lr_ratio"])
        if self.budget_kind is None:
            factor = functools.partial(schedule, total=cfg["steps"])
        else:
            factor = functools.partial(budget_factor, schedule, self.budget[self.budget_kind], self.spent, cfg["steps"])
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class DivergenceCheck:
    """Whether a training loss was NaN or inf, and at which step.

    CPU: read at once (no cost). Several processes: read at once and agreed on by every rank
    (a rank that stopped alone would leave the others waiting in the gradient all-reduce).
    One GPU: reading a loss makes the host wait for the GPU in every step, so each step's
    flag is copied to pinned host memory without blocking and read once its copy is done,
    a step or two later; `flush` reads the rest at the end. A run found diverged that way took
    its bad step's update; it is recorded diverged at the first non-finite step either way,
    and its weights are not kept."""

    def __init__(self, trainer: pl.Trainer):
        self.strategy = trainer.strategy
        self.collective = trainer.world_size > 1
        self.deferred = trainer.strategy.root_device.type == "cuda" and not self.collective
        self.pending: list[tuple[int, torch.Tensor, torch.cuda.Event]] = []

    def check(self, loss: torch.Tensor, step: int) -> int | None:
        """The first step known to have diverged (this one or an earlier one), or None."""
        if not self.deferred:
            bad = not bool(torch.isfinite(loss))
            if self.collective:
                bad = self.strategy.reduce_boolean_decision(bad, all=False)
            return step if bad else None
        flag = torch.empty((), dtype=torch.bool, pin_memory=True)
        flag.copy_(~torch.isfinite(loss.detach()), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.pending.append((step, flag, event))
        return self._read(wait=False)

    def flush(self) -> int | None:
        return self._read(wait=True) if self.deferred else None

    def _read(self, wait: bool) -> int | None:
        while self.pending and (wait or self.pending[0][2].query()):
            step, flag, event = self.pending.pop(0)
            event.synchronize()
            if bool(flag):
                self.pending.clear()
                return step
        return None


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


def matmul_precision(train: dict[str, Any], device: str) -> str:
    """torch's float32 matmul precision a run trains with: the study's `train.matmul_precision`
    on CUDA ('high': TF32 on Ampere or newer), full float32 ('highest') elsewhere."""
    return train["matmul_precision"] if device == "cuda" else "highest"


def check_device(train: dict[str, Any], source_of: Callable[[str], str | None] = lambda key: None,
                 machine: Machine | None = None) -> str:
    """The device the runs will use; a WorkbenchError, before anything trains, when a setting
    needs hardware `machine` (default: this one; a cluster's for a cluster executor) lacks
    (workbench.hardware) or the chosen logger is not installed. `source_of(key)` names the
    option that set a key (StudyFile.source_of), for the advice."""
    machine = machine or Machine.here()
    needs = train_needs(train, machine)
    if needs:
        raise WorkbenchError(needs[0].error(source_of(needs[0].field), machine))
    check_packages(train)
    return machine.device_for(train["accelerator"])


def check_packages(train: dict[str, Any]) -> None:
    """A WorkbenchError, before anything trains, when a setting needs code that is not there: the
    logger's package, Lion's package, or a `train.callbacks` class that does not import or does
    not take its arguments."""
    check_logger(train)
    if train["optimizer"]["name"] == "lion" and importlib.util.find_spec("lion_pytorch") is None:
        raise WorkbenchError("train.optimizer: 'lion' needs the lion-pytorch package: "
                             "pip install 'transformer-workbench[lion]', or use adamw, adam or sgd")
    for i, spec in enumerate(train["callbacks"]):
        cls = import_callback(spec["path"], f"train.callbacks.{i}")
        try:
            inspect.signature(cls).bind(**spec["args"])
        except TypeError as err:
            raise WorkbenchError(f"train.callbacks.{i}: {spec['path']} does not take the arguments "
                                 f"{sorted(spec['args'])}: {err}") from None


def import_callback(path: str, field: str) -> type[Callback]:
    """The Lightning callback class at an import path the study wrote (`package.module.Class` or
    `package.module:Class`). Importing runs that module's code, as `pip install` of it would."""
    module_name, _, name = path.replace(":", ".").rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise WorkbenchError(f"{field}: cannot import {module_name!r} ({err}); give the import path of a class "
                             "in an installed package, e.g. pytorch_lightning.callbacks.LearningRateMonitor") from None
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        raise WorkbenchError(f"{field}: {path!r} is not a pytorch_lightning Callback class "
                             "(a subclass of pytorch_lightning.callbacks.Callback)")
    return cls


def user_callbacks(train: dict[str, Any]) -> list[Callback]:
    return [import_callback(spec["path"], f"train.callbacks.{i}")(**spec["args"])
            for i, spec in enumerate(train["callbacks"])]


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
        self._step_loss: torch.Tensor | None = None  # the training loss of the step in progress, summed over its micro-batches
        self.best: float | None = None  # train.early_stopping: the best value of its metric so far ...
        self.evals_without_gain = 0  # ... and the evaluations since it improved

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
        self.tokens += outputs["tokens"]  # the micro-batch's (every rank's share)
        self.flops += (outputs["flops"] if outputs["flops"] is not None
                       else self.cost.flops * outputs["sequences"] // self.cost.sequences)
        # Lightning divides each micro-batch's loss by their number; summed on the device (no wait)
        loss_part = outputs["loss"].detach()
        self._step_loss = loss_part if self._step_loss is None else self._step_loss + loss_part
        if not step_done(trainer, batch_idx):
            return
        step_loss, self._step_loss = self._step_loss, None
        if pl_module.budget_kind == "seconds" and self.train_time() >= pl_module.budget["seconds"]:
            trainer.should_stop = True
        # A budget's last step (budgets train in one process: no rank waits alone in the reduce below)
        last = step == self.fixed_steps or (pl_module.budget_kind is not None and trainer.should_stop)
        if step % self.train["log_every"] == 0 or last:
            lr = trainer.optimizers[0].param_groups[0]["lr"]
            loss = float(trainer.strategy.reduce(step_loss, reduce_op="mean"))  # every rank calls it
            self.curves += [(step, "train", "loss", loss), (step, "train", "lr", lr), *self.progress(step)]
            self._log(trainer, {"train/loss": loss, "train/lr": lr}, step)
        if (step % self.train["eval_every"] == 0 or last) and trainer.is_global_zero:
            self.evaluate(trainer, pl_module, step)  # on rank 0 alone: the others wait at the next step

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
        if self.train.get("early_stopping") and self.no_longer_improving(metrics):
            trainer.should_stop = True

    def no_longer_improving(self, metrics: dict[str, float]) -> bool:
        """train.early_stopping: whether its metric has not improved (by more than min_delta)
        for `patience` evaluations in a row; the direction is the task's (loss: lower)."""
        rule = self.train["early_stopping"]
        value = metrics.get(rule["metric"])
        if value is None or math.isnan(value):
            return False
        higher = self.task.metrics.get(rule["metric"].split("@")[0], False)
        gain = math.inf if self.best is None else (value - self.best if higher else self.best - value)
        if gain > rule["min_delta"]:
            self.best, self.evals_without_gain = value, 0
        else:
            self.evals_without_gain += 1
        return self.evals_without_gain >= rule["patience"]

    @staticmethod
    def _log(trainer, metrics: dict[str, float], step: int) -> None:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
            logger.save()

    def state_dict(self) -> dict[str, Any]:
        # The CPU random state too (dropout draws from it): a resumed run continues the stream.
        return {"curves": self.curves, "last_eval": self.last_eval, "tokens": self.tokens, "flops": self.flops,
                "train_time": self.train_time(), "torch_rng": torch.get_rng_state(),
                "early_stopping": [self.best, self.evals_without_gain]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curves = [tuple(c) for c in state["curves"]]
        self.last_eval = state["last_eval"]
        self.tokens = state["tokens"]
        self.flops = state.get("flops", 0)
        self.prior_train_time = state["train_time"]
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
        self.best, self.evals_without_gain = state.get("early_stopping", (None, 0))


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
        if (not outputs or not trainer.is_global_zero or not step_done(trainer, batch_idx)
                or (now - self.last_write < self.every_s and step < self.steps)):
            return
        self.last_write = now
        write_json_atomic(self.path, {"step": step, "steps": self.steps,
                                      "loss": float(outputs["loss"]) * trainer.accumulate_grad_batches,
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
        if not step_done(trainer, batch_idx):  # a checkpoint holds whole steps
            return
        stop = stopping.stop_requested()
        if trainer.world_size > 1:  # the ranks stop at the same step, or one waits for the others forever
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop:
            if outputs and trainer.global_step < trainer.max_steps:  # nothing to keep otherwise
                trainer.save_checkpoint(self.path)
                raise stopping.RunInterrupted(f"stopped at step {trainer.global_step} and checkpointed it")
            raise stopping.RunInterrupted(f"stopped at step {trainer.global_step}")


# ---- one run --------------------------------------------------------------------------------


CPU_ALLOCATOR_FAILED = "DefaultCPUAllocator: can't allocate memory"


def train_run(run_id: str, config: dict[str, Any], run_dir: Path, tracker: TrackerRun | None = None) -> RunResult:
    """Train one run to completion (or divergence / error) and write its result.json and
    final weights. Continues from checkpoints/last.ckpt when an earlier attempt left one.
    Never raises for a run's own failure: outcomes are data. `tracker` names the run in an
    experiment tracker (workbench.run.tracking). A run on several devices or nodes trains in a
    process group of its own (workbench.run.distributed)."""
    if stopping.stop_requested():
        raise stopping.RunInterrupted("had not begun training")
    if needs_processes(config["train"]):
        return train_in_processes(run_id, config, run_dir, tracker)
    return train_here(run_id, config, run_dir, tracker)


def train_here(run_id: str, config: dict[str, Any], run_dir: Path, tracker: TrackerRun | None = None) -> RunResult:
    """train_run in this process: every rank of a multi-process run runs it; rank 0 alone
    writes the run folder's files."""
    quiet_lightning()
    start, cpu_start = time.perf_counter(), cpu_seconds()
    writer = rank_zero()
    try:
        if writer:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(run_dir / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True))
    except OSError as err:  # a full disk, a read-only folder: the sweep cannot go on
        raise WorkbenchError(f"{run_dir}: cannot write the run folder ({err.strerror}); free some space (or make the "
                             "folder writable) and run again: finished runs are kept") from None
    train = config["train"]
    device = resolve_accelerator(train)
    memory = PeakMemory(on_cuda=device == "cuda")
    matmul_before = torch.get_float32_matmul_precision()
    matmul = matmul_precision(train, device)
    result = RunResult(run_id=run_id, status=Status.FAILED, peak_memory_instrument=memory.instrument,
                       environment={**environment(device_name(device)), "float32_matmul_precision": matmul,
                                    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                    **run_providers(config)})
    recorder = logger = None
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.set_float32_matmul_precision(matmul)
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
        if writer:
            ckpt.with_name(ckpt.name + ".tmp").unlink(missing_ok=True)  # a save cut short by a kill
        max_steps = train["steps"] if module.budget_kind is None else BUDGET_STEP_CAP  # a budget stops the run
        logger = make_logger(train["logger"], run_dir, config, tracker)
        trainer = pl.Trainer(
            max_steps=max_steps, max_epochs=-1, limit_val_batches=0, num_sanity_val_steps=0,
            accelerator=train["accelerator"], devices=train["devices"], strategy=lightning_strategy(train),
            num_nodes=train["num_nodes"], precision=train["precision"],
            gradient_clip_val=train["grad_clip"], gradient_clip_algorithm="norm",
            accumulate_grad_batches=train["grad_accumulation"],
            deterministic=device == "cpu", logger=logger,
            callbacks=[recorder, StopOnRequest(ckpt), checkpoint, memory, ProgressFile(run_dir, train["steps"]),
                       *user_callbacks(train)],
            log_every_n_steps=train["log_every"], plugins=[SafeCheckpointIO()],
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=run_dir,
            use_distributed_sampler=False,  # StepBatches shares each batch between the ranks
        )
        datamodule = TaskDataModule(task, module.family, train["batch_size"], max_steps, train["grad_accumulation"])
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt if ckpt.exists() else None, weights_only=True)
        result.resumed_from_step = recorder.start_step or None
        result.steps_done = trainer.global_step
        result.environment["processes"] = trainer.world_size
        result.last_step = module.last_step
        if module.diverged_step is not None:
            result.status, result.diverged_step = Status.DIVERGED, module.diverged_step
        else:
            result.status = Status.FINISHED
            result.metrics = recorder.last_eval["metrics"]
            result.not_applicable = recorder.last_eval["not_applicable"]
            if writer:
                save_final_weights(module.model, config, trainer.global_step, run_dir / FINAL_WEIGHTS)
    except (stopping.RunInterrupted, SIGTERMException) as err:
        # Stopped by a signal: the checkpoint holds the run; nothing is recorded for it.
        raise stopping.RunInterrupted(str(err) or "stopped") from None
    except (torch.OutOfMemoryError, MemoryError) as err:
        result.status, result.error = Status.OOM, f"{type(err).__name__}: {err}".splitlines()[0]
    except Exception as err:  # any other error is this run's outcome; the sweep goes on
        # PyTorch's CPU allocator raises a RuntimeError, not a MemoryError, when memory runs out
        result.status = Status.OOM if CPU_ALLOCATOR_FAILED in str(err) else Status.FAILED
        result.error = f"{type(err).__name__}: {err}".splitlines()[0]
        if writer:
            with contextlib.suppress(OSError):  # a full disk fails this too; the error is in the result already
                write_text_atomic(run_dir / "error.txt", traceback.format_exc())
    finally:
        torch.use_deterministic_algorithms(deterministic_before)  # Trainer(deterministic=True) sets it globally
        torch.set_float32_matmul_precision(matmul_before)  # global too: the next run in this process sets its own
        if logger is not None:
            try:
                close_logger(logger, result.status, result.metrics)
            except Exception as err:  # noqa: BLE001 - a tracker that cannot be reached loses no result
                warnings.warn(f"train.logger {train['logger']}: could not close the tracker run "
                              f"({type(err).__name__}: {str(err).splitlines()[0][:120]})", stacklevel=1)
    if recorder is not None:
        result.curves = recorder.curves
        result.tokens = recorder.tokens
        result.train_flops = recorder.flops
        result.train_time_s = recorder.train_time()
        result.eval_time_s = recorder.session_eval_time
        result.tokens_per_s = result.tokens / result.train_time_s if result.tokens and result.train_time_s > 0 else None
    result.peak_memory_bytes = memory.peak_bytes()
    result.wall_time_s = time.perf_counter() - start
    result.cpu_time_s = cpu_seconds() - cpu_start
    result.environment.update(machine_load())
    if not writer:
        return result
    try:
        write_json_atomic(run_dir / RESULT_FILE, result.to_json())
    except OSError as err:  # a full disk, a folder made read-only: the sweep cannot go on
        raise WorkbenchError(f"{run_dir / RESULT_FILE}: cannot write it ({err.strerror}); free some space (or make "
                             "the folder writable) and run again: finished runs are kept") from None
    return result
