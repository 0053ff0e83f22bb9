"""Training budgets in compute: what a run may spend, and what each step costs.

    train.budget: {flops: X}    counted training FLOPs: every step's forward is counted as it
                                runs (useful FLOPs, workbench.cost.flops.counted_forward),
                                x3 for forward + backward, so a model that costs more per
                                token trains for fewer steps
    train.budget: {tokens: X}   real (non-padding) input tokens
    train.budget: {seconds: X}  training seconds (evaluation excluded)

The budget stops the run (workbench.run.run_module): steps are added until one would pass it.
That last step trains on the first sequences the budget still pays for, the nearest whole
number (FLOPs and tokens are linear in the number of sequences): all of them ("whole"),
fewer ("partial"), or none when the remainder is under half a sequence ("dropped"). So a
run spends its budget to within half a sequence's cost, and records it (`train_flops`,
`train_tokens`, `last_step`).

Before training, `estimated_steps` gives the steps a budget buys at training batch 0's cost
(exact for tasks of fixed-length sequences, such as the language-model tasks; an estimate
where batches are padded to their longest sequence): `workbench validate` shows it, and the
learning-rate schedule starts from it and re-projects its total from the spending so far.
Runs without a FLOP budget record `train_flops` from batch 0's count per sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from workbench.cost.flops import train_step_flops

# A budgeted run's step count is not fixed in advance (the budget stops it): its one epoch of
# batches is this long.
BUDGET_STEP_CAP = 10**9

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


def unpadded(batch: dict[str, torch.Tensor]) -> bool:
    """Whether every sequence of the batch is all real tokens (then all have one length)."""
    return all(bool(batch[mask].all()) for key, mask in INPUT_MASKS.items() if key in batch and mask in batch)


def step_cost(model: torch.nn.Module, loss: Callable[[dict[str, torch.Tensor]], torch.Tensor],
              batch: dict[str, torch.Tensor]) -> StepCost:
    """The cost of one step of `model` on `batch` (`loss(batch)` is the task's training loss).
    Sequences without padding each cost the same (every counted operation is per sequence, and
    attention's pairs are summed over them), so such a batch is counted on its first sequence
    and multiplied: exact, and the batch size times cheaper (`validate` counts a GPU profile's
    100M-parameter models at batch 64 x 512 on a CPU)."""
    sequences = next(iter(batch.values())).shape[0]
    counted = {key: value[:1] for key, value in batch.items()} if unpadded(batch) else batch
    flops = train_step_flops(model, lambda: loss(counted)) * (sequences if counted is not batch else 1)
    return StepCost(flops=flops, tokens=count_tokens(batch), sequences=sequences)


def sequences_within(left: float, cost: float, sequences: int) -> int:
    """Of a step costing `cost` for `sequences` sequences, how many the `left` budget pays for:
    the nearest whole number (costs are linear in sequences), at most all of them."""
    return min(sequences, max(0, round(left / (cost / sequences))))


def estimated_steps(budget: float, kind: str, cost: StepCost) -> int:
    """The steps `budget` (`kind` "flops" or "tokens") buys at batch 0's cost: whole steps, and
    one more when the remainder pays for at least one sequence. A budget under half a
    sequence's cost buys nothing: ValueError."""
    per_step = cost.flops if kind == "flops" else cost.tokens
    full = int(budget // per_step)
    last = sequences_within(budget - full * per_step, per_step, cost.sequences)
    if full == 0 and last == 0:
        raise ValueError(f"one training sequence costs {cost.per_sequence(kind):.4g} {kind}, more than twice the "
                         f"budget of {budget:.4g}")
    return full + (last > 0)
