"""Decoding metrics of the text_lm task (claim E12): distinct-n and repetition-n on hand-made
sequences, and continuations written by a model under each strategy."""

import math

import pytest
import torch

from workbench.model.transformer import build_model
from workbench_plugins.task_text_lm import TextLM, TextParams, distinct_n, repetition_n


def test_distinct_pools_ngrams_over_sequences():
    assert distinct_n([[1, 2, 3, 4]], 2) == 1.0  # 12 23 34: all distinct
    assert distinct_n([[1, 1, 1, 1]], 2) == pytest.approx(1 / 3)  # 11 three times
    # The same bigram in two sequences counts once: 12 23 | 12 34 -> 3 distinct of 4
    assert distinct_n([[1, 2, 3], [1, 2, 4]], 2) == pytest.approx(3 / 4)
    assert math.isnan(distinct_n([[1]], 2))


def test_repetition_is_the_share_of_repeated_ngrams_per_sequence():
    loop = [5, 6, 7, 8] * 3  # 9 four-grams, of which 4 distinct: 5 repeats
    assert repetition_n([loop], 4) == pytest.approx(5 / 9)
    assert repetition_n([[1, 2, 3, 4, 5, 6]], 4) == 0.0
    # Averaged per sequence, not pooled: a fresh sequence does not dilute by its length.
    assert repetition_n([loop, list(range(30))], 4) == pytest.approx((5 / 9 + 0.0) / 2)
    # A 4-gram shared by two sequences is not a repeat within either.
    assert repetition_n([[1, 2, 3, 4], [1, 2, 3, 4]], 4) == 0.0
    assert math.isnan(repetition_n([[1, 2, 3]], 4))


def task(**params) -> TextLM:
    return TextLM(TextParams(**{"train_length": 24, "n_eval": 8, "decode_samples": 4, "decode_tokens": 8, **params}),
                  seed=0)


def model_for(t: TextLM):
    torch.manual_seed(0)
    return build_model({"vocab_size": len(t.vocab), "d_model": 16, "n_heads": 2, "n_layers": 1}).eval()


def test_continuations_fill_the_window_and_follow_the_strategy():
    greedy, sampled = task(), task(decode_strategy="sample", temperature=2.0)
    model = model_for(greedy)
    batches = greedy.eval_batches(24, 8, "decoder")
    a, b = greedy.continuations(model, batches), greedy.continuations(model, batches)
    assert len(a) == 4 and all(len(row) == 8 for row in a)
    assert a == b  # greedy: deterministic
    s1, s2 = sampled.continuations(model, batches), sampled.continuations(model, batches)
    assert s1 == s2  # sampling draws from a generator seeded by the run's seed
    assert s1 != a  # an untrained model at temperature 2 does not sample its argmax 32 times
    scores = sampled.evaluate(model, batches, "decoder")
    assert 0 < scores["distinct_2"] <= 1 and 0 <= scores["repetition_4"] < 1
    off = task(decode_samples=0).evaluate(model, batches, "decoder")  # generation off
    assert math.isnan(off["distinct_2"]) and math.isnan(off["repetition_4"]) and off["bpc"] == scores["bpc"]


def test_short_windows_continue_their_second_half():
    t = task(train_length=10, decode_tokens=32)
    rows = t.continuations(model_for(t), t.eval_batches(10, 8, "decoder"))
    assert [len(r) for r in rows] == [5] * 4  # half of a 10-byte window, not 32 bytes past it


def test_a_swept_null_matches_its_expectation_point():
    # top_p: null comes back from the results table as NaN; the report must still find it.
    import pandas as pd

    from workbench.report.sweep_points import Variants

    runs = pd.DataFrame({"task.top_p": [float("nan"), 0.9]})
    variants = Variants.of(["task.top_p"], runs, {"task.top_p": [None, 0.9]})
    assert variants.labels == ["top_p=None", "top_p=0.9"]
    assert variants.pairs({"task.top_p": 0.9}, {"task.top_p": None}) == [("top_p=0.9", "top_p=None")]
