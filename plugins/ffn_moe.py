"""Mixture of experts (Shazeer et al. 2017; top-k routing as GShard, Switch, Mixtral, OLMoE and
DeepSeek-V3): a router scores each token against `n_experts` feed-forward experts, the token goes
to its `top_k` best, and their outputs are summed with the router's weights; an optional shared
expert reads every token. Each expert is any registered FFN (`expert: {name: swiglu, d_ff: 64}`),
so the active parameters per token are top_k experts (plus the shared one) out of n_experts.

Routing, as the references do it:
- `router: softmax` (Mixtral, OLMoE, Qwen3-MoE): weights = softmax over all experts, the top_k
  kept, renormalised to sum 1 when `normalize` (Mixtral: yes; OLMoE: no).
- `router: sigmoid` (DeepSeek-V3): scores = sigmoid(logits); the top_k chosen by score plus a
  per-expert selection bias (DeepSeek-V3's auxiliary-loss-free balancing: the bias rises for
  under-loaded experts by `bias_update` per training step and falls for over-loaded ones; it only
  chooses, never weights), within the `top_groups` best of `n_groups` expert groups (a group
  scores as the sum of its two best experts); weights = the chosen scores, renormalised when
  `normalize`, times `scale` (routed_scaling_factor).
- `weight_inputs` (Llama 4): the weight multiplies the expert's input instead of its output.
- `shared` (DeepSeek, Qwen3-Next, Llama 4): an FFN that reads every token, added to the routed
  sum; `shared_gate` (Qwen3-Next) scales it by sigmoid(x w).
- `capacity_factor` (GShard, Switch): each expert takes at most ceil(factor * tokens * top_k /
  n_experts) tokens of a training batch, the first ones in batch order; the rest of its tokens are
  dropped (their share is 0: the residual stream carries them). In evaluation and generation no
  token is dropped (a capacity would depend on how many tokens a call holds, and a cached decoding
  step must equal the full forward). None (the default): no token is dropped in training either,
  as Mixtral, OLMoE and DeepSeek-V3 run.

Losses (workbench.model.losses, added during training only, each recorded as a curve):
`balance_loss` * n_experts * sum_k sum_i f_ki P_i, the load-balancing loss of Switch as Hugging
Face's `load_balancing_loss_func` computes it (f_ki: the share of tokens whose k-th choice is
expert i, P_i: the mean router probability of expert i; top_k at a perfect balance), per layer,
summed over layers; `z_loss` * mean(logsumexp(logits)^2) (ST-MoE, Zoph et al. 2022). Statistics
of every training step: `moe.load_max` (the busiest expert's share of the assignments times
n_experts: 1 is a perfect balance) and `moe.dropped` (the share of assignments over capacity).

Each expert computes only the tokens routed to it (gathered, then scattered back): the FLOPs a
run counts are the active ones. Deviation: DeepSeek-V3 balances per sequence with its small
auxiliary loss; the balance loss here is the batch-wise one of Switch and Mixtral.
"""

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator, model_validator
from torch import Tensor, nn

from workbench import hookimpl
from workbench.errors import SpecError
from workbench.model.ffn import FeedForward
from workbench.model.losses import add_loss, collecting, record
from workbench.model.spec import resolve_choice
from workbench.variants import Params


