"""Two-layer MLP with GELU: W2 gelu(W1 x), gelu(x) = x * Phi(x) (exact, erf) or its tanh
approximation (`approximate: tanh`, GPT-2's gelu_new)."""

from workbench import hookimpl
from workbench.model.ffn import MLP, GELUActivation


class GELU(GELUActivation, MLP):
    """Two-layer MLP with GELU: W2 gelu(W1 x), gelu(x) = x Phi(x) (erf; tanh approximation optional)."""

    name = "gelu"


@hookimpl
def register_ffn_types():
    return [GELU]
