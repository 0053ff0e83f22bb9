"""sort: sort a random symbol string by symbol id (duplicates kept)."""

import math

import numpy as np
from scipy.special import gammaln, xlogy
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

    def prefix_probs(self, answers):
        """Exact: a predictor that reads the sorted prefix (last symbol s, seen c times, m
        symbols still to come) knows the remaining counts of every symbol below s (none) and
        that the rest are >= s. The multiset's probability is proportional to 1/prod(count!),
        so r more copies of s have weight u^(m-r) / ((c+r)! (m-r)!) with u = A-1-s symbols
        above s, and when no s follows, the others are uniform over those u symbols, whose
        smallest is t with probability ((A-t)/u)^m - ((A-t-1)/u)^m. At the first position the
        answer is the smallest of n uniform draws."""
        a = self.params.alphabet_size
        rows, n = answers.shape
        t = np.arange(a)
        probs = np.zeros((rows, n, a))
        probs[:, 0] = ((a - t) / a) ** n - ((a - t - 1) / a) ** n
        for k in range(1, n):
            s, m = answers[:, k - 1], n - k
            c = (answers[:, :k] == s[:, None]).sum(1)
            u = a - 1 - s
            r = np.arange(m + 1)
            log_w = xlogy((m - r)[None], u[:, None]) - gammaln(c[:, None] + r[None] + 1) - gammaln(m - r + 1)[None]
            w = np.exp(log_w - log_w.max(1, keepdims=True))
            none_more = np.where(u > 0, w[:, 0] / w.sum(1), 0.0)  # P(no further s)
            above = t[None] > s[:, None]
            safe_u = np.maximum(u, 1)[:, None]
            smallest = (np.clip(a - t[None], 0, None) / safe_u) ** m - (np.clip(a - t[None] - 1, 0, None) / safe_u) ** m
            probs[:, k] = np.where(above, none_more[:, None] * smallest, 0.0)
            probs[np.arange(rows), k, s] = 1 - none_more
        return probs


@hookimpl
def register_tasks():
    return [Sort]
