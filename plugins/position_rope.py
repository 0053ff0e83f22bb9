"""Rotary position embedding (Su et al. 2021): rotate each pair of query/key dimensions by an
angle proportional to the position, so that q_m . k_n depends only on m - n.

Pairs are (x[2i], x[2i + 1]), as in the paper and Meta's LLaMA reference (`apply_rotary_emb`):
each pair is one complex number multiplied by e^(i * pos * theta_i), one kernel forward and one
backward. (GPT-NeoX and Hugging Face pair x[i] with x[i + hd/2], "rotate half": the same model
up to a fixed permutation of the learned q/k dimensions, at ~7 element-wise kernels: measured
1.4x the time of the complex product forward + backward on the CPU.) The rotation table is
computed once per forward and shared by every layer. It is float32 (complex64), as in LLaMA's
reference and Hugging Face's, except in a float64 model, where it is float64 (complex128).
`interpolation: f` divides every position by f (Chen et al. 2023, "Extending Context Window of
Large Language Models via Positional Interpolation"; Hugging Face's `rope_type: linear`).

Partial rotary (`fraction`; GPT-NeoX's and Qwen3-Next's `partial_rotary_factor`, GPT-J's
`rotary_dim`): only the first r = int(fraction * head_dim) dimensions of each head rotate, their
pair j at the frequency base^(-2j/r); the other head_dim - r pass unchanged. Hugging Face rotates
the same first r dimensions, paired by rotate-half within them (ours[2j] = theirs[j],
ours[2j + 1] = theirs[j + r/2], the rest in place: workbench.model.hf_decoders.rope_pairing).
"""

import torch
from pydantic import Field
from torch import Tensor

from workbench import hookimpl
from workbench.errors import SpecError
from workbench.model.position import PositionScheme, table_dtype
from workbench.variants import Params


class RopeParams(Params):
    added_later = ("interpolation", "fraction")  # runs stored before them keep their ids
    base: float = Field(10000.0, gt=1, description="theta: wavelength scale of the slowest pair")
    interpolation: float = Field(1.0, gt=0, description="positions divided by this factor (Position Interpolation, "
                                 "Chen et al. 2023; Hugging Face's linear RoPE scaling, Gemma 3's global layers)")
    fraction: float = Field(1.0, gt=0, le=1, description="share of each head's dimensions that rotate (the first "
                            "int(fraction * head_dim), an even number); the rest pass unchanged (partial_rotary_factor: "
                            "GPT-NeoX-20B and Qwen3-Next 0.25)")


def rotation(pos: Tensor, head_dim: int, base: float, dtype: torch.dtype = torch.float32,
             interpolation: float = 1.0) -> Tensor:
    """e^(i * pos / interpolation * base^(-2j/hd)) for each pair j: [B or 1, 1, n, hd/2],
    complex64 (dtype float32) or complex128 (float64)."""
    if pos.stride(0) == 0:  # every row holds the same positions (an expanded arange): one row of angles
        pos = pos[:1]
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=pos.device, dtype=dtype) / head_dim) / interpolation
    angles = pos[:, None, :, None].to(dtype) * inv_freq  # [B, 1, n, hd/2]
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotation(x: Tensor, rot: Tensor) -> Tensor:
    """x [B, h, n, hd] with pair (2j, 2j + 1) rotated by the unit complex rot[..., j].
    Half-precision inputs rotate in float32 (no complex bfloat16), as in LLaMA's reference."""
    wide = x if x.dtype in (torch.float32, torch.float64) else x.float()
    pairs = torch.view_as_complex(wide.reshape(*x.shape[:-1], -1, 2))  # [B, h, n, hd/2]
    return torch.view_as_real(pairs * rot).flatten(-2).type_as(x)


def rotate(x: Tensor, pos: Tensor, base: float) -> Tensor:
    """x [B, h, n, hd], pos [B, n] -> x with pair j rotated by pos * base^(-2j/hd)."""
    return apply_rotation(x, rotation(pos, x.shape[-1], base, table_dtype(x)))


class Rope(PositionScheme):
    """Rotary embedding of queries and keys (relative offsets)."""

    name = "rope"
    Params = RopeParams
    picture_note = "constant along diagonals: the score depends only on the offset m - n"

    def __init__(self, params: RopeParams, **dims):
        super().__init__(params, **dims)
        self.rotary_dim = int(self.head_dim * params.fraction)  # as Hugging Face rounds partial_rotary_factor
        if self.rotary_dim % 2 or self.rotary_dim == 0:
            field = "model.head_dim" if params.fraction == 1 else "model.position.fraction"
            raise SpecError(field, f"RoPE rotates pairs of dimensions: int(fraction {params.fraction} * head_dim "
                            f"{self.head_dim}) = {self.rotary_dim} must be even and above 0")

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        q_rot = self.table(q_pos, table_dtype(q))
        if k is q:  # tied Q/K: rotate once so keys stay identical to queries
            q = self.apply(q, q_rot)
            return q, q
        # self-attention passes one positions tensor for both: the angles are computed once
        k_rot = q_rot if k_pos is q_pos else self.table(k_pos, table_dtype(k))
        return self.apply(q, q_rot), self.apply(k, k_rot)

    def apply(self, x: Tensor, rot: Tensor) -> Tensor:
        """x [B, h, n, hd] with its first rotary_dim dimensions rotated by `rot`, the rest unchanged."""
        if self.rotary_dim == x.shape[-1]:
            return apply_rotation(x, rot)
        return torch.cat([apply_rotation(x[..., : self.rotary_dim], rot), x[..., self.rotary_dim :]], dim=-1)

    def table(self, pos: Tensor, dtype: torch.dtype) -> Tensor:
        """The rotation of `pos`, computed once per positions tensor: every layer of a forward
        receives the same one (the reference kept here keeps its identity from being reused)."""
        cached = self.__dict__.get("_table")
        if cached is None or cached[0] is not pos or cached[1] != dtype:
            cached = self.__dict__["_table"] = (pos, dtype, rotation(pos, self.rotary_dim, self.params.base, dtype,
                                                                 self.params.interpolation))
        return cached[2]


@hookimpl
def register_position_schemes():
    return [Rope]
