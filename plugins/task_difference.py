"""difference: label each symbol with its right neighbour minus its left neighbour.

Two relations per token, at offsets -1 and +1, read at once: the task of claim E7 ("several
heads can learn different relations at once; one head must squeeze them into one pattern").
One attention layer solves it with a head per neighbour, or with one head that weighs the two
unequally (equal weights blur which neighbour is which, and the difference is not symmetric).
"""

from __future__ import annotations

import functools

import numpy as np

from workbench import hookimpl
from workbench.tasks import MECHANISM, SymbolTask, Task
from workbench.tasks.baselines import BASELINE_SEED, BASELINE_STRINGS

SIDE_BLIND = "side-blind"  # knows both neighbours of each symbol, not which side each is on


def neighbour_difference(values: np.ndarray, alphabet: int) -> np.ndarray:
    """[..., n] symbol values (0..alphabet-1) -> [..., n] labels: (right - left) mod alphabet,
    a missing neighbour (past either end) counting as 0."""
    padded = np.pad(values, [(0, 0)] * (values.ndim - 1) + [(1, 1)])
    return (padded[..., 2:] - padded[..., :-2]) % alphabet


class Difference(SymbolTask):
    """Label each symbol with its right neighbour minus its left (mod the alphabet): two relations per token."""

    name = "difference"
    families = ("encoder",)  # a label per input symbol, read in both directions
    claim_kind = MECHANISM  # built so that telling a neighbour's side decides it

    baselines_text = (f"{Task.baselines_text}, {SIDE_BLIND} (knows the two neighbours of "
                      "each symbol, not which side each is on, and the one neighbour of an end symbol: what one "
                      "attention pattern that weighs both alike carries)")

    def transform(self, symbols: list[int]) -> list[int]:
        values = np.array(symbols) - self.first_symbol
        return (neighbour_difference(values, self.params.alphabet_size) + self.first_symbol).tolist()

    def symbol_chance(self, length):
        """Every label is uniform over the alphabet (the right neighbour is, whatever the left).
        The whole label row is uniform over the map's image: the labels at even positions,
        0, 2, ..., are x1, x3 - x1, x5 - x3, ..., and for odd `length` the last of them, -x(n-2),
        makes them sum to 0, so the image has A^(length-1) rows (A^length for even length, where
        the map is one to one)."""
        a = self.params.alphabet_size
        return [(1.0, np.full(a, 1.0 / a))] * length, float(a) ** -(length - length % 2)

    def baselines(self, family, length):
        """Input-ignoring (`chance`) and side-blind (Monte Carlo, fixed seed)."""
        return super().baselines(family, length) | {SIDE_BLIND: side_blind(self.params.alphabet_size, length)}


@functools.cache
def side_blind(alphabet: int, length: int) -> dict[str, float]:
    """A predictor that knows, for each symbol, the unordered pair {left, right} of its
    neighbours puts half its weight on right - left and half on left - right (all of it where
    the two agree: equal neighbours, or a difference of alphabet/2). The first and the last
    symbol have one neighbour each, on the side their position tells: those it gets right.
    Scored on BASELINE_STRINGS strings of `length` symbols; its best guess breaks ties towards
    the smaller label."""
    rng = np.random.default_rng(BASELINE_SEED)
    values = rng.integers(0, alphabet, (BASELINE_STRINGS, length))
    labels = neighbour_difference(values, alphabet)
    swapped = -labels % alphabet  # left - right: the other reading of the same pair
    sure = labels == swapped
    sure[:, [0, -1]] = True  # an end symbol has one neighbour, whose side its position tells
    guess = np.minimum(labels, swapped)
    p_true = np.where(sure, 1.0, 0.5)  # the true label is always one of the two
    return {"accuracy": float(p_true.mean()), "symbol_accuracy": float(p_true.mean()),
            "exact_match": float((guess == labels).all(1).mean()), "loss": float(-np.log(p_true).mean())}


@hookimpl
def register_tasks():
    return [Difference]
