"""Chunked (local block) attention, as Llama 4's RoPE layers do it (Meta 2025, "The Llama 4 herd";
reference: Hugging Face transformers' `Llama4TextAttention` with `attention_chunk_size` and
`masking_utils.chunked_overlay`): the sequence is cut into chunks of `chunk` positions, and a
query at position t reads only the keys of its own chunk, s // chunk == t // chunk (causal: those
at s <= t too). Positions count from each row's first real token, as transformers' overlay
counts indices after the left padding.

Unlike a sliding window, the first query of a chunk reads one key whatever came before, and
the context a query sees grows from 1 to `chunk` within each chunk.

Cost is O(n * chunk), not O(n^2): queries are cut into blocks of `chunk` tokens, and each block
attends only to the keys of its own block (and the block before it when a row's chunks do not
start at a multiple of `chunk` in index space: a left-padded batch), the chunk rule applied
inside the tiles (workbench.model.attention.block_attention). Decoding steps read a KV cache of
the last `chunk` positions, which always holds the current chunk of every row (rows of a
left-padded batch reach a chunk boundary at different steps, so the cache is a ring of `chunk`
slots, each with its position, rather than one that empties at a boundary), through `dense()`:
O(chunk) per token and `chunk` cached positions at most, as transformers' sliding cache for
its chunked layers. Positions that are not a per-row shift of indices fall back to `dense()`.
"""

import torch
from pydantic import Field
from torch import Tensor

from workbench import hookimpl
from workbench.model.attention import (AttentionParams, AttentionVariant, aligned_offsets, block_attention,
                                       same_sequence, zero_unaligned_queries)
from workbench.model.flex import flex_applies


class ChunkedParams(AttentionParams):
    chunk: int = Field(128, gt=0, description="positions per chunk: a query reads the keys of its own chunk "
                       "(Llama 4's attention_chunk_size, 8192 there)")


class ChunkedAttention(AttentionVariant):
    """Each query reads the keys of its own chunk of `chunk` positions (causal: up to itself). O(n * chunk)."""

    name = "chunked"
    Params = ChunkedParams

    @property
    def cache_window(self) -> int:
        return self.params.chunk

    def allowed(self, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
        same_chunk = torch.div(q_pos, self.params.chunk, rounding_mode="floor") == torch.div(
            k_pos, self.params.chunk, rounding_mode="floor")
        return same_chunk & (k_pos <= q_pos) if causal else same_chunk

    def forward(self, q, k, v, *, q_pos, k_pos, key_mask, causal, score_bias) -> Tensor:
        if flex_applies(q, q_pos, k_pos, key_mask):  # CUDA: FlexAttention skips the empty tiles
            return self.flex(q, k, v, causal=causal, score_bias=score_bias)
        kwargs = dict(q_pos=q_pos, k_pos=k_pos, key_mask=key_mask, causal=causal, score_bias=score_bias)
        if not same_sequence(q_pos, k_pos):  # a decoding step: at most `chunk` cached keys
            return self.dense(q, k, v, **kwargs)
        shift = aligned_offsets(k_pos, key_mask)  # [B]: position = index - shift
        if shift is None:
            return self.dense(q, k, v, **kwargs)
        n, c = q.shape[2], self.params.chunk
        block = min(n, c)  # n < c: one block holds the whole sequence
        # A row's chunks start at index shift (mod c): in step with the blocks when every shift is
        # a multiple of c, so a query block reads its own block; else a chunk straddles two.
        reach = 1 if bool((shift % c).any()) else 0
        blocks = torch.arange(-(-n // block), device=q.device)
        span = range(-reach, 1) if causal else range(-reach, reach + 1)
        row_shift = shift[:, None, None, None]  # [B, 1, 1, 1] against the tiles' [T, block, c] indices
        out = block_attention(
            q, k, v, block=block, q_blocks=blocks, kv_blocks=torch.stack([blocks + d for d in span], dim=1),
            keep_pair=lambda q_idx, k_idx: self.allowed(q_idx - row_shift, k_idx - row_shift, causal),
            key_mask=key_mask, score_bias=score_bias, scale=self.scale,
        )[:, :, :n]
        return zero_unaligned_queries(out, q_pos, shift)


@hookimpl
def register_attention_variants():
    return [ChunkedAttention]
