"""translate: a synthetic Chinese -> English corpus from a small bilingual grammar.

In the spirit of the tutorials' running example, "我 爱 猫" -> "I love cats". Both sides
are generated from one derivation, so every pair is aligned by construction:

  simple clause     subject  verb-with-tense  object
                    我 不 喜欢 狗 -> I do not like dogs   (bare object of 爱/喜欢: generic plural)
                    他 买 了 一 本 有趣 的 书 -> he bought an interesting book   (measure words)
                    tenses: V (present), 不 V (do/does not), V 了 (past), 没 V (did not),
                    会 V (will), 不 会 V (will not); 爱/喜欢 only take the two present forms
  把 clause         S 把 O V-complement 了 -> S V-past O         (the object moves)
                    我 把 苹果 吃 了 -> I ate the apple
  它 clause         S 没 V O ， 因为 它 <reason>  -> S did not V O because it <reason>
                    the reason decides the referent of 它:
                    小猫 没 追上 汽车 ， 因为 它 跑 得 太 快 了 -> ... because it ran too fast  (it = the car)
                    小猫 没 追上 汽车 ， 因为 它 太 累 了     -> ... because it was too tired (it = the cat)
  sentence          clause ( ， 而且 clause )*  -> clause ( and clause )*

Tokens are words (Chinese pre-segmented). With `pronoun: referent` 它 is translated as the
noun phrase it refers to ("because the car ran too fast"), so that exact match requires
resolving it; with the default `pronoun: it` the target keeps the tutorial's "it" and the
resolution is only visible in attention maps. `train_length` is the longest source sentence
in words; an eval length past it draws sentences longer than any seen in training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import Field

from workbench import hookimpl
from workbench.tasks import Example, LengthRangeParams, Task, declared, draw_within, length_window

# ---- lexicon --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Noun:
    zh: str
    en: str
    plural: str
    measure: str  # classifier used with numbers: 一 本 书
    kind: str  # human, animal, vehicle, book, food, toy: what verbs and adjectives accept


@dataclass(frozen=True)
class Pronoun:
    zh: str
    subject: str
    object: str
    third_singular: bool


@dataclass(frozen=True)
class Verb:
    zh: str
    base: str
    third: str
    past: str
    stative: bool  # 爱/喜欢: present forms only, and a bare object reads as generic plural
    subjects: frozenset[str]
    objects: frozenset[str]
    ba: tuple[tuple[str, ...], str] | None = None  # (zh words after the object, English verb)


@dataclass(frozen=True)
class Adjective:
    zh: str
    en: str
    kinds: frozenset[str]


@dataclass(frozen=True)
class Number:
    zh: str
    en: str  # "a" is spelled "a"/"an" at rendering time
    plural: bool


@dataclass(frozen=True)
class Reason:
    """A 因为-clause about 它; `role` says whose property it is (subject or object)."""

    zh: tuple[str, ...]
    en: tuple[str, ...]
    role: Literal["subject", "object"]
    kinds: frozenset[str]  # kinds the referent can have (never human: 它 is non-human)


def kinds(*names: str) -> frozenset[str]:
    return frozenset(names)


THINGS = kinds("vehicle", "book", "food", "toy")
NON_HUMAN = THINGS | {"animal"}
ANY = NON_HUMAN | {"human"}

NOUNS = (
    Noun("猫", "cat", "cats", "只", "animal"), Noun("小猫", "cat", "cats", "只", "animal"),
    Noun("狗", "dog", "dogs", "只", "animal"), Noun("小狗", "dog", "dogs", "只", "animal"),
    Noun("鸟", "bird", "birds", "只", "animal"),
    Noun("汽车", "car", "cars", "辆", "vehicle"), Noun("自行车", "bike", "bikes", "辆", "vehicle"),
    Noun("书", "book", "books", "本", "book"),
    Noun("苹果", "apple", "apples", "个", "food"), Noun("鱼", "fish", "fish", "条", "food"),
    Noun("球", "ball", "balls", "个", "toy"),
    Noun("老师", "teacher", "teachers", "位", "human"), Noun("学生", "student", "students", "个", "human"),
)
PRONOUNS = (
    Pronoun("我", "I", "me", False), Pronoun("你", "you", "you", False),
    Pronoun("他", "he", "him", True), Pronoun("她", "she", "her", True),
    Pronoun("我们", "we", "us", False), Pronoun("他们", "they", "them", False),
)
ANIMATE = kinds("human", "animal")
VERBS = (
    Verb("爱", "love", "loves", "loved", True, ANIMATE, ANY),
    Verb("喜欢", "like", "likes", "liked", True, ANIMATE, ANY),
    Verb("买", "buy", "buys", "bought", False, kinds("human"), THINGS),
    Verb("卖", "sell", "sells", "sold", False, kinds("human"), THINGS, (("卖", "了"), "sold")),
    Verb("吃", "eat", "eats", "ate", False, ANIMATE, kinds("food"), (("吃", "了"), "ate")),
    Verb("看见", "see", "sees", "saw", False, ANIMATE, ANY),
    Verb("追", "chase", "chases", "chased", False, ANIMATE, kinds("human", "animal", "vehicle", "toy")),
    Verb("追上", "catch", "catches", "caught", False, ANIMATE, kinds("animal", "vehicle", "toy")),
    Verb("修", "fix", "fixes", "fixed", False, kinds("human"), kinds("vehicle", "toy"), (("修", "好", "了"), "fixed")),
    Verb("读", "read", "reads", "read", False, kinds("human"), kinds("book"),
         (("读", "完", "了"), "finished reading")),
)
ADJECTIVES = (
    Adjective("有趣", "interesting", kinds("book")),
    Adjective("可爱", "cute", kinds("animal")),
    Adjective("聪明", "clever", kinds("animal", "human")),
    Adjective("新", "new", kinds("vehicle", "book", "toy")),
    Adjective("旧", "old", kinds("vehicle", "book", "toy")),
    Adjective("红色", "red", kinds("vehicle", "book", "toy", "food")),
    Adjective("大", "big", NON_HUMAN),
)
NUMBERS = (Number("一", "a", False), Number("两", "two", True), Number("三", "three", True))
# 它-sentences: main verb (negated past) -> reasons whose predicate decides the referent.
REASONS = {
    "追上": (
        Reason(("跑", "得", "太", "快", "了"), ("ran", "too", "fast"), "object", kinds("animal", "vehicle", "toy")),
        Reason(("太", "累", "了"), ("was", "too", "tired"), "subject", kinds("animal")),
        Reason(("太", "慢", "了"), ("was", "too", "slow"), "subject", kinds("animal")),
    ),
    "吃": (
        Reason(("太", "饱", "了"), ("was", "too", "full"), "subject", kinds("animal")),
        Reason(("坏", "了"), ("had", "gone", "bad"), "object", kinds("food")),
    ),
    "买": (Reason(("太", "贵", "了"), ("was", "too", "expensive"), "object", THINGS),),
    "看见": (
        Reason(("太", "小", "了"), ("was", "too", "small"), "object", NON_HUMAN),
        Reason(("睡", "着", "了"), ("was", "asleep"), "subject", kinds("animal")),
    ),
}
TENSES = ("present", "present_negative", "past", "past_negative", "future", "future_negative")
FUNCTION_WORDS_ZH = ("的", "了", "不", "没", "会", "把", "，", "因为", "而且", "它")
FUNCTION_WORDS_EN = ("the", "a", "an", "do", "does", "did", "not", "will", "because", "it", "and")
VERB_OF = {v.zh: v for v in VERBS}

# ---- derivations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NP:
    """A noun phrase: a pronoun, or a noun with an optional adjective and number."""

    pronoun: Pronoun | None = None
    noun: Noun | None = None
    adjective: Adjective | None = None
    number: Number | None = None

    @property
    def kind(self) -> str:
        return "human" if self.pronoun else self.noun.kind

    @property
    def third_singular(self) -> bool:
        return self.pronoun.third_singular if self.pronoun else not (self.number and self.number.plural)

    def zh(self) -> list[str]:
        if self.pronoun:
            return [self.pronoun.zh]
        words = [self.number.zh, self.noun.measure] if self.number else []
        words += [self.adjective.zh, "的"] if self.adjective else []
        return words + [self.noun.zh]

    def en(self, role: str = "subject", generic: bool = False) -> list[str]:
        if self.pronoun:
            return [self.pronoun.subject if role == "subject" else self.pronoun.object]
        adjective = [self.adjective.en] if self.adjective else []
        if self.number:
            head = self.noun.plural if self.number.plural else self.noun.en
            article = self.number.en if self.number.plural else ("an" if (adjective or [head])[0][0] in "aeiou" else "a")
            return [article, *adjective, head]
        return [*adjective, self.noun.plural] if generic else ["the", *adjective, self.noun.en]


@dataclass
class Pair:
    zh: list[str]
    en: list[str]
    referents: list[NP] = field(default_factory=list)  # what each 它 refers to, in order


def verb_phrase(verb: Verb, tense: str, subject: NP) -> tuple[list[str], list[str]]:
    """Chinese and English words of the verb in one tense (English agrees with the subject)."""
    s3 = subject.third_singular
    return {
        "present": ([verb.zh], [verb.third if s3 else verb.base]),
        "present_negative": (["不", verb.zh], ["does" if s3 else "do", "not", verb.base]),
        "past": ([verb.zh, "了"], [verb.past]),
        "past_negative": (["没", verb.zh], ["did", "not", verb.base]),
        "future": (["会", verb.zh], ["will", verb.base]),
        "future_negative": (["不", "会", verb.zh], ["will", "not", verb.base]),
    }[tense]


def simple_clause(subject: NP, verb: Verb, tense: str, obj: NP) -> Pair:
    vzh, ven = verb_phrase(verb, tense, subject)
    generic = verb.stative and obj.noun is not None and obj.number is None
    return Pair(subject.zh() + vzh + obj.zh(), subject.en("subject") + ven + obj.en("object", generic))


def ba_clause(subject: NP, verb: Verb, obj: NP) -> Pair:
    """S 把 O V-complement 了 -> S V-past O: the object moves before the verb in Chinese."""
    zh_tail, en_verb = verb.ba
    return Pair(subject.zh() + ["把"] + obj.zh() + list(zh_tail),
                subject.en("subject") + en_verb.split() + obj.en("object"))


def it_clause(subject: NP, verb: Verb, obj: NP, reason: Reason, pronoun: str) -> Pair:
    """S 没 V O ， 因为 它 <reason>: the reason's role picks the referent of 它."""
    main = simple_clause(subject, verb, "past_negative", obj)
    referent = subject if reason.role == "subject" else obj
    it = ["it"] if pronoun == "it" else NP(noun=referent.noun, adjective=referent.adjective).en()
    return Pair(main.zh + ["，", "因为", "它", *reason.zh], main.en + ["because", *it, *reason.en], [referent])


