"""Two-layer MLP with GELU: W2 gelu(W1 x)."""

from torch import nn

from workbench import hookimpl
from workbench.model.ffn import MLP


class GELU(MLP):
    """Two-layer MLP with GELU: W2 gelu(W1 x)."""

    name = "gelu"
    activation = nn.GELU


@hookimpl
def register_ffn_types():
    return [GELU]
