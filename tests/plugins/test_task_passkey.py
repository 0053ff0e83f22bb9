"""passkey (Mohtashami & Jaggi 2023): the generator puts one key at the asked depth in filler of
the asked length, and the input-ignoring baseline is 1 / 10 per digit, 1 / 10^k per key."""

from __future__ import annotations

import pytest

from workbench.errors import WorkbenchError
from workbench.registry import variants
from workbench.tasks.base import Task
from workbench_plugins.task_passkey import DIGITS, FILLER, QUESTION

Passkey = variants("task")["passkey"]


def make(**params):
    return Passkey(Passkey.Params(**{"train_length": 40, "n_eval": 64, **params}), seed=0)


def parts(task, ex):
    """(filler before the needle, key, filler after, question) of an example, in words."""
    words = task.decode(ex.source)
    start = next(i for i in range(len(words)) if words[i:i + 4] == ["the", "pass", "key", "is"])
    k = task.params.key_length
    return words[:start], words[start + 4:start + 4 + k], words[start + 4 + k + 4:-len(QUESTION)], words[-len(QUESTION):]


@pytest.mark.parametrize("length", [40, 80, 200])
def test_one_key_in_filler_of_the_asked_length_and_the_question_at_the_end(length):
    task = make(eval_lengths=[40, 80, 200])
    for ex in task.evaluation_set(length):
        before, key, after, question = parts(task, ex)
        assert question == QUESTION and task.decode(ex.target) == key
        filler = before + after
        assert len(filler) == length and filler == (FILLER * 20)[:length]  # the sentences, unbroken
        assert all(w not in DIGITS for w in filler)  # the key is the only number in the row
        assert not before or before[-1] == "."  # the needle sits between sentences


@pytest.mark.parametrize(("depth", "where"), [(0.0, 0), (1.0, 40), (0.5, 20)])
def test_depth_places_the_needle(depth, where):
    task = make(depth=depth)
    for ex in task.evaluation_set(40):
        before, _, _, _ = parts(task, ex)
        # at the sentence boundary at or before depth * length (FILLER's sentences end at 5, 10, 15, 19, 24, ...)
        assert len(before) == max(s for s in (0, 5, 10, 15, 19, 24, 29, 34, 39, 40) if s <= where)
        assert ex.meta["depth"] == len(before) / 40


def test_depths_spread_over_the_filler_when_not_fixed():
    depths = [ex.meta["depth"] for ex in make(n_eval=400).evaluation_set(40)]
    assert min(depths) == 0.0 and max(depths) > 0.9
    assert 0.35 < sum(depths) / len(depths) < 0.6


def test_keys_are_uniform_digits():
    keys = [ex.target for ex in make(n_eval=2000, key_length=2).evaluation_set(40)]
    assert len(set(keys)) > 90  # of 100 possible keys
    first = [k[0] for k in keys]
    assert all(abs(first.count(d) / 2000 - 0.1) < 0.03 for d in set(first))


@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("key_length", [1, 3])
def test_input_ignoring_baseline_is_one_over_the_number_of_keys(family, key_length):
    task = make(key_length=key_length, n_eval=3000)
    chance = task.chance(family, 40)
    assert chance["exact_match"] == pytest.approx(10.0 ** -key_length)
    eos = 1  # both families score an <eos> after the key, which a blind predictor knows
    assert chance["accuracy"] == pytest.approx((0.1 * key_length + eos) / (key_length + eos))
    counted = Task.chance(task, family, 40)  # the generic estimate, counted on the held-out set
    assert counted["accuracy"] == pytest.approx(chance["accuracy"], abs=0.02)


def test_training_refuses_an_example_space_its_evaluation_sets_hold_out():
    # A 1-digit key in 32 filler tokens has 10 keys x 8 sentence boundaries: 256 held-out rows
    # cover nearly all of them, so training would cycle through the few left.
    tiny = Passkey(Passkey.Params(train_length=32, n_eval=256, key_length=1), seed=0)
    with pytest.raises(WorkbenchError, match=r"held out for evaluation.*task.n_eval=256"):
        for index in range(8):
            tiny.train_batch(index, 64, "decoder")
    roomy = make(key_length=2)  # 100 keys: the held-out rows are a small share
    for index in range(8):
        roomy.train_batch(index, 64, "decoder")
    assert roomy._held_draws < 0.5 * roomy._draws
