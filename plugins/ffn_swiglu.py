"""Gated unit with SiLU gate: W2 (silu(W1 x) * W3 x)."""

from torch import nn

from workbench import hookimpl
from workbench.model.ffn import GatedMLP


class SwiGLU(GatedMLP):
    """Gated unit with SiLU gate: W2 (silu(W1 x) * W3 x)."""

    name = "swiglu"
    activation = nn.SiLU


@hookimpl
def register_ffn_types():
    return [SwiGLU]
