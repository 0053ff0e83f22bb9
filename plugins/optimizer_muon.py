"""Muon (Jordan 2024, "Muon: An optimizer for hidden layers in neural networks";
torch.optim.Muon): momentum, then the update orthogonalised by Newton-Schulz iterations, for the
hidden matrices; AdamW for the rest. The split is the reference's: the 2-D weights of the blocks
(attention and FFN projections, experts, routers) take Muon; the token embedding, the output
head, position tables, norms, biases and gains take AdamW (betas 0.9, 0.95), decayed as
`adamw` decays them (matrices only).

One learning rate (train.lr) serves both, which is what `adjust_lr: match_rms_adamw` is for
(Liu et al. 2025, "Muon is Scalable for LLM Training": each matrix's update scaled by
0.2 sqrt(max(rows, cols)) so that its RMS matches AdamW's, and AdamW's rate and decay carry
over). `adjust_lr: original` is Jordan's scaling, sqrt(max(1, rows / cols)), whose tuned rates
are about 0.02 for Muon and 3e-4 for AdamW: set train.lr for Muon and `adamw_lr_ratio` for the
rest. Weight decay (train.weight_decay) is decoupled in both.
"""

from typing import Literal

import torch
from pydantic import Field

from workbench import hookimpl
from workbench.model.optimizers import Optimizer, OptimizerChain, decay_groups, hidden_matrices
from workbench.variants import Params


class MuonParams(Params):
    momentum: float = Field(0.95, ge=0, lt=1, description="momentum of the Muon updates")
    nesterov: bool = Field(True, description="Nesterov momentum (the reference's)")
    ns_steps: int = Field(5, gt=0, le=20, description="Newton-Schulz iterations per update")
    adjust_lr: Literal["match_rms_adamw", "original"] = Field(
        "match_rms_adamw", description="per-matrix rate: match_rms_adamw (Liu et al. 2025: 0.2 sqrt(max(A, B)), "
        "AdamW's rate carries over) or original (Jordan 2024: sqrt(max(1, A / B)))")
    adamw_lr_ratio: float = Field(1.0, gt=0, description="the AdamW groups' rate as a multiple of train.lr")


class Muon(Optimizer):
    """Muon on the hidden matrices, AdamW on embeddings, head, norms and biases (torch.optim.Muon)."""

    name = "muon"
    Params = MuonParams

    def build(self, model, *, lr, weight_decay):
        hidden, rest = hidden_matrices(model)
        p = self.params
        muon = torch.optim.Muon(hidden, lr=lr, weight_decay=weight_decay, momentum=p.momentum, nesterov=p.nesterov,
                                ns_steps=p.ns_steps, adjust_lr_fn=p.adjust_lr)
        adamw = torch.optim.AdamW(decay_groups(rest, weight_decay), lr=lr * p.adamw_lr_ratio, betas=(0.9, 0.95),
                                  eps=1e-8)
        return OptimizerChain([muon, adamw])


@hookimpl
def register_optimizers():
    return [Muon]
