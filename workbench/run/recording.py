"""What a run records as it trains: Lightning callbacks whose figures go into its result.

    RunRecorder   train loss every `log_every` steps, evaluation on every eval length every
                  `eval_every` steps and at the end, training time and tokens; its state is
                  saved in checkpoints, so a resumed run keeps its whole history. Runs that
                  differ only in how they evaluate train one model: it evaluates it for each
                  (Evaluations), and each keeps its own curves.
    ProgressFile  step, loss and seconds in progress.json, for the sweep display.
    PeakMemory    the run's peak memory, with the instrument that measured it.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback

from workbench.cost.budget import StepCost
from workbench.cost.memory import LiveTensorBytes
from workbench.results import PROGRESS, PROGRESS_FILE, PROGRESS_MEASURES, write_json_atomic
from workbench.run.evaluate import evaluate_lengths


@dataclass
class Evaluations:
    """What one run records of the model being trained: its task (with its evaluation settings,
    e.g. a decoding strategy), its curves (the shared training rows and its own evaluations),
    its last evaluation and the seconds it spent evaluating in this session."""

    task: Any
    train: dict[str, Any]
    curves: list[tuple[int, str, str, float]] = field(default_factory=list)  # (step, split, metric, value)
    last_eval: dict[str, Any] = field(default_factory=lambda: {"step": None, "metrics": {}, "not_applicable": {}})
    batches: dict[int, list] = field(default_factory=dict)  # its held-out batches, made once
    session_time: float = 0.0

    def state(self) -> dict[str, Any]:
        return {"curves": self.curves, "last_eval": self.last_eval}

    def restore(self, state: dict[str, Any]) -> None:
        self.curves = [tuple(c) for c in state["curves"]]
        self.last_eval = state["last_eval"]


class RunRecorder(Callback):
    """Learning curves, evaluations, training time and tokens; all restored on resume. With
    `siblings` ((task, train section) of runs that train the same model and evaluate it their own
    way) every evaluation is made for each of them too, into an Evaluations of its own."""

    def __init__(self, task, family: str, train: dict[str, Any], cost: StepCost,
                 siblings: Sequence[tuple[Any, dict[str, Any]]] = ()):
        self.task, self.family, self.train = task, family, train
        self.runs = [Evaluations(task, train), *(Evaluations(t, tr) for t, tr in siblings)]
        self.tokens = 0
        self.flops = 0  # counted training FLOPs spent (workbench.cost.budget)
        self.cost = cost  # batch 0's, for the FLOPs of steps that are not counted as they run
        self.fixed_steps = train["steps"] if not train.get("budget") else None  # else the budget stops the run
        self.prior_train_time = 0.0  # training time of earlier sessions (from the checkpoint)
        self.session_start: float | None = None
        self.start_step = 0  # the global step this session started at (> 0: resumed)
        self.session_eval_time = 0.0
        self.best: float | None = None  # train.early_stopping: the best value of its metric so far ...
        self.evals_without_gain = 0  # ... and the evaluations since it improved
        self.loggers: list[Any] | None = None  # where its figures are logged (None: the trainer's loggers)

    @property
    def curves(self) -> list[tuple[int, str, str, float]]:
        return self.runs[0].curves

    @property
    def last_eval(self) -> dict[str, Any]:
        return self.runs[0].last_eval

    def _record(self, rows: list[tuple[int, str, str, float]]) -> None:
        """Rows of the training itself, into every run's curves."""
        for run in self.runs:
            run.curves += rows

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
        """The steps of one call of the training step (RunModule.training_step: what each spent),
        in order; records and evaluations fall at the call's end (workbench.run.batches.steps_per_call)."""
        for spent in outputs["steps"] if outputs else ():
            self.step_end(trainer, pl_module, spent)
        step = trainer.global_step
        if pl_module.last_step == "dropped" and step and self.last_eval["step"] != step:
            self.evaluate(trainer, pl_module, step)  # a budget's remainder took no step: the one before was the last

    def step_end(self, trainer, pl_module, spent: dict[str, Any]) -> None:
        """One optimizer step's figures (`spent`: its step, summed loss and terms over its
        micro-batches, tokens, sequences and counted FLOPs); its loss curve point, and its
        evaluation, when due."""
        step = spent["step"]
        self.tokens += spent["tokens"]  # every rank's share
        self.flops += (spent["flops"] if spent["flops"] is not None
                       else self.cost.flops * spent["sequences"] // self.cost.sequences)
        step_loss, step_terms = spent["loss"], dict(spent["terms"])
        if pl_module.budget_kind == "seconds" and self.train_time() >= pl_module.budget["seconds"]:
            trainer.should_stop = True
        # A budget's last step (budgets train in one process: no rank waits alone in the reduce below)
        last = step == self.fixed_steps or (pl_module.budget_kind is not None and trainer.should_stop)
        if step % self.train["log_every"] == 0 or last:
            lr = trainer.optimizers[0].param_groups[0]["lr"]
            if step_terms:  # the loss curve is the task's; the total (with the terms) is `loss_total`
                step_terms["loss_total"] = step_loss
                step_loss = step_terms.pop("task_loss")
            loss = float(trainer.strategy.reduce(step_loss, reduce_op="mean"))  # every rank calls it
            terms = {name: float(trainer.strategy.reduce(value, reduce_op="mean")) for name, value in step_terms.items()}
            self._record([(step, "train", "loss", loss), (step, "train", "lr", lr),
                          *[(step, "train", name, value) for name, value in terms.items()], *self.progress(step)])
            self._log(trainer, {"train/loss": loss, "train/lr": lr, **{f"train/{k}": v for k, v in terms.items()}}, step)
        if (step % self.train["eval_every"] == 0 or last) and trainer.is_global_zero:
            self.evaluate(trainer, pl_module, step)  # on rank 0 alone: the others wait at the next step

    def progress(self, step: int) -> list[tuple[int, str, str, float]]:
        """What the run has spent by `step` (split "progress"): training tokens, counted FLOPs and
        seconds, so that curves can be drawn against any of them."""
        return [(step, PROGRESS, name, float(value))
                for name, value in zip(PROGRESS_MEASURES, (self.tokens, self.flops, self.train_time()))]

    def evaluate(self, trainer, pl_module, step: int) -> None:
        for run in self.runs:
            self._sync(pl_module)
            start = time.perf_counter()
            metrics, not_applicable = evaluate_lengths(
                run.task, pl_module.model, self.family, run.train["eval_batch_size"], run.batches,
                trainer.precision_plugin.forward_context, run.train["attention_entropy"],
            )
            self._sync(pl_module)
            seconds = time.perf_counter() - start
            run.session_time += seconds
            self.session_eval_time += seconds
            run.curves += [(step, "eval", name, value) for name, value in metrics.items()] + self.progress(step)
            run.last_eval = {"step": step, "metrics": metrics, "not_applicable": not_applicable}
        metrics = self.last_eval["metrics"]
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
        higher = self.task.metric(rule["metric"]).higher_is_better
        gain = math.inf if self.best is None else (value - self.best if higher else self.best - value)
        if gain > rule["min_delta"]:
            self.best, self.evals_without_gain = value, 0
        else:
            self.evals_without_gain += 1
        return self.evals_without_gain >= rule["patience"]

    def _log(self, trainer, metrics: dict[str, float], step: int) -> None:
        for logger in trainer.loggers if self.loggers is None else self.loggers:
            logger.log_metrics(metrics, step=step)
            logger.save()

    def state_dict(self) -> dict[str, Any]:
        # The CPU random state too (dropout draws from it): a resumed run continues the stream.
        state = {**self.runs[0].state(), "tokens": self.tokens, "flops": self.flops,
                 "train_time": self.train_time(), "torch_rng": torch.get_rng_state(),
                 "early_stopping": [self.best, self.evals_without_gain]}
        if len(self.runs) > 1:  # the siblings' evaluations, in order (their checkpoint is theirs alone)
            state["siblings"] = [run.state() for run in self.runs[1:]]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for run, saved in zip(self.runs, [state, *state.get("siblings", [])], strict=True):
            run.restore(saved)
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
        if (not outputs or not outputs["steps"] or not trainer.is_global_zero
                or (now - self.last_write < self.every_s and step < self.steps)):
            return
        self.last_write = now
        write_json_atomic(self.path, {"step": step, "steps": self.steps, "loss": float(outputs["steps"][-1]["loss"]),
                                      "seconds": now - self.started})


class PeakMemory(Callback):
    """Peak memory of one run, with the instrument that measured it.

    cuda_max_allocated: torch.cuda.max_memory_allocated (tensors allocated by PyTorch on the
        GPU, reset at the start of the run; excludes the CUDA context and allocator caching).
    train_step_live_tensor_bytes (CPU): the peak of live tensor bytes (workbench.cost.memory) that
        one training step allocates on top of what is live when it starts (parameters,
        optimizer state, the batch): forward, backward and optimizer step. The step measured
        is the session's second, whose optimizer state already exists; its first is measured
        too only where the session may end after it (one step left, or a budget that decides
        when it ends), so that such a session has its figure; one that ends at its first step
        unplanned (a loss not finite there, a stop request) has none. The dispatch mode slows the
        measured steps only (about 8 ms on a 16-18 ms step of the quickstart's model). The process RSS, most of it the
        interpreter and libraries, is not a measurement of the run and is not reported.
    """

    MEASURED_STEPS = 2  # the session's steps that may be measured: its first (see above) and second

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

    def measures(self, steps_left: int | None) -> bool:
        """Whether the session's next step is measured; `steps_left`: the steps the session has
        left, this one included (None: unknown, a budget ends the run)."""
        if self.on_cuda or self.session_steps >= self.MEASURED_STEPS:
            return False
        return self.session_steps == 1 or steps_left is None or steps_left <= 1

    def step(self, steps_left: int | None) -> contextlib.AbstractContextManager:
        """Around one optimizer step, where a call of the training step takes several (RunModule):
        what the hooks below do around a call."""
        return self._counted(steps_left) if self.session_steps < self.MEASURED_STEPS else contextlib.nullcontext()

    @contextlib.contextmanager
    def _counted(self, steps_left: int | None):
        self._start(steps_left)
        try:
            yield
        finally:
            self.on_train_batch_end(None, None, None, None, 0)

    def _start(self, steps_left: int | None) -> None:
        if self.measures(steps_left):
            self._live = LiveTensorBytes("cpu").__enter__()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start(None if trainer is None else trainer.max_steps - trainer.global_step)

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
