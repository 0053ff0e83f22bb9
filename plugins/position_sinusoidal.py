"""Fixed sinusoidal encoding (Vaswani et al. 2017, section 3.5), added to the token embeddings:

    PE(pos, 2i) = sin(pos / base^(2i/d)),   PE(pos, 2i+1) = cos(pos / base^(2i/d))

Low dimensions oscillate fast, high dimensions slowly. Computed from the positions on the
fly, so it is defined at every position (which does not mean the model works there).

Scale: Vaswani et al. 3.4 add the unit-amplitude table (RMS 1/sqrt(2)) to token embeddings
of unit RMS (N(0, d^-0.5) times sqrt(d)), so the position signal is ~0.7x the token signal.
Our tokens keep GPT-2's N(0, INIT_STD) init (see `model.Transformer._init_weights` for why), so
the table is multiplied by INIT_STD: the same ~0.7 ratio at every width. Added at amplitude 1,
the table was ~35x the tokens and the model never learned to copy. `scale` multiplies on top,
for ablations: scale 50 gives amplitude 1, that old ratio. (x-transformers'
`ScaledSinusoidalEmbedding` starts a learned gain at d_model^-0.5 instead.)
"""

import torch
from pydantic import Field
from torch import Tensor

from workbench import hookimpl
from workbench.model.position import INIT_STD, PositionScheme, table_dtype
from workbench.variants import Params


class SinusoidalParams(Params):
    base: float = Field(10000.0, gt=1, description="wavelength scale of the slowest dimension")
    scale: float = Field(1.0, gt=0, description="multiplier on the table, whose amplitude is the token "
                         "embeddings' init std (position/token RMS ~0.7, as in Vaswani et al.); ablation: 50 "
                         "gives amplitude 1, a table ~35x the tokens")


def sinusoidal_table(pos: Tensor, d_model: int, base: float = 10000.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """pos [...] -> encodings [..., d_model] (sin in even, cos in odd dimensions), computed in
    `dtype` (float32, or float64 for a float64 model)."""
    i = torch.arange(0, d_model, 2, device=pos.device, dtype=dtype)  # the 2i of the formula
    angles = pos[..., None].to(dtype) / base ** (i / d_model)  # [..., d_model/2]
    table = torch.empty(*pos.shape, d_model, device=pos.device, dtype=dtype)
    table[..., 0::2] = torch.sin(angles)
    table[..., 1::2] = torch.cos(angles[..., : d_model // 2])
    return table


class Sinusoidal(PositionScheme):
    """Fixed sin/cos encoding added to the embeddings."""

    name = "sinusoidal"
    Params = SinusoidalParams
    picture_note = "low dimensions oscillate fast, high ones slowly"

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        amplitude = self.params.scale * INIT_STD
        table = sinusoidal_table(pos, self.d_model, self.params.base, table_dtype(x))
        return x + amplitude * table.to(x.dtype)


@hookimpl
def register_position_schemes():
    return [Sinusoidal]
