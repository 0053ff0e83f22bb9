"""Full attention through PyTorch's fused kernel (F.scaled_dot_product_attention): exact
softmax attention over every allowed key, without materialising the n x n matrix when the
backend can avoid it (no score bias, no padding). With a score bias (ALiBi) on CUDA,
FlexAttention adds it inside the kernel instead of materialising an [h, n, n] bias.

`length_scaled: true` is Scalable-Softmax (SSMax, Nakanishi 2025, "Scalable-Softmax Is Superior
for Attention"): each query's scores are multiplied by s * log(n), n the number of keys it reads
and s a learned scalar per head (starting at the paper's 0.43), so that a softmax over more keys
does not flatten. Done by scaling the queries, so the fused kernel still computes it. Deviations:
with a score bias (ALiBi, T5's) only q.k is scaled, not the bias (the paper's models have none);
counting the keys of a causal or padded row takes an [nq, nk] boolean relation.
"""

import math

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from workbench import hookimpl
from workbench.model.attention import AttentionParams, AttentionVariant
from workbench.model.flex import flex_applies

SSMAX_INIT = 0.43  # Nakanishi 2025's starting value of s


class FullAttentionParams(AttentionParams):
    added_later = ("length_scaled",)  # runs stored before it keep their ids
    length_scaled: bool = Field(False, description="Scalable-Softmax (Nakanishi 2025): scores times s * log(keys "
                                "read), s learned per head; keeps attention from flattening on longer inputs")


class FullAttention(AttentionVariant):
    """Every query reads every key (causal: every earlier key). Fused SDPA kernel."""

    name = "full"
    Params = FullAttentionParams

    def __init__(self, params: FullAttentionParams, **dims):
        super().__init__(params, **dims)
        if params.length_scaled:
            self.ssmax_scale = nn.Parameter(torch.full((self.n_heads,), SSMAX_INIT))

    def length_scaled_queries(self, q: Tensor, q_pos: Tensor, k_pos: Tensor, key_mask: Tensor | None,
                              causal: bool) -> Tensor:
        """q times s * log(n), n the keys each query reads (at least 1: a padding query reads none)."""
        if key_mask is None and not causal:  # every query reads every key
            log_n = math.log(k_pos.shape[-1])
        else:
            log_n = self.visible_keys(q_pos, k_pos, key_mask, causal).sum(-1, keepdim=True).clamp_min(1).to(q.dtype).log()
        return q * (self.ssmax_scale.view(1, -1, 1, 1) * log_n).to(q.dtype)  # [B, h, nq, hd]

    def dense(self, q, k, v, *, q_pos, k_pos, key_mask, causal, score_bias, return_weights=False):
        if self.params.length_scaled:
            q = self.length_scaled_queries(q, q_pos, k_pos, key_mask, causal)
        return super().dense(q, k, v, q_pos=q_pos, k_pos=k_pos, key_mask=key_mask, causal=causal,
                             score_bias=score_bias, return_weights=return_weights)

    def forward(self, q, k, v, *, q_pos, k_pos, key_mask, causal, score_bias) -> Tensor:
        if self.params.length_scaled:
            q = self.length_scaled_queries(q, q_pos, k_pos, key_mask, causal)
        nq, nk = q.shape[2], k.shape[2]
        sdpa = dict(scale=self.scale, enable_gqa=self.n_kv_heads != self.n_heads)
        if key_mask is None and score_bias is None:
            if not causal or nq == 1:  # one decoding step never has future keys in its cache
                return F.scaled_dot_product_attention(q, k, v, **sdpa)
            if nq == nk:  # queries and keys are the same positions: the kernel's own causal mask
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, **sdpa)
        if score_bias is not None and flex_applies(q, q_pos, k_pos, key_mask):
            return self.flex(q, k, v, causal=causal, score_bias=score_bias)  # CUDA: no n x n bias tensor
        if key_mask is None and q_pos.stride(0) == 0 and k_pos.stride(0) == 0:
            # Every row holds the same positions (an expanded arange): one row of mask and bias
            # broadcasts over the batch instead of B copies of [h, nq, nk].
            q_pos, k_pos = q_pos[:1], k_pos[:1]
        keep = self.allowed(q_pos[:, :, None], k_pos[:, None, :], causal)  # [B or 1, nq, nk]
        if key_mask is not None:
            keep = keep & key_mask[:, None, :]
        keep = keep[:, None]  # [B, 1, nq, nk]
        if score_bias is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, **sdpa)
        bias = score_bias((q_pos[:, :, None] - k_pos[:, None, :])[:, None]).to(q.dtype)  # [B or 1, h, nq, nk]
        bias = bias.masked_fill(~keep, float("-inf"))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, **sdpa)
        # Rows with no readable key (padding queries) are NaN under a float mask: zero them.
        return out.masked_fill(~keep.any(-1, keepdim=True), 0.0)


@hookimpl
def register_attention_variants():
    return [FullAttention]
