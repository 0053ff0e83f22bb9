"""Block-sparse attention: the BigBird pattern (Zaheer et al. 2020, "ITC": global tokens are
existing tokens). The sequence is cut into blocks of `block` positions; a query in block i reads

- local:  blocks i-1, i, i+1 (causal: i-1 and i, with the causal mask inside block i);
- global: the first `n_global_blocks` blocks, which every query reads; bidirectional only:
          queries in those blocks also read every key (causal: they read every earlier key,
          which the pattern already gives them);
- random: `n_random_blocks` distinct blocks per query block, drawn separately for every layer
          and every head, among the blocks that are neither local nor global, as BigBird's
          `bigbird_block_rand_mask` draws them: bidirectional from both sides (blocks g .. N-1
          but i-1, i, i+1, N = the row's number of blocks); causal from the earlier blocks
          g .. i-2. Fewer candidates than `n_random_blocks` (short rows): fewer blocks.

The draw is a pure function of (seed, layer key, head, query block, candidate), so it stays
fixed for the model's life and cached decoding reads what the full forward reads: block j is
drawn when its hash is among the `n_random_blocks` smallest over the candidates. The layer key
is sampled from torch's RNG when the layer is built (it follows the run's seed and differs per
layer) and kept as a buffer, so checkpoints restore the pattern.

What still differs from the paper, and why:
- The random graph is resampled per run seed (BigBird seeds it with the layer index), so seeds
  of a study are also replicates of the pattern.
- BigBird draws over the padded input length; here N is the row's own number of blocks (its
  last key position), so a padded row reads exactly what it reads alone (claim P7) and
  evaluation does not depend on batching.
- Causal models draw only earlier blocks: BigBird is defined for bidirectional encoders (its
  decoder uses full attention); a causal query cannot read later blocks anyway.
- BigBird's ITC also makes the last block global; here only the first `n_global_blocks` are,
  which keeps causal and bidirectional patterns alike and the count a parameter.
- The local window is three whole blocks (BigBird's sliding keys are blocks, as here).

Cost: each query block attends to at most 3 + g + r gathered key blocks: O(n * block * (3 + g + r))
work and memory per head; bidirectional global rows are a separate O(g * block * n) full-row
computation. Since every head reads its own blocks, K/V heads shared by several query heads
(GQA/MQA) are copied per query head before the blocks are gathered. A decoding step
gathers only the key blocks its query reads from the cache: O(block * (2 + g + r)) per head.

Padded batches: positions of real tokens are their index minus a per-row shift (left padding);
rows are rolled so that index == position, which keeps the blocked path exact for every real
query. Padding queries return zeros (nothing reads them). Any other position layout falls back
to `dense()`.
"""

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from workbench import hookimpl
from workbench.model.attention import (AttentionParams, AttentionVariant, aligned_offsets, block_attention,
                                       masked_softmax, repeat_kv, same_sequence, zero_unaligned_queries)
from workbench.model.flex import flex_applies

_PRIME = 2**31 - 1  # hash arithmetic stays below 2^48: exact in int64 on every device


def _mix(x: Tensor) -> Tensor:
    """Integer hash on [0, 2^31): xor-shift and multiply rounds (MINSTD multipliers)."""
    for multiplier in (48271, 69621, 48271):
        x = ((x ^ (x >> 15)) * multiplier) % _PRIME
    return x


