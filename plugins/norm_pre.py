"""Pre-Norm (GPT-2 onwards): x + f(norm(x)). The residual path is an identity from input to
output, which is why deep stacks train without warmup; the stack ends with a final norm."""

from torch import Tensor

from workbench import hookimpl
from workbench.model.norm import NormPlacement


class PreNorm(NormPlacement):
    """Normalise the sublayer's input: x + f(norm(x))."""

    name = "pre"
    final_norm = True

    def before(self, x: Tensor) -> Tensor:
        return self.norm(x)


@hookimpl
def register_norm_placements():
    return [PreNorm]
