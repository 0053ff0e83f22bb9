"""Post-Norm (the original Transformer, BERT): norm(x + f(x)). Every residual sum passes
through a norm, so gradients to early layers shrink with depth; it usually needs warmup."""

from collections.abc import Callable

from torch import Tensor

from workbench import hookimpl
from workbench.model.norm import NormPlacement


class PostNorm(NormPlacement):
    """Normalise after the residual add: norm(x + f(x))."""

    name = "post"
    final_norm = False

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self.norm(x + sublayer(x))


@hookimpl
def register_norm_placements():
    return [PostNorm]
