"""The zh -> en grammar: pairs are aligned, and 它 resolves as each reason dictates."""

from __future__ import annotations

import collections

import pytest

from workbench.registry import variants
from workbench_plugins.task_translate import NOUNS, PRONOUNS, canonical_pairs

NOUN_EN = {n.zh: (n.en, n.plural) for n in NOUNS}
PRONOUN_EN = {p.zh: (p.subject, p.object) for p in PRONOUNS}
# Whose property each 因为-reason states, decided by hand from the Chinese predicate.
REASON_ROLE = {"快": "object", "累": "subject", "慢": "subject", "饱": "subject",
               "坏": "object", "贵": "object", "小": "object", "睡": "subject"}


def pairs(pronoun: str, n: int = 400):
    cls = variants("task")["translate"]
    task = cls(cls.Params(pronoun=pronoun, train_length=24, n_eval=n), seed=3)
    return task, [(task.decode(ex.source), task.decode(ex.target)) for ex in task.eval_examples(24)]


def english_nouns(words: list[str]) -> collections.Counter:
    singular_or_plural = {w: en for en, plural in NOUN_EN.values() for w in (en, plural)}
    return collections.Counter(singular_or_plural[w] for w in words if w in singular_or_plural)


def test_canonical_sentences():
    love, fast, tired = canonical_pairs("it")
    assert (" ".join(love.zh), " ".join(love.en)) == ("我 爱 猫", "I love cats")
    assert " ".join(fast.zh) == "小猫 没 追上 汽车 ， 因为 它 跑 得 太 快 了"
    assert " ".join(fast.en) == "the cat did not catch the car because it ran too fast"
    assert " ".join(tired.en) == "the cat did not catch the car because it was too tired"
    _, fast, tired = canonical_pairs("referent")
    assert " ".join(fast.en).endswith("because the car ran too fast")
    assert " ".join(tired.en).endswith("because the cat was too tired")


def test_translate_sample_shows_the_tutorial_sentences():
    cls = variants("task")["translate"]
    sample = cls(cls.Params(), seed=0).sample("encoder_decoder")
    assert sample["examples"][0]["source"] == ["我", "爱", "猫"]
    assert sample["examples"][0]["target"] == ["I", "love", "cats"]
    assert "它" in sample["examples"][1]["source"] and sample["batch"]["src"].shape[0] == 3


def test_pairs_mention_the_same_entities():
    _, corpus = pairs("it")
    for zh, en in corpus:
        source_nouns = collections.Counter(NOUN_EN[w][0] for w in zh if w in NOUN_EN)
        assert source_nouns == english_nouns(en), (zh, en)
        for w in zh:
            if w in PRONOUN_EN:
                assert set(PRONOUN_EN[w]) & set(en), (zh, en)
        assert zh.count("它") == en.count("it") and zh.count("而且") == en.count("and")


def test_it_resolves_as_the_reason_dictates():
    _, corpus = pairs("referent")
    checked = 0
    for zh, en in corpus:
        assert "it" not in en
        clause_starts = [0] + [i + 2 for i, w in enumerate(zh) if w == "，" and zh[i + 1] == "而且"]
        for i, w in enumerate(zh):
            if w != "它":
                continue
            start = max(s for s in clause_starts if s < i)
            clause = zh[start:i]
            nouns = [x for x in clause if x in NOUN_EN]
            subject_noun = [x for x in clause[: clause.index("没")] if x in NOUN_EN]
            role = REASON_ROLE[next(x for x in zh[i + 1:] if x in REASON_ROLE)]
            expected = subject_noun[-1] if role == "subject" else nouns[-1]
            # English: "because" is followed by the referent's noun phrase "the (adj) noun".
            nth = zh[:i].count("因为") - 1  # the k-th 它 belongs to the k-th "because"
            after = en[[j for j, x in enumerate(en) if x == "because"][nth]:]
            referent_noun = next(iter(english_nouns(after[1:4])))
            assert referent_noun == NOUN_EN[expected][0], (zh, en)
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder"])
def test_every_generated_word_is_in_the_vocabulary(family):
    task, _ = pairs("it", n=8)
    for index in range(30):
        batch = task.train_batch(index, 16, family)  # encode() raises KeyError on an unknown word
        assert batch[next(iter(batch))].shape[0] == 16
