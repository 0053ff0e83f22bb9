"""n-gram models fitted on part of a stream: the spans a run's training windows cover, and only
the grams wholly inside one span counted (workbench.tasks.ngram)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from workbench.tasks import ngram
from workbench.tasks.ngram import WittenBell, count_grams, covering


def brute_counts(tokens: np.ndarray, spans, k: int) -> Counter:
    """Each k-gram inside a span, counted span by span with tuples."""
    out: Counter = Counter()
    for a, b in zip(spans.starts, spans.stops):
        piece = tokens[a:b].tolist()
        out.update(tuple(piece[i: i + k]) for i in range(len(piece) - k + 1))
    return out


def as_counter(keys: np.ndarray, counts: np.ndarray, k: int, vocab: int) -> Counter:
    grams = {}
    for key, count in zip(keys.tolist(), counts.tolist()):
        digits = []
        for _ in range(k):
            key, d = divmod(key, vocab)
            digits.append(d)
        grams[tuple(reversed(digits))] = count
    return Counter(grams)


def test_windows_cover_disjoint_spans_merged_where_they_overlap():
    spans = covering(np.array([10, 0, 3, 30, 33, 60]), 5)
    assert spans.starts.tolist() == [0, 10, 30, 60] and spans.stops.tolist() == [8, 15, 38, 65]
    assert spans.inside(0, 10, 2).tolist() == [True] * 7 + [False] * 3  # a gram ending at 8 leaves [0, 8)
    empty = covering(np.array([], dtype=np.int64), 5)
    assert len(empty.starts) == 0 and not empty.inside(0, 4, 1).any()


@pytest.mark.parametrize("chunk", [7, 1 << 21])  # spans across chunk borders, and one chunk
def test_only_grams_inside_the_spans_are_counted(monkeypatch, chunk):
    monkeypatch.setattr(ngram, "CHUNK", chunk)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 5, 200).astype(np.uint8)
    spans = covering(rng.integers(0, 190, 12), 10)
    for k in (1, 2, 3):
        keys, counts = count_grams(tokens, k, 5, spans)
        assert as_counter(keys, counts, k, 5) == brute_counts(tokens, spans, k)


def test_spans_that_cover_the_stream_fit_the_model_of_the_whole_stream():
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, 6, 500).astype(np.uint8)
    windows = rng.integers(0, 6, (4, 12)).astype(np.uint8)
    everything = covering(np.arange(0, 500 - 16 + 1), 16)
    whole, part = WittenBell(tokens, 2, 6), WittenBell(tokens, 2, 6, everything)
    assert np.allclose(whole.log_probs(windows), part.log_probs(windows))
    little = WittenBell(tokens, 2, 6, covering(np.array([0]), 16))  # 16 tokens: a different, flatter model
    assert not np.allclose(little.log_probs(windows), whole.log_probs(windows))
