"""Statistics behind reports (checked against scipy): t intervals, paired and Welch differences, Holm, the
learned-at-all gate, verdicts, variant pairing."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_h
from scipy import stats

from workbench.report.intervals import Share, difference, holm, mean_ci, welch_diff
from workbench.report.learned_gate import learned_criterion, learned_gate
from workbench.report.stats import Comparison, verdict, verdicts
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
    ([0.90, 0.91, 0.95], [0.50, 0.52, 0.51], True, "holds", ""),
    ([0.50, 0.52, 0.51], [0.90, 0.91, 0.95], True, "does not hold", ""),
    ([0.50, 0.70, 0.60], [0.55, 0.65, 0.62], True, "inconclusive", "contains 0"),
    # loss: lower is better, so the lower group wins
    ([1.0, 1.1, 1.02], [2.0, 2.1, 2.05], False, "holds", ""),
    ([2.0, 2.1, 2.05], [1.0, 1.1, 1.02], False, "does not hold", ""),
    ([0.9], [0.5, 0.52], True, "inconclusive", "1 finished seed"),
    ([], [0.5, 0.52], True, "inconclusive", "no finished run"),
    ([0.5, 0.5], [0.4, 0.4], True, "inconclusive", "no spread"),
])
def test_verdict_rule(a, b, higher, outcome, reason):
    v = verdict(a, b, "m", "A", "B", higher=higher)
    assert v.outcome == outcome
    assert reason in v.label
    if outcome == "inconclusive":
        assert v.label.startswith("inconclusive (")
    else:
        assert v.label == outcome


def by_seed(values, seeds=(0, 1, 2, 3)):
    return pd.Series(values, index=list(seeds)[: len(values)], dtype=float)


def test_same_seeds_pair_and_the_interval_is_scipys_paired_one():
    # Seed effects shared by both groups: Welch sees the spread, pairing removes it.
    a, b = by_seed([0.61, 0.72, 0.55, 0.80]), by_seed([0.58, 0.70, 0.51, 0.77])
    d = difference(a, b)
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert d.method == "paired" and d.p == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert (d.lo, d.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d.lo > 0  # paired: separated; Welch on the same numbers is not
    welch = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert welch.low < 0 < welch.high
    assert verdict(a, b, "accuracy", "A", "B").outcome == "holds"
    assert verdict(list(a), list(b), "accuracy", "A", "B").outcome == "inconclusive"  # lists: no seeds, Welch


@pytest.mark.parametrize("b_seeds", [(0, 1, 4, 5), (0, 1, 2)])
def test_different_seeds_use_welch(b_seeds):
    a = by_seed([0.61, 0.72, 0.55, 0.80])
    b = by_seed([0.58, 0.70, 0.51, 0.77][: len(b_seeds)], b_seeds)
    d = difference(a, b)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert d.method == "Welch" and (d.lo, d.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))


def test_a_failed_seed_unpairs_the_groups():
    a, b = by_seed([0.61, 0.72, float("nan"), 0.80]), by_seed([0.58, 0.70, 0.51, 0.77])
    assert difference(a, b).method == "Welch"


def test_holm_matches_the_step_down_definition():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.06
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def holm_case():
    """Three paired comparisons from clearly separated to overlapping."""
    strong = (by_seed([0.80, 0.82, 0.85, 0.83]), by_seed([0.50, 0.51, 0.55, 0.50]))
    middle = (by_seed([0.60, 0.64, 0.66, 0.70]), by_seed([0.55, 0.60, 0.58, 0.66]))
    weak = (by_seed([0.60, 0.65, 0.55, 0.70]), by_seed([0.58, 0.66, 0.56, 0.63]))
    return [Comparison("accuracy@8", f"A{i}", f"B{i}", a, b, higher=True, bounds=(0.0, 1.0))
            for i, (a, b) in enumerate((strong, middle, weak))]


def test_verdicts_apply_holm_and_show_the_interval_they_decide_from():
    comparisons = holm_case()
    raw = [stats.ttest_rel(c.better_values, c.than_values).pvalue for c in comparisons]
    out = verdicts(comparisons)
    expected = holm(raw)
    for rank, k in enumerate(np.argsort(raw)):
        v, c = out[k], comparisons[k]
        assert v.p_holm == pytest.approx(expected[k])
        level = 1 - 0.05 / (len(comparisons) - rank)
        ci = stats.ttest_rel(c.better_values, c.than_values).confidence_interval(level)
        assert v.diff.level == pytest.approx(level)
        assert (v.diff.lo, v.diff.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
        separated = v.diff.lo > 0 or v.diff.hi < 0
        assert (v.outcome in ("holds", "does not hold")) == (separated and v.p_holm <= 0.05)
    assert out[0].outcome == "holds" and out[2].outcome == "inconclusive"


@settings(max_examples=60, deadline=None)
@given(st_h.lists(st_h.floats(0, 1), min_size=2, max_size=5), st_h.lists(st_h.floats(0, 1), min_size=2, max_size=5))
def test_accuracy_intervals_stay_in_range(a, b):
    for iv in (mean_ci(a, bounds=(0.0, 1.0)), mean_ci(b, bounds=(0.0, 1.0))):
        assert math.isnan(iv.lo) or 0.0 <= iv.lo <= iv.mean <= iv.hi <= 1.0
    d = difference(a, b, bounds=(0.0, 1.0))
    assert math.isnan(d.lo) or -1.0 <= d.lo <= d.hi <= 1.0


def test_an_accuracy_interval_is_the_t_interval_cut_to_0_1():
    x = [0.99, 0.80, 1.0]
    lo, hi = stats.t.interval(0.95, df=2, loc=np.mean(x), scale=stats.sem(x))
    assert hi > 1  # the plain t interval leaves the range
    iv = mean_ci(x, bounds=(0.0, 1.0))
    assert (iv.lo, iv.hi) == (pytest.approx(lo), 1.0)


def test_seeds_that_all_scored_the_same_are_flagged():
    iv = mean_ci([0.125, 0.125, 0.125], bounds=(0.0, 1.0))
    assert iv.constant and iv.mean == 0.125 and math.isnan(iv.lo)
    assert not mean_ci([0.125, 0.13]).constant


def test_a_verdict_is_decided_by_the_gate_when_only_one_group_learned():
    a, b = by_seed([0.90, 0.91, 0.95]), by_seed([0.10, 0.11, 0.10])
    gates = (learned_gate("A", "accuracy@8", 0.92, 0.1, 1.0, True),
             learned_gate("B", "accuracy@8", 0.103, 0.1, 1.0, True))
    assert gates[0].needed == pytest.approx(0.19) and gates[0].learned and not gates[1].learned
    v = verdicts([Comparison("accuracy@16", "A", "B", a, b, higher=True, bounds=(0.0, 1.0), gates=gates)])[0]
    assert (v.outcome, v.label) == ("holds", "holds (only A learned)")
    assert "B: accuracy@8 0.103 vs chance 0.1" in v.reason
    v = verdicts([Comparison("accuracy@16", "B", "A", b, a, higher=True, bounds=(0.0, 1.0), gates=gates)])[0]
    assert (v.outcome, v.label) == ("does not hold", "does not hold (only A learned)")
    neither = (gates[1], learned_gate("C", "accuracy@8", 0.1, 0.1, 1.0, True))
    v = verdicts([Comparison("accuracy@16", "B", "C", b, b, higher=True, bounds=(0.0, 1.0), gates=neither)])[0]
    assert v.outcome == "not tested"
    assert v.label.startswith("not tested (neither group learned: B: accuracy@8 0.103") and "C: accuracy@8 0.1" in v.label
    # lower is better: a loss must fall 10% of the way from chance to 0
    ln4 = math.log(4)
    assert learned_gate("A", "loss@8", 1.2, ln4, 0.0, False).learned
    assert not learned_gate("A", "loss@8", 1.3, ln4, 0.0, False).learned


def test_the_gate_measures_against_the_strongest_baseline():
    gate = learned_gate("A", "accuracy@12", 0.45, {"input-ignoring": 0.169, "order-blind": 0.443}, 1.0, True)
    assert (gate.baseline, gate.chance, gate.needed) == ("order-blind", 0.443, pytest.approx(0.4987))
    assert not gate.learned and "vs order-blind 0.443" in gate.text
    loss = learned_gate("A", "loss@12", 1.5, {"input-ignoring": 2.1, "order-blind": 1.2}, 0.0, False)
    assert loss.baseline == "order-blind" and not loss.learned


def test_a_gate_at_the_compared_length_counts_as_well_as_the_training_length():
    a, b = by_seed([0.30, 0.31, 0.33]), by_seed([0.20, 0.21, 0.20])
    gates = (learned_gate("A", "accuracy@16", 0.9, 0.17, 1.0, True), learned_gate("A", "accuracy@32", 0.31, 0.17, 1.0, True),
             learned_gate("B", "accuracy@16", 0.9, 0.17, 1.0, True), learned_gate("B", "accuracy@32", 0.20, 0.17, 1.0, True))
    v = verdicts([Comparison("accuracy@32", "A", "B", a, b, higher=True, bounds=(0.0, 1.0), gates=gates)])[0]
    assert v.label == "holds (only A learned)" and "B: accuracy@32 0.2" in v.reason


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


def test_learned_criterion_line_states_threshold_and_who_missed_it():
    gate = lambda group, score, chance=0.2: learned_gate(group, "accuracy@12", score, chance, 1.0, True)  # noqa: E731
    assert learned_criterion("accuracy", [gate("a", 0.9), gate("b", 0.3)]) == (
        "Learned (accuracy@12 ≥ 0.28, 10% of the way from chance 0.2 to 1): both groups met it")
    assert learned_criterion("accuracy", [gate("a", 0.9), gate("b", 0.25), gate("c", math.nan)]) == (
        "Learned (accuracy@12 ≥ 0.28, 10% of the way from chance 0.2 to 1): 1 of 3 groups met it; "
        "not met: b (0.25); c (no finished run)")
    # Chance differs by group (e.g. by family): one threshold per chance level.
    assert learned_criterion("accuracy", [gate("enc", 0.15, 0.1), gate("dec", 0.3), gate("ed", 0.5)]) == (
        "Learned (10% of the way from the strongest baseline to a perfect score: accuracy@12 ≥ 0.19 for enc (chance 0.1); "
        "accuracy@12 ≥ 0.28 for dec and ed (chance 0.2)): 2 of 3 groups met it; not met: enc (0.15)")
    loss = learned_gate("x", "loss@8", 1.0, 2.0, 0.0, False)
    assert learned_criterion("loss", [loss]) == (
        "Learned (loss@8 ≤ 1.8, 10% of the way from chance 2 to 0): the group met it")
    unknown = learned_gate("x", "accuracy@8", 0.9, math.nan, 1.0, True)
    assert learned_criterion("accuracy", [unknown]).startswith("Learned: no chance level of accuracy is known")


def test_a_margin_makes_an_interval_inside_it_equivalent():
    a, b = by_seed([0.900, 0.905, 0.898, 0.902]), by_seed([0.901, 0.903, 0.899, 0.900])
    v = verdict(a, b, "accuracy@8", "A", "B", higher=True, bounds=(0.0, 1.0), margin=0.02)
    assert v.outcome == v.label == "equivalent"
    assert -0.02 < v.diff.lo and v.diff.hi < 0.02 and v.diff.level == pytest.approx(0.90)  # 1 - 2 alpha (m = 1)
    assert "within ±0.02" in v.reason
    # the same groups without a margin: no difference found, which is not the same as none
    assert verdict(a, b, "accuracy@8", "A", "B", higher=True, bounds=(0.0, 1.0)).outcome == "inconclusive"
    # a margin smaller than the noise: still inconclusive, with what the seeds would need to show it
    wide = verdict(by_seed([0.8, 0.9, 0.85]), by_seed([0.82, 0.86, 0.9]), "accuracy@8", "A", "B", higher=True,
                   bounds=(0.0, 1.0), margin=0.01)
    assert wide.outcome == "inconclusive" and "the margin ±0.01 would need about" in wide.reason


def test_both_groups_at_the_perfect_score_on_every_seed_is_a_ceiling():
    v = verdict(by_seed([1.0, 1.0, 1.0]), by_seed([1.0, 1.0, 1.0]), "accuracy@8", "A", "B", higher=True,
                bounds=(0.0, 1.0))
    assert (v.outcome, v.label) == ("ceiling", "ceiling: the task does not separate them")
    loss = verdict(by_seed([0.0, 0.0]), by_seed([0.0, 0.0]), "loss@8", "A", "B", higher=False, bounds=(0.0, math.inf))
    assert loss.outcome == "ceiling"
    # equal seeds below the best value are not a ceiling: no spread, no interval
    assert verdict(by_seed([0.9, 0.9]), by_seed([0.9, 0.9]), "accuracy@8", "A", "B", higher=True,
                   bounds=(0.0, 1.0)).label.startswith("inconclusive (every seed gave the same difference")


def test_an_inconclusive_verdict_states_its_detectable_difference_and_the_seeds_needed():
    a, b = by_seed([0.61, 0.72, 0.55, 0.80]), by_seed([0.58, 0.66, 0.57, 0.74])
    v = verdict(a, b, "accuracy@8", "A", "B", higher=True, bounds=(0.0, 1.0))
    assert v.outcome == "inconclusive"
    d = (a - b).to_numpy()
    sd, n = d.std(ddof=1), len(d)
    mde = float(re.search(r"4 seeds detect ±([\d.]+) with 80% power", v.reason).group(1))
    needed = int(re.search(r"the observed difference [\d.]+ would need about (\d+) seeds", v.reason).group(1))
    # check against the noncentral t: power of the paired two-sided test at 5%
    def power(effect, k):
        crit, nc = stats.t.ppf(0.975, k - 1), effect / (sd / math.sqrt(k))
        return stats.nct.sf(crit, k - 1, nc) + stats.nct.cdf(-crit, k - 1, nc)
    assert power(mde, n) == pytest.approx(0.8, abs=0.01)
    assert power(d.mean(), needed) >= 0.8 > power(d.mean(), needed - 1)


def test_holms_family_is_every_expect_entry_even_those_not_tested():
    a, b = by_seed([0.90, 0.91, 0.95]), by_seed([0.50, 0.52, 0.51])
    tested = Comparison("accuracy@8", "A", "B", a, b, higher=True, bounds=(0.0, 1.0))
    untested_gates = (learned_gate("C", "accuracy@8", 0.1, 0.1, 1.0, True), learned_gate("D", "accuracy@8", 0.1, 0.1, 1.0, True))
    untested = Comparison("accuracy@8", "C", "D", a, b, higher=True, bounds=(0.0, 1.0), gates=untested_gates)
    alone = verdicts([tested])[0]
    with_untested = verdicts([tested, untested])
    assert with_untested[1].outcome == "not tested"
    assert alone.diff.level == pytest.approx(0.95)
    assert with_untested[0].diff.level == pytest.approx(0.975)  # m = 2: the untested entry still counts
    assert with_untested[0].p_holm == pytest.approx(min(1.0, 2 * alone.diff.p))


def test_failure_shares_compare_with_fishers_exact_test_and_clopper_pearson_intervals():
    seeds = range(12)
    post = pd.Series([1.0] * 10 + [0.0] * 2, index=seeds)  # 10 of 12 seeds diverged or did not learn
    pre = pd.Series([0.0] * 12, index=seeds)
    v = verdicts([Comparison("failure_share", "pre", "post", pre, post, higher=False, bounds=(0.0, 1.0), counts=True)])[0]
    assert v.outcome == "holds" and v.diff.method == "Fisher's exact"
    assert v.diff.p == pytest.approx(stats.fisher_exact([[0, 12], [10, 2]]).pvalue)
    ci = stats.binomtest(10, 12).proportion_ci(0.95, method="exact")
    assert (v.than_ci.mean, v.than_ci.lo, v.than_ci.hi) == pytest.approx((10 / 12, ci.low, ci.high))
    few = verdicts([Comparison("failure_share", "pre", "post", pre[:3], post[:3], higher=False, bounds=(0.0, 1.0),
                               counts=True)])[0]
    assert few.label.startswith("inconclusive (Fisher's exact p = 0.1")
    assert Share(0, 3).text == "0/3 = 0 [0, 0.708]"
