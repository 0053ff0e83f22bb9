"""`paired_correlation`: the Pearson correlation of two groups' values over their common seeds,
which the report shows beside each paired difference (how much of the seed noise the arms share)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from workbench.stats.intervals import paired_correlation, paired_diff


def test_it_is_pearsons_r_over_the_seeds_both_groups_have():
    a = pd.Series([0.50, 0.61, 0.55, 0.70, 0.58], index=[0, 1, 2, 3, 4])
    b = pd.Series([0.41, 0.49, 0.47, 0.60, 0.33, 0.9], index=[0, 1, 2, 3, 4, 9])  # seed 9: only in b
    assert paired_correlation(a, b) == pytest.approx(st.pearsonr(a, b.loc[a.index]).statistic)
    assert paired_correlation(a, b.iloc[::-1]) == paired_correlation(a, b)  # matched by seed, not by position


def test_it_says_how_much_the_paired_difference_cancels():
    rng = np.random.default_rng(0)
    shared = rng.normal(size=8)  # seed noise both arms see
    a = pd.Series(shared + 0.3 * rng.normal(size=8))
    b = pd.Series(shared + 0.3 * rng.normal(size=8))
    r = paired_correlation(a, b)
    assert r > 0.8
    # var(a - b) = var a + var b - 2 r sd a sd b
    assert np.var(a - b, ddof=1) == pytest.approx(np.var(a, ddof=1) + np.var(b, ddof=1)
                                                  - 2 * r * np.std(a, ddof=1) * np.std(b, ddof=1))
    assert paired_correlation(a, -b) == pytest.approx(-r)


@pytest.mark.parametrize("a, b", [
    (pd.Series([0.1, 0.2]), pd.Series([0.3, 0.5])),  # two seeds: always ±1
    (pd.Series([0.1, 0.2, 0.3], index=[0, 1, 2]), pd.Series([0.3, 0.5, 0.4], index=[0, 1, 7])),  # two common
    (pd.Series([0.1, 0.2, math.nan]), pd.Series([0.3, 0.5, 0.6])),  # a failed seed: two of three left
    (pd.Series([1.0, 1.0, 1.0, 1.0]), pd.Series([0.3, 0.5, 0.4, 0.2])),  # no spread: every seed perfect
    (pd.Series([0.1, 0.2, 0.3], index=[0, 0, 1]), pd.Series([0.3, 0.5, 0.4], index=[0, 1, 2])),  # a seed twice
])
def test_it_is_nan_where_no_correlation_can_be_read(a, b):
    assert math.isnan(paired_correlation(a, b))


def test_a_failed_seed_is_left_out_as_the_paired_difference_leaves_it():
    a = pd.Series([0.1, 0.2, 0.35, math.nan, 0.5])
    b = pd.Series([0.3, 0.5, 0.6, 0.2, 0.7])
    assert paired_correlation(a, b) == pytest.approx(st.pearsonr(a.dropna(), b.drop(3)).statistic)
    assert paired_diff(a.dropna(), b.drop(3)).n == 4
