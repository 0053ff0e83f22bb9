"""Norm placements: where the normalisation sits around each residual branch.

    pre:  x = x + f(norm(x))          (GPT-2, LLaMA; a final norm before the head)
    post: x = norm(x + f(x))          (the original Transformer, BERT; no final norm)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Literal

from pydantic import Field
from torch import Tensor, nn

from workbench.variants import Params, Variant


class NormParams(Params):
    type: Literal["layernorm", "rmsnorm"] = Field("layernorm", description="normalisation layer")
    eps: float = Field(1e-5, gt=0, description="added to the variance for stability")


def make_norm(params: NormParams, d_model: int) -> nn.Module:
    if params.type == "rmsnorm":
        return nn.RMSNorm(d_model, eps=params.eps)
    return nn.LayerNorm(d_model, eps=params.eps)


class NormPlacement(Variant, nn.Module):
    """Wraps one sublayer with its residual connection and norm."""

    axis = "norm"
    Params = NormParams
    final_norm: ClassVar[bool]  # whether the stack ends with a norm before the output head

    def __init__(self, params: NormParams, *, d_model: int):
        super().__init__()
        self.params = params
        self.norm = make_norm(params, d_model)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        raise NotImplementedError
