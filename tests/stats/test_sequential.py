"""Adaptive seeds' arithmetic (workbench.stats.sequential): the looks, the alpha each spends and
reads at, and futility's power, which a batch compares through one root per level."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from workbench.stats.sequential import (BEFORE_MIN_SEEDS, EARLIER_LOOKS, LOOKS, below_power, futile_chance,
                                        obrien_fleming, pocock)


def test_looks_grow_by_half_up_to_the_maximum_and_spend_exactly_alpha():
    assert LOOKS.looks(3, 20) == [3, 4, 6, 9, 14, 20] and LOOKS.looks(2, 5) == [2, 3, 4, 5]
    assert LOOKS.looks(3, 12) == [3, 4, 6, 8, 12] and LOOKS.looks(2, 3) == [2, 3]
    alphas = LOOKS.alphas(LOOKS.looks(3, 20))
    assert sum(alphas) == pytest.approx(0.05) and all(a > 0 for a in alphas[1:])
    # a look under 4 seeds decides nothing and spends nothing; the first look that decides, at 4 of 20
    # seeds, spends what the Pocock-type function has reached there: alpha ln(1 + (e - 1) 0.2) = 0.0148
    assert alphas[0] == 0 and alphas[1] == pytest.approx(0.05 * math.log(1 + (math.e - 1) * 0.2))
    # it reads the gates and group intervals at what the function has reached at 3 seeds: 0.0115
    assert LOOKS.reading_alphas(LOOKS.looks(3, 20))[0] == pytest.approx(0.05 * math.log(1 + (math.e - 1) * 0.15))
    assert BEFORE_MIN_SEEDS.alphas(LOOKS.looks(3, 20))[0] == pytest.approx(0.05 * math.log(1 + (math.e - 1) * 0.15))
    assert pocock(1.0) == pytest.approx(0.05) and pocock(0.0) == 0.0
    # the earlier rule: doubling looks, O'Brien-Fleming-type, which spent almost nothing early
    assert EARLIER_LOOKS.looks(3, 20) == [3, 6, 12, 20]
    earlier = EARLIER_LOOKS.alphas([3, 6, 12, 20])
    assert sum(earlier) == pytest.approx(0.05) and earlier[0] < 1e-5 and earlier[-1] > 0.03
    assert obrien_fleming(0.5) == pytest.approx(2 - 2 * stats.norm.cdf(1.96 / 0.5 ** 0.5), rel=1e-3)



def test_a_batch_reads_futility_as_the_power_itself_would():
    """`below_power` (a batch's futility: the difference's power through the noncentrality at which it
    reaches 5%, once per level) says what futile_chance(...) < 5% says, paired and Welch, with margins
    and without."""
    rng = np.random.default_rng(5)
    k = 4000
    mean, se = rng.normal(0, 1, k), rng.uniform(0.05, 2, k)
    n, paired = rng.choice([4, 6, 8], k), rng.random(k) < 0.5
    alpha = rng.choice([0.0226 / 2, 0.0226, 0.0084], k)
    margin = np.where(rng.random(k) < 0.3, rng.uniform(0.1, 3, k), np.nan)
    chance = futile_chance(mean, se, n, paired, alpha, 12, margin)
    assert np.array_equal(below_power(0.05, mean, se, n, paired, alpha, 12, margin), chance < 0.05)
    assert 0.05 < np.mean(chance < 0.05) < 0.95  # both sides of the threshold were met
