"""Interpolated Witten-Bell n-gram models of a token stream: the language-model baselines.

Witten & Bell (1991), in the interpolated form of Chen & Goodman (1998, "An Empirical Study
of Smoothing Techniques for Language Modeling", section 2.5), as SRILM's
`ngram-count -wbdiscount -interpolate` computes it:

    P(w | h) = (c(h w) + N1+(h .) P(w | h')) / (c(h) + N1+(h .))

where h' is the context h without its oldest token, c(h) = sum_w c(h w) counts h followed by
any token, and N1+(h .) the distinct tokens seen after h. A context never seen (c(h) = 0)
gives P(w | h'); the recursion ends in the uniform distribution over the V tokens.

A model is fitted on token ids 0..V-1 (the tokenizer's, before the task's specials) and scores
each window as the language model does: the token at window index t from at most the n - 1
tokens before it inside the window, so the first tokens of a window use shorter contexts.

Memory stays bounded by the number of distinct n-grams, never by the stream: k-grams are
counted chunk by chunk as base-V integers (uint64), and only each chunk's distinct keys are
kept. Orders whose keys do not fit 64 bits (V^n > 2^64, e.g. n = 4 past 65,536 tokens) are
not fitted. Past FIT_TOKENS training tokens the counts come from FIT_TOKENS tokens in chunks
spread evenly over the stream (a deviation from fitting on everything, to keep a report's
baselines cheap on a corpus of gigabytes; at that size a byte 4-gram's estimates no longer move).

A model may be fitted on part of the stream only, given as `Spans` (disjoint [start, stop)
ranges, e.g. the text a training run read, `covering`): only k-grams lying wholly inside one
span are counted, as if the spans were separate documents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CHUNK = 1 << 21  # tokens counted at once: its uint64 keys take 16 MB
FIT_TOKENS = 1 << 26  # the most training tokens a model is fitted on (32 chunks)


def fits(vocab: int, order: int) -> bool:
    """Whether the keys of `order`-grams over `vocab` tokens fit in uint64."""
    return vocab ** order <= 2**64


def gram_keys(tokens: np.ndarray, k: int, vocab: int) -> np.ndarray:
    """The base-`vocab` key of every k-gram along the last axis ([..., n - k + 1] uint64)."""
    width = tokens.shape[-1] - k + 1
    keys = np.zeros((*tokens.shape[:-1], max(width, 0)), dtype=np.uint64)
    for i in range(k):
        keys = keys * np.uint64(vocab) + tokens[..., i: i + width].astype(np.uint64)
    return keys


def chunk_starts(n_tokens: int) -> list[int]:
    """Starts of the chunks a model is fitted on: every chunk, or FIT_TOKENS // CHUNK spread evenly."""
    starts = range(0, n_tokens, CHUNK)
    if n_tokens <= FIT_TOKENS:
        return list(starts)
    return [int(s) for s in np.linspace(0, n_tokens - CHUNK, FIT_TOKENS // CHUNK).astype(np.int64)]


@dataclass(frozen=True)
class Spans:
    """Disjoint ranges [starts[i], stops[i]) of a token stream, sorted."""

    starts: np.ndarray
    stops: np.ndarray

    def inside(self, first: int, count: int, k: int) -> np.ndarray:
        """Whether each of the `count` k-grams starting at first, first + 1, ... lies in one span."""
        if not len(self.starts):
            return np.zeros(count, dtype=bool)
        at = np.arange(first, first + count)
        span = np.searchsorted(self.starts, at, side="right") - 1  # the last span starting at or before
        return (span >= 0) & (at + k <= self.stops[np.maximum(span, 0)])


def covering(starts: np.ndarray, length: int) -> Spans:
    """The text that windows of `length` tokens starting at `starts` cover, as disjoint spans."""
    starts = np.sort(np.asarray(starts, dtype=np.int64))
    if not len(starts):
        return Spans(starts, starts)
    reach = np.maximum.accumulate(starts + length)  # the furthest token covered so far (exclusive)
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] > reach[:-1]  # a gap before this window: a span starts here
    last = np.append(np.flatnonzero(new)[1:] - 1, len(starts) - 1)  # each span's last window
    return Spans(starts[new], reach[last])


def count_grams(tokens: np.ndarray, k: int, vocab: int, spans: Spans | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct k-gram keys of `tokens` (any integer array, or a TokenFile) and their
    counts, each chunk's merged into the running set: memory is the distinct grams plus a chunk.
    With `spans`, only the grams inside them."""
    keys, counts = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    for start in chunk_starts(len(tokens)):
        segment = np.asarray(tokens[start: start + CHUNK + k - 1])  # k - 1 of overlap: no gram is lost
        grams = gram_keys(segment, k, vocab)
        if spans is not None:
            grams = grams[spans.inside(start, len(grams), k)]
        unique, count = np.unique(grams, return_counts=True)
        keys, inverse = np.unique(np.concatenate([keys, unique]), return_inverse=True)
        counts = np.bincount(inverse, weights=np.concatenate([counts, count]), minlength=len(keys)).astype(np.int64)
    return keys, counts


@dataclass(frozen=True)
class Order:
    """The counts of one order k: k-grams, and per context (its first k - 1 tokens) c(h) and N1+(h .)."""

    keys: np.ndarray  # sorted uint64 k-gram keys
    counts: np.ndarray  # c(h w) per key
    contexts: np.ndarray  # sorted distinct context keys (key // V)
    totals: np.ndarray  # c(h) per context
    types: np.ndarray  # N1+(h .) per context

    @classmethod
    def count(cls, tokens: np.ndarray, k: int, vocab: int, spans: Spans | None = None) -> Order:
        keys, counts = count_grams(tokens, k, vocab, spans)
        # Keys sort by context first, so each context's grams are contiguous.
        contexts, first, types = np.unique(keys // np.uint64(vocab), return_index=True, return_counts=True)
        totals = np.add.reduceat(counts, first) if len(keys) else counts
        return cls(keys, counts, contexts, totals, types)


def lookup(sorted_keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """values[i] where sorted_keys[i] == query, else 0 (same shape as queries)."""
    if not len(sorted_keys):
        return np.zeros(queries.shape, dtype=values.dtype)
    at = np.minimum(np.searchsorted(sorted_keys, queries), len(sorted_keys) - 1)
    return np.where(sorted_keys[at] == queries, values[at], 0)


class WittenBell:
    """An interpolated Witten-Bell model of order `order` fitted on `tokens` (ids < `vocab`), or
    on the `spans` of them only."""

    def __init__(self, tokens: np.ndarray, order: int, vocab: int, spans: Spans | None = None):
        if not fits(vocab, order):
            raise ValueError(f"{order}-gram keys over {vocab} tokens do not fit 64 bits")
        self.order, self.vocab = order, vocab
        self.levels = [Order.count(tokens, k, vocab, spans) for k in range(1, order + 1)]

    def log_probs(self, windows: np.ndarray, order: int | None = None) -> np.ndarray:
        """ln P of each window's tokens after its first, each from the tokens before it inside
        the window (at most order - 1 of them; `order` may be below the fitted one, whose
        lower orders are the same counts): [W, L] ids -> [W, L - 1]."""
        n_windows, length = windows.shape
        p = np.full((n_windows, length - 1), 1.0 / self.vocab)  # order 0: uniform
        for k, level in enumerate(self.levels[: order or self.order], start=1):
            first = max(k - 1, 1)  # the first scored index with k - 1 tokens before it
            if first > length - 1:
                break
            grams = gram_keys(windows, k, self.vocab)[:, first - k + 1:]  # grams ending at index first..L-1
            lower = p[:, first - 1:]
            seen = lookup(level.keys, level.counts, grams)
            if k == 1:  # the empty context: every token, every distinct token
                total, types = level.counts.sum(), len(level.keys)
            else:
                contexts = grams // np.uint64(self.vocab)
                total = lookup(level.contexts, level.totals, contexts)
                types = lookup(level.contexts, level.types, contexts)
            with np.errstate(invalid="ignore", divide="ignore"):
                mixed = (seen + types * lower) / (total + types)
            p[:, first - 1:] = np.where(total > 0, mixed, lower)
        return np.log(p)
