"""Reordered norm (OLMo 2, Team OLMo 2024, "2 OLMo 2 Furious", section 3.2.1): the norm moves
from the sublayer's input to its output, x + norm(f(x)); the stack ends with a final norm.
Hugging Face's Olmo2DecoderLayer: post_attention_layernorm and post_feedforward_layernorm on
each sublayer's output, no input norm. Unlike Post-Norm (norm(x + f(x))) the residual stream
itself is never normalised."""

from torch import Tensor

from workbench import hookimpl
from workbench.model.norm import NormPlacement


class ReorderedNorm(NormPlacement):
    """Normalise the sublayer's output before the add: x + norm(f(x)) (OLMo 2)."""

    name = "reordered"
    final_norm = True

    def output(self, y: Tensor) -> Tensor:
        return self.norm(y)


@hookimpl
def register_norm_placements():
    return [ReorderedNorm]
