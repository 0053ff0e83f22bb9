"""Two-layer MLP with ReLU: W2 relu(W1 x), relu(x) = max(0, x)."""

from torch import nn

from workbench import hookimpl
from workbench.model.ffn import MLP


class ReLU(MLP):
    """Two-layer MLP with ReLU: W2 relu(W1 x), relu(x) = max(0, x)."""

    name = "relu"
    activation = nn.ReLU


@hookimpl
def register_ffn_types():
    return [ReLU]
