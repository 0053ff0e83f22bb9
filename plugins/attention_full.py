"""Full attention through PyTorch's fused kernel (F.scaled_dot_product_attention): exact
softmax attention over every allowed key, without materialising the n x n matrix when the
backend can avoid it (no score bias, no padding). With a score bias (ALiBi) on CUDA,
FlexAttention adds it inside the kernel instead of materialising an [h, n, n] bias."""

import torch.nn.functional as F
from torch import Tensor

from workbench import hookimpl
from workbench.model.attention import AttentionVariant
from workbench.model.flex import flex_applies


class FullAttention(AttentionVariant):
    """Every query reads every key (causal: every earlier key). Fused SDPA kernel."""

    name = "full"

    def forward(self, q, k, v, *, q_pos, k_pos, key_mask, causal, score_bias) -> Tensor:
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
