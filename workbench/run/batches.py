"""Training batches of one run, as Lightning reads them.

    TaskDataModule  batch i of training = task.train_batch(i): a pure function of (seed, i),
                    so a run resumed at step k continues with batch k (StepSampler starts at
                    the restored global step; the whole budget is one epoch).
    StepBatches     with train.grad_accumulation, each batch in micro-batches; with several
                    processes, each rank's share of each micro-batch.
    StepCalls       what one call of the training step receives: `steps_per_call` steps, each its
                    micro-batches (Keras's `steps_per_execution`): the Trainer's own work per call
                    (hooks, fetching, progress; about 1 ms on a CPU) is paid once per K steps.
"""

from __future__ import annotations

import math

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from workbench.cost.budget import count_tokens
from workbench.errors import WorkbenchError
from workbench.run.distributed import shard


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


# At most this many optimizer steps per call of the training step: past ~10 the Trainer's work per
# call (about 1 ms on this CPU) is under 1% of a 12 ms step of the smallest shipped model.
MAX_STEPS_PER_CALL = 16


def steps_per_call(train: dict, user_callbacks: bool) -> int:
    """How many optimizer steps one call of the training step takes: the largest K <=
    MAX_STEPS_PER_CALL that divides the steps, `log_every`, `eval_every` and `checkpoint_every`,
    so every record, evaluation, checkpoint, early stop and the last step fall at the end of a call
    as they would step by step; a stop request ends training at the end of its call (up to K - 1
    steps later than one step a call would). One where that
    cannot hold or a step's own hooks are wanted: a compute budget (the step that reaches it is cut
    by what the steps before it spent), and a study's own `train.callbacks` (which expect
    `on_train_batch_end` once per step)."""
    if train.get("budget") or user_callbacks:
        return 1
    every = math.gcd(train["steps"], train["log_every"], train["eval_every"], train["checkpoint_every"])
    return max(k for k in range(1, MAX_STEPS_PER_CALL + 1) if every % k == 0)


class StepCalls(Dataset):
    """Item i: steps i*K .. i*K + K - 1, each a list of its micro-batches as StepBatches gives them."""

    def __init__(self, batches: StepBatches, per_call: int):
        self.batches, self.per_call = batches, per_call

    def __len__(self) -> int:
        return self.batches.steps // self.per_call

    def __getitem__(self, index: int) -> list[list[tuple[dict[str, torch.Tensor], int]]]:
        micro = self.batches.micro_batches
        return [[self.batches[step * micro + part] for part in range(micro)]
                for step in range(index * self.per_call, (index + 1) * self.per_call)]


class StepSampler(Sampler[int]):
    """Indices start() .. length-1: the training budget is one epoch of `length` items (its calls of
    the training step, StepCalls; batched seeds: its steps).

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
    def __init__(self, task, family: str, batch_size: int, steps: int, micro_batches: int = 1, per_call: int = 1):
        super().__init__()
        self.task, self.family, self.batch_size, self.steps = task, family, batch_size, steps
        self.micro_batches, self.per_call = micro_batches, per_call

    def train_dataloader(self) -> DataLoader:
        trainer, micro = self.trainer, self.micro_batches
        world = trainer.world_size if trainer is not None else 1
        if self.batch_size % (world * micro):
            raise WorkbenchError(f"train.batch_size: {self.batch_size} rows cannot be shared equally by {world} "
                                 f"processes x {micro} micro-batches; use a multiple of {world * micro}")
        rank = trainer.global_rank if trainer is not None else 0
        calls = StepCalls(StepBatches(self.task, self.batch_size, self.family, self.steps, micro, rank, world),
                          self.per_call)
        # Lightning restores the global step before iterating: start at the call that begins with it, so
        # a resumed run continues with the batch it would have seen next (a checkpoint is written at
        # the end of a call: its step is a multiple of K). Every rank steps through the same indices
        # (its share of each batch), so Lightning's distributed sampler stays off.
        per_call = self.per_call
        sampler = StepSampler(len(calls), lambda: trainer.global_step // per_call if trainer is not None else 0)
        # Its own generator: starting an iterator would otherwise draw from the global random
        # state that dropout uses, once more in a resumed session than in an uninterrupted run.
        # Pinned host memory: Lightning copies the batch to a GPU without blocking.
        pin = trainer is not None and trainer.strategy.root_device.type == "cuda"
        return DataLoader(calls, batch_size=None, sampler=sampler, generator=torch.Generator(), pin_memory=pin)

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        """A CPU run's batch is already where it trains: Lightning's default walks it at every
        step to move each tensor."""
        if device.type == "cpu":
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)
