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


def rotation(pos: Tensor, head_dim: int, base: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin of the angles pos * base^(-2i/hd): [B or 1, 1, n, hd/2] each."""
    if pos.stride(0) == 0:  # every row holds the same positions (an expanded arange): one row of angles
        pos = pos[:1]
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim)
    angles = pos[:, None, :, None].float() * inv_freq  # [B, 1, n, hd/2]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotation(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, h, n, hd] with pair (i, i + hd/2) rotated by the angle whose cos/sin are given."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rotate(x: Tensor, pos: Tensor, base: float) -> Tensor:
    """x [B, h, n, hd], pos [B, n] -> x with pair i rotated by pos * base^(-2i/hd)."""
    return apply_rotation(x, *rotation(pos, x.shape[-1], base, x.dtype))


class Rope(PositionScheme):
    """Rotary embedding of queries and keys (relative offsets)."""

    name = "rope"
    Params = RopeParams

    def __init__(self, params: RopeParams, **dims):
        super().__init__(params, **dims)
        if self.head_dim % 2:
            raise SpecError("model.head_dim", f"RoPE rotates pairs of dimensions: head_dim {self.head_dim} must be even")

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        q_rot = rotation(q_pos, self.head_dim, self.params.base, q.dtype)
        if k is q:  # tied Q/K: rotate once so keys stay identical to queries
            q = apply_rotation(q, *q_rot)
            return q, q
        # self-attention passes one positions tensor for both: the angles are computed once
        k_rot = q_rot if k_pos is q_pos else rotation(k_pos, self.head_dim, self.params.base, k.dtype)
        return apply_rotation(q, *q_rot), apply_rotation(k, *k_rot)


@hookimpl
def register_position_schemes():
    return [Rope]
