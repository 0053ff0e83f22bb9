"""Attention variants: which keys each query reads, and how the scores are computed.

A variant receives queries, keys and values already projected and split into heads
(and rotated by the position scheme), and returns the per-head outputs:

    q: [B, h, nq, hd]   k, v: [B, h_kv, nk, hd]   ->   [B, h, nq, hd]

h_kv divides h: h_kv == h is multi-head attention, 1 < h_kv < h grouped-query (GQA),
h_kv == 1 multi-query (MQA); each group of h / h_kv query heads shares one K/V head.

`allowed(q_pos, k_pos, causal)` states the variant's pattern as a boolean relation on
positions. Callers give the positions a singleton head axis at -3 (q_pos [B, 1, nq, 1],
k_pos [B, 1, 1, nk]); the answer has that axis of size 1, or n_heads for a variant whose
pattern differs per head (sparse). `dense()` computes attention through that relation with an explicit score
matrix: it is the reference that tests compare the fast paths against, the path that
returns attention weights for heatmaps, and the decode path where nq * nk is small.
Fast paths (fused kernels, blocked local attention) live in `forward()`.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
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

    def visible_keys(self, q_pos: Tensor, k_pos: Tensor, key_mask: Tensor | None, causal: bool) -> Tensor:
        """[B, 1 or h, nq, nk]: True where a query may read a key (the pattern and real keys).
        q_pos [B, nq], k_pos [B, nk], key_mask [B, nk] True for real tokens (None: all real)."""
        keep = self.allowed(q_pos[:, None, :, None], k_pos[:, None, None, :], causal)
        return keep if key_mask is None else keep & key_mask[:, None, None, :]

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
        weights = masked_softmax(scores, self.visible_keys(q_pos, k_pos, key_mask, causal))
        out = weights @ v  # [B, h, nq, hd]
        return (out, weights) if return_weights else out

    def flex(self, q, k, v, *, causal, score_bias) -> Tensor:
        """FlexAttention over positions 0..n-1 (see `flex_applies`): `allowed` as a block mask
        (built once per length and kept), the score bias as a score_mod."""
        n, dev = q.shape[2], q.device
        score_mod = None if score_bias is None else bias_score_mod(score_bias, n, dev)
        return flex_attention_call(q, k, v, score_mod=score_mod, block_mask=self.flex_block_mask(n, causal, dev),
                                   scale=self.scale, enable_gqa=self.n_kv_heads != self.n_heads)

    def flex_block_mask(self, n: int, causal: bool, device: torch.device):
        """The BlockMask of `allowed` on positions 0..n-1, built once per (n, causal, device)."""
        masks = self.__dict__.setdefault("_flex_masks", {})  # plain attribute: not state_dict
        key = (n, causal, str(device))
        if key not in masks:
            masks[key] = block_mask_from_allowed(lambda qp, kp: self.allowed(qp, kp, causal), n, device)
        return masks[key]


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


# ---- blocked computation shared by the local and block-sparse variants ------------------------


def same_sequence(q_pos: Tensor, k_pos: Tensor) -> bool:
    """True when queries and keys are the same tokens (a full forward, or a prompt), so that
    query i and key i are one position; False for a decoding step reading a cache."""
    return q_pos is k_pos or (q_pos.shape == k_pos.shape and torch.equal(q_pos, k_pos))


def aligned_offsets(pos: Tensor, key_mask: Tensor | None) -> Tensor | None:
    """Per-row shift o [B] with position == index - o for every real token, or None when a
    row's real tokens do not sit at consecutive positions.

    Blocked paths compute on indices; where this holds, index distance equals position
    distance for every (query, real key) pair whose query shares the shift, so the index band
    or block layout is exact on those queries. Padding queries of a left- or right-padded batch
    do not share it (their positions are clamped): blocked paths return zeros there."""
    shift = torch.arange(pos.shape[1], device=pos.device) - pos  # [B, n]
    if key_mask is None:
        lo, hi = shift.amin(-1), shift.amax(-1)
    else:
        lo = shift.masked_fill(~key_mask, torch.iinfo(shift.dtype).max).amin(-1)
        hi = shift.masked_fill(~key_mask, torch.iinfo(shift.dtype).min).amax(-1)
        empty = ~key_mask.any(-1)  # rows without a real token: every query row is zeros anyway
        lo, hi = lo.masked_fill(empty, 0), hi.masked_fill(empty, 0)
    return lo if bool((lo == hi).all()) else None


def zero_unaligned_queries(out: Tensor, q_pos: Tensor, shift: Tensor) -> Tensor:
    """Zero the rows of queries whose position is not index - shift (padding queries, see
    `aligned_offsets`)."""
    aligned = (torch.arange(q_pos.shape[1], device=q_pos.device) - q_pos) == shift[:, None]  # [B, n]
    return out if bool(aligned.all()) else out * aligned[:, None, :, None]



def block_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    block: int,
    q_blocks: Tensor,
    kv_blocks: Tensor,
    keep_pair: Callable[[Tensor, Tensor], Tensor] | None,
    key_mask: Tensor | None,
    score_bias: ScoreBias | None,
    scale: float,
) -> Tensor:
    """Attention computed only on the kept (query block, key block) tiles. O(T * block * S * block).

    q: [B, h, n, hd], k, v: [B, h_kv, n, hd], indexed so that index distance is position
    distance (see `aligned_offsets`). The sequence is cut into blocks of `block` tokens
    (the last one padded). Query block q_blocks[t] ([T]) reads the key blocks kv_blocks[t]
    ([T, S]; entries outside [0, n_blocks) are empty slots, e.g. the block before the first).
    Inside the gathered tiles, `keep_pair(q_idx [T, block, 1], k_idx [T, 1, S * block])`
    (broadcastable bool; None keeps all) and key_mask [B, n] select the pairs; score_bias gets
    rel = q_idx - k_idx of the tiles only.
    Returns [B, h, T * block, hd]: the rows of the query blocks in order (rows past n are
    padding for the caller to drop). Rows with no readable key are zeros.

    Query heads sharing a K/V head are stacked as extra query rows of one tile, so GQA/MQA
    never copies K/V per query head. Tiles go to F.scaled_dot_product_attention as a batch
    (measured ~2.7x faster than matmul + softmax on CPU at block 256, and it lets GPUs use a
    fused masked kernel).
    """
    B, h, n, hd = q.shape
    h_kv = k.shape[1]
    g = h // h_kv
    nb = -(-n // block)
    pad = nb * block - n
    dev = q.device
    slot_ok = (kv_blocks >= 0) & (kv_blocks < nb)  # [T, S]
    used = slot_ok.any(0)  # drop slots that are empty for every query block (e.g. n < block)
    kv_blocks, slot_ok = kv_blocks[:, used], slot_ok[:, used]
    kv_idx = kv_blocks.clamp(0, nb - 1)
    T, S = kv_blocks.shape
    c = S * block  # keys per tile

    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    # [B, h_kv, g, nb, block, hd] -> tiles [B*T, h_kv, g*block, hd] (query heads of a group stacked)
    q_tiles = q.view(B, h_kv, g, nb, block, hd)[:, :, :, q_blocks].permute(0, 3, 1, 2, 4, 5)
    q_tiles = q_tiles.reshape(B * T, h_kv, g * block, hd)
    # [B, h_kv, nb, block, hd] -> [B, h_kv, T, S, block, hd] -> [B*T, h_kv, S*block, hd]
    k_tiles, v_tiles = (
        x.view(B, h_kv, nb, block, hd)[:, :, kv_idx].permute(0, 2, 1, 3, 4, 5).reshape(B * T, h_kv, c, hd)
        for x in (k, v)
    )

    offsets = torch.arange(block, device=dev)
    q_idx = (q_blocks[:, None] * block + offsets)[:, :, None]  # [T, block, 1]
    k_idx = (kv_idx[:, :, None] * block + offsets).reshape(T, 1, c)  # [T, 1, c]
    keep = slot_ok.repeat_interleave(block, dim=-1)[:, None, :]  # [T, 1, c]
    if keep_pair is not None:
        keep = keep & keep_pair(q_idx, k_idx)
    real = torch.arange(nb * block, device=dev) < n  # the padded tail is never a key
    real = real.expand(B, -1) if key_mask is None else F.pad(key_mask, (0, pad)) & real
    real = real.view(B, nb, block)[:, kv_idx].reshape(B, T, 1, c)
    keep = keep & real  # [B, T, block, c]
    has_key = keep.any(-1, keepdim=True)  # [B, T, block, 1]
    # Rows with no readable key read everything and are zeroed after: finite forward and backward.
    keep = keep | ~has_key
    keep = keep[:, :, None].expand(B, T, g, block, c).reshape(B, T, 1, g * block, c)

    if score_bias is None:
        mask = keep.reshape(B * T, 1, g * block, c)
    else:
        bias = score_bias((q_idx - k_idx)[None, None])  # [1, h, T, block, c]
        bias = bias.view(1, h_kv, g, T, block, c).permute(0, 3, 1, 2, 4, 5).reshape(1, T, h_kv, g * block, c)
        mask = bias.to(q.dtype).masked_fill(~keep, float("-inf")).reshape(B * T, h_kv, g * block, c)
    out = F.scaled_dot_product_attention(q_tiles, k_tiles, v_tiles, attn_mask=mask, scale=scale)
    has_key = has_key[:, :, None].expand(B, T, g, block, 1).reshape(B * T, 1, g * block, 1)
    out = out * has_key  # [B*T, h_kv, g*block, hd]
    out = out.view(B, T, h_kv, g, block, hd).permute(0, 2, 3, 1, 4, 5)  # [B, h_kv, g, T, block, hd]
    return out.reshape(B, h, T * block, hd)


# ---- FlexAttention (CUDA): the variant's own pattern as a block mask ---------------------------

FLEX_BLOCK = 128  # FlexAttention's default tile: tiles the pattern leaves empty are skipped
FLEX_DEVICES = ("cuda",)  # on the CPU the tiled SDPA path stays: FlexAttention there has no backward
FLEX_COMPILED_DEVICES = ("cuda",)  # elsewhere eager flex_attention (scores materialised: tests only)
FLEX_MIN_HEAD_DIM = 16  # the compiled kernel needs head_dim >= 16 (torch 2.11 - 2.13): smaller heads keep their path
# Tiles of the compiled kernel (both passes). torch's default tiles for Hopper at head_dim 64
# (128 x 128, 3 stages) asked an H200 for more shared memory than it has on a sliding-window
# mask at n = 8192 (torch 2.11, 2026-12-01: 247,808 > 232,448 bytes, "No valid triton configs").
# 64 x 64 tiles in 2 stages hold a fraction of that (q, k, v tiles of 8 KiB each in bf16 at
# head_dim 64): chosen from that arithmetic; not yet run on a GPU (benchmarks/README.md).
# The block mask's 128-wide tiles stay: the kernel's tiles must divide them.
FLEX_KERNEL_OPTIONS = {"fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64, "fwd_num_stages": 2, "fwd_num_warps": 4,
                       "bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 32,
                       "bwd_num_stages": 2, "bwd_num_warps": 4}
# Compiled graphs flex_attention may accumulate in a process (mask kinds x head counts x dtypes x
# grad modes, over a sweep's runs) before dynamo would silently fall back to eager flex_attention,
# which materialises the n x n scores. Past it the compile cache is cleared, with a warning.
FLEX_RECOMPILE_LIMIT = 64
_flex_disabled = False
_compiled_flex = None


def flex_applies(q: Tensor, q_pos: Tensor, k_pos: Tensor, key_mask: Tensor | None) -> bool:
    """Whether a variant takes the FlexAttention path: `flex_eligible`, outside `flex_disabled`."""
    return not _flex_disabled and flex_eligible(q, q_pos, k_pos, key_mask)


def flex_eligible(q: Tensor, q_pos: Tensor, k_pos: Tensor, key_mask: Tensor | None) -> bool:
    """A device in FLEX_DEVICES, heads of at least FLEX_MIN_HEAD_DIM, one sequence (queries are
    the keys: training, a prompt), no padding, and positions 0..n-1 in every row, so that the
    block mask depends only on n. Anything else keeps the variant's own path."""
    if q.device.type not in FLEX_DEVICES or q.shape[-1] < FLEX_MIN_HEAD_DIM:
        return False
    if key_mask is not None or not same_sequence(q_pos, k_pos):
        return False
    return counts_from_zero(q_pos)


