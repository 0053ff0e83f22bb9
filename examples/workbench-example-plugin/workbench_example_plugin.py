"""KERPLE-log (Chi et al., NeurIPS 2022, "KERPLE: Kernelized Relative Positional Embedding for
Length Extrapolation"): no position embedding; head h adds

    -r1_h * log(1 + r2_h * |i - j|)

to the score of query i and key j, with r1_h, r2_h > 0 learned. Like ALiBi it penalises
distance and depends only on it (so it works causal and bidirectional), but the penalty grows
logarithmically and its two shape parameters are trained; the paper's log variant
extrapolates best among its kernels.
"""

import torch
from pydantic import Field
from torch import Tensor, nn

from workbench import hookimpl
from workbench.model.position import PositionScheme
from workbench.variants import Params


class KerpleParams(Params):
    eps: float = Field(0.01, gt=0, description="lower bound on r1 and r2: keeps the kernel conditionally positive definite")


class KerpleLog(PositionScheme):
    """Learned logarithmic distance penalty on attention scores, per head (KERPLE-log)."""

    name = "kerple"
    Params = KerpleParams
    has_score_bias = True
    picture_note = "a learned penalty growing with the log of the distance"

    def __init__(self, params: KerpleParams, **dims):
        super().__init__(params, **dims)
        # The reference implementation's initialisation: r1 ~ U(0, 2), r2 ~ U(0, 1).
        self.r1 = nn.Parameter(2 * torch.rand(self.n_heads))
        self.r2 = nn.Parameter(torch.rand(self.n_heads))

    def score_bias(self, rel: Tensor) -> Tensor:
        shape = (1, self.n_heads) + (1,) * (rel.dim() - 2)
        r1 = self.r1.clamp(min=self.params.eps).view(shape)
        r2 = self.r2.clamp(min=self.params.eps).view(shape)
        return -r1 * torch.log1p(r2 * rel.abs())  # [B, h, ...]


@hookimpl
def register_position_schemes():
    return [KerpleLog]
