"""Gated unit with GELU gate (Shazeer 2020): W2 (gelu(W1 x) * W3 x), gelu(x) = x * Phi(x)
(exact, erf) or its tanh approximation (`approximate: tanh`, T5 v1.1's gated-gelu)."""

from workbench import hookimpl
from workbench.model.ffn import GatedMLP, GELUActivation


class GEGLU(GELUActivation, GatedMLP):
    """Gated unit with GELU gate: W2 (gelu(W1 x) * W3 x), gelu(x) = x Phi(x) (erf; tanh optional)."""

    name = "geglu"


@hookimpl
def register_ffn_types():
    return [GEGLU]
