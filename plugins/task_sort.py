"""sort: sort a random symbol string by symbol id (duplicates kept)."""

import math

import numpy as np
from scipy.stats import binom

from workbench import hookimpl
from workbench.tasks import SymbolTask


class Sort(SymbolTask):
    """Sort a random symbol string (alphabet order, duplicates kept)."""

    name = "sort"

    def transform(self, symbols: list[int]) -> list[int]:
        return sorted(symbols)

    def symbol_chance(self, length):
        """Closed form: target position k holds the k-th smallest of `length` uniform draws
        from A symbols, P(X_(k) <= s) = P(Binomial(length, (s+1)/A) >= k+1), so a blind
        predictor already does better than 1/A at the ends (the first sorted symbol is the
        smallest one with probability 1 - (1 - 1/A)^length). The most likely whole target is
        the most even multiset (the mode of the multinomial)."""
        a, n = self.params.alphabet_size, length
        cdf = binom.sf(np.arange(n)[:, None], n, (np.arange(a)[None] + 1) / a)  # [n, A]: P(X_(k) <= s)
        marginals = np.diff(cdf, axis=1, prepend=0.0)  # [n, A]: P(X_(k) = s)
        q, r = divmod(n, a)  # r symbols occur q + 1 times, the others q times
        log_mode = math.lgamma(n + 1) - r * math.lgamma(q + 2) - (a - r) * math.lgamma(q + 1) - n * math.log(a)
        return [(1.0, p) for p in marginals], math.exp(log_mode)


@hookimpl
def register_tasks():
    return [Sort]
