"""Choosing the next token from logits: greedy, or sampling with temperature, top-k, top-p."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

STRATEGIES = ("greedy", "sample")


@dataclass(frozen=True)
class GenerationConfig:
    """How `generate` continues a sequence."""

    max_new_tokens: int = 32
    strategy: str = "greedy"  # greedy (argmax) or sample
    temperature: float = 1.0  # sample: logits are divided by it (lower: closer to greedy)
    top_k: int | None = None  # sample: only the k most likely tokens
    top_p: float | None = None  # sample: only the smallest set reaching this probability (nucleus)
    eos_id: int | None = None  # a row that emitted it continues with pad_id; all did: stop
    pad_id: int = 0
    use_cache: bool = True  # decode one token per step from the KV cache (else recompute all)


def next_token(logits: Tensor, settings: GenerationConfig = GenerationConfig(),
               generator: torch.Generator | None = None) -> Tensor:
    """logits [B, vocab] -> token ids [B]."""
    strategy, temperature, top_k, top_p = settings.strategy, settings.temperature, settings.top_k, settings.top_p
    if strategy == "greedy":
        return logits.argmax(dim=-1)
    if strategy != "sample":
        raise ValueError(f"unknown decoding strategy {strategy!r} (valid: {', '.join(STRATEGIES)})")
    if temperature <= 0:
        raise ValueError("temperature must be > 0 (use strategy='greedy' for argmax)")
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of tokens whose probability reaches top_p (nucleus sampling)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # Drop a token when the tokens ranked above it already reach top_p; the first always stays.
    drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))