def join(clauses: list[Pair]) -> Pair:
    out = Pair(list(clauses[0].zh), list(clauses[0].en), list(clauses[0].referents))
    for c in clauses[1:]:
        out.zh += ["，", "而且", *c.zh]
        out.en += ["and", *c.en]
        out.referents += c.referents
    return out


class Grammar:
    """Random derivations: each choice is drawn from the lexicon entries that fit."""

    def __init__(self, rng: np.random.Generator, pronoun: str):
        self.rng, self.pronoun = rng, pronoun

    def pick(self, items):
        items = list(items)
        return items[int(self.rng.integers(len(items)))]

    def noun_phrase(self, allowed: frozenset[str], *, pronouns: bool, numbers: bool,
                    avoid: NP | None = None) -> NP:
        if pronouns and "human" in allowed and self.rng.random() < 0.4:
            return NP(pronoun=self.pick(p for p in PRONOUNS if avoid is None or p != avoid.pronoun))
        noun = self.pick(n for n in NOUNS if n.kind in allowed)
        fitting = [a for a in ADJECTIVES if noun.kind in a.kinds]
        adjective = self.pick(fitting) if fitting and self.rng.random() < 0.3 else None
        number = self.pick(NUMBERS) if numbers and self.rng.random() < 0.3 else None
        return NP(noun=noun, adjective=adjective, number=number)

    def clause(self) -> Pair:
        r = self.rng.random()
        if r < 0.5:
            verb = self.pick(VERBS)
            subject = self.noun_phrase(verb.subjects, pronouns=True, numbers=False)
            tense = self.pick(TENSES[:2] if verb.stative else TENSES)
            obj = self.noun_phrase(verb.objects, pronouns=True, numbers=True, avoid=subject)
            return simple_clause(subject, verb, tense, obj)
        if r < 0.7:
            verb = self.pick(v for v in VERBS if v.ba)
            subject = self.noun_phrase(verb.subjects, pronouns=True, numbers=False)
            return ba_clause(subject, verb, self.noun_phrase(verb.objects, pronouns=False, numbers=False))
        verb = VERB_OF[self.pick(REASONS)]
        reason = self.pick(REASONS[verb.zh])
        subject_kinds = verb.subjects & reason.kinds if reason.role == "subject" else verb.subjects
        object_kinds = verb.objects & reason.kinds if reason.role == "object" else verb.objects
        subject = self.noun_phrase(subject_kinds, pronouns=reason.role == "object", numbers=False)
        obj = self.noun_phrase(object_kinds, pronouns=False, numbers=False)
        return it_clause(subject, verb, obj, reason, self.pronoun)

    def sentence(self, lo: int, hi: int, and_probability: float) -> Pair:
        """Clauses joined by 而且 until the source has at least `lo` words (then maybe more)."""
        clauses = [self.clause()]
        length = len(clauses[0].zh)
        while length < lo or (length < hi and self.rng.random() < and_probability):
            clauses.append(self.clause())
            length += 2 + len(clauses[-1].zh)
        return join(clauses)


