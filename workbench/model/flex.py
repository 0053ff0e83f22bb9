"""FlexAttention tooling (CUDA): a variant's own pattern as a block mask, and the compiled kernel.

An attention variant states which keys a query reads through `allowed` (workbench.model.attention);
on training shapes on a GPU (`flex_applies`), `AttentionVariant.flex` hands that pattern to
PyTorch's FlexAttention as a BlockMask (`block_mask_from_allowed`: tiles the pattern leaves
empty are skipped) and a score bias as a score_mod (`bias_score_mod`), through one compiled
kernel (`flex_attention_call`). Everywhere else each variant keeps its own path (fused SDPA,
blocked local attention, the dense reference). Nothing here knows the variant classes: this
module sits below workbench.model.attention.

The module keeps three process-wide values (below the constants, each with its reason).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

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

# ---- the module's state -------------------------------------------------------------------
# Three values outside any module instance, each because what it describes is not one layer's:
# - `_flex_disabled`: set by `flex_disabled()` while torch's FlopCounterMode counts a whole
#   forward (workbench.cost.flops): that mode has no rule for the FlexAttention operator, so
#   every variant of every layer called within it must keep its own path.
# - `_compiled_flex`: the one torch.compile'd flex_attention. Dynamo caches compiled graphs per
#   function object, so every layer of every model in the process shares this one and
#   FLEX_RECOMPILE_LIMIT counts all their graphs; it is made on first use because
#   torch.compile loads the compiler stack.
# - `_ARANGE_POSITIONS`: id -> weak reference of the position tensors `arange_positions` made
#   (a WeakSet would compare tensors with ==), so that `counts_from_zero` knows them without
#   reading them (a read would wait for the GPU in every layer of every step). The model makes
#   them and each attention variant asks, through an interface of plain position tensors: the
#   registry carries that fact across it; an entry dies with its tensor.
_flex_disabled = False
_compiled_flex = None
_ARANGE_POSITIONS: dict[int, weakref.ref] = {}


def flex_applies(q: Tensor, q_pos: Tensor, k_pos: Tensor, key_mask: Tensor | None) -> bool:
    """Whether a variant takes the FlexAttention path: `flex_eligible`, outside `flex_disabled`."""
    return not _flex_disabled and flex_eligible(q, q_pos, k_pos, key_mask)


def flex_eligible(q: Tensor, q_pos: Tensor, k_pos: Tensor, key_mask: Tensor | None) -> bool:
    """A device in FLEX_DEVICES, heads of at least FLEX_MIN_HEAD_DIM, one sequence (queries are
    the keys: training, a prompt), no padding, and positions 0..n-1 in every row, so that the
    block mask depends only on n. Anything else keeps the variant's own path."""
    if q.device.type not in FLEX_DEVICES or q.shape[-1] < FLEX_MIN_HEAD_DIM:
        return False
    if key_mask is not None or q_pos.shape != k_pos.shape:
        return False
    # Both 0..n-1 with one shape: the same positions (a decoding step's k_pos is longer).
    return counts_from_zero(q_pos) and (k_pos is q_pos or counts_from_zero(k_pos))


def counts_from_zero(pos: Tensor) -> bool:
    """Every row of pos [B, n] is 0..n-1. Positions made by `arange_positions` are known to be,
    without reading the tensor (a read would wait for the GPU in every layer of every step)."""
    known = _ARANGE_POSITIONS.get(id(pos))
    if known is not None and known() is pos:
        return True
    return bool((pos == torch.arange(pos.shape[1], device=pos.device)).all())


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


def bias_score_mod(score_bias: Callable[[Tensor], Tensor], n: int, device: torch.device) -> Callable:
    """FlexAttention score_mod adding `score_bias` (a function of the offset q_pos - k_pos, e.g.
    ALiBi) read from one [h, 2n - 1] table of every offset. The table stays float32 (the kernel
    adds it to float32 scores): in bf16 an ALiBi bias of ~10^4 would be rounded by ~64."""
    rel = torch.arange(-(n - 1), n, device=device)
    table = score_bias(rel[None, None])[0].float()  # [h, 2n - 1]

    def score_mod(score, b, h, q_idx, kv_idx):  # offset 0 sits at the middle of the table, n - 1
        return score + table[h, q_idx - kv_idx + table.shape[-1] // 2]

    return score_mod
