"""Naive attention: the textbook computation that materialises the full [B, h, n, n] score
matrix, masks it, softmaxes it and multiplies by V (the base class's `dense()` path).

It computes exactly what `full` computes; it exists as the O(n^2)-memory reference that fused
kernels avoid, so cost studies can measure what the fusion saves.
"""

from workbench import hookimpl
from workbench.model.attention import AttentionVariant


class NaiveAttention(AttentionVariant):
    """Full attention through an explicit n x n score matrix (O(n^2) memory), the unfused reference."""

    name = "naive"
    # forward() is the base class's: `dense()` over every allowed key.


@hookimpl
def register_attention_variants():
    return [NaiveAttention]
