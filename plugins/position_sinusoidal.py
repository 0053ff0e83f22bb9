"""Fixed sinusoidal encoding (Vaswani et al. 2017), added to the token embeddings:

    PE(pos, 2i) = sin(pos / base^(2i/d)),   PE(pos, 2i+1) = cos(pos / base^(2i/d))

Low dimensions oscillate fast, high dimensions slowly. Computed from the positions on the
fly, so it is defined at every position (which does not mean the model works there).
"""

import torch
from pydantic import Field
from torch import Tensor

from workbench import hookimpl
from workbench.position import PositionScheme
from workbench.variants import Params


class SinusoidalParams(Params):
    base: float = Field(10000.0, gt=1, description="wavelength scale of the slowest dimension")


def sinusoidal_table(pos: Tensor, d_model: int, base: float = 10000.0) -> Tensor:
    """pos [...] -> encodings [..., d_model] (sin in even, cos in odd dimensions)."""
    i = torch.arange(0, d_model, 2, device=pos.device, dtype=torch.float32)  # the 2i of the formula
    angles = pos[..., None].float() / base ** (i / d_model)  # [..., d_model/2]
    table = torch.empty(*pos.shape, d_model, device=pos.device)
    table[..., 0::2] = torch.sin(angles)
    table[..., 1::2] = torch.cos(angles[..., : d_model // 2])
    return table


class Sinusoidal(PositionScheme):
    """Fixed sin/cos encoding added to the embeddings."""

    name = "sinusoidal"
    Params = SinusoidalParams

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + sinusoidal_table(pos, self.d_model, self.params.base).to(x.dtype)


@hookimpl
def register_position_schemes():
    return [Sinusoidal]
