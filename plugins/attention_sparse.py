"""Block-sparse attention: the BigBird pattern (Zaheer et al. 2020, "ITC": global tokens are
existing tokens). The sequence is cut into blocks of `block` positions; a query in block i reads

- local:  blocks i-1, i, i+1 (causal: i-1 and i, with the causal mask inside block i);
- global: the first `n_global_blocks` blocks, which every query reads; bidirectional only:
          queries in those blocks also read every key (causal: they read every earlier key,
          which the pattern already gives them);
- random: `n_random_blocks` distinct blocks drawn from the earlier blocks that are neither
          local nor global (blocks g .. i-2), as in BigBird's reference `bigbird_block_rand_mask`
          which excludes local and global blocks. Fewer exist for early blocks: then fewer.

Random blocks are a pure function of (query block, `seed`): block j is drawn for query block i
when its hash h(seed, i, j) is among the `n_random_blocks` smallest over the candidates. Drawing
only earlier blocks, also when bidirectional (BigBird draws from the whole sequence), keeps the
pattern independent of sequence length, so a padded row reads what it reads alone, and cached
decoding reads what the full forward reads.

Cost: each query block attends to at most 3 + g + r gathered key blocks: O(n * block * (3 + g + r))
work and memory; bidirectional global rows are a separate O(g * block * n) full-row computation.
A decoding step gathers only the key blocks its query reads from the cache: O(block * (2 + g + r)).

Padded batches: positions of real tokens are their index minus a per-row shift (left padding);
rows are rolled so that index == position, which keeps the blocked path exact for every real
query. Padding queries return zeros (nothing reads them). Any other position layout falls back
to `dense()`.
"""

import torch
from pydantic import Field
from torch import Tensor

from workbench import hookimpl
from workbench.attention import (AttentionParams, AttentionVariant, aligned_offsets, block_attention,
                                 flex_applies, same_sequence, zero_unaligned_queries)

_PRIME = 2**31 - 1  # hash arithmetic stays below 2^48: exact in int64 on every device


def _mix(x: Tensor) -> Tensor:
    """Integer hash on [0, 2^31): xor-shift and multiply rounds (MINSTD multipliers)."""
    for multiplier in (48271, 69621, 48271):
        x = ((x ^ (x >> 15)) * multiplier) % _PRIME
    return x


def random_blocks(q_blocks: Tensor, n_random: int, n_global: int, seed: int) -> tuple[Tensor, Tensor]:
    """The random key blocks of each query block: (blocks [..., r], valid [..., r]).

    Candidates for query block i are g .. i-2; the r with the smallest hash(seed, i, j) are
    drawn (the index breaks ties), so the draw depends only on i and seed."""
    n_cand = int(q_blocks.max()) + 1 if q_blocks.numel() else 1
    r = min(n_random, n_cand)
    cand = torch.arange(n_cand, device=q_blocks.device)
    i = q_blocks[..., None]  # [..., 1]
    key = _mix(_mix(torch.full_like(cand, seed % _PRIME)) ^ i) ^ cand
    key = _mix(key) * n_cand + cand  # unique per candidate
    eligible = (cand >= n_global) & (cand <= i - 2)
    key = key.masked_fill(~eligible, torch.iinfo(torch.int64).max)
    drawn = key.topk(r, dim=-1, largest=False).indices  # [..., r]
    return drawn, eligible.gather(-1, drawn)


class SparseParams(AttentionParams):
    block: int = Field(64, gt=0, description="tokens per block of the block-sparse pattern")
    n_global_blocks: int = Field(1, ge=0, description="leading blocks that every query reads (and, bidirectional, that read every key)")
    n_random_blocks: int = Field(1, ge=0, description="random earlier blocks each query block reads")
    seed: int = Field(0, ge=0, description="seed of the random-block draw (a pure function of block index and seed)")