def counts_from_zero(pos: Tensor) -> bool:
    """Every row of pos [B, n] is 0..n-1. Positions made by `arange_positions` are known to be,
    without reading the tensor (a read would wait for the GPU in every layer of every step)."""
    known = _ARANGE_POSITIONS.get(id(pos))
    if known is not None and known() is pos:
        return True
    return bool((pos == torch.arange(pos.shape[1], device=pos.device)).all())


# id -> weak reference of the tensors arange_positions made (a WeakSet would compare tensors with ==)
_ARANGE_POSITIONS: dict[int, weakref.ref] = {}


def arange_positions(B: int, n: int, device: torch.device | str) -> Tensor:
    """[B, n] positions 0..n-1 in every row (an expanded view), recognised by `counts_from_zero`."""
    pos = torch.arange(n, device=device).expand(B, n)
    key = id(pos)
    _ARANGE_POSITIONS[key] = weakref.ref(pos, lambda _: _ARANGE_POSITIONS.pop(key, None))
    return pos


@contextlib.contextmanager
def flex_disabled() -> Iterator[None]:
    """Within the block every variant keeps its own path (FLOP counting: torch's FlopCounterMode
    has no rule for the FlexAttention operator; workbench.cost.flops counts its tiles instead)."""
    global _flex_disabled
    before, _flex_disabled = _flex_disabled, True
    try:
        yield
    finally:
        _flex_disabled = before


