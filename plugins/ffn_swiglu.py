"""Gated unit with SiLU gate (Shazeer 2020): W2 (silu(W1 x) * W3 x), silu(x) = x * sigmoid(x)."""

from torch import nn

from workbench import hookimpl
from workbench.model.ffn import GatedMLP


class SwiGLU(GatedMLP):
    """Gated unit with SiLU gate (Shazeer 2020): W2 (silu(W1 x) * W3 x), silu(x) = x * sigmoid(x)."""

    name = "swiglu"
    activation = nn.SiLU


@hookimpl
def register_ffn_types():
    return [SwiGLU]
