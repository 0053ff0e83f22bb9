"""passkey: retrieve a number hidden in filler text (Mohtashami & Jaggi 2023, "Landmark
Attention", section 4.2), the field's standard probe of length extrapolation.

A row is filler (their repeated sentences "the grass is green . the sky is blue . the sun is
yellow . here we go . there and back again ."), with the needle "the pass key is D D D D D .
remember it ." inserted at a chosen depth, and the question "what is the pass key ?" at the
end; the target is the key's digits. The filler carries no information, so only retrieval
from the needle answers: the key is uniform over 10^key_length values, and a predictor that
ignores the input scores 1 / 10^key_length on exact match (1/10 per digit).

`train_length` and `eval_lengths` count filler tokens; evaluating at lengths past the
training one puts the key farther from the question than training ever did. `depth` fixes
where the needle sits (0: at the start, 1: just before the question; a fraction of the filler,
rounded down to a sentence boundary of the filler as in the paper's prompt); without it every
example draws its depth uniformly. Generated locally from a seed: no download.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from workbench import hookimpl
from workbench.tasks import Example, Task, TaskParams, blind_scores

FILLER = "the grass is green . the sky is blue . the sun is yellow . here we go . there and back again .".split()
NEEDLE_START, NEEDLE_END = "the pass key is".split(), ". remember it .".split()
QUESTION = "what is the pass key ?".split()
DIGITS = tuple(str(d) for d in range(10))


class PasskeyParams(TaskParams):
    train_length: int = Field(64, gt=0, description="filler tokens around the needle in training (eval_lengths: at evaluation)")
    key_length: int = Field(5, ge=1, le=12, description="digits of the key: 10^key_length possible keys")
    depth: float | None = Field(None, ge=0, le=1, description="where the needle sits in the filler (0 start, 1 end); "
                                "default: uniform per example")


class Passkey(Task):
    """Retrieve a key of digits hidden at a chosen depth in filler text (passkey retrieval)."""

    name = "passkey"
    Params = PasskeyParams
    families = ("decoder", "encoder_decoder")

    def __init__(self, params: PasskeyParams, **kw):
        super().__init__(params, **kw)
        self._set_vocab([*dict.fromkeys(FILLER + NEEDLE_START + NEEDLE_END + QUESTION), *DIGITS])
        self.digit_ids = np.array(self.encode(DIGITS))
        self.filler_ids = self.encode(FILLER)

    def filler(self, n: int) -> list[int]:
        """The first n tokens of the repeated filler sentences."""
        repeats = -(-n // len(self.filler_ids))
        return list(self.filler_ids * repeats)[:n]

    def needle_offset(self, rng: np.random.Generator, length: int) -> int:
        """Filler tokens before the needle: the sentence boundary (or the filler's end) at or
        below depth * length."""
        depth = self.params.depth if self.params.depth is not None else rng.random()
        wanted = int(depth * length)
        stops = [0, length] + [i + 1 for i, t in enumerate(self.filler(length)) if self.vocab[t] == "."]
        return max(s for s in stops if s <= wanted)

    def example(self, rng, length, training):
        key = self.digit_ids[rng.integers(10, size=self.params.key_length)].tolist()
        offset = self.needle_offset(rng, length)
        text = self.filler(length)
        needle = [*self.encode(NEEDLE_START), *key, *self.encode(NEEDLE_END)]
        source = text[:offset] + needle + text[offset:] + list(self.encode(QUESTION))
        return Example(tuple(source), tuple(key), meta={"depth": offset / length})

    def chance(self, family, length):
        """Closed form: each digit is uniform over 10, independent of the filler and of the
        other digits, so the input-ignoring predictor scores 1/10 per digit (loss ln 10) and
        1 / 10^key_length on exact match; the <eos> a family scores sits at a known place."""
        digits = [(1.0, np.full(10, 0.1))] * self.params.key_length
        certain = [(1.0, np.ones(1))] * self.always_predictable(family)
        return blind_scores(digits + certain, 10.0 ** -self.params.key_length)


@hookimpl
def register_tasks():
    return [Passkey]
