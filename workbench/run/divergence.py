"""Whether a run diverged: a NaN or inf training loss, found without making a GPU wait."""

from __future__ import annotations

import pytorch_lightning as pl
import torch


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
