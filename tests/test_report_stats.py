"""Statistics behind reports: t intervals, Welch differences, verdicts, variant pairing."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from workbench.report.stats import mean_ci, verdict, welch_diff
from workbench.report.variants import Variants


def test_mean_ci_is_the_t_interval():
    x = [0.5, 0.52, 0.55, 0.49]
    iv = mean_ci(x)
    lo, hi = stats.t.interval(0.95, df=3, loc=np.mean(x), scale=stats.sem(x))
    assert (iv.mean, iv.n) == (pytest.approx(np.mean(x)), 4)
    assert (iv.lo, iv.hi) == (pytest.approx(lo), pytest.approx(hi))


def test_one_seed_has_no_interval_and_nan_values_are_skipped():
    iv = mean_ci([0.7, float("nan")])
    assert iv.mean == 0.7 and iv.n == 1 and math.isnan(iv.lo) and math.isnan(iv.hi)


def test_welch_difference_matches_scipy():
    a, b = [0.9, 0.91, 0.95], [0.5, 0.6, 0.52, 0.55]
    d = welch_diff(a, b)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert d.mean == pytest.approx(np.mean(a) - np.mean(b))
    assert (d.lo, d.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))


@pytest.mark.parametrize("a, b, higher, outcome, reason", [
    ([0.90, 0.91, 0.92], [0.50, 0.52, 0.51], True, "holds", ""),
    ([0.50, 0.52, 0.51], [0.90, 0.91, 0.92], True, "does not hold", ""),
    ([0.50, 0.70, 0.60], [0.55, 0.65, 0.62], True, "inconclusive", "intervals overlap"),
    # loss: lower is better, so the lower group wins
    ([1.0, 1.1, 1.05], [2.0, 2.1, 2.05], False, "holds", ""),
    ([2.0, 2.1, 2.05], [1.0, 1.1, 1.05], False, "does not hold", ""),
    ([0.9], [0.5, 0.52], True, "inconclusive", "1 finished seed"),
    ([], [0.5, 0.52], True, "inconclusive", "no finished run"),
])
def test_verdict_rule(a, b, higher, outcome, reason):
    v = verdict(a, b, "m", "A", "B", higher=higher)
    assert v.outcome == outcome
    assert reason in v.label
    if outcome == "inconclusive":
        assert v.label.startswith("inconclusive (")
    else:
        assert v.label == outcome


def test_touching_intervals_count_as_overlap():
    # Identical spreads placed so that A's lower bound equals B's upper bound exactly.
    b = [0.0, 1.0, 2.0]
    half = mean_ci(b).hi - 1.0
    a = [x + 2 * half for x in b]
    assert verdict(a, b, "m", "A", "B", higher=True).outcome == "inconclusive"


def test_pairs_compare_like_with_like_across_other_swept_keys():
    runs = pd.DataFrame([{"model.position": p, "model.n_layers": n} for p in ("rope", "alibi") for n in (2, 6)])
    variants = Variants.of(["model.position", "model.n_layers"], runs,
                           {"model.position": ["rope", "alibi"], "model.n_layers": [2, 6]})
    assert variants.labels == ["position=rope, n_layers=2", "position=rope, n_layers=6",
                               "position=alibi, n_layers=2", "position=alibi, n_layers=6"]
    pairs = variants.pairs({"model.position": "alibi"}, {"model.position": "rope"})
    assert pairs == [("position=alibi, n_layers=2", "position=rope, n_layers=2"),
                     ("position=alibi, n_layers=6", "position=rope, n_layers=6")]
    assert variants.counterpart("position=alibi, n_layers=6", {"model.position": "rope"}) == "position=rope, n_layers=6"
