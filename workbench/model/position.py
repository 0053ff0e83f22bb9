"""Position schemes: how a model learns where each token is.

A scheme may act at three places, each a no-op by default:
  embed(x, pos)            add a signal to the token embeddings       (sinusoidal, learned)
  rotate(q, k, q_pos, k_pos)  transform queries and keys             (RoPE)
  score_bias(rel)          add a bias to attention scores by offset   (ALiBi, T5's bias)
Positions are integer tensors [B, n] so that left-padded batches count from each row's
first real token.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from workbench.variants import Variant


# Every weight matrix and embedding table starts N(0, INIT_STD) (GPT-2's init, model._init_weights),
# so token embeddings start at RMS INIT_STD: a fixed additive encoding scales itself to that.
INIT_STD = 0.02


def table_dtype(x: Tensor) -> torch.dtype:
    """The dtype a scheme computes its tables in (RoPE's angles, the sinusoid): float64 in a
    float64 model, float32 otherwise (half precision models too, whose tables would round)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class PositionLimitError(ValueError):
    """A sequence is longer than the scheme can represent (e.g. a learned table's size)."""


class PositionScheme(Variant, nn.Module):
    axis = "position"
    has_score_bias: ClassVar[bool] = False  # lets attention skip building offsets when unused
    # What the report's picture of the scheme shows (workbench.recipes.train.pictures.position_items),
    # in the scheme's own words: only the scheme knows what its values mean. Empty: no gloss.
    picture_note: ClassVar[str] = ""

    def __init__(self, params, *, d_model: int, n_heads: int, head_dim: int, causal: bool = False):
        super().__init__()
        self.params = params
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.causal = causal  # the stack's attention: a scheme may treat earlier and later keys apart (T5)

    @classmethod
    def adds_to_embeddings(cls) -> bool:
        """Whether the scheme overrides `embed`: its signal enters once per stack, so it cannot
        differ per layer (model.position as a per-layer pattern)."""
        return cls.embed is not PositionScheme.embed

    @property
    def max_length(self) -> int | None:
        """Longest sequence the scheme can represent; None when unbounded."""
        return None

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        """x: [B, n, d_model], pos: [B, n] -> x with position information added."""
        return x

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """q: [B, h, nq, hd], k: [B, h_kv, nk, hd], positions [B, nq] / [B, nk]."""
        return q, k

    def score_bias(self, rel: Tensor) -> Tensor:
        """rel: integer offsets q_pos - k_pos, [B', H, ...] with B' = 1 or B, H = 1 or h, and any
        trailing axes (dense attention passes [B', 1, nq, nk], FlexAttention's table [1, 1, 2n - 1],
        block attention [1, 1, T, block, c], sparse attention each head's own offsets [1, h, T, bs, c]).
        Returns the bias [B', h, ...] (same trailing axes), head i's bias at rel[:, 0] when H = 1 and
        at rel[:, i] when H = h: broadcast per-head values as view(1, h, 1, ...), never index heads
        out of axis 1. tests/test_model_contract.py checks every registered scheme against this."""
        raise NotImplementedError(f"{self.name} adds no score bias")

    def check_length(self, pos: Tensor) -> None:
        limit = self.max_length
        if limit is not None and pos.numel() and int(pos.max()) >= limit:
            raise PositionLimitError(
                f"{self.name} positions end at {limit}; got position {int(pos.max())}"
            )
