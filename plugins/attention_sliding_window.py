"""Sliding-window (local) attention, as in Longformer (Beltagy et al. 2020) and Mistral:
a query at position t reads keys at positions t - window < s <= t (causal: the last `window`
positions, itself included) or |t - s| < window (bidirectional).

Cost is O(n * window), not O(n^2): queries are cut into blocks of `window` tokens and each block
attends only to the keys of its own and previous block (and the next one when bidirectional),
with the band mask applied inside those [window, 2 * window] (or [window, 3 * window]) tiles.
Decoding steps read a KV cache that keeps only the last `window` positions, through `dense()`:
O(window) per token.

Left- or right-padded batches stay on the blocked path: positions of real tokens are their
index minus a per-row shift, so the index band is the position band for every real query.
Padding queries return zeros there (`dense()` would let them read the first real token; nothing
reads their outputs). Positions that are not a per-row shift of indices fall back to `dense()`.
"""

import torch
from pydantic import Field
from torch import Tensor

from workbench import hookimpl
from workbench.model.attention import (AttentionParams, AttentionVariant, aligned_offsets, block_attention,
                                       same_sequence, zero_unaligned_queries)
from workbench.model.flex import flex_applies


class SlidingWindowParams(AttentionParams):
    window: int = Field(128, gt=0, description="positions each query reads: itself and the window - 1 before it")


class SlidingWindowAttention(AttentionVariant):
    """Each query reads the last `window` positions (bidirectional: |t - s| < window). O(n * window)."""

    name = "sliding_window"
    Params = SlidingWindowParams

    @property
    def cache_window(self) -> int:
        return self.params.window

    def allowed(self, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
        dist = q_pos - k_pos
        if causal:
            return (dist >= 0) & (dist < self.params.window)
        return dist.abs() < self.params.window

    def forward(self, q, k, v, *, q_pos, k_pos, key_mask, causal, score_bias) -> Tensor:
        if flex_applies(q, q_pos, k_pos, key_mask):  # CUDA: FlexAttention skips the empty tiles
            return self.flex(q, k, v, causal=causal, score_bias=score_bias)
        kwargs = dict(q_pos=q_pos, k_pos=k_pos, key_mask=key_mask, causal=causal, score_bias=score_bias)
        if not same_sequence(q_pos, k_pos):  # a decoding step: at most `window` cached keys
            return self.dense(q, k, v, **kwargs)
        shift = aligned_offsets(k_pos, key_mask)
        if shift is None:
            return self.dense(q, k, v, **kwargs)
        n, w = q.shape[2], self.params.window
        block = min(n, w)  # measured: smaller blocks (less masked work) ran no faster on CPU
        reach = -(-(w - 1) // block)  # the band of a query block spans `reach` blocks each side
        blocks = torch.arange(-(-n // block), device=q.device)
        span = range(-reach, 1) if causal else range(-reach, reach + 1)
        neighbours = [blocks + d for d in span]
        out = block_attention(
            q, k, v, block=block, q_blocks=blocks, kv_blocks=torch.stack(neighbours, dim=1),
            keep_pair=lambda q_idx, k_idx: self.allowed(q_idx, k_idx, causal),
            key_mask=key_mask, score_bias=score_bias, scale=self.scale,
        )[:, :, :n]
        return zero_unaligned_queries(out, q_pos, shift)


@hookimpl
def register_attention_variants():
    return [SlidingWindowAttention]
