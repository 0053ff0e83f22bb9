"""Attention variants: which keys each query reads, and how the scores are computed.

A variant receives queries, keys and values already projected and split into heads
(and rotated by the position scheme), and returns the per-head outputs:

    q: [B, h, nq, hd]   k, v: [B, h_kv, nk, hd]   ->   [B, h, nq, hd]

h_kv divides h: h_kv == h is multi-head attention, 1 < h_kv < h grouped-query (GQA),
h_kv == 1 multi-query (MQA); each group of h / h_kv query heads shares one K/V head.

`allowed(q_pos, k_pos, causal)` states the variant's pattern as a boolean relation on
positions. `dense()` computes attention through that relation with an explicit score
matrix: it is the reference that tests compare the fast paths against, the path that
returns attention weights for heatmaps, and the decode path where nq * nk is small.
Fast paths (fused kernels, blocked local attention) live in `forward()`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pydantic import Field
from torch import Tensor, nn

from workbench.variants import Params, Variant

ScoreBias = Callable[[Tensor], Tensor]


class AttentionParams(Params):
    scaled: bool = Field(
        True, description="divide scores by sqrt(head_dim); false is the unscaled ablation"
    )


class AttentionVariant(Variant, nn.Module):
    axis = "attention"
    Params = AttentionParams

    def __init__(self, params: AttentionParams, *, n_heads: int, n_kv_heads: int, head_dim: int):
        super().__init__()
        self.params = params
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.scale = head_dim**-0.5 if params.scaled else 1.0

    @property
    def cache_window(self) -> int | None:
        """How many most recent positions decoding must keep in the KV cache (None: all)."""
        return None

    def allowed(self, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
        """Boolean 'query at q_pos may read key at k_pos', for broadcastable position tensors."""
        return k_pos <= q_pos if causal else torch.ones_like(q_pos == k_pos)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        q_pos: Tensor,
        k_pos: Tensor,
        key_mask: Tensor | None,
        causal: bool,
        score_bias: ScoreBias | None,
    ) -> Tensor:
        """key_mask: [B, nk], True for real tokens (None: all real).
        Rows with no readable key (padding queries only) return zeros."""
        return self.dense(q, k, v, q_pos=q_pos, k_pos=k_pos, key_mask=key_mask, causal=causal,
                          score_bias=score_bias)

    def dense(self, q, k, v, *, q_pos, k_pos, key_mask, causal, score_bias, return_weights=False):
        """Reference: explicit [B, h, nq, nk] scores masked by `allowed`. O(nq * nk) memory."""
        k, v = repeat_kv(k, self.n_heads), repeat_kv(v, self.n_heads)  # [B, h, nk, hd]
        scores = (q @ k.transpose(-2, -1)) * self.scale  # [B, h, nq, nk]
        if score_bias is not None:
            scores = scores + score_bias((q_pos[:, :, None] - k_pos[:, None, :])[:, None])
        keep = self.allowed(q_pos[:, :, None], k_pos[:, None, :], causal)  # [B, nq, nk]
        if key_mask is not None:
            keep = keep & key_mask[:, None, :]
        keep = keep[:, None]  # [B, 1, nq, nk]
        weights = masked_softmax(scores, keep)
        out = weights @ v  # [B, h, nq, hd]
        return (out, weights) if return_weights else out


def repeat_kv(x: Tensor, n_heads: int) -> Tensor:
    """[B, h_kv, n, hd] -> [B, h, n, hd]: each K/V head serves h / h_kv query heads."""
    groups = n_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def masked_softmax(scores: Tensor, keep: Tensor) -> Tensor:
    """Softmax over the last axis among kept entries; all-masked rows give zeros.

    Masked entries get the dtype's lowest finite value rather than -inf so that all-masked
    rows stay finite in the backward pass; they are zeroed afterwards."""
    scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    return weights * keep.any(dim=-1, keepdim=True)
