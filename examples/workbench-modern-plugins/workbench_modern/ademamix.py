"""AdEMAMix (Pagliardini, Ablin & Grangier 2024, "The AdEMAMix Optimizer: Better, Faster, Older",
Algorithm 1): Adam whose numerator mixes a fast EMA of the gradients (beta1) with a slow one
(beta3, e.g. 0.9999) weighted by alpha,

    m1 = b1 m1 + (1 - b1) g,   m2 = b3 m2 + (1 - b3) g,   nu = b2 nu + (1 - b2) g^2
    theta -= lr * ((m1 / (1 - b1^t) + alpha m2) / (sqrt(nu / (1 - b2^t)) + eps) + wd theta)

with alpha and beta3 warmed up over `warmup` steps by the paper's schedulers (0: none). Decoupled
weight decay (train.weight_decay) on the weight matrices, as the workbench's AdamW decays."""

import math

import torch
from pydantic import Field

from workbench import hookimpl
from workbench.model.optimizers import Optimizer, decay_groups
from workbench.variants import Params


class AdEMAMixParams(Params):
    beta1: float = Field(0.9, ge=0, lt=1, description="decay of the fast gradient EMA")
    beta2: float = Field(0.999, ge=0, lt=1, description="decay of the squared-gradient EMA")
    beta3: float = Field(0.9999, ge=0, lt=1, description="decay of the slow gradient EMA")
    alpha: float = Field(5.0, ge=0, description="weight of the slow EMA")
    warmup: int = Field(0, ge=0, description="steps over which alpha and beta3 rise to their values (0: none)")
    eps: float = Field(1e-8, gt=0, description="added to the denominator")


class AdEMAMixTorch(torch.optim.Optimizer):
    def __init__(self, groups, *, lr, beta1, beta2, beta3, alpha, warmup, eps):
        super().__init__(groups, dict(lr=lr, beta1=beta1, beta2=beta2, beta3=beta3, alpha=alpha, warmup=warmup, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2, b3_end, alpha_end, warmup = (group[k] for k in ("beta1", "beta2", "beta3", "alpha", "warmup"))
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, m1=torch.zeros_like(p), m2=torch.zeros_like(p), nu=torch.zeros_like(p))
                state["step"] += 1
                t = state["step"]
                alpha, b3 = alpha_end, b3_end
                if warmup:  # the paper's schedulers: alpha linear, beta3 so that its half-life grows linearly
                    alpha = min(t * alpha_end / warmup, alpha_end)
                    log_start, log_end = math.log(b1), math.log(b3_end)
                    frac = min(t / warmup, 1.0)
                    b3 = min(math.exp(log_start * log_end / ((1 - frac) * log_end + frac * log_start)), b3_end)
                g = p.grad
                state["m1"].lerp_(g, 1 - b1)
                state["m2"].lerp_(g, 1 - b3)
                state["nu"].mul_(b2).addcmul_(g, g, value=1 - b2)
                denominator = (state["nu"] / (1 - b2**t)).sqrt_().add_(group["eps"])
                update = (state["m1"] / (1 - b1**t) + alpha * state["m2"]) / denominator
                p.mul_(1 - group["lr"] * group["weight_decay"]).add_(update, alpha=-group["lr"])
        return loss


class AdEMAMix(Optimizer):
    """AdEMAMix (Pagliardini et al. 2024): Adam with a mixture of a fast and a slow gradient EMA."""

    name = "ademamix"
    Params = AdEMAMixParams

    def build(self, model, *, lr, weight_decay):
        p = self.params
        return AdEMAMixTorch(decay_groups(list(model.parameters()), weight_decay), lr=lr, beta1=p.beta1,
                             beta2=p.beta2, beta3=p.beta3, alpha=p.alpha, warmup=p.warmup, eps=p.eps)


@hookimpl
def register_optimizers():
    return [AdEMAMix]
