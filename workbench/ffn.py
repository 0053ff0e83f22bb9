"""Feed-forward sublayers: the per-token computation of each block."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from torch import Tensor, nn

from workbench.variants import Params, Variant


class FFNParams(Params):
    d_ff: int | None = Field(
        None, gt=0, description="hidden width; default 4*d_model, or 8/3*d_model when gated (same parameters)"
    )


class FeedForward(Variant, nn.Module):
    axis = "ffn"
    Params = FFNParams
    is_sublayer: ClassVar[bool] = True  # False: blocks have no FFN sublayer at all (ablation)

    def __init__(self, params: FFNParams, *, d_model: int, bias: bool):
        super().__init__()
        self.params = params


class MLP(FeedForward):
    """Two linear layers around an activation: W2 act(W1 x)."""

    activation: ClassVar[type[nn.Module]]

    def __init__(self, params: FFNParams, *, d_model: int, bias: bool):
        super().__init__(params, d_model=d_model, bias=bias)
        d_ff = params.d_ff or 4 * d_model
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.act = self.activation()
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))  # [B, n, d_model]


class GatedMLP(FeedForward):
    """Gated linear unit (Shazeer 2020): W2 (act(W1 x) * W3 x).

    Three matrices instead of two, so the default hidden width is round(8/3 * d_model):
    the parameter count then matches the 4x non-gated MLP.
    """

    activation: ClassVar[type[nn.Module]]

    def __init__(self, params: FFNParams, *, d_model: int, bias: bool):
        super().__init__(params, d_model=d_model, bias=bias)
        d_ff = params.d_ff or round(8 * d_model / 3)
        self.gate_up = nn.Linear(d_model, 2 * d_ff, bias=bias)  # W1 and W3 in one GEMM
        self.act = self.activation()
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # 2 x [B, n, d_ff]
        return self.down(self.act(gate) * up)
