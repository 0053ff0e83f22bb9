"""The plain residual connection of the Transformer (Vaswani et al. 2017) and GPT-2: x + f(x),
the skip and the branch added as they are. The default: a model without `model.residual` is
this one, and a stored run config leaves it out (run ids from before the axis stand)."""

import torch

from workbench import hookimpl
from workbench.model.residual import Residual


class Plain(Residual):
    """x + f(x): the sublayer's output added to the stream as it is."""

    name = "plain"
    # `x + y` itself: the default path calls no skip or branch hook (so a connection of your own
    # derives from Residual, not from Plain, whose add never calls them)
    add = staticmethod(torch.add)


@hookimpl
def register_residual_connections():
    return [Plain]