class MoEParams(Params):
    n_experts: int = Field(8, ge=2, le=1024, description="routed experts per layer")
    top_k: int = Field(2, ge=1, description="experts each token is sent to")
    expert: Any = Field("swiglu", description="each expert: an FFN variant, a name or {name: ..., d_ff: ...}")
    shared: Any = Field(None, description="a shared expert every token reads (an FFN variant), or null: none")
    shared_gate: bool = Field(False, description="scale the shared expert by sigmoid(x w) (Qwen3-Next)")
    router: Literal["softmax", "sigmoid"] = Field("softmax", description="softmax over experts (Mixtral, OLMoE) or "
                                                  "a sigmoid per expert (DeepSeek-V3)")
    normalize: bool = Field(True, description="renormalise the top_k weights to sum 1")
    scale: float = Field(1.0, gt=0, description="routed output times this (DeepSeek's routed_scaling_factor)")
    weight_inputs: bool = Field(False, description="weigh each expert's input instead of its output (Llama 4)")
    n_groups: int = Field(1, ge=1, description="expert groups for group-limited routing (DeepSeek-V3's n_group)")
    top_groups: int = Field(1, ge=1, description="groups a token may choose experts from (topk_group)")
    bias_update: float = Field(0.0, ge=0, description="auxiliary-loss-free balancing: the selection bias step per "
                               "training step (DeepSeek-V3: 0.001); 0: no bias")
    capacity_factor: float | None = Field(None, gt=0, description="tokens an expert takes at most, as a multiple of "
                                          "an even share (Switch, GShard); null: no token dropped")
    balance_loss: float = Field(0.01, ge=0, description="weight of the load-balancing loss (Switch; 0: none)")
    z_loss: float = Field(0.0, ge=0, description="weight of the router z-loss (ST-MoE; 0: none)")

    @field_validator("expert", "shared")
    @classmethod
    def _ffn(cls, value, info):
        if value is None and info.field_name == "shared":
            return None
        choice = resolve_choice("ffn", value, f"model.ffn.{info.field_name}")
        if not choice.cls.is_sublayer or choice.name == "moe":
            raise SpecError(f"model.ffn.{info.field_name}", f"an expert is a dense FFN, got {choice.name!r}")
        return choice.as_dict()

    @model_validator(mode="after")
    def _routing(self):
        if self.top_k > self.n_experts:
            raise SpecError("model.ffn.top_k", f"{self.top_k} experts per token of {self.n_experts}")
        if self.n_experts % self.n_groups:
            raise SpecError("model.ffn.n_groups", f"{self.n_groups} groups do not divide {self.n_experts} experts")
        if self.top_groups > self.n_groups:
            raise SpecError("model.ffn.top_groups", f"{self.top_groups} of {self.n_groups} groups")
        if self.top_groups * (self.n_experts // self.n_groups) < self.top_k:
            raise SpecError("model.ffn.top_groups", f"{self.top_groups} groups hold fewer experts than top_k "
                            f"{self.top_k}")
        if self.n_groups > 1 and self.n_experts // self.n_groups < 2:
            raise SpecError("model.ffn.n_groups", "a group scores as its two best experts: give each at least two")
        return self


def build_ffn(mapping: dict[str, Any], d_model: int, bias: bool) -> FeedForward:
    choice = resolve_choice("ffn", mapping, "model.ffn.expert")
    return choice.cls(choice.params, d_model=d_model, bias=bias)


class MixtureOfExperts(FeedForward):
    """Top-k mixture of experts: a router, routed experts, an optional shared expert, balance losses."""

    name = "moe"
    Params = MoEParams

    def __init__(self, params: MoEParams, *, d_model: int, bias: bool):
        super().__init__(params, d_model=d_model, bias=bias)
        self.router = nn.Linear(d_model, params.n_experts, bias=False)
        self.experts = nn.ModuleList(build_ffn(params.expert, d_model, bias) for _ in range(params.n_experts))
        self.shared = None if params.shared is None else build_ffn(params.shared, d_model, bias)
        self.shared_gate = nn.Linear(d_model, 1, bias=False) if params.shared_gate and self.shared else None
        if params.router == "sigmoid" or params.bias_update > 0:  # chooses, never weights: a buffer, not trained
            self.register_buffer("selection_bias", torch.zeros(params.n_experts))
        # the weights that write into the residual stream, for the depth-scaled init
        experts = [f"experts.{i}.{name}" for i, expert in enumerate(self.experts) for name in expert.residual_outputs]
        shared = [f"shared.{name}" for name in self.shared.residual_outputs] if self.shared is not None else []
        self.residual_outputs = tuple(experts + shared)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # (T, d_model)
        logits = self.router(tokens)  # (T, E)
        weights, chosen, probs = self.route(logits)  # (T, k) each; probs (T, E) for the balance loss
        keep = self.capacity(chosen)  # (T, k): False where an expert was over capacity
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero((chosen == e) & keep, as_tuple=True)
            if rows.numel() == 0:
                continue
            weight = weights[rows, slot, None].to(tokens.dtype)  # (t, 1)
            if self.params.weight_inputs:
                out.index_add_(0, rows, expert(tokens[rows] * weight))
            else:
                out.index_add_(0, rows, expert(tokens[rows]) * weight)
        if self.params.scale != 1.0:
            out = out * self.params.scale
        if self.shared is not None:
            shared = self.shared(tokens)
            out = out + (shared * torch.sigmoid(self.shared_gate(tokens)) if self.shared_gate is not None else shared)
        if collecting():
            self.losses(logits, probs, chosen, keep)
        return out.view(shape)

    def route(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(the top_k weights, the experts chosen, every expert's probability), each token's."""
        p = self.params
        if p.router == "softmax":
            probs = scores = logits.float().softmax(-1)
        else:  # the balance loss reads each token's scores as shares (DeepSeek-V3's normalised s')
            scores = logits.float().sigmoid()
            probs = scores / scores.sum(-1, keepdim=True)
        choice = scores + self.selection_bias if hasattr(self, "selection_bias") else scores
        if p.n_groups > 1:
            choice = self.within_top_groups(choice)
        chosen = choice.topk(p.top_k, dim=-1).indices  # (T, k)
        weights = scores.gather(-1, chosen)
        if p.normalize:
            weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if p.router == "sigmoid" else 0.0))
        return weights, chosen, probs

    def within_top_groups(self, choice: Tensor) -> Tensor:
        """DeepSeek-V3's group-limited routing: experts outside a token's top_groups groups (a group
        scores as the sum of its two best experts) cannot be chosen."""
        p = self.params
        T = choice.shape[0]
        grouped = choice.view(T, p.n_groups, -1)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # (T, n_groups)
        kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(
            1, group_scores.topk(p.top_groups, dim=-1).indices, True)
        # -inf, as Hugging Face's DeepseekV3TopkRouter: with a negative selection bias a kept expert
        # may score below 0, and a masked one must still never be chosen over it
        return grouped.masked_fill(~kept[..., None], float("-inf")).view(T, -1)

    def capacity(self, chosen: Tensor) -> Tensor:
        """Which assignments each expert takes: all (no capacity), or the first `capacity` in batch
        order, the k-th choices of every token ranked after the (k-1)-th (GShard's priority)."""
        if self.params.capacity_factor is None or not self.training:
            return torch.ones_like(chosen, dtype=torch.bool)
        T, k = chosen.shape
        cap = math.ceil(self.params.capacity_factor * T * k / self.params.n_experts)
        onehot = F.one_hot(chosen.T.reshape(-1), self.params.n_experts)  # (k*T, E): choice rank major
        position = (onehot.cumsum(0) * onehot).sum(-1) - 1  # each assignment's place in its expert's queue
        return (position < cap).view(k, T).T

    @torch.no_grad()
    def update_selection_bias(self, chosen: Tensor, keep: Tensor) -> None:
        load = torch.bincount(chosen[keep], minlength=self.params.n_experts).float()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(load)  # every rank's load: the ranks' biases stay equal
        self.selection_bias += self.params.bias_update * torch.sign(load.mean() - load)

    def losses(self, logits: Tensor, probs: Tensor, chosen: Tensor, keep: Tensor) -> None:
        p = self.params
        mask = F.one_hot(chosen, p.n_experts).float()  # (T, k, E)
        if p.balance_loss > 0:
            share = mask.mean(0)  # (k, E): f_ki
            add_loss("moe.balance", p.n_experts * (share * probs.mean(0)).sum(), p.balance_loss)
        if p.z_loss > 0:
            add_loss("moe.router_z", torch.logsumexp(logits.float(), -1).square().mean(), p.z_loss)
        load = mask.sum((0, 1))
        record("moe.load_max", load.max() * p.n_experts / load.sum())
        record("moe.dropped", 1.0 - keep.float().mean())
        if p.bias_update > 0 and self.training:
            self.update_selection_bias(chosen, keep)


@hookimpl
def register_ffn_types():
    return [MixtureOfExperts]
