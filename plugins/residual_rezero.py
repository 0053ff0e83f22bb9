"""ReZero (Bachlechner et al. 2020, "ReZero is All You Need"): x + alpha f(x), alpha a learned
scalar started at 0, so that every block starts as the identity and signals and gradients pass
any depth unchanged at init.

Deviations: the paper drops LayerNorm altogether; here the norm stays where model.norm puts it
(Pre-Norm by default: x + alpha f(norm(x)), still the identity at init), because the norm is an
axis of its own and no placement without a norm ships. With norm: post the block starts as
norm(x) instead. The paper's Transformer layer (their RZTXEncoderLayer) shares one alpha between
its attention and FFN; here each sublayer has its own, as the paper's formula x_{i+1} = x_i +
alpha_i F(x_i) writes it per residual branch."""

import torch
from torch import Tensor, nn

from workbench import hookimpl
from workbench.model.residual import Depth, Residual
from workbench.variants import Params


class ReZero(Residual):
    """x + alpha f(x): a learned scalar on the branch, started at 0 (each block the identity)."""

    name = "rezero"

    def __init__(self, params: Params, *, d_model: int, depth: Depth):
        super().__init__(params, d_model=d_model, depth=depth)
        self.alpha = nn.Parameter(torch.zeros(1))  # [1], as the reference's `resweight`

    def branch(self, y: Tensor) -> Tensor:
        return self.alpha * y  # [B, n, d_model]


@hookimpl
def register_residual_connections():
    return [ReZero]
