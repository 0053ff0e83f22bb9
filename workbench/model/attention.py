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
Fast paths (fused kernels, blocked local attention, FlexAttention through `flex()`; its tooling
is `workbench.model.flex`) live in `forward()`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from workbench.model.flex import bias_score_mod, block_mask_from_allowed, flex_attention_call
from workbench.variants import FieldError, Params, Variant

ScoreBias = Callable[[Tensor], Tensor]


class AttentionParams(Params):
    """The parameters every kernel variant takes: `scaled`, `scale_dim` and `softcap` are the
    kernel's (KERNEL_OPTIONS); the others are options of the self-attention layer around the
    kernel (workbench.model.transformer.SelfAttention), so each composes with every kernel."""

    added_later = ("qk_norm", "qk_norm_gain", "gate", "value_residual", "scale_dim", "softcap")  # stored runs keep their ids
    scaled: bool = Field(
        True, description="divide scores by sqrt(head_dim); false is the unscaled ablation"
    )
    scale_dim: int | None = Field(
        None, gt=0, description="divide scores by sqrt(scale_dim) instead of sqrt(head_dim) (Gemma's "
        "query_pre_attn_scalar); null: head_dim")
    softcap: float | None = Field(
        None, gt=0, description="cap * tanh(scores / cap) on the scaled scores before the softmax (Gemma 2's "
        "attn_logit_softcapping); no fused kernel computes it, so attention runs its explicit path (n x n scores)")
    qk_norm: Literal["none", "head", "projection"] = Field(
        "none", description="RMS-normalise queries and keys before the position scheme rotates them: 'head' each "
        "head (one gain of head_dim for all heads: Qwen3, Gemma 3), 'projection' the whole query and key projection "
        "(one gain per unit: OLMo 2, OLMoE)")
    qk_norm_gain: bool = Field(True, description="QK-norm with a learned gain; false: none (Llama 4's L2 norm)")
    gate: Literal["none", "headwise", "elementwise"] = Field(
        "none", description="gated attention (Qiu et al. 2025): each head's output times sigmoid(x W), W computed from "
        "the layer input: one gate per head (headwise) or per unit (elementwise, Qwen3-Next)")
    value_residual: Literal["none", "fixed", "learned"] = Field(
        "none", description="value residual learning (Zhou et al. 2025, ResFormer): every layer after the first reads "
        "lambda1 * its values + lambda2 * the first layer's; fixed: 0.5 and 0.5, learned: from 0.5 and 0.5")

    @model_validator(mode="after")
    def _scale(self):
        if self.scale_dim is not None and not self.scaled:
            raise FieldError("scale_dim", "sets the scale of scaled scores: needs scaled: true")
        return self


KERNEL_OPTIONS = ("scaled", "scale_dim", "softcap")  # the AttentionParams a kernel reads itself


def kernel_options(params: AttentionParams) -> dict[str, Any]:
    """The kernel options of `params`, for a kernel built inside another variant (a mixer's, or
    cross-attention's) to compute its scores as the variant's own would."""
    return {name: getattr(params, name) for name in KERNEL_OPTIONS}


