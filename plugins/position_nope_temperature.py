"""NoPE with attention temperature tuning, Llama 4's position scheme for its NoPE layers (Meta
2025, "The Llama 4 herd"; reference: Hugging Face transformers' `Llama4TextAttention` with
`attn_temperature_tuning`, which cites Nakanishi 2025, "Scalable-Softmax Is Superior for
Attention"): no rotation and no bias, but each query is multiplied by

    1 + attn_scale * log(1 + floor((t + 1) / floor_scale)),     t the query's position,

so its scores sharpen as the context grows (by 1 + 0.1 ln 2 from position 8191 at Llama 4's
values), keeping attention over long inputs from flattening; keys are left as they are. The
scale is a function of the query's position, so it lives here rather than in a kernel: a
cached decoding step scales its one query by its own position, as the full forward does.

Deviation: positions count from each row's first real token (as every workbench scheme's);
transformers counts indices (a left-padded row's first real token there is not at position 0).
Unpadded inputs are the same.
"""

import torch
from pydantic import Field
from torch import Tensor

from workbench import hookimpl
from workbench.model.position import PositionScheme, table_dtype
from workbench.variants import Params


class NopeTemperatureParams(Params):
    floor_scale: int = Field(8192, gt=0, description="positions per step of the log: the scale first rises at "
                             "position floor_scale - 1 (Llama 4's floor_scale)")
    attn_scale: float = Field(0.1, ge=0, description="strength: queries times 1 + attn_scale * log(1 + "
                              "floor((t + 1) / floor_scale)) (Llama 4's attn_scale)")


class NopeTemperature(PositionScheme):
    """No position signal but a query temperature that grows with log position (Llama 4's NoPE layers)."""

    name = "nope_temperature"
    Params = NopeTemperatureParams
    picture_note = ("constant along each row: a query's scores scale with its position's temperature only "
                    "(1 before position floor_scale - 1)")

    def query_scale(self, pos: Tensor, dtype: torch.dtype) -> Tensor:
        """[B, 1, n, 1]: each query's factor at positions pos [B, n]."""
        steps = torch.div(pos + 1, self.params.floor_scale, rounding_mode="floor").to(dtype)
        return (1.0 + self.params.attn_scale * torch.log1p(steps))[:, None, :, None]

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return (q * self.query_scale(q_pos, table_dtype(q))).to(q.dtype), k


@hookimpl
def register_position_schemes():
    return [NopeTemperature]
