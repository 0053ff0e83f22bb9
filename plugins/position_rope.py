"""Rotary position embedding (Su et al. 2021): rotate each pair of query/key dimensions by an
angle proportional to the position, so that q_m . k_n depends only on m - n.

Pairs are (x[i], x[i + hd/2]) ("rotate half", as in GPT-NeoX and LLaMA).
"""

import torch
from pydantic import Field
from torch import Tensor

from workbench import hookimpl
from workbench.errors import SpecError
from workbench.position import PositionScheme
from workbench.variants import Params


class RopeParams(Params):
    base: float = Field(10000.0, gt=1, description="theta: wavelength scale of the slowest pair")


def rotate(x: Tensor, pos: Tensor, base: float) -> Tensor:
    """x [B, h, n, hd], pos [B, n] -> x with pair i rotated by pos * base^(-2i/hd)."""
    hd = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)  # [hd/2]
    angles = pos[:, None, :, None].float() * inv_freq  # [B, 1, n, hd/2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Rope(PositionScheme):
    """Rotary embedding of queries and keys (relative offsets)."""

    name = "rope"
    Params = RopeParams

    def __init__(self, params: RopeParams, **dims):
        super().__init__(params, **dims)
        if self.head_dim % 2:
            raise SpecError("model.head_dim", f"RoPE rotates pairs of dimensions: head_dim {self.head_dim} must be even")

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        if k is q:  # tied Q/K: rotate once so keys stay identical to queries
            q = rotate(q, q_pos, self.params.base)
            return q, q
        return rotate(q, q_pos, self.params.base), rotate(k, k_pos, self.params.base)


@hookimpl
def register_position_schemes():
    return [Rope]
