"""Stochastic gradient descent with momentum (torch.optim.SGD): train.weight_decay is an L2 term
in the gradient, on the weight matrices only."""

import torch
from pydantic import Field, model_validator

from workbench import hookimpl
from workbench.errors import SpecError
from workbench.model.optimizers import Optimizer, decay_groups
from workbench.variants import Params


class SGDParams(Params):
    momentum: float = Field(0.9, ge=0, lt=1, description="momentum factor (0: plain SGD)")
    nesterov: bool = Field(False, description="Nesterov momentum (needs momentum > 0)")

    @model_validator(mode="after")
    def _nesterov(self):
        if self.nesterov and self.momentum == 0:
            raise SpecError("train.optimizer.nesterov", "Nesterov momentum needs momentum > 0")
        return self


class SGD(Optimizer):
    """torch.optim.SGD: train.weight_decay is an L2 term in the gradient."""

    name = "sgd"
    Params = SGDParams
    elementwise = True

    def build(self, model, *, lr, weight_decay):
        groups = decay_groups(list(model.parameters()), weight_decay)
        return torch.optim.SGD(groups, lr=lr, momentum=self.params.momentum, nesterov=self.params.nesterov)


@hookimpl
def register_optimizers():
    return [SGD]
