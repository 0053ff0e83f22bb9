"""Optimizers: what a study's `train.optimizer` names, a plugin axis (hook `register_optimizers`),
built by the run's LightningModule (workbench.run.run_module) over its model.

An optimizer variant declares its parameters (Params, as every variant does: YAML validation,
`workbench list optimizer` and reports read them there) and builds a torch optimizer over a model,
choosing its parameter groups:

    class MyOptimizer(Optimizer):
        name = "my_opt"
        Params = MyParams
        def build(self, model, *, lr, weight_decay) -> torch.optim.Optimizer: ...

`train.lr` and `train.weight_decay` are passed to every variant; the run's schedule (warmup and
decay) multiplies the `lr` of every parameter group of what `build` returns, keeping the ratio of
groups that start at different rates. Helpers for the usual groups: `decay_groups` (decay on
matrices, none on norms and biases) and `hidden_matrices` (Muon's split: the 2-D weights of the
blocks against embeddings, head, position tables, norms and biases). Where one model needs two
torch optimizers (Muon for the matrices, AdamW for the rest), `OptimizerChain` makes them one,
which Lightning steps, clips, schedules and checkpoints like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from workbench.model.spec import resolve_choice
from workbench.model.transformer import Stack
from workbench.variants import Params, Variant


class Optimizer(Variant):
    """An optimizer a study can name in `train.optimizer` (see the module docstring)."""

    axis = "optimizer"
    Params = Params
    # Whether its update of each parameter element reads only that element's gradient and state
    # (AdamW, Adam, SGD, Lion; not Muon, which orthogonalises whole matrices): then the seeds of
    # `train.batch_seeds`, their weights stacked along a new first dimension, each train as alone.
    elementwise: ClassVar[bool] = False

    def __init__(self, params: Params):
        self.params = params

    def build(self, model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        raise NotImplementedError

    def missing(self) -> str | None:
        """What to install when the optimizer needs a package that is not there (checked before
        any run trains); None when nothing is missing."""
        return None


def build_optimizer(spec: dict[str, Any], model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """The torch optimizer a run's resolved `train.optimizer` mapping names, over `model`."""
    choice = resolve_choice("optimizer", spec, "train.optimizer")
    return choice.cls(choice.params).build(model, lr=lr, weight_decay=weight_decay)


def decay_groups(params: list[nn.Parameter], weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only; norms, biases and 1-d parameters are not decayed."""
    params = [p for p in params if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def hidden_matrices(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(the 2-D weights of the model's blocks: attention and FFN projections, experts and routers;
    every other trainable parameter: token embedding, output head, position tables, norms, biases,
    gains). The split of Muon's reference (Jordan 2024): orthogonalised updates for the hidden
    matrices only."""
    outside = {id(p) for stack in model.modules() if isinstance(stack, Stack)
               for scheme in stack.schemes() for p in scheme.parameters()}
    in_blocks = {id(p) for stack in model.modules() if isinstance(stack, Stack) for p in stack.blocks.parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    hidden = [p for p in trainable if p.dim() == 2 and id(p) in in_blocks and id(p) not in outside]
    chosen = {id(p) for p in hidden}
    return hidden, [p for p in trainable if id(p) not in chosen]


class OptimizerChain(torch.optim.Optimizer):
    """Several torch optimizers over disjoint parameters, stepped as one: `param_groups` is the
    list of theirs (the same dicts, so a scheduler's lr reaches each), `state_dict` holds each
    one's, and `step(closure)` evaluates the closure once, then steps each optimizer."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers
        super().__init__([p for o in optimizers for group in o.param_groups for p in group["params"]], {})
        self.param_groups = [group for o in optimizers for group in o.param_groups]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.optimizers:
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for optimizer, state in zip(self.optimizers, state_dict["optimizers"], strict=True):
            optimizer.load_state_dict(state)