class SparseAttention(AttentionVariant):
    """BigBird block-sparse pattern: local + global + random blocks. O(n * block * (3 + g + r))."""

    name = "sparse"
    Params = SparseParams

    def allowed(self, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
        p = self.params
        qb, kb = q_pos // p.block, k_pos // p.block
        local = (qb - kb).abs() <= 1
        glob = kb < p.n_global_blocks
        if not causal:
            glob = glob | (qb < p.n_global_blocks)
        drawn, valid = random_blocks(qb, p.n_random_blocks, p.n_global_blocks, p.seed)
        rand = ((drawn == kb[..., None]) & valid).any(-1)
        reads = local | glob | rand
        return reads & (k_pos <= q_pos) if causal else reads

    def key_blocks(self, q_blocks: Tensor, causal: bool) -> Tensor:
        """Key blocks read by each query block [...] -> [..., S], each block once; -1 marks an
        empty slot (a global or random block that is also local, or none left to draw)."""
        p = self.params
        i = q_blocks[..., None]
        local = i + torch.tensor([-1, 0] if causal else [-1, 0, 1], device=i.device)
        glob = torch.arange(p.n_global_blocks, device=i.device).expand(*i.shape[:-1], -1)
        # A global block is already read as a local one, or (causal) lies in the future.
        glob = glob.masked_fill(((glob - i).abs() <= 1) | (causal & (glob > i)), -1)
        drawn, valid = random_blocks(q_blocks, p.n_random_blocks, p.n_global_blocks, p.seed)
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
        """The pattern on aligned rows (index == position)."""
        n, bs, g = q.shape[2], self.params.block, self.params.n_global_blocks
        blocks = torch.arange(-(-n // bs), device=q.device)
        tile = dict(block=bs, key_mask=key_mask, score_bias=score_bias, scale=self.scale)
        causal_inside = (lambda q_idx, k_idx: k_idx <= q_idx) if causal else None
        if causal or g == 0:
            return block_attention(q, k, v, q_blocks=blocks, kv_blocks=self.key_blocks(blocks, causal),
                                   keep_pair=causal_inside, **tile)[:, :, :n]
        # Bidirectional global query blocks read every key block; the others read their pattern.
        n_glob = min(g, len(blocks))
        glob_rows = block_attention(q, k, v, q_blocks=blocks[:n_glob], kv_blocks=blocks.expand(n_glob, -1),
                                    keep_pair=None, **tile)
        rest = blocks[n_glob:]
        if len(rest) == 0:
            return glob_rows[:, :, :n]
        other_rows = block_attention(q, k, v, q_blocks=rest, kv_blocks=self.key_blocks(rest, causal),
                                     keep_pair=None, **tile)
        return torch.cat([glob_rows, other_rows], dim=2)[:, :, :n]

    def _decode_step(self, q, k, v, shift, *, q_pos, k_pos, key_mask, causal, score_bias) -> Tensor:
        """One new query per row: gather only its key blocks from the cache (index = position +
        shift), then attend densely over those O(block * (2 + g + r)) keys."""
        bs, nk = self.params.block, k.shape[2]
        blocks = self.key_blocks(q_pos[:, 0] // bs, causal)  # [B, S]
        idx = (blocks[:, :, None] * bs + torch.arange(bs, device=q.device)).flatten(1)  # [B, S*bs] positions
        idx = idx + shift[:, None]  # cache slots
        valid = (blocks >= 0).repeat_interleave(bs, dim=1) & (idx >= 0) & (idx < nk)
        idx = idx.clamp(0, nk - 1)
        gather = idx[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        k, v = k.gather(2, gather), v.gather(2, gather)
        key_mask = valid if key_mask is None else valid & key_mask.gather(1, idx)
        return self.dense(q, k, v, q_pos=q_pos, k_pos=k_pos.gather(1, idx), key_mask=key_mask,
                          causal=causal, score_bias=score_bias)


def roll_rows(x: Tensor, src: Tensor) -> Tensor:
    """x [B, h, n, hd] with row b's token j taken from index src[b, j]."""
    return x.gather(2, src[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))


@hookimpl
def register_attention_variants():
    return [SparseAttention]
