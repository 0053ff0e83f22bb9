"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", the lion-pytorch
package): sign updates, decoupled weight decay on the weight matrices; it wants a learning rate
3-10x smaller than AdamW's."""

import importlib.util
from typing import Annotated

from pydantic import Field

from workbench import hookimpl
from workbench.model.optimizers import Optimizer, decay_groups
from workbench.variants import Params

Betas = tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]]


class LionParams(Params):
    betas: Betas = Field((0.9, 0.99), description="interpolation and momentum decay rates")


class Lion(Optimizer):
    """Lion (Chen et al. 2023): sign updates, decoupled weight decay; a learning rate 3-10x below AdamW's."""

    name = "lion"
    Params = LionParams
    elementwise = True

    def missing(self):
        if importlib.util.find_spec("lion_pytorch") is None:
            return "'lion' needs the lion-pytorch package: pip install 'transformer-workbench[lion]', or use adamw, adam or sgd"
        return None

    def build(self, model, *, lr, weight_decay):
        from lion_pytorch import Lion as LionOptimizer  # an optional package (the `lion` extra), checked before any run

        groups = decay_groups(list(model.parameters()), weight_decay)
        return LionOptimizer(groups, lr=lr, betas=tuple(self.params.betas))


@hookimpl
def register_optimizers():
    return [Lion]