def random_blocks(q_blocks: Tensor, n_random: int, n_global: int, key: Tensor | int,
                  n_blocks: Tensor | int | None = None) -> tuple[Tensor, Tensor]:
    """The random key blocks of each query block: (blocks [..., r], valid [..., r]).

    q_blocks, key (one per layer and head, in [0, 2^31)) and n_blocks broadcast together to
    [...]. Candidates for query block i: causal (n_blocks None) g .. i-2; bidirectional
    g .. n_blocks-1 except i-1, i, i+1. The r with the smallest hash(key, i, j) are drawn (the
    index breaks ties), so the draw depends only on (key, i) and, bidirectional, n_blocks."""
    key = torch.as_tensor(key, device=q_blocks.device)
    i = q_blocks[..., None]  # [..., 1]
    if n_blocks is not None:
        n_blocks = torch.as_tensor(n_blocks, device=q_blocks.device)[..., None]  # [..., 1]
        n_cand = max(int(n_blocks.max()), 1) if n_blocks.numel() else 1
    else:
        n_cand = int(q_blocks.max()) + 1 if q_blocks.numel() else 1
    r = min(n_random, n_cand)
    cand = torch.arange(n_cand, device=q_blocks.device)
    if n_blocks is None:
        eligible = (cand >= n_global) & (cand <= i - 2)
    else:
        eligible = (cand >= n_global) & ((cand - i).abs() >= 2) & (cand < n_blocks)
    h = _mix(_mix(key[..., None] % _PRIME) ^ i) ^ cand
    h = _mix(h) * n_cand + cand  # unique per candidate
    h = h.masked_fill(~eligible, torch.iinfo(torch.int64).max)
    drawn = h.topk(r, dim=-1, largest=False).indices  # [..., r]
    return drawn, eligible.expand_as(h).gather(-1, drawn)


class SparseParams(AttentionParams):
    block: int = Field(64, gt=0, description="tokens per block of the block-sparse pattern")
    n_global_blocks: int = Field(1, ge=0, description="leading blocks that every query reads (and, bidirectional, that read every key)")
    n_random_blocks: int = Field(1, ge=0, description="random blocks each query block reads, drawn per layer and head "
                                 "(bidirectional: from both sides; causal: earlier blocks)")
    seed: int = Field(0, ge=0, description="seed of the random-block draw, mixed with each layer's key (drawn from the "
                      "run's RNG when the model is built) and the head index")


