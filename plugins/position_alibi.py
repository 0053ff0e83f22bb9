"""ALiBi (Press et al. 2022): no position embedding; each head adds -slope * |i - j| to its
attention scores. Slopes form the geometric sequence 2^(-8/h), 2^(-16/h), ..., 2^(-8);
for h not a power of two, the paper's interleaving of the nearest powers is used.
Press et al. define it for causal attention; a bidirectional stack here uses the same
symmetric penalty (as MosaicBERT does), which gives a key on the left and one on the right at
the same distance the same bias. An encoder with ALiBi is therefore equivariant to reversing
its input (tests/model/test_transformer_properties.py) and cannot tell a left neighbour from a
right one (studies/position-direction.yaml).

The slopes follow the model's dtype, computed in it (exactly in a float64 model; a cast of
float32 slopes would round those that are not powers of two, e.g. 2^-0.5 at 16 heads).
"""

import math

import torch
from torch import Tensor

from workbench import hookimpl
from workbench.model.position import PositionScheme


def alibi_slopes(n_heads: int) -> list[float]:
    """The slopes of Press et al.'s reference code (`get_slopes`)."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]


class Alibi(PositionScheme):
    """Linear distance penalty on attention scores, one fixed slope per head."""

    name = "alibi"
    has_score_bias = True
    picture_note = "a linear penalty on distance, steeper for heads with larger slopes"

    def __init__(self, params, **dims):
        super().__init__(params, **dims)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(self.n_heads)), persistent=False)

    def _apply(self, fn, recurse=True):
        # .double(), .to(dtype): compute the slopes again in the new dtype rather than cast them
        super()._apply(fn, recurse)
        self.slopes = torch.tensor(alibi_slopes(self.n_heads), dtype=self.slopes.dtype, device=self.slopes.device)
        return self

    def score_bias(self, rel: Tensor) -> Tensor:
        shape = (1, self.n_heads) + (1,) * (rel.dim() - 2)
        return -self.slopes.view(shape) * rel.abs()  # [B, h, ...]


@hookimpl
def register_position_schemes():
    return [Alibi]