def canonical_pairs(pronoun: str = "it") -> list[Pair]:
    """The tutorials' sentences: 我爱猫 and the two readings of the 它 sentence."""
    noun = {n.zh: n for n in NOUNS}
    cat, car = NP(noun=noun["小猫"]), NP(noun=noun["汽车"])
    fast, tired = REASONS["追上"][0], REASONS["追上"][1]
    return [
        simple_clause(NP(pronoun=PRONOUNS[0]), VERB_OF["爱"], "present", NP(noun=noun["猫"])),
        it_clause(cat, VERB_OF["追上"], car, fast, pronoun),
        it_clause(cat, VERB_OF["追上"], car, tired, pronoun),
    ]


def lexicon_words() -> tuple[list[str], list[str]]:
    """Every word the grammar can emit, Chinese and English, in a fixed order."""
    zh = [*FUNCTION_WORDS_ZH, *(n.zh for n in NOUNS), *(n.measure for n in NOUNS), *(p.zh for p in PRONOUNS),
          *(v.zh for v in VERBS), *(w for v in VERBS if v.ba for w in v.ba[0]), *(a.zh for a in ADJECTIVES),
          *(n.zh for n in NUMBERS), *(w for rs in REASONS.values() for r in rs for w in r.zh)]
    en = [*FUNCTION_WORDS_EN, *(w for n in NOUNS for w in (n.en, n.plural)),
          *(w for p in PRONOUNS for w in (p.subject, p.object)),
          *(w for v in VERBS for w in (v.base, v.third, v.past)), *(w for v in VERBS if v.ba for w in v.ba[1].split()),
          *(a.en for a in ADJECTIVES), *(n.en for n in NUMBERS), *(w for rs in REASONS.values() for r in rs for w in r.en)]
    return list(dict.fromkeys(zh)), list(dict.fromkeys(en))