class SparseAttention(AttentionVariant):
    """BigBird block-sparse pattern: local + global + random blocks, random ones per layer and
    head. O(n * block * (3 + g + r)) per head."""

    name = "sparse"
    Params = SparseParams

    def __init__(self, params: SparseParams, **dims):
        super().__init__(params, **dims)
        # This layer's draw key: one integer from the run's RNG, kept (and checkpointed) for life.
        self.register_buffer("layer_key", torch.randint(0, _PRIME, ()))

    def head_keys(self) -> Tensor:
        """The draw key of each head: [h]."""
        heads = torch.arange(self.n_heads, device=self.layer_key.device)
        return _mix(_mix(_mix(self.layer_key + self.params.seed % _PRIME) ^ heads))

    def allowed(self, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
        """Per head: q_pos [..., 1, nq, 1] and k_pos [..., 1, 1, nk] (a singleton head axis at
        -3, or 2-D [nq, 1] / [1, nk]) -> [..., h, nq, nk], head j's pattern at index j of axis
        -3. Bidirectional, the random draw depends on the row's number of blocks, read from the
        largest position on k_pos's last axis: k_pos must span the row."""
        p = self.params
        qb, kb = q_pos // p.block, k_pos // p.block
        local = (qb - kb).abs() <= 1
        glob = kb < p.n_global_blocks
        if not causal:
            glob = glob | (qb < p.n_global_blocks)
        n_blocks = None if causal else kb.amax(-1, keepdim=True) + 1  # [..., 1, 1, 1]: the row's blocks
        keys = self.head_keys()[:, None, None]  # [h, 1, 1]
        drawn, valid = random_blocks(qb, p.n_random_blocks, p.n_global_blocks, keys, n_blocks)  # [..., h, nq, 1, r]
        rand = ((drawn == kb[..., None]) & valid).any(-1)  # [..., h, nq, nk]
        reads = local | glob | rand
        return reads & (k_pos <= q_pos) if causal else reads

    def key_blocks(self, q_blocks: Tensor, causal: bool, key: Tensor, n_blocks: Tensor | int | None = None) -> Tensor:
        """Key blocks read by each query block [...] under draw key(s) `key` (broadcast with
        q_blocks) -> [..., S], each block once; -1 marks an empty slot (a global or random block
        that is also local, or none left to draw)."""
        p = self.params
        q_blocks, key = torch.broadcast_tensors(q_blocks, key)
        i = q_blocks[..., None]
        local = i + torch.tensor([-1, 0] if causal else [-1, 0, 1], device=i.device)
        glob = torch.arange(p.n_global_blocks, device=i.device).expand(*i.shape[:-1], -1)
        # A global block is already read as a local one, or (causal) lies in the future.
        glob = glob.masked_fill(((glob - i).abs() <= 1) | (causal & (glob > i)), -1)
        drawn, valid = random_blocks(q_blocks, p.n_random_blocks, p.n_global_blocks, key, n_blocks)
        return torch.cat([local, glob, drawn.masked_fill(~valid, -1)], dim=-1)

    def forward(self, q, k, v, *, q_pos, k_pos, key_mask, causal, score_bias) -> Tensor:
        if flex_applies(q, q_pos, k_pos, key_mask):  # CUDA: FlexAttention skips the empty tiles
            return self.flex(q, k, v, causal=causal, score_bias=score_bias)
        kwargs = dict(q_pos=q_pos, k_pos=k_pos, key_mask=key_mask, causal=causal, score_bias=score_bias)
        shift = aligned_offsets(k_pos, key_mask)
        if shift is None:
            return self.dense(q, k, v, **kwargs)
        if not same_sequence(q_pos, k_pos):
            if causal and q.shape[2] == 1:
                return self._decode_step(q, k, v, shift, **kwargs)
            return self.dense(q, k, v, **kwargs)
        # Blocks are counted in positions: roll each row so that index == position.
        n = q.shape[2]
        outside = (k_pos < 0) | (k_pos >= n)
        if bool((outside if key_mask is None else outside & key_mask).any()):
            return self.dense(q, k, v, **kwargs)
        rolled = bool(shift.any())
        if rolled:
            src = (torch.arange(n, device=q.device) + shift[:, None]) % n  # [B, n]
            q, k, v = (roll_rows(x, src) for x in (q, k, v))
            key_mask = key_mask.gather(1, src)
        out = self._blocked(q, k, v, key_mask=key_mask, causal=causal, score_bias=score_bias)
        if rolled:
            out = roll_rows(out, (torch.arange(n, device=q.device) - shift[:, None]) % n)
        return zero_unaligned_queries(out, q_pos, shift)

    def _blocked(self, q, k, v, *, key_mask, causal, score_bias) -> Tensor:
        """The pattern on aligned rows (index == position): real tokens sit at 0 .. length-1."""
        B, n, bs = q.shape[0], q.shape[2], self.params.block
        if causal:  # the causal draw does not depend on the row's length
            return self._blocked_rows(q, k, v, key_mask=key_mask, causal=True, score_bias=score_bias, n_blocks=None)
        # Bidirectional: each row draws over its own number of blocks; rows alike go together.
        lengths = torch.full((B,), n, device=q.device) if key_mask is None else key_mask.sum(-1)
        row_blocks = -(-lengths // bs)  # [B]
        groups = row_blocks.unique()
        if len(groups) == 1:
            return self._blocked_rows(q, k, v, key_mask=key_mask, causal=False, score_bias=score_bias,
                                      n_blocks=int(groups[0]))
        out = q.new_zeros(q.shape)
        for n_blocks in groups.tolist():
            rows = (row_blocks == n_blocks).nonzero()[:, 0]
            out[rows] = self._blocked_rows(q[rows], k[rows], v[rows], key_mask=key_mask[rows], causal=False,
                                           score_bias=score_bias, n_blocks=n_blocks)
        return out

    def _blocked_rows(self, q, k, v, *, key_mask, causal, score_bias, n_blocks) -> Tensor:
        """Rows sharing one random draw (causal, or one row length in blocks)."""
        B, h, n, hd = q.shape
        bs, g = self.params.block, self.params.n_global_blocks
        nb = -(-n // bs)
        blocks = torch.arange(nb, device=q.device)
        real = torch.ones(B, n, dtype=torch.bool, device=q.device) if key_mask is None else key_mask
        # Bidirectional global query blocks read every key block (the same for every head).
        n_glob = 0 if causal else min(g, nb)
        glob_rows = None
        if n_glob:
            glob_rows = block_attention(q, k, v, block=bs, q_blocks=blocks[:n_glob], kv_blocks=blocks.expand(n_glob, -1),
                                        keep_pair=None, key_mask=key_mask, score_bias=score_bias, scale=self.scale)
        rest = blocks[n_glob:]
        if len(rest) == 0:
            return glob_rows[:, :, :n]
        # Each head reads its own random blocks: lay the heads side by side on one axis (head j's
        # index t at j * nb * bs + t, each head padded to whole blocks) so that one blocked call
        # serves them all; block b of head j is block j * nb + b.
        T = len(rest)
        kv_blocks = self.key_blocks(rest, causal, self.head_keys()[:, None], n_blocks)  # [h, T, S]
        head_first = (torch.arange(h, device=q.device) * nb)[:, None, None]  # [h, 1, 1]
        kv_blocks = torch.where((kv_blocks >= 0) & (kv_blocks < nb), kv_blocks + head_first, -1)
        q_blocks = (rest + head_first[:, :, 0]).flatten()  # [h * T]

        def side_by_side(x: Tensor) -> Tensor:  # [B, h or h_kv, n, hd] -> [B, 1, h * nb * bs, hd]
            return F.pad(repeat_kv(x, h), (0, 0, 0, nb * bs - n)).reshape(B, 1, h * nb * bs, hd)

        def bias(rel: Tensor) -> Tensor:  # [1, 1, h * T, bs, c] -> each head's own bias, same shape
            return score_bias(rel.view(1, h, T, *rel.shape[3:])).reshape(rel.shape)

        other_rows = block_attention(
            side_by_side(q), side_by_side(k), side_by_side(v), block=bs, q_blocks=q_blocks,
            kv_blocks=kv_blocks.flatten(0, 1), keep_pair=(lambda q_idx, k_idx: k_idx <= q_idx) if causal else None,
            key_mask=F.pad(real, (0, nb * bs - n)).repeat(1, h), score_bias=None if score_bias is None else bias,
            scale=self.scale,
        ).view(B, h, T * bs, hd)
        rows = other_rows if glob_rows is None else torch.cat([glob_rows, other_rows], dim=2)
        return rows[:, :, :n]

    def _decode_step(self, q, k, v, shift, *, q_pos, k_pos, key_mask, causal, score_bias) -> Tensor:
        """One new query per row: each head gathers only its key blocks from the cache (index =
        position + shift) and attends over those O(block * (2 + g + r)) keys."""
        bs, nk = self.params.block, k.shape[2]
        blocks = self.key_blocks((q_pos[:, 0] // bs)[:, None], causal, self.head_keys())  # [B, h, S]
        idx = (blocks[..., None] * bs + torch.arange(bs, device=q.device)).flatten(2)  # [B, h, S*bs] positions
        idx = idx + shift[:, None, None]  # cache slots
        keep = (blocks >= 0).repeat_interleave(bs, dim=-1) & (idx >= 0) & (idx < nk)
        idx = idx.clamp(0, nk - 1)
        gather = idx[..., None].expand(-1, -1, -1, k.shape[3])
        k, v = (repeat_kv(x, self.n_heads).gather(2, gather) for x in (k, v))  # [B, h, S*bs, hd]
        k_pos = k_pos.gather(1, idx.flatten(1)).view(idx.shape)  # [B, h, S*bs]
        if key_mask is not None:
            keep = keep & key_mask.gather(1, idx.flatten(1)).view(idx.shape)
        keep = (keep & (k_pos <= q_pos[:, :, None]))[:, :, None]  # [B, h, 1, S*bs]
        scores = (q @ k.transpose(-2, -1)) * self.scale  # [B, h, 1, S*bs]
        if score_bias is not None:
            scores = scores + score_bias((q_pos[:, :, None] - k_pos)[:, :, None])  # rel [B, h, 1, S*bs]
        return masked_softmax(scores, keep) @ v  # [B, h, 1, hd]


def roll_rows(x: Tensor, src: Tensor) -> Tensor:
    """x [B, h, n, hd] with row b's token j taken from index src[b, j]."""
    return x.gather(2, src[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))


@hookimpl
def register_attention_variants():
    return [SparseAttention]
