"""The LightningModule of one run, and its optimizer and learning-rate schedule.

    RunModule   build_model(spec) + task.loss + the auxiliary loss terms its modules add
                (workbench.model.losses; each recorded as a curve) (`train.init: paired`: each
                matrix drawn by its name and shape, paired_init_seed); the optimizer
                train.optimizer names (AdamW by default, a plugin axis: workbench.model.optimizers);
                warmup + decay (LambdaLR), which under a compute budget ends when the
                budget does; the step that reaches a budget trains only the sequences it still
                pays for; a NaN/inf loss stops training and marks the run diverged
                (workbench.run.divergence). Its training step takes several optimizer steps a
                call (workbench.run.batches.StepCalls) with Lightning's manual optimization, in
                the order and arithmetic of its automatic one (tests/run/test_train_frozen.py).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import ParallelStrategy

from workbench.cost.budget import count_tokens, sequences_within
from workbench.cost.flops import counted_forward
from workbench.model.losses import collect
from workbench.model.transformer import Transformer, build_model
from workbench.model.optimizers import build_optimizer
from workbench.run.divergence import DivergenceCheck
from workbench.tasks.base import rng_for

INIT_STREAM = 7  # seeds torch for `train.init_stream`: a numpy stream apart from the tasks' data streams
PAIRED_INIT = 8  # seeds `train.init: paired`'s per-parameter generators: another such stream


def paired_init_seed(train_config: dict[str, Any], seed: int) -> int | None:
    """The seed of `train.init: paired`'s per-parameter draws (workbench.model.transformer.
    parameter_generator) for this run's seed and init_stream; None under the default init."""
    if train_config.get("init", "sequential") != "paired":
        return None
    return int(rng_for(seed, PAIRED_INIT, train_config.get("init_stream", 0)).integers(2**63))


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


def unmeasured(steps_left: int | None) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


