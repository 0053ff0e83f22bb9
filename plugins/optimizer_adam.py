"""Adam (Kingma & Ba 2015, torch.optim.Adam): train.weight_decay is an L2 term in the gradient,
on the weight matrices only."""

import torch

from workbench import hookimpl
from workbench_plugins.optimizer_adamw import AdamW


class Adam(AdamW):
    """torch.optim.Adam: train.weight_decay is an L2 term in the gradient."""

    name = "adam"
    torch_class = torch.optim.Adam


@hookimpl
def register_optimizers():
    return [Adam]
