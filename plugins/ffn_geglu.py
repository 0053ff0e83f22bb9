"""Gated unit with GELU gate: W2 (gelu(W1 x) * W3 x)."""

from torch import nn

from workbench import hookimpl
from workbench.model.ffn import GatedMLP


class GEGLU(GatedMLP):
    """Gated unit with GELU gate: W2 (gelu(W1 x) * W3 x)."""

    name = "geglu"
    activation = nn.GELU


@hookimpl
def register_ffn_types():
    return [GEGLU]
