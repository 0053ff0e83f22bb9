"""Auxiliary loss terms and training statistics that any module adds during a forward pass.

    add_loss("load_balance", value, weight=0.01)    # in a module's forward: weight * value joins the loss
    record("router.dropped", fraction)               # a statistic of the step, recorded as a curve

The training step collects them (workbench.run.run_module):

    with collect() as terms:
        loss = task.loss(model, batch, family)
    loss = loss + terms.total()                      # sum of weight * value over every term

Outside `collect()` (evaluation, generation, a model used from Python) both do nothing, so no
term ever enters an evaluation metric. Terms of one name added by several layers are summed (the
per-layer auxiliary losses of Switch, Mixtral and DeepSeek add up); statistics of one name are
averaged over the calls that recorded them. Each term and statistic becomes a curve of its own
(split "train", `aux.<name>` unweighted and `stat.<name>`). The collector lives in a context
variable: one per thread and task, so DDP ranks and Ray workers each collect their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor


class Terms:
    """What the modules of one training forward added: loss terms and statistics, by name."""

    def __init__(self) -> None:
        self.losses: dict[str, list[tuple[Tensor, float]]] = {}  # name -> [(value, weight)] per call
        self.stats: dict[str, list[Tensor]] = {}

    def total(self) -> Tensor | float:
        """The sum of weight * value over every term (0.0 when there is none)."""
        return sum((weight * value for calls in self.losses.values() for value, weight in calls), 0.0)

    def curves(self) -> dict[str, Tensor]:
        """`aux.<name>`: each term's value summed over its calls, unweighted; `stat.<name>`: each
        statistic averaged over its calls. Detached 0-d tensors (no host sync here)."""
        out = {f"aux.{name}": sum(value.detach() for value, _ in calls) for name, calls in self.losses.items()}
        out |= {f"stat.{name}": torch.stack([v.detach() for v in values]).mean() for name, values in self.stats.items()}
        return out

    def __bool__(self) -> bool:
        return bool(self.losses or self.stats)


_ACTIVE: ContextVar[Terms | None] = ContextVar("workbench_loss_terms", default=None)


@contextmanager
def collect() -> Iterator[Terms]:
    """Within the block, `add_loss` and `record` add to the yielded Terms."""
    terms = Terms()
    token = _ACTIVE.set(terms)
    try:
        yield terms
    finally:
        _ACTIVE.reset(token)


def collecting() -> bool:
    """Whether a training step is collecting terms: a module may skip computing a term (or a
    statistic) that nobody would read."""
    return _ACTIVE.get() is not None


def add_loss(name: str, value: Tensor, weight: float = 1.0) -> None:
    """Add `weight * value` (a 0-d tensor that carries its gradient) to the training loss of the
    step being collected; nothing outside a training step."""
    terms = _ACTIVE.get()
    if terms is not None:
        terms.losses.setdefault(name, []).append((value, float(weight)))


def record(name: str, value: Tensor | float) -> None:
    """Record a statistic of the step being collected (averaged over calls); nothing outside one."""
    terms = _ACTIVE.get()
    if terms is not None:
        terms.stats.setdefault(name, []).append(torch.as_tensor(value, dtype=torch.float32).detach())
