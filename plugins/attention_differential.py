"""Differential attention (Ye et al. 2024, "Differential Transformer"; Hugging Face's DiffLlama):
each head's output is the difference of two softmax attention maps over a value twice as wide,

    (softmax(Q1 K1^T / sqrt(d)) - lambda softmax(Q2 K2^T / sqrt(d))) [V1; V2]

followed by a per-head RMSNorm (no gain) and the factor (1 - lambda_init), with

    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,   lambda_init = 0.8 - 0.6 exp(-0.3 l)

l the 0-based index of the layer (the paper's l - 1 for its 1-based l) and lq1, lk1, lq2, lk2 learned
vectors of head_dim from N(0, 0.1). Laid out as DiffLlama lays it out, so that its weights copy
over unchanged: query heads i and i + h/2 are the two maps of differential head i; value heads
[0, h_kv/2) and [h_kv/2, h_kv) are its V1 and V2 halves (n_heads and n_kv_heads even). The paper
itself pairs adjacent heads: the same function class up to a permutation of the projections' rows.
Computed as two calls of the attention kernel (any kernel variant: `kernel`), sharing queries and
keys, one per value half, as DiffLlama does; the KV cache is the standard one. `gate` is refused:
the gate's units would straddle the two maps of a head.
"""

import math

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from workbench import hookimpl
from workbench.errors import SpecError
from workbench.model.attention import AttentionParams, kernel_options
from workbench.model.spec import Choice, resolve_choice
from workbench.model.transformer import SelfAttention

LAMBDA_STD = 0.1  # the reference's std of the lambda vectors


class DifferentialParams(AttentionParams):
    kernel: str | dict = Field("full", description="the attention kernel of both maps: a kernel variant (full, "
                               "sliding_window, ...) by name or {name: ..., <its parameters>}")

    @model_validator(mode="after")
    def _kernel(self):
        if self.gate != "none":
            raise SpecError("model.attention.gate", "differential attention normalises each head's two maps "
                            "together: a gate per unit or head would straddle them (use gate: none)")
        choice = self.kernel_choice()
        if not hasattr(choice.cls, "dense"):
            raise SpecError("model.attention.kernel", f"{choice.name} is not a kernel variant (q, k, v in)")
        return self

    def kernel_choice(self) -> Choice:
        """The kernel of both maps, scaled (and softcapped) as these params say unless the kernel's
        mapping says otherwise."""
        given = {"name": self.kernel} if isinstance(self.kernel, str) else dict(self.kernel)
        return resolve_choice("attention", {**kernel_options(self), **given}, "model.attention.kernel")


def lambda_init(layer: int) -> float:
    """The reference's lambda_init at 0-based layer index `layer`."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


class DifferentialAttention(SelfAttention):
    """Differential attention (Ye et al. 2024): the difference of two softmax maps, lambda by layer."""

    name = "differential"
    Params = DifferentialParams

    def __init__(self, params: DifferentialParams, *, spec, layer, position):
        if spec.n_heads % 2 or spec.n_kv_heads % 2:
            raise SpecError("model.n_kv_heads" if spec.n_heads % 2 == 0 else "model.n_heads",
                            f"differential attention pairs heads: n_heads ({spec.n_heads}) and n_kv_heads "
                            f"({spec.n_kv_heads}) must be even")
        super().__init__(params, spec=spec, layer=layer, position=position)
        hd = self.head_dim
        self.lambda_init = lambda_init(layer.index)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(hd) * LAMBDA_STD) for _ in range(4))
        self.subln = nn.RMSNorm(2 * hd, eps=getattr(spec.at("norm", layer.index).params, "eps", 1e-6),
                                elementwise_affine=False)

    def make_kernel(self, params: DifferentialParams):
        kernel = params.kernel_choice()
        return kernel.cls(kernel.params, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, query_mask: Tensor | None, **kwargs) -> Tensor:
        """(B, h/2, n, 2 hd): each differential head's combined output, normalised."""
        halves = (half.repeat(1, 2, 1, 1) for half in v.chunk(2, dim=1))  # V1 and V2 for every K/V head
        y = torch.cat([super(DifferentialAttention, self).attend(q, k, half, query_mask, **kwargs)
                       for half in halves], dim=-1)  # (B, h, n, 2 hd)
        first, second = y.chunk(2, dim=1)  # (B, h/2, n, 2 hd): the two maps of each differential head
        # each exp(lq . lk) summed in float32 and cast, then combined in the model's dtype, as DiffLlama does
        lam = (torch.exp((self.lambda_q1 * self.lambda_k1).sum(dtype=torch.float32)).to(q.dtype)
               - torch.exp((self.lambda_q2 * self.lambda_k2).sum(dtype=torch.float32)).to(q.dtype) + self.lambda_init)
        return (1 - self.lambda_init) * self.subln(first - lam * second)


@hookimpl
def register_attention_variants():
    return [DifferentialAttention]
