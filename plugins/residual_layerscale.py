"""LayerScale (Touvron et al. 2021, "Going deeper with Image Transformers", CaiT, sec. 2.1):
x + diag(lambda) f(x), lambda a learned vector of d_model channels per sublayer, started at a
small epsilon so that each block starts near the identity and deep stacks train.

Their epsilon depends on depth: 0.1 up to 18 blocks, 1e-5 at 24, 1e-6 deeper; `init_scale`
left unset follows that rule with the block's stack depth (between 19 and 24 blocks it takes
1e-5). As in CaiT the norm stays where model.norm puts it (their blocks are Pre-Norm, the
default); no placement is required. lambda is a vector, so it has no weight decay (the
runner's rule for every parameter of fewer than 2 dimensions)."""

import torch
from pydantic import Field
from torch import Tensor, nn

from workbench import hookimpl
from workbench.model.residual import Depth, Residual
from workbench.variants import Params


class LayerScaleParams(Params):
    init_scale: float | None = Field(None, gt=0, description="lambda's initial value on every channel; unset: "
                                     "CaiT's rule, 0.1 up to 18 layers per stack, 1e-5 up to 24, 1e-6 deeper")


def cait_init_scale(layers: int) -> float:
    """Touvron et al. 2021's epsilon for a stack of `layers` blocks."""
    return 0.1 if layers <= 18 else 1e-5 if layers <= 24 else 1e-6


class LayerScale(Residual):
    """x + diag(lambda) f(x): a learned per-channel scale on the branch, started small."""

    name = "layerscale"
    Params = LayerScaleParams

    def __init__(self, params: LayerScaleParams, *, d_model: int, depth: Depth):
        super().__init__(params, d_model=d_model, depth=depth)
        scale = params.init_scale if params.init_scale is not None else cait_init_scale(depth.layers)
        self.scale = nn.Parameter(torch.full((d_model,), scale))  # lambda [d_model]

    def branch(self, y: Tensor) -> Tensor:
        return self.scale * y  # [B, n, d_model]


@hookimpl
def register_residual_connections():
    return [LayerScale]