class AttentionVariant(Variant, nn.Module):
    axis = "attention"
    Params = AttentionParams

    def __init__(self, params: AttentionParams, *, n_heads: int, n_kv_heads: int, head_dim: int):
        super().__init__()
        self.params = params
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.scale = (params.scale_dim or head_dim)**-0.5 if params.scaled else 1.0

    @property
    def explicit_scores(self) -> bool:
        """Whether every call takes the explicit `dense` path: score softcapping, which no fused
        kernel here computes."""
        return self.params.softcap is not None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
        # the variant's `forward` (its fast paths), or `dense` where they cannot compute the
        # scores, whoever calls the kernel: a kernel's forward need not know of softcapping
        if self.explicit_scores:
            return self.dense(q, k, v, **kwargs)
        return super().__call__(q, k, v, **kwargs)

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
        if self.params.softcap is not None:  # Gemma 2: capped after scaling, before the mask
            scores = self.params.softcap * torch.tanh(scores / self.params.softcap)
        if score_bias is not None:
            scores = scores + score_bias((q_pos[:, :, None] - k_pos[:, None, :])[:, None])
        weights = masked_softmax(scores, self.visible_keys(q_pos, k_pos, key_mask, causal))
        out = weights @ v  # [B, h, nq, hd]
        return (out, weights) if return_weights else out

    def flex(self, q, k, v, *, causal, score_bias) -> Tensor:
        """FlexAttention over positions 0..n-1 (see `flex.flex_applies`): `allowed` as a block mask
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
    (bool, broadcastable to [B, T, block, S * block]: a rule may differ per row; None keeps all)
    and key_mask [B, n] select the pairs; score_bias gets
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

    q_idx, k_idx, keep, has_key = tile_pairs(q_blocks, kv_idx, slot_ok, block, n, B, keep_pair, key_mask)
    mask = tile_mask(keep, q_idx - k_idx, score_bias, block, h_kv, g, q.dtype)
    out = F.scaled_dot_product_attention(q_tiles, k_tiles, v_tiles, attn_mask=mask, scale=scale)
    has_key = has_key[:, :, None].expand(B, T, g, block, 1).reshape(B * T, 1, g * block, 1)
    out = out * has_key  # [B*T, h_kv, g*block, hd]
    out = out.view(B, T, h_kv, g, block, hd).permute(0, 2, 3, 1, 4, 5)  # [B, h_kv, g, T, block, hd]
    return out.reshape(B, h, T * block, hd)


def tile_mask(keep: Tensor, rel: Tensor, score_bias: ScoreBias | None, block: int, h_kv: int, g: int,
              dtype) -> Tensor:
    """The attention mask of `block_attention`'s tiles: `keep` [B, T, block, c] for every query
    head of a K/V group (stacked as rows), as bools, or with a score bias on `rel` [T, block, c]
    as additive scores ([B*T, 1 or h_kv, g*block, c])."""
    B, T, _, c = keep.shape  # the block axis may be 1 (no pair rule): broadcast below
    keep = keep[:, :, None].expand(B, T, g, block, c).reshape(B, T, 1, g * block, c)
    if score_bias is None:
        return keep.reshape(B * T, 1, g * block, c)
    bias = score_bias(rel[None, None])  # [1, h, T, block, c]
    bias = bias.view(1, h_kv, g, T, block, c).permute(0, 3, 1, 2, 4, 5).reshape(1, T, h_kv, g * block, c)
    return bias.to(dtype).masked_fill(~keep, float("-inf")).reshape(B * T, h_kv, g * block, c)


def tile_pairs(q_blocks: Tensor, kv_idx: Tensor, slot_ok: Tensor, block: int, n: int, B: int,
               keep_pair: Callable[[Tensor, Tensor], Tensor] | None,
               key_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Which (query, key) pairs of each tile of `block_attention` are read: the tiles' query
    positions q_idx [T, block, 1] and key positions k_idx [T, 1, c], keep [B, T, block or 1, c]
    and has_key [B, T, block or 1, 1] (rows with no readable key keep every pair, to be zeroed after)."""
    T, S = kv_idx.shape
    c, nb = S * block, -(-n // block)
    offsets = torch.arange(block, device=kv_idx.device)
    q_idx = (q_blocks[:, None] * block + offsets)[:, :, None]  # [T, block, 1]
    k_idx = (kv_idx[:, :, None] * block + offsets).reshape(T, 1, c)  # [T, 1, c]
    keep = slot_ok.repeat_interleave(block, dim=-1)[:, None, :]  # [T, 1, c]
    if keep_pair is not None:
        keep = keep & keep_pair(q_idx, k_idx)
    real = torch.arange(nb * block, device=kv_idx.device) < n  # the padded tail is never a key
    real = real.expand(B, -1) if key_mask is None else F.pad(key_mask, (0, nb * block - n)) & real
    real = real.view(B, nb, block)[:, kv_idx].reshape(B, T, 1, c)
    keep = keep & real  # [B, T, block, c]
    has_key = keep.any(-1, keepdim=True)  # [B, T, block, 1]
    # Rows with no readable key read everything and are zeroed after: finite forward and backward.
    return q_idx, k_idx, keep | ~has_key, has_key
