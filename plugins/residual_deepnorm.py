"""DeepNorm (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers", sec. 4 and
fig. 2): Post-LN with the skip weighted up, LN(alpha x + f(x)), and the branches' FFN, value and
output projections initialised beta times smaller, so that the model update stays bounded with
depth. alpha and beta follow from the stack depths:

    encoder-only or decoder-only, N layers:   alpha = (2N)^(1/4),   beta = (8N)^(-1/4)
    encoder-decoder, N encoder and M decoder layers:
        encoder:  alpha = 0.81 (N^4 M)^(1/16),   beta = 0.87 (N^4 M)^(-1/16)
        decoder:  alpha = (3M)^(1/4),            beta = (12M)^(-1/4)

Requires norm: post (the spec refuses another placement). Deviations: the paper initialises
those projections with Xavier normal of gain beta (and q, k with gain 1); here every matrix
keeps the model's N(0, 0.02) init and beta multiplies the FFN's matrices, the value rows and the
output projection (as the authors' torchscale divides its default init), in place of GPT-2's
1/sqrt(2 * layers) on the output projections. Cross-attention is scaled as self-attention is
(torchscale does so too)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from workbench import hookimpl
from workbench.errors import SpecError
from workbench.model.ffn import FeedForward
from workbench.model.residual import Depth, Residual, residual_outputs
from workbench.variants import Params


def deepnorm_constants(depth: Depth) -> tuple[float, float]:
    """(alpha, beta) of fig. 2 for a block at `depth`."""
    n, m = depth.encoder_layers, depth.decoder_layers
    if n == 0 or m == 0:  # one stack
        layers = n or m
        return (2 * layers) ** 0.25, (8 * layers) ** -0.25
    if depth.in_decoder:
        return (3 * m) ** 0.25, (12 * m) ** -0.25
    return 0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)


class DeepNorm(Residual):
    """LN(alpha x + f(x)) with a beta-scaled init of the branches (alpha, beta from the depth)."""

    name = "deepnorm"
    norm_placement = "post"
    depth_scaled_init = False  # beta sets the output projections' scale instead

    def __init__(self, params: Params, *, d_model: int, depth: Depth):
        super().__init__(params, d_model=d_model, depth=depth)
        self.alpha, self.beta = deepnorm_constants(depth)

    def skip(self, x: Tensor) -> Tensor:
        return self.alpha * x  # [B, n, d_model]

    def init_branch(self, sublayer: nn.Module) -> None:
        if isinstance(sublayer, FeedForward):
            scaled = [p for p in sublayer.parameters() if p.dim() >= 2]
        else:  # self- or cross-attention: the values and the output, not the queries and keys
            if not hasattr(sublayer, "value_projection"):
                raise SpecError("model.residual", f"deepnorm scales the weights that compute each attention layer's "
                                f"values, and {type(sublayer).__name__} does not say which they are (value_projection)")
            scaled = [sublayer.value_projection(), *residual_outputs(sublayer)]
        with torch.no_grad():
            for weight in scaled:
                weight.mul_(self.beta)


@hookimpl
def register_residual_connections():
    return [DeepNorm]
