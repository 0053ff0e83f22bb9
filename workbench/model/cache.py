"""The KV cache: each attention layer's keys and values of past tokens, for incremental decoding.

Memory is allocated once per generation, for the longest the cache may need:
all positions for full attention, the last `window` for a sliding window (a ring buffer:
attention is order-free over keys because each slot carries its position). Keys are
stored after the position scheme's rotation, so RoPE is applied once per token.
"""

from __future__ import annotations

import torch
from torch import Tensor


class LayerCache:
    """K/V of one attention layer: [B, h_kv, capacity, hd] plus each slot's position and mask.
    (Any two per-token tensors [B, heads, capacity, width]: multi-head latent attention keeps its
    latent and its rotary key here.)"""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.filled = 0  # slots holding a token
        self.next = 0  # slot the next token goes to (wraps around when full)
        self._k = self._v = self._pos = None
        self._mask: Tensor | None = None  # [B, capacity], None while every stored token is real

    @property
    def empty(self) -> bool:
        return self.filled == 0

    def append(self, k: Tensor, v: Tensor, pos: Tensor, mask: Tensor | None) -> None:
        """Add n tokens: k, v [B, h_kv, n, hd], pos [B, n], mask [B, n] or None (all real)."""
        if self._k is None:
            self._allocate(k, v, pos)
        n = k.shape[2]
        if n > self.capacity:  # only the last `capacity` tokens can ever be read again
            k, v, pos = k[:, :, -self.capacity :], v[:, :, -self.capacity :], pos[:, -self.capacity :]
            mask = None if mask is None else mask[:, -self.capacity :]
            n = self.capacity
        slots = (torch.arange(n, device=k.device) + self.next) % self.capacity
        self._k[:, :, slots] = k
        self._v[:, :, slots] = v
        self._pos[:, slots] = pos
        if mask is not None and self._mask is None:
            self._mask = torch.ones_like(self._pos, dtype=torch.bool)
        if self._mask is not None:
            self._mask[:, slots] = True if mask is None else mask
        self.next = (self.next + n) % self.capacity
        self.filled = min(self.filled + n, self.capacity)

    def _allocate(self, k: Tensor, v: Tensor, pos: Tensor) -> None:
        B, h_kv, _, hd = k.shape
        self._k = k.new_empty(B, h_kv, self.capacity, hd)
        self._v = v.new_empty(*v.shape[:2], self.capacity, v.shape[3])
        self._pos = pos.new_empty(B, self.capacity)

    @property
    def k(self) -> Tensor:
        return self._k[:, :, : self.filled]  # [B, h_kv, filled, hd]

    @property
    def v(self) -> Tensor:
        return self._v[:, :, : self.filled]

    @property
    def pos(self) -> Tensor:
        return self._pos[:, : self.filled]  # [B, filled]

    @property
    def mask(self) -> Tensor | None:
        return None if self._mask is None else self._mask[:, : self.filled]

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values held: 2 * h_kv * hd * tokens * batch * element size."""
        return 0 if self._k is None else self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


class KVCache:
    """The cache of each self-attention layer, made by its token mixer at the layer's first call
    (`mixer.new_cache(capacity)`: keys and values, the last `window` of them for a sliding window,
    or what else the mixer caches), and a LayerCache per cross-attention layer when present."""

    def __init__(self, n_layers: int, capacity: int, cross_capacity: int = 0):
        self.capacity = capacity  # tokens one generation holds at most (prompt + new)
        self.self_attn: list = [None] * n_layers
        # Cross-attention K/V depend only on the encoder output: computed once, then reused.
        self.cross_attn = [LayerCache(cross_capacity) for _ in range(n_layers)] if cross_capacity else []

    def self_attn_of(self, layer: int, mixer):
        """Layer `layer`'s cache, made by its mixer on first use."""
        if self.self_attn[layer] is None:
            self.self_attn[layer] = mixer.new_cache(self.capacity)
        return self.self_attn[layer]

    @property
    def nbytes(self) -> int:
        """Bytes the self-attention layers' caches hold, over all layers."""
        return sum(layer.nbytes for layer in self.self_attn if layer is not None)

    @property
    def cross_nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.cross_attn)
