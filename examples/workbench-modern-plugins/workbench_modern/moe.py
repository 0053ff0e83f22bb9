"""A top-k mixture-of-experts FFN with the load-balancing loss of Switch Transformers (Fedus et al.
2022, eq. 4-6; as Mixtral and OLMoE train): a linear router scores each token against E experts
(each a SwiGLU MLP), the token is sent to its top k, and their outputs are summed with the
softmax weights renormalised over the k. The auxiliary loss alpha * E * sum_i f_i P_i (f_i: the
share of routed slots that go to expert i, P_i: expert i's mean router probability) reaches the
training loss through workbench.model.losses.add_loss, which does nothing outside a training
step, so no evaluation metric sees it."""

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from workbench import hookimpl
from workbench.errors import SpecError
from workbench.model.ffn import FeedForward
from workbench.model.losses import add_loss
from workbench.variants import Params


class TopKParams(Params):
    experts: int = Field(4, ge=2, description="experts per layer")
    k: int = Field(2, ge=1, description="experts per token")
    d_ff: int | None = Field(None, gt=0, description="each expert's hidden width (default 8/3 d_model / k)")
    alpha: float = Field(0.01, ge=0, description="weight of the load-balancing loss")

    @model_validator(mode="after")
    def _k(self):
        if self.k > self.experts:
            raise SpecError("model.ffn.k", f"{self.k} experts per token of {self.experts}")
        return self


class TopKMoE(FeedForward):
    """Top-k mixture of SwiGLU experts with the Switch load-balancing loss."""

    name = "topk_moe"
    Params = TopKParams

    def __init__(self, params, *, d_model, bias):
        super().__init__(params, d_model=d_model, bias=bias)
        d_ff = params.d_ff or max(1, round(8 * d_model / 3 / params.k))
        self.router = nn.Linear(d_model, params.experts, bias=False)
        self.w_gate = nn.Parameter(torch.empty(params.experts, d_model, d_ff))
        self.w_up = nn.Parameter(torch.empty(params.experts, d_model, d_ff))
        self.w_down = nn.Parameter(torch.empty(params.experts, d_ff, d_model))
        self.residual_outputs = ("w_down",)  # what writes into the residual stream: the depth-scaled init

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1])  # (T, d)
        probs = self.router(tokens).float().softmax(-1)  # (T, E)
        weights, chosen = probs.topk(self.params.k, dim=-1)  # (T, k)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(tokens)
        for e in range(self.params.experts):
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel():
                h = tokens[rows]
                y = (F.silu(h @ self.w_gate[e]) * (h @ self.w_up[e])) @ self.w_down[e]
                out.index_add_(0, rows, y * weights[rows, slot, None])
        share = F.one_hot(chosen, self.params.experts).float().mean((0, 1))  # f_i
        add_loss("balance", self.params.experts * (share * probs.mean(0)).sum(), self.params.alpha)
        return out.view_as(x)


@hookimpl
def register_ffn_types():
    return [TopKMoE]
