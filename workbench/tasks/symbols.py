"""Symbol tasks (copy, reverse, sort): the target is a fixed function of a random symbol
string, so chance has a closed form and the baselines beyond it are computed from the
generator (`symbol_baselines`)."""

from __future__ import annotations

import functools
import string
from typing import ClassVar

import numpy as np
from pydantic import Field

from workbench.results import Metric
from workbench.tasks.base import Example, LengthRangeParams, Task
from workbench.tasks.baselines import BASELINE_SEED, BASELINE_STRINGS, ORDER_BLIND, PREFIX_AWARE, blind_scores
from workbench.tasks.metrics import declared
from workbench.tasks.tokens import SPECIALS


def symbol_names(n: int) -> list[str]:
    """Readable names for an alphabet: a..z, A..Z, 0..9, then s62, s63, ..."""
    base = string.ascii_lowercase + string.ascii_uppercase + string.digits
    return [base[i] if i < len(base) else f"s{i}" for i in range(n)]


class SymbolParams(LengthRangeParams):
    train_length: int = Field(16, gt=0, description="longest training string; eval strings have exactly each eval length")
    min_length: int = Field(1, gt=0, description="shortest training string")
    alphabet_size: int = Field(16, ge=2, le=1024, description="distinct symbols")


class SymbolTask(Task):
    """Base of copy / reverse / sort: the target is a fixed function of a random symbol string.

    Families: decoder (string <sep> answer), encoder_decoder, and encoder with per-token
    labels (label i = answer[i]) for reverse and sort, which need reads across the whole
    string, as a bidirectional encoder has. Copy has no encoder form: a tied-embedding
    encoder solves the identity map before any training.

    `symbol_accuracy` scores the answer's symbols only: the <eos> that decoder and
    encoder-decoder rows also predict is left out, so every family is scored on the same
    tokens (an encoder's per-token labels hold no <eos>, and its `accuracy` equals this one).
    """

    Params = SymbolParams
    metrics: ClassVar[dict[str, Metric]] = {**Task.metrics, **declared("symbol_accuracy")}

    def __init__(self, params: SymbolParams, **kw):
        super().__init__(params, **kw)
        self._set_vocab(symbol_names(params.alphabet_size))
        self.first_symbol = len(SPECIALS)

    def transform(self, symbols: list[int]) -> list[int]:
        raise NotImplementedError

    def example(self, rng, length, training):
        n = int(rng.integers(self.params.min_length, length + 1)) if training else length
        symbols = (rng.integers(0, self.params.alphabet_size, n) + self.first_symbol).tolist()
        return Example(tuple(symbols), tuple(self.transform(symbols)))

    def chance(self, family, length):
        """The blind predictor of `symbol_chance` on the answer's symbols, plus the <eos> a
        family also scores, which is always right (and left out of symbol_accuracy)."""
        symbols, exact = self.symbol_chance(length)
        scores = blind_scores(symbols + [(1.0, np.ones(1))] * self.always_predictable(family), exact)
        return scores | {"symbol_accuracy": blind_scores(symbols, exact)["accuracy"]}

    def symbol_chance(self, length: int) -> tuple[list[tuple[float, np.ndarray]], float]:
        """Closed form: an evaluation string holds `length` symbols drawn uniformly from the
        alphabet (A), so a blind predictor gets each answer symbol right with probability 1/A
        (loss ln A) and the whole string with A^-length. Returns the per-position target
        distributions (as `blind_scores` takes them) and the whole-row chance."""
        a = self.params.alphabet_size
        return [(1.0, np.full(a, 1.0 / a))] * length, float(a) ** -length

    # ---- baselines beyond chance --------------------------------------------------------------

    order_blind: ClassVar[bool] = False  # the task is about order: knowing the symbols is not enough
    baselines_text = (f"{Task.baselines_text}, {PREFIX_AWARE} (also reads the answer's own teacher-forced prefix; "
                      f"not for an encoder), {ORDER_BLIND} (knows which symbols the input holds, not their order; "
                      "tasks about order)")

    def baselines(self, family, length):
        """Input-ignoring (chance); prefix-aware where the model reads the answer's prefix
        (decoder, encoder-decoder); order-blind for tasks about order (copy, reverse)."""
        out = super().baselines(family, length)
        out.update(symbol_baselines(type(self), self.params.alphabet_size, length, self.always_predictable(family),
                                    reads_prefix=family != "encoder"))
        return out

    def prefix_probs(self, answers: np.ndarray) -> np.ndarray:
        """[S, n, A]: the distribution a predictor that reads only the answer's prefix (and
        knows the length) puts on each answer symbol. The symbols are independent draws, so
        the prefix tells nothing: uniform. Tasks whose answer has structure override it."""
        s, n = answers.shape
        return np.full((s, n, self.params.alphabet_size), 1.0 / self.params.alphabet_size)

    @staticmethod
    def order_blind_probs(sources: np.ndarray, answers: np.ndarray, alphabet: int, crossed_off: bool) -> np.ndarray:
        """[S, n, A]: a predictor that knows the input's symbols but not their order puts on
        each answer position the share of each symbol among those not yet emitted (crossed
        off as the teacher-forced prefix shows them); without a prefix (encoder), the share
        among all of them."""
        total = np.eye(alphabet)[sources].sum(1)  # [S, A]
        if not crossed_off:
            return np.repeat((total / sources.shape[1])[:, None], answers.shape[1], 1)
        emitted = np.cumsum(np.eye(alphabet)[answers], 1) - np.eye(alphabet)[answers]  # [S, n, A] before k
        remaining = total[:, None] - emitted
        return remaining / remaining.sum(-1, keepdims=True)


