"""No feed-forward sublayer: the ablation that tests whether attention alone suffices.
Blocks leave the sublayer out entirely (with its norm), so no unused parameters are counted."""

import torch
from torch import Tensor

from workbench import hookimpl
from workbench.model.ffn import FeedForward


class NoFFN(FeedForward):
    """No FFN (ablation): the branch adds zero."""

    name = "none"
    is_sublayer = False

    def forward(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)


@hookimpl
def register_ffn_types():
    return [NoFFN]
