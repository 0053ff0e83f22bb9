"""Training batches of one run, as Lightning reads them.

    TaskDataModule  batch i of training = task.train_batch(i): a pure function of (seed, i),
                    so a run resumed at step k continues with batch k (StepSampler starts at
                    the restored global step; the whole budget is one epoch).
    StepBatches     with train.grad_accumulation, each batch in micro-batches; with several
                    processes, each rank's share of each micro-batch.
"""

from __future__ import annotations

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

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        """A CPU run's batch is already where it trains: Lightning's default walks it at every
        step to move each tensor."""
        if device.type == "cpu":
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)


def step_done(trainer: pl.Trainer, batch_idx: int) -> bool:
    """Whether this batch ended an optimizer step (with train.grad_accumulation, only every k-th)."""
    return (batch_idx + 1) % trainer.accumulate_grad_batches == 0