def flex_attention_call(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
    """flex_attention: compiled with FLEX_KERNEL_OPTIONS on FLEX_COMPILED_DEVICES (a fused kernel),
    eager elsewhere. Default dynamic shapes: after a second length the kernel is compiled for
    symbolic lengths instead of once per length.

    Dynamo's recompile limit is raised to FLEX_RECOMPILE_LIMIT for these calls and made to
    raise instead of falling back to eager: at the limit the compile cache is cleared, one
    warning says so, and the call compiles again. The eager fallback would run silently with
    O(n^2) memory."""
    global _compiled_flex
    # On first use only: importing FlexAttention loads torch's compiler stack (dynamo, inductor).
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type not in FLEX_COMPILED_DEVICES:
        return flex_attention(q, k, v, **kwargs)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    limits = dict(recompile_limit=FLEX_RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True)
    try:
        with torch._dynamo.config.patch(**limits):
            return _compiled_flex(q, k, v, kernel_options=FLEX_KERNEL_OPTIONS, **kwargs)
    except torch._dynamo.exc.FailOnRecompileLimitHit:
        warnings.warn(f"FlexAttention: {FLEX_RECOMPILE_LIMIT} compiled graphs in this process (mask kinds, head "
                      "counts, dtypes, grad modes); clearing torch.compile's cache and compiling again rather "
                      "than falling back to eager FlexAttention (O(n^2) memory)", stacklevel=2)
        torch._dynamo.reset()
        with torch._dynamo.config.patch(**limits):
            return _compiled_flex(q, k, v, kernel_options=FLEX_KERNEL_OPTIONS, **kwargs)


def block_mask_from_allowed(allowed: Callable[[Tensor, Tensor], Tensor], n: int, device: torch.device,
                            block: int = FLEX_BLOCK):
    """A FlexAttention BlockMask equal to `allowed(q_pos [R, 1], k_pos [1, n])` (bool [R, n], or
    [H, R, n] for a per-head pattern) on positions 0..n-1.

    The pattern is evaluated once on the whole grid, a chunk of query blocks at a time, and each
    (query block, key block) tile is classified: empty (skipped by the kernel), full (no mask
    evaluated) or partial, whose exact bits are kept and read back by the mask_mod. This works
    for any pattern a variant states through `allowed`, including ones that are not a pointwise
    formula (sparse's random blocks use a top-k), at O(n^2) cost once per length."""
    from torch.nn.attention.flex_attention import BlockMask  # on first use, as in flex_attention_call

    nb = -(-n // block)
    pos = torch.arange(nb * block, device=device)
    real = pos < n
    rows_per_chunk = max(1, 2**24 // (block * nb * block)) * block
    any_tiles, full_tiles, states, bits = [], [], [], []
    n_partial = 0
    for start in range(0, nb * block, rows_per_chunk):
        # Padding positions past n repeat n - 1 (and are masked below): a pattern that depends on
        # the sequence's length, such as bidirectional sparse's random blocks, sees length n.
        q_pos = pos[start:start + rows_per_chunk].clamp(max=n - 1)
        keep = allowed(q_pos[:, None], pos.clamp(max=n - 1)[None, :])
        keep = keep[None] if keep.dim() == 2 else keep  # [H, R, N]
        valid = real[start:start + rows_per_chunk, None] & real[None, :]  # [R, N]
        H, rb = keep.shape[0], keep.shape[1] // block
        tiles = (keep & valid).view(H, rb, block, nb, block).transpose(2, 3)  # [H, rb, nb, bs, bs]
        any_tile = tiles.any(-1).any(-1)  # [H, rb, nb]
        full = (keep | ~valid).view(H, rb, block, nb, block).all(2).all(-1) & any_tile
        partial = any_tile & ~full
        # tile state: -2 empty, -1 full, p >= 0 the partial tile bits[p]
        state = torch.full(partial.shape, -2, dtype=torch.int32, device=device)
        state[full] = -1
        count = int(partial.sum())
        state[partial] = torch.arange(n_partial, n_partial + count, dtype=torch.int32, device=device)
        n_partial += count
        any_tiles.append(any_tile), full_tiles.append(full), states.append(state)
        bits.append(tiles[partial])  # [count, bs, bs], in the order of the ids above
    partial = torch.cat(any_tiles, 1) & ~torch.cat(full_tiles, 1)  # [H, nb, nb]
    full, state = torch.cat(full_tiles, 1), torch.cat(states, 1)
    bits = torch.cat([*bits, torch.zeros(1, block, block, dtype=torch.bool, device=device)])
    H = state.shape[0]

    def mask_mod(b, h, q_idx, kv_idx):
        s = state[h % H, q_idx // block, kv_idx // block]
        return (s == -1) | ((s >= 0) & bits[s.clamp(min=0), q_idx % block, kv_idx % block])

    def ordered(tiles: Tensor) -> tuple[Tensor, Tensor]:  # [H, nb, nb] bool -> counts, indices first
        counts = tiles.sum(-1, dtype=torch.int32)
        indices = tiles.to(torch.int32).argsort(dim=-1, descending=True, stable=True).to(torch.int32)
        return counts[None].contiguous(), indices[None].contiguous()  # batch axis 1: broadcasts

    return BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=block,
                                    mask_mod=mask_mod, seq_lengths=(n, n))


def bias_score_mod(score_bias: ScoreBias, n: int, device: torch.device) -> Callable:
    """FlexAttention score_mod adding `score_bias` (a function of the offset q_pos - k_pos, e.g.
    ALiBi) read from one [h, 2n - 1] table of every offset. The table stays float32 (the kernel
    adds it to float32 scores): in bf16 an ALiBi bias of ~10^4 would be rounded by ~64."""
    rel = torch.arange(-(n - 1), n, device=device)
    table = score_bias(rel[None, None])[0].float()  # [h, 2n - 1]

    def score_mod(score, b, h, q_idx, kv_idx):  # offset 0 sits at the middle of the table, n - 1
        return score + table[h, q_idx - kv_idx + table.shape[-1] // 2]

    return score_mod