class RunModule(pl.LightningModule):
    def __init__(self, config: dict[str, Any], task,
                 measure_step: Callable[[int | None], contextlib.AbstractContextManager] = unmeasured):
        super().__init__()
        self.automatic_optimization = False  # training_step takes K steps a call (workbench.run.batches.StepCalls)
        init_stream = config["train"].get("init_stream", 0)
        if init_stream:  # the same seed's data (the task's own numpy streams), other initial weights
            torch.manual_seed(int(rng_for(config["seed"], INIT_STREAM, init_stream).integers(2**63)))
        init_seed = paired_init_seed(config["train"], config["seed"])
        self.model: Transformer = build_model(config["model"], init_seed=init_seed)
        if init_seed is not None:  # dropout from a stream that the arm's parameter count did not advance
            torch.manual_seed(init_seed)
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
        self.step_terms: dict[str, torch.Tensor] = {}  # the last loss's task loss and auxiliary terms (curves)
        # around each optimizer step, given the session's steps left (None: a budget decides): PeakMemory.step
        self.measure_step = measure_step

    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning names the hook in progress before and after every hook call, ~40 times a step:
        # a plain attribute, set without nn.Module's checks for parameters, modules and buffers
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def training_step(self, batch, batch_idx: int):
        """One call: the K optimizer steps of `batch` (workbench.run.batches.StepCalls), each its
        micro-batches' forward and backward, then clipping (on_before_optimizer_step), the
        optimizer's and the schedule's step: the order and arithmetic of Lightning's automatic
        optimization, with the Trainer's own work per step paid once per call. Returns what
        each step spent, for the recorder; a step that took no update (diverged, or a budget's
        dropped remainder) ends the call and is not in it."""
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        steps = []
        for micro_batches in batch:
            with self.measure_step(None if self.budget_kind else self.trainer.max_steps - self.global_step):
                spent = self.take_step(micro_batches, optimizer)
                if spent is None:
                    break
                scheduler.step()
            steps.append(spent)
            if self.trainer.should_stop:  # a budget reached, or a diverged step found a step late
                break
        return {"steps": steps}

    def take_step(self, micro_batches, optimizer) -> dict[str, Any] | None:
        """One optimizer step over its micro-batches (each a loss divided by their number, summed in
        the gradients as Lightning's accumulation does); what it spent, or None without an update."""
        step, parts = self.global_step + 1, len(micro_batches)
        spent = {"step": step, "loss": None, "tokens": 0, "sequences": 0, "flops": None, "terms": {}}
        for i, (inputs, tokens) in enumerate(micro_batches):  # tokens: the micro-batch's, every rank's share
            flops = None
            if self.budget_kind == "flops":
                fitted, loss, flops = self.flop_budgeted_loss(inputs)
            else:
                fitted = self.fit_budget(inputs, tokens) if self.budget_kind == "tokens" else inputs
                loss = None if fitted is None else self.loss(fitted)
            if loss is None:  # the budget's remainder was under half a sequence: dropped
                return None
            if self.divergence is None:
                self.divergence = DivergenceCheck(self.trainer)
            diverged_step = self.divergence.check(loss, step)
            if diverged_step is not None:
                self.diverged_step = diverged_step
                self.trainer.should_stop = True
                if diverged_step == step:
                    return None  # no optimizer step: the weights stay those before the bad step
            if i == 0:  # where Lightning's automatic optimization zeroes them: after the first forward
                optimizer.zero_grad()
            part = loss / parts if parts > 1 else loss
            with self.gradient_sync(last=i == parts - 1):
                self.manual_backward(part)
            # Every rank holds an equal share (train.batch_size is a multiple of the processes): the
            # step's sequences are this rank's times their number, so FLOPs estimated from them count all.
            spent["tokens"] += tokens if fitted is inputs else count_tokens(fitted)  # a budget's last step kept fewer
            spent["sequences"] += batch_size(fitted) * self.trainer.world_size
            if flops is not None:
                spent["flops"] = (spent["flops"] or 0) + flops
            loss_part = part.detach()
            spent["loss"] = loss_part if spent["loss"] is None else spent["loss"] + loss_part
            for name, value in self.step_terms.items():  # each micro-batch's, as the loss: a mean
                value = value / parts if parts > 1 else value
                spent["terms"][name] = spent["terms"][name] + value if name in spent["terms"] else value
        optimizer.step()  # Lightning's: on_before_optimizer_step (clipping), then the step; the global step + 1
        return spent

    def gradient_sync(self, last: bool):
        """Several processes all-reduce gradients at the last micro-batch of a step only, as
        Lightning's automatic accumulation does."""
        strategy = self.trainer.strategy
        if last or not isinstance(strategy, ParallelStrategy):
            return contextlib.nullcontext()
        return strategy.block_backward_sync()

    def on_before_optimizer_step(self, optimizer) -> None:
        # where Lightning's automatic optimization clips: after the callbacks' hooks, on unscaled gradients
        if self.train_cfg["grad_clip"] is not None:
            self.clip_gradients(optimizer, gradient_clip_val=self.train_cfg["grad_clip"], gradient_clip_algorithm="norm")

    def loss(self, inputs) -> torch.Tensor:
        """The task's loss plus every auxiliary term the model's modules added during its forward
        (workbench.model.losses: load balance, z-losses). With terms, `step_terms` keeps the task's
        loss alone ("task_loss": the run's loss curve, comparable with a model that has no terms)
        and each term, for the step's curves; no term enters an evaluation metric."""
        with collect() as terms:
            loss = self.task.loss(self.model, inputs, self.family)
        if not terms:
            self.step_terms = {}
            return loss
        self.step_terms = {"task_loss": loss.detach(), **terms.curves()}
        return loss + terms.total()

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
        (workbench.cost.flops.counted_forward). A forward's FLOPs depend on the batch's shapes
        and masks only (which positions are real and may meet), not on the token values: a
        batch like one counted before reuses that count, so fixed-length tasks count once."""
        key = tuple((name, tuple(t.shape), t.cpu().numpy().tobytes() if t.dtype == torch.bool else b"")
                    for name, t in sorted(inputs.items()))
        if key in self.flops_by_shape:
            return self.loss(inputs), self.flops_by_shape[key]
        loss, forward = counted_forward(self.model, lambda: self.loss(inputs))
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

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint of the workbench before 2026-12-07 (Lightning's automatic optimization, one
        call per micro-batch) resumes too: its step count and batch counters become this loop's
        (its step is a multiple of this session's steps per call: workbench.run.train.session_steps_per_call)."""
        loop = checkpoint["loops"]["fit_loop"]
        automatic = loop["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"]
        if automatic["total"]["completed"] == 0:
            return
        loop["epoch_loop.manual_optimization.optim_step_progress"] = copy.deepcopy(automatic)
        data = self.trainer.datamodule
        per_call = data.per_call * data.micro_batches  # its calls counted micro-batches
        batches = loop["epoch_loop.batch_progress"]
        for part in ("total", "current"):
            batches[part] = {name: count // per_call for name, count in batches[part].items()}
        loop["epoch_loop.state_dict"]["_batches_that_stepped"] //= per_call

    def on_train_end(self) -> None:
        if self.divergence is not None and (step := self.divergence.flush()) is not None:
            self.diverged_step = step

    def configure_optimizers(self):
        cfg = self.train_cfg
        optimizer = build_optimizer(cfg["optimizer"], self.model, lr=cfg["lr"], weight_decay=cfg["weight_decay"])
        schedule = functools.partial(lr_factor, warmup=cfg["warmup_steps"], schedule=cfg["schedule"],
                                     min_ratio=cfg["min_lr_ratio"])
        if self.budget_kind is None:
            factor = functools.partial(schedule, total=cfg["steps"])
        else:
            factor = functools.partial(budget_factor, schedule, self.budget[self.budget_kind], self.spent, cfg["steps"])
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
