"""Training budgets in compute: how many steps a FLOP or token budget buys a run.

    train.budget: {flops: X}    steps from the run's own counted training FLOPs per step
                                (useful FLOPs, workbench.cost.measure.train_step_flops: x3 of
                                the forward), so a model that costs more per token trains
                                for fewer steps
    train.budget: {tokens: X}   steps from the real (non-padding) input tokens per step
    train.budget: {seconds: X}  training time, decided while the run trains (workbench.run.train)

Both counted budgets are measured on training batch 0 of the run's task; every batch of a
task with fixed-length sequences (the language-model tasks) costs exactly as much, and FLOPs
and tokens are linear in the number of sequences. So the budget buys `full` whole steps and
a remainder; the remainder trains as one last step on the nearest whole number of sequences
("partial"), or is dropped when that is under half a sequence ("dropped"). The run records
what it actually spent (`train_flops`, `train_tokens`): within half a sequence's cost of the
budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from workbench.cost.measure import train_step_flops

# Inputs whose real (non-padding) tokens count as training tokens, with their padding masks.
INPUT_MASKS = {"tokens": "padding_mask", "src": "src_mask", "tgt": "tgt_mask"}


def count_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Real (non-padding) input tokens of a batch."""
    total = 0
    for key, mask_key in INPUT_MASKS.items():
        if key in batch:
            total += int(batch[mask_key].sum()) if mask_key in batch else batch[key].numel()
    return total


@dataclass(frozen=True)
class StepCost:
    """What one whole training step of a run costs, counted on training batch 0."""

    flops: int  # useful training FLOPs (forward x3)
    tokens: int  # real input tokens
    sequences: int  # the batch size it was counted at

    def per_sequence(self, kind: str) -> float:
        return (self.flops if kind == "flops" else self.tokens) / self.sequences


def step_cost(model: torch.nn.Module, loss: Callable[[dict[str, torch.Tensor]], torch.Tensor],
              batch: dict[str, torch.Tensor]) -> StepCost:
    """The cost of one step of `model` on `batch` (`loss(batch)` is the task's training loss)."""
    sequences = next(iter(batch.values())).shape[0]
    return StepCost(flops=train_step_flops(model, lambda: loss(batch)), tokens=count_tokens(batch),
                    sequences=sequences)


@dataclass(frozen=True)
class BudgetSteps:
    """The steps a counted budget buys."""

    steps: int  # optimizer steps, the last one included
    last_batch_size: int  # sequences of the last step (the batch size unless it is partial)
    last_step: str  # "whole" (the budget divides), "partial" (fewer sequences) or "dropped" (remainder unspent)
    planned: float  # what the steps cost in the budget's unit


def budget_steps(budget: float, kind: str, cost: StepCost) -> BudgetSteps:
    """Whole steps that fit in `budget` (`kind` "flops" or "tokens"), then the remainder as a
    last step of round(remainder / cost per sequence) sequences (module docstring). A budget
    under half a sequence's cost buys nothing: ValueError."""
    per_step = cost.flops if kind == "flops" else cost.tokens
    per_sequence = cost.per_sequence(kind)
    full = int(budget // per_step)
    remainder = budget - full * per_step
    extra = min(round(remainder / per_sequence), cost.sequences)
    if full == 0 and extra == 0:
        raise ValueError(f"one training sequence costs {per_sequence:.4g} {kind}, more than twice the budget "
                         f"of {budget:.4g}")
    if extra == cost.sequences:  # the remainder rounds up to a whole step
        return BudgetSteps(full + 1, cost.sequences, "whole", (full + 1) * per_step)
    if extra == 0:
        return BudgetSteps(full, cost.sequences, "dropped" if remainder > 0 else "whole", full * per_step)
    return BudgetSteps(full + 1, extra, "partial", full * per_step + extra * per_sequence)
