"""Norm placements: where the normalisation sits around each residual branch.

Block.forward does every residual add itself; a placement decides what the sublayer reads
(`before`), what of its output joins the stream (`output`) and what becomes of the sum (`after`):

    x = x + placement.output(f(placement.before(x)))
    x = placement.after(x)

    pre:      before = norm                   ->  x + f(norm(x))          (GPT-2, Llama; a final norm before the head)
    post:     after = norm                    ->  norm(x + f(x))          (Vaswani et al. 2017, BERT; no final norm)
    sandwich: before = norm, output = norm'   ->  x + norm'(f(norm(x)))   (Gemma 2 and 3)
    reordered: output = norm                  ->  x + norm(f(x))          (OLMo 2)
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from workbench.variants import Params, Variant


class NormParams(Params):
    type: Literal["layernorm", "rmsnorm"] = Field("layernorm", description="normalisation layer")
    eps: float = Field(1e-5, gt=0, description="added to the variance for stability")


def make_norm(params: NormParams, d_model: int) -> nn.Module:
    if params.type == "rmsnorm":
        return RMSNorm(d_model, eps=params.eps)
    return nn.LayerNorm(d_model, eps=params.eps)


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm (Zhang & Sennrich 2019: x / sqrt(mean(x^2) + eps) * weight), same parameters
    and values, with a hand-written backward. PyTorch's CPU rms_norm is composed of ~5 kernels
    forward and ~12 backward (LayerNorm has a fused kernel); this one takes 3 and 6, measured
    1.8x faster forward + backward on the CPU. tests/model/test_transformer_properties.py pins values and
    gradients to nn.RMSNorm. Used on the CPU only, where it was measured: other devices keep
    PyTorch's own kernel."""

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type != "cpu" or self.weight is None:  # weightless (Llama 4's QK-norm): PyTorch's
            return super().forward(x)
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps  # nn.RMSNorm's default
        return _RMSNormFunction.apply(x, self.weight, eps)


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        mean_square = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1])
        rstd = mean_square.add_(eps).rsqrt_()  # [..., 1]
        x_hat = x * rstd
        ctx.save_for_backward(x_hat, rstd, weight)
        return x_hat * weight

    @staticmethod
    def backward(ctx, grad: Tensor):
        x_hat, rstd, weight = ctx.saved_tensors
        grad_weight = (grad * x_hat).flatten(0, -2).sum(0)
        grad_x_hat = grad * weight
        # d/dx of x * rstd: rstd * (g - x_hat * mean(g * x_hat))
        dot = (grad_x_hat * x_hat).mean(-1, keepdim=True)
        return torch.addcmul(grad_x_hat, x_hat, dot, value=-1).mul_(rstd), grad_weight, None


class NormPlacement(Variant, nn.Module):
    """Where one residual branch's norm sits: on the sublayer's input, on its output, on the
    residual sum, or several of them. Each defaults to the identity; a placement overrides where
    its norms go."""

    axis = "norm"
    Params = NormParams
    final_norm: ClassVar[bool]  # whether the stack ends with a norm before the output head

    def __init__(self, params: NormParams, *, d_model: int):
        super().__init__()
        self.params = params
        self.norm = make_norm(params, d_model)

    def before(self, x: Tensor) -> Tensor:
        """What the sublayer reads from the residual stream x [B, n, d_model]."""
        return x

    def output(self, y: Tensor) -> Tensor:
        """What joins the stream of the sublayer's output y [B, n, d_model]."""
        return y

    def after(self, x: Tensor) -> Tensor:
        """The residual stream after the add, x + output(f(before(x))) [B, n, d_model]."""
        return x
