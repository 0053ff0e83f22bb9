"""Fixed sinusoidal encoding (Vaswani et al. 2017, section 3.5), added to the token embeddings:

    PE(pos, 2i) = sin(pos / base^(2i/d)),   PE(pos, 2i+1) = cos(pos / base^(2i/d))

Low dimensions oscillate fast, high dimensions slowly. Computed from the positions on the
fly, so it is defined at every position (which does not mean the model works there).

Scale follows Vaswani et al. 3.4: the table keeps amplitude 1 (RMS 1/sqrt(2)) and the model
multiplies the token embeddings by sqrt(d_model) (initialised N(0, d_model^-0.5) as in fairseq,
see `Transformer._init_weights`), so tokens and positions start at comparable RMS at every
width. Without that, N(0, 0.02) tokens under a unit table are ~35x smaller and the model never
learned to copy. `scale` multiplies the table for ablations: scale 50 restores that old ratio
(table ~35x the tokens); x-transformers' `ScaledSinusoidalEmbedding` starts its (learned) gain
at d_model^-0.5.
"""

import torch
from pydantic import Field
from torch import Tensor

from workbench import hookimpl
from workbench.position import PositionScheme
from workbench.variants import Params


class SinusoidalParams(Params):
    base: float = Field(10000.0, gt=1, description="wavelength scale of the slowest dimension")
    scale: float = Field(1.0, gt=0, description="multiplier on the table; 1 as Vaswani et al. (tokens times "
                         "sqrt(d_model) and table at comparable RMS); ablation: 50 makes the table ~35x the "
                         "tokens, as unscaled N(0, 0.02) tokens were")


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
        return x + self.params.scale * sinusoidal_table(pos, self.d_model, self.params.base).to(x.dtype)


@hookimpl
def register_position_schemes():
    return [Sinusoidal]
