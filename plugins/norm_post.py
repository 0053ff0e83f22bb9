"""Post-Norm (the original Transformer, BERT): norm(x + f(x)). Every residual sum passes
through a norm, so gradients to early layers shrink with depth; it usually needs warmup.

With the same weights a Post-Norm stack equals torch.nn.TransformerEncoderLayer(norm_first=False)
layers under a causal mask, with no final norm (tests/plugins/test_norm_post.py). What differs
is the init: ours is GPT-2's N(0, 0.02) for every matrix (model._init_weights), PyTorch's is
about 1/sqrt(fan_in). At small widths 0.02 is far below 1/sqrt(d_model) (0.125 at 64), so each
sublayer starts at about 1% of the unit-RMS stream its norm keeps: the stack starts as nearly
the identity, and with a tied head the token embeddings collapse before the sublayers grow
(studies/norm-placement.yaml, notes; benchmarks/post_norm_probe.py). Pre-Norm, whose stream
stays at the embeddings' scale, is not affected."""

from torch import Tensor

from workbench import hookimpl
from workbench.model.norm import NormPlacement


class PostNorm(NormPlacement):
    """Normalise after the residual add: norm(x + f(x))."""

    name = "post"
    final_norm = False

    def after(self, x: Tensor) -> Tensor:
        return self.norm(x)


@hookimpl
def register_norm_placements():
    return [PostNorm]
