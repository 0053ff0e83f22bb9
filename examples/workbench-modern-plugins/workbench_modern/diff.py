"""Differential attention (Ye et al. 2024, "Differential Transformer", section 2.1): each head
splits its queries and keys into two halves, computes two softmax maps and subtracts the second,
weighted by lambda, from the first, over the head's values:

    DiffAttn(X) = (softmax(Q1 K1^T / sqrt(d)) - lambda softmax(Q2 K2^T / sqrt(d))) V
    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,  lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1))

for layer l = 1 .. L (here from the mixer's layer index), then a per-head RMSNorm without gain,
times (1 - lambda_init). The paper's own layout: each head's query and key of head_dim hold the
two halves (d = head_dim / 2 each); the value keeps its whole head_dim. Reads the layer index
from `self.layer`, which the workbench gives every mixer."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from workbench import hookimpl
from workbench.errors import SpecError
from workbench.model.attention import AttentionParams
from workbench.model.position import PositionScheme
from workbench.model.transformer import SelfAttention


class DiffAttention(SelfAttention):
    """Differential attention with the paper's layer-dependent lambda_init (Ye et al. 2024)."""

    name = "diff_attention"
    Params = AttentionParams

    def __init__(self, params, *, spec, layer, position):
        super().__init__(params, spec=spec, layer=layer, position=position)
        # Each half must hold whole pairs where the scheme rotates pairs (RoPE: (2i, 2i + 1)).
        rotates = type(position).rotate is not PositionScheme.rotate
        if self.head_dim % (4 if rotates else 2):
            raise SpecError("model.head_dim", f"differential attention halves each head"
                            f"{' and RoPE rotates pairs' if rotates else ''}: head_dim {self.head_dim} "
                            f"must be a multiple of {4 if rotates else 2}")
        half = self.head_dim // 2
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer.index)  # l - 1 = the 0-based index
        self.lambdas = nn.ParameterList(nn.Parameter(torch.randn(half) * 0.1) for _ in range(4))

    def attend(self, q, k, v, query_mask, **kwargs):
        # The layer's kernel (full attention) scales scores by 1/sqrt(head_dim); the paper's maps
        # by 1/sqrt(head_dim / 2): the query halves are scaled up by sqrt(2) to make up the difference.
        q1, q2 = (half * math.sqrt(2) for half in q.chunk(2, dim=-1))  # (B, h, n, hd/2) each
        k1, k2 = k.chunk(2, dim=-1)
        first = super().attend(q1, k1, v, query_mask, **kwargs)  # (B, h, n, hd)
        second = super().attend(q2, k2, v, query_mask, **kwargs)
        lq1, lk1, lq2, lk2 = self.lambdas
        lam = torch.exp((lq1 * lk1).sum()) - torch.exp((lq2 * lk2).sum()) + self.lambda_init
        out = F.rms_norm(first - lam * second, (v.shape[-1],))
        return (1 - self.lambda_init) * out


@hookimpl
def register_attention_variants():
    return [DiffAttention]