@functools.cache
def symbol_baselines(cls: type[SymbolTask], alphabet: int, length: int, eos: int, *,
                     reads_prefix: bool) -> dict[str, dict[str, float]]:
    """The baselines beyond chance of a symbol task, by Monte Carlo over BASELINE_STRINGS strings
    of `length` symbols (fixed seed, cached; every baseline scored on the same strings):
    prefix-aware where the model `reads_prefix` (the answer's teacher-forced prefix), order-blind
    for tasks about order (crossing symbols off as the prefix shows them, where there is one).
    Accuracy is the expected share right (the probability of the predictor's best guess at each
    position), loss its cross-entropy on the true symbol, exact match the share of strings whose
    every best guess is right; `eos` scored tokens per row (the <eos>) are always right."""
    rng = np.random.default_rng(BASELINE_SEED)
    task = cls(cls.Params.model_validate({"train_length": length, "alphabet_size": alphabet}), seed=0)
    names = [PREFIX_AWARE] * reads_prefix + [ORDER_BLIND] * cls.order_blind
    if not names:
        return {}
    sums = {name: {"best": 0.0, "nll": 0.0, "exact": 0} for name in names}
    rows = 0
    for start in range(0, BASELINE_STRINGS, 5000):  # in chunks: [S, n, A] stays small at long lengths
        sources = rng.integers(0, alphabet, (min(5000, BASELINE_STRINGS - start), length))
        answers = np.array([task.transform(row) for row in sources.tolist()])  # list[int], as `transform` takes
        for name, total in sums.items():
            if name == PREFIX_AWARE:
                probs = task.prefix_probs(answers)
            else:
                probs = SymbolTask.order_blind_probs(sources, answers, alphabet, crossed_off=reads_prefix)
            truth = np.take_along_axis(probs, answers[..., None], -1)[..., 0]  # [S, n]
            total["best"] += float(probs.max(-1).sum())
            total["nll"] -= float(np.log(np.maximum(truth, 1e-300)).sum())
            total["exact"] += int((probs.argmax(-1) == answers).all(-1).sum())
        rows += len(sources)
    symbols, scored = rows * length, rows * (length + eos)
    return {name: {"accuracy": (t["best"] + rows * eos) / scored, "symbol_accuracy": t["best"] / symbols,
                   "exact_match": t["exact"] / rows, "loss": t["nll"] / scored} for name, t in sums.items()}