# ---- the task -------------------------------------------------------------------------------


def corpus_bleu(hypotheses: list[list[str]], references: list[list[str]]) -> float:
    """Corpus BLEU (sacrebleu, 0-100) of word lists; our words are already tokenised."""
    import sacrebleu  # here, not at the top: every command loads the plugins, only this task scores BLEU

    return sacrebleu.corpus_bleu([" ".join(h) for h in hypotheses], [[" ".join(r) for r in references]],
                                 tokenize="none").score


class TranslateParams(LengthRangeParams):
    train_length: int = Field(16, gt=2, description="longest training source sentence in words")
    min_length: int = Field(1, gt=0, description="shortest training source sentence in words")
    pronoun: Literal["it", "referent"] = Field(
        "it", description="translate 它 as 'it', or as the noun phrase it refers to (makes resolution scored)"
    )
    and_probability: float = Field(0.2, ge=0, lt=1, description="chance of one more 而且-clause while it fits")


class Translate(Task):
    """Toy Chinese -> English translation from a bilingual grammar (我 爱 猫 -> I love cats)."""

    name = "translate"
    Params = TranslateParams
    families = ("encoder_decoder", "decoder")
    metrics = declared("bleu", "accuracy", "exact_match")

    def __init__(self, params: TranslateParams, **kw):
        super().__init__(params, **kw)
        zh, en = lexicon_words()
        self._set_vocab(zh + [w for w in en if w not in zh])

    def pair_to_example(self, pair: Pair) -> Example:
        return Example(self.encode(pair.zh), self.encode(pair.en), {"referents": pair.referents})

    def example(self, rng, length, training):
        p = self.params
        lo, hi = length_window(length, p.train_length, p.min_length, training)
        grammar = Grammar(rng, p.pronoun)
        pair = draw_within(lambda: grammar.sentence(lo, hi, p.and_probability), lambda s: len(s.zh), lo, hi,
                           "task translate")
        return self.pair_to_example(pair)

    def sample_examples(self):
        return [self.pair_to_example(p) for p in canonical_pairs(self.params.pronoun)]

    def extra_metrics(self, model, batches, family, scores):
        hypotheses, references = [], []
        for batch in batches:
            source_length = (batch["src_mask"].sum(-1) if family == "encoder_decoder"
                             else batch["loss_mask"].int().argmax(-1))  # decoder: prompt length
            budget = 2 * int(source_length.max()) + 4  # English is never twice as long as the source
            hypotheses += [self.decode(row) for row in self.generate(model, batch, family, budget)]
            references += [self.decode(row) for row in self.targets(batch, family)]
        return {"bleu": corpus_bleu(hypotheses, references)}

    def targets(self, batch, family) -> list[list[int]]:
        """Reference target ids of each row (without <bos>/<eos>/padding)."""
        if family == "encoder_decoder":
            rows, masks = batch["tgt"][:, 1:], batch["tgt_mask"][:, 1:]
        else:
            rows, masks = batch["tokens"], batch["loss_mask"]
        return [[t for t, m in zip(r, k) if m and t != self.eos_id] for r, k in zip(rows.tolist(), masks.tolist())]


@hookimpl
def register_tasks():
    return [Translate]
