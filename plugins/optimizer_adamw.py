"""AdamW (Loshchilov & Hutter 2019, torch.optim.AdamW): Adam with decoupled weight decay
(train.weight_decay) on the weight matrices; norms, biases and gains are not decayed. The
workbench's default optimizer, betas (0.9, 0.95) as GPT-3 and Llama train."""

from typing import Annotated

import torch
from pydantic import Field

from workbench import hookimpl
from workbench.model.optimizers import Optimizer, decay_groups
from workbench.variants import Params

Betas = tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]]


class AdamParams(Params):
    betas: Betas = Field((0.9, 0.95), description="decay rates of the first and second moment estimates")
    eps: float = Field(1e-8, gt=0, description="added to the denominator for stability")


class AdamW(Optimizer):
    """torch.optim.AdamW: decoupled weight decay (train.weight_decay) on weight matrices."""

    name = "adamw"
    Params = AdamParams
    elementwise = True
    torch_class = torch.optim.AdamW

    def build(self, model, *, lr, weight_decay):
        groups = decay_groups(list(model.parameters()), weight_decay)
        return self.torch_class(groups, lr=lr, betas=tuple(self.params.betas), eps=self.params.eps)


@hookimpl
def register_optimizers():
    return [AdamW]
