"""Statistics behind reports (checked against scipy): t intervals, paired and Welch differences, Holm, the
learned-at-all gate, verdicts, variant pairing."""

from __future__ import annotations

import math
from dataclasses import replace
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_h
from scipy import stats

from workbench.stats.intervals import Share, difference, holm, mean_ci, welch_diff
from workbench.stats.gate import GateState, learned_criterion, make_gate, threshold
from workbench.stats.rule import Comparison, verdict, verdicts
from workbench.report.sweep_points import Variants


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
    ([0.90, 0.91, 0.95, 0.93], [0.50, 0.52, 0.51, 0.50], True, "holds", ""),
    ([0.50, 0.52, 0.51, 0.50], [0.90, 0.91, 0.95, 0.93], True, "does not hold", ""),
    ([0.50, 0.70, 0.60, 0.58], [0.55, 0.65, 0.62, 0.60], True, "inconclusive", "contains 0"),
    # loss: lower is better, so the lower group wins
    ([1.0, 1.1, 1.02, 1.05], [2.0, 2.1, 2.05, 2.02], False, "holds", ""),
    ([2.0, 2.1, 2.05, 2.02], [1.0, 1.1, 1.02, 1.05], False, "does not hold", ""),
    # three seeds decide nothing, however far apart: seeds that each learn or not line up by chance
    ([0.90, 0.91, 0.95], [0.50, 0.52, 0.51], True, "inconclusive", "3 seeds per group; a verdict needs 4"),
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
    assert verdict(a, b, "accuracy", "A", "B", higher=True).outcome == "holds"
    assert verdict(list(a), list(b), "accuracy", "A", "B", higher=True).outcome == "inconclusive"  # lists: no seeds, Welch


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


def gate(group, metric, scores, chance, higher=True, perfect=1.0):
    return make_gate(group, metric, by_seed(scores), chance if isinstance(chance, dict) else {"chance": chance},
                     perfect, higher, (0.0, 1.0) if higher else (0.0, math.inf))


def test_the_gate_qualifies_a_decided_difference_and_never_decides_alone():
    a, b = [0.90, 0.91, 0.95, 0.92], [0.10, 0.11, 0.10, 0.105]
    gates = (gate("A", "accuracy@8", a, 0.1), gate("B", "accuracy@8", b, 0.1))
    assert gates[0].limit.needed == pytest.approx(0.19)
    assert [g.at().state for g in gates] == [GateState.LEARNED, GateState.NOT_LEARNED]
    v = verdicts([Comparison("accuracy@8", "A", "B", by_seed(a), by_seed(b), higher=True, bounds=(0.0, 1.0),
                             gates=gates)])[0]
    assert (v.outcome, v.label) == ("holds", "holds (only A learned)")
    assert "B: accuracy@8 0.104" in "; ".join(g.text for g in v.gates) and "did not learn" in v.gates[1].text
    v = verdicts([Comparison("accuracy@8", "B", "A", by_seed(b), by_seed(a), higher=True, bounds=(0.0, 1.0),
                             gates=gates[::-1])])[0]
    assert (v.outcome, v.label) == ("does not hold", "does not hold (only A learned)")
    # The audit's case: one mean above the threshold (0.5845), the other below, the difference not
    # decided: the old gate read "holds (only A learned)"; now it is inconclusive, and so undecided.
    a, b = [0.70, 0.55, 0.72, 0.66], [0.50, 0.62, 0.51, 0.58]
    gates = (gate("A", "accuracy@8", a, {"order-blind": 0.538333}), gate("B", "accuracy@8", b, {"order-blind": 0.538333}))
    assert gates[0].limit.needed == pytest.approx(0.5845, abs=1e-4)
    assert np.mean(a) > 0.5845 > np.mean(b) and [g.at().state for g in gates] == [GateState.UNDETERMINED] * 2
    v = verdicts([Comparison("accuracy@8", "A", "B", by_seed(a), by_seed(b), higher=True, bounds=(0.0, 1.0),
                             gates=gates)])[0]
    assert v.outcome == "inconclusive" and not v.only
    # a decided difference beside an undetermined gate says so
    a, b = [0.95, 0.96, 0.97, 0.96], [0.50, 0.72, 0.53, 0.60]
    gates = (gate("A", "accuracy@8", a, 0.5), gate("B", "accuracy@8", b, 0.5))
    v = verdicts([Comparison("accuracy@8", "A", "B", by_seed(a), by_seed(b), higher=True, bounds=(0.0, 1.0),
                             gates=gates)])[0]
    assert v.label == "holds (whether B learned is undetermined)"


def test_neither_group_learned_qualifies_the_tested_outcome_and_never_ends_the_test():
    low, lower = [0.10, 0.11, 0.10, 0.104], [0.05, 0.062, 0.049, 0.054]
    neither = (gate("B", "accuracy@8", low, 0.1), gate("C", "accuracy@8", lower, 0.1))
    v = verdicts([Comparison("accuracy@8", "B", "C", by_seed(low), by_seed(lower), higher=True, bounds=(0.0, 1.0),
                             gates=neither)])[0]
    # the difference (about +0.05 on every seed) is tested and decided; the gates say it does not test the claim
    assert v.outcome == "holds" and v.diff.p < 0.05 and not v.tests_claim
    assert v.label.startswith("holds (neither group learned: B: accuracy@8 0.104") and "C: accuracy@8 0.0537" in v.label
    same = [0.10, 0.12, 0.11, 0.095]
    v = verdicts([Comparison("accuracy@8", "B", "C", by_seed(low), by_seed(same), higher=True, bounds=(0.0, 1.0),
                             gates=(neither[0], gate("C", "accuracy@8", same, 0.1)))])[0]
    assert v.outcome == "inconclusive" and not v.outcome.final and not v.tests_claim  # more seeds may decide it
    assert v.label.startswith("inconclusive (the interval of the difference contains 0; ")
    assert "; neither group learned: B: accuracy@8" in v.label
    # one of them undetermined (its interval reaches the threshold 0.19): the claim is tested
    spread = [0.05, 0.30, 0.10, 0.12]
    v = verdicts([Comparison("accuracy@8", "B", "C", by_seed(low), by_seed(spread), higher=True, bounds=(0.0, 1.0),
                             gates=(neither[0], gate("C", "accuracy@8", spread, 0.1)))])[0]
    assert v.outcome == "inconclusive" and v.tests_claim and "neither" not in v.label
    # lower is better: a loss must fall 10% of the way from chance to 0, its interval too
    ln4 = math.log(4)
    assert gate("A", "loss@8", [1.20, 1.19, 1.21], ln4, higher=False, perfect=0.0).at().learned
    assert gate("A", "loss@8", [1.30, 1.31, 1.29], ln4, higher=False, perfect=0.0).at().not_learned
    assert gate("A", "loss@8", [1.0, 1.5, 1.2], ln4, higher=False, perfect=0.0).at().state is GateState.UNDETERMINED
    assert gate("A", "loss@8", [1.0], ln4, higher=False, perfect=0.0).at().state is GateState.UNDETERMINED


def test_identical_groups_end_as_identical():
    same = by_seed([0.4, 0.5, 0.6])
    v = verdicts([Comparison("accuracy@8", "A", "B", same, same.copy(), higher=True, bounds=(0.0, 1.0))])[0]
    assert v.outcome == "identical" and v.outcome.final and not v.outcome.decides
    assert v.label == "identical (both groups gave the same accuracy@8 on every seed)"


def test_the_gate_measures_against_the_strongest_baseline():
    g = gate("A", "accuracy@12", [0.45, 0.46, 0.44], {"input-ignoring": 0.169, "order-blind": 0.443}).at()
    assert (g.baseline, g.chance, g.needed) == ("order-blind", 0.443, pytest.approx(0.4987))
    assert g.not_learned and "vs order-blind 0.443" in g.text
    loss = gate("A", "loss@12", [1.5, 1.6], {"input-ignoring": 2.1, "order-blind": 1.2}, higher=False, perfect=0.0).at()
    assert loss.baseline == "order-blind" and not loss.learned
    # a task may name the baselines that gate; the others are only shown
    limit = threshold({"unigram": 4.66, "bigram": 3.75, "trigram": 3.10}, 0.0, False, gating=("bigram",))
    assert (limit.baseline, limit.chance) == ("bigram", 3.75) and len(limit.baselines) == 3


def test_a_gate_at_the_compared_length_counts_as_well_as_the_training_length():
    a, b = [0.30, 0.31, 0.33, 0.32], [0.20, 0.21, 0.20, 0.20]
    gates = (gate("A", "accuracy@16", [0.9, 0.91, 0.92, 0.9], 0.17), gate("A", "accuracy@32", a, 0.17),
             gate("B", "accuracy@16", [0.9, 0.91, 0.92, 0.9], 0.17), gate("B", "accuracy@32", b, 0.17))
    v = verdicts([Comparison("accuracy@32", "A", "B", by_seed(a), by_seed(b), higher=True, bounds=(0.0, 1.0),
                             gates=gates)])[0]
    assert v.label == "holds (only A learned)" and "B: accuracy@32 0.203" in v.gates[3].text


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


def test_learned_criterion_line_states_threshold_and_where_each_group_stands():
    def g(group, scores, chance=0.2):
        return gate(group, "accuracy@12", scores, chance).at()

    rule = "accuracy@12 ≥ 0.28, 10% of the way from chance 0.2 to 1; learned when the 95% interval of the mean lies past it"
    assert learned_criterion("accuracy", [g("a", [0.9, 0.91, 0.92]), g("b", [0.3, 0.31, 0.305])]) == (
        f"Learned ({rule}): both groups learned")
    assert learned_criterion("accuracy", [g("a", [0.9, 0.91, 0.92]), g("b", [0.25, 0.26, 0.255]), g("c", []), g("d", [0.2, 0.4, 0.3])]) == (
        f"Learned ({rule}): 1 of 4 groups learned; did not learn: b (0.255); undetermined: c (no finished run); d (0.3)")
    # Chance differs by group (e.g. by family): one threshold per chance level.
    assert learned_criterion("accuracy", [g("enc", [0.15, 0.16, 0.155], 0.1), g("dec", [0.3, 0.31, 0.305]), g("ed", [0.5, 0.51, 0.52])]) == (
        "Learned (10% of the way from the strongest baseline to a perfect score: accuracy@12 ≥ 0.19 for enc (chance 0.1); "
        "accuracy@12 ≥ 0.28 for dec and ed (chance 0.2); learned when the 95% interval of the mean lies past it): "
        "2 of 3 groups learned; did not learn: enc (0.155)")
    loss = gate("x", "loss@8", [1.0, 1.01, 1.02], 2.0, higher=False, perfect=0.0).at()
    assert learned_criterion("loss", [loss]) == (
        "Learned (loss@8 ≤ 1.8, 10% of the way from chance 2 to 0; learned when the 95% interval of the mean lies "
        "past it): the group learned")
    unknown = gate("x", "accuracy@8", [0.9, 0.91], math.nan).at()
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
    wide = verdict(by_seed([0.8, 0.9, 0.85, 0.86]), by_seed([0.82, 0.86, 0.9, 0.85]), "accuracy@8", "A", "B",
                   higher=True, bounds=(0.0, 1.0), margin=0.01)
    assert wide.outcome == "inconclusive" and re.search(
        r"to show equivalence within ±0.01 with 80% power, were the observed difference -0.005 the true one, would "
        r"take (about \d+|more than 1000) seeds", wide.reason)


def test_both_groups_at_the_perfect_score_on_every_seed_is_a_ceiling():
    v = verdict(by_seed([1.0, 1.0, 1.0]), by_seed([1.0, 1.0, 1.0]), "accuracy@8", "A", "B", higher=True,
                bounds=(0.0, 1.0))
    assert (v.outcome, v.label) == ("ceiling", "ceiling: the task does not separate them (both groups scored the "
                                              "metric's best value on every seed)")
    loss = verdict(by_seed([0.0, 0.0]), by_seed([0.0, 0.0]), "loss@8", "A", "B", higher=False, bounds=(0.0, math.inf))
    assert loss.outcome == "ceiling"
    # equal seeds below the best value are not a ceiling: the same values are identical groups, the same
    # nonzero difference on every seed has no spread, so no interval
    assert verdict(by_seed([0.9, 0.9]), by_seed([0.9, 0.9]), "accuracy@8", "A", "B", higher=True,
                   bounds=(0.0, 1.0)).outcome == "identical"
    assert verdict(by_seed([0.9, 0.8]), by_seed([0.8, 0.7]), "accuracy@8", "A", "B", higher=True,
                   bounds=(0.0, 1.0)).label.startswith("inconclusive (every seed gave the same difference")


def test_an_inconclusive_verdict_states_its_detectable_difference_and_the_seeds_needed():
    a, b = by_seed([0.61, 0.72, 0.55, 0.80]), by_seed([0.58, 0.66, 0.57, 0.74])
    v = verdict(a, b, "accuracy@8", "A", "B", higher=True, bounds=(0.0, 1.0))
    assert v.outcome == "inconclusive"
    d = (a - b).to_numpy()
    sd, n = d.std(ddof=1), len(d)
    mde = float(re.search(r"4 seeds detect ±([\d.]+) with 80% power", v.reason).group(1))
    needed = int(re.search(r"to find the observed difference \+[\d.]+ \(the claim's direction\) with 80% power "
                           r"would take about (\d+) seeds", v.reason).group(1))
    # check against the noncentral t: power of the paired two-sided test at 5%
    def power(effect, k):
        crit, nc = stats.t.ppf(0.975, k - 1), effect / (sd / math.sqrt(k))
        return stats.nct.sf(crit, k - 1, nc) + stats.nct.cdf(-crit, k - 1, nc)
    assert power(mde, n) == pytest.approx(0.8, abs=0.01)
    assert power(d.mean(), needed) >= 0.8 > power(d.mean(), needed - 1)


def test_holms_family_is_every_hypothesis_even_of_entries_that_end_before_a_test():
    a, b = by_seed([0.90, 0.91, 0.95, 0.92]), by_seed([0.50, 0.52, 0.51, 0.50])
    tested = Comparison("accuracy@8", "A", "B", a, b, higher=True, bounds=(0.0, 1.0))
    same = Comparison("accuracy@8", "C", "D", a, a.copy(), higher=True, bounds=(0.0, 1.0))
    alone = verdicts([tested])[0]
    with_identical = verdicts([tested, same])
    assert with_identical[1].outcome == "identical"
    assert alone.diff.level == pytest.approx(0.95)
    assert with_identical[0].diff.level == pytest.approx(0.975)  # M = 2: the identical entry still counts
    assert with_identical[0].p_holm == pytest.approx(min(1.0, 2 * alone.diff.p))
    # an entry with a margin brings two hypotheses (no difference; outside ±margin), of which at most one can
    # be true: Shaffer's count of possibly true hypotheses stays 2
    with_margin = verdicts([tested, replace(same, margin=0.05)])
    assert with_margin[0].diff.level == pytest.approx(0.975)
    assert with_margin[0].p_holm == pytest.approx(min(1.0, 2 * alone.diff.p))


def test_equivalence_is_in_holms_family_and_reads_before_a_decided_difference():
    # equal groups, tight: the difference is not decided, equivalence within ±0.02 is
    a, b = by_seed([0.900, 0.905, 0.898, 0.902]), by_seed([0.901, 0.903, 0.899, 0.900])
    v = verdicts([Comparison("accuracy@8", "A", "B", a, b, higher=True, bounds=(0.0, 1.0), margin=0.02)])[0]
    # one entry: its two hypotheses cannot both be true, so each is read at the full 0.05 (Shaffer 1986): TOST's 90%
    assert v.outcome == "equivalent" and v.diff.level == pytest.approx(0.90)
    assert -0.02 < v.diff.lo and v.diff.hi < 0.02 and v.label == "equivalent"
    # a decided difference smaller than the margin: both hypotheses rejected; equivalence reads first and says so
    shifted = a + 0.005 + by_seed([0.0, 0.0001, -0.0001, 0.0])
    v = verdicts([Comparison("accuracy@8", "A", "B", shifted, a, higher=True, bounds=(0.0, 1.0), margin=0.02)])[0]
    assert v.outcome == "equivalent" and "the difference is decided too, above 0" in v.reason
    # the same difference without a margin holds
    assert verdicts([Comparison("accuracy@8", "A", "B", shifted, a, higher=True, bounds=(0.0, 1.0))])[0].outcome == "holds"
    # equivalence's p is that of the two one-sided tests: at most a exactly when the 1 - 2a interval is inside
    from workbench.stats.intervals import difference
    d = difference(shifted, a, level=0.9)
    for margin in (0.004, 0.00505, 0.0051, 0.006, 0.02):
        assert (d.equivalence_p(margin) <= 0.05) == (-margin < d.lo and d.hi < margin), margin


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


@pytest.mark.parametrize("seed", range(5))
def test_the_t_intervals_and_p_values_are_scipys(seed):
    from workbench.stats.intervals import paired_diff, welch_diff

    rng = np.random.default_rng(seed)
    x, y = rng.normal(0.5, 0.1, 3 + seed), rng.normal(0.45, 0.2, 3 + seed)
    for level in (0.95, 0.99997):
        ci = stats.ttest_1samp(x, 0.0).confidence_interval(level)
        assert (mean_ci(x, level).lo, mean_ci(x, level).hi) == pytest.approx((ci.low, ci.high), rel=1e-10)
        test = stats.ttest_rel(x, y)
        iv = paired_diff(pd.Series(x), pd.Series(y), level)
        assert (iv.lo, iv.hi, iv.p) == pytest.approx((*test.confidence_interval(level), test.pvalue), rel=1e-10)
        test = stats.ttest_ind(x, y[:-1], equal_var=False)
        iv = welch_diff(x, y[:-1], level)
        assert (iv.lo, iv.hi, iv.p) == pytest.approx((*test.confidence_interval(level), test.pvalue), rel=1e-10)


def test_a_level_prints_with_the_digits_its_alpha_needs_everywhere_it_is_shown():
    from workbench.report.document import VerdictLine, level_text

    assert [level_text(x) for x in (0.95, 0.975, 0.99965, 1 - 4.2e-7)] == ["95%", "97.5%", "99.965%", "99.99996%"]
    line = VerdictLine("a is better than b on x", "holds", "holds", "", difference={
        "mean": 0.159, "lo": 0.121, "hi": 0.197, "level": 0.99965, "method": "paired"})
    assert line.interval_kind == "99.965% paired"  # it printed "100% paired"


def test_the_verdict_table_shows_what_each_label_adds_to_its_outcome():
    from workbench.report.document import VerdictLine
    from workbench.stats.outcomes import CEILING_LABEL

    def reason(outcome: str, label: str) -> str:
        return VerdictLine("a is better than b on x", outcome, label, "").reason

    assert reason("ceiling", CEILING_LABEL) == "the task does not separate them"  # it printed "(: the task ...)"
    assert reason("ceiling", CEILING_LABEL + " (both at 1)") == "the task does not separate them (both at 1)"
    assert reason("holds", "holds (only a learned)") == "only a learned"
    assert reason("holds", "holds") == ""


def test_an_equivalence_whose_groups_both_sit_within_the_margin_of_the_best_value_reads_as_a_ceiling():
    """kv-sharing-window's case: 0.986 against 0.986 with a margin of 0.02, on accuracy whose best is 1.
    Both means lie within 0.02 of 1, so the range alone keeps them within the margin: the task does not
    separate them, and it is no decided claim. Below 1 - margin it is an equivalence."""
    a, b = by_seed([0.985, 0.987, 0.986, 0.986]), by_seed([0.986, 0.985, 0.987, 0.986])
    v = verdict(a, b, "accuracy@8", "A", "B", higher=True, bounds=(0.0, 1.0), margin=0.02)
    assert v.outcome == "ceiling" and not v.outcome.decides
    assert v.label.startswith("ceiling: the task does not separate them (both groups lie within ±0.02 of the "
                              "metric's best value 1 (0.986 and 0.986)")
    assert "interval lies within ±0.02" in v.label
    lower = verdict(a - 0.1, b - 0.1, "accuracy@8", "A", "B", higher=True, bounds=(0.0, 1.0), margin=0.02)
    assert lower.outcome == "equivalent"
    # a loss near 0 (its best value; lower is better) is a ceiling too; accuracies near 0 are a floor
    loss = verdict(by_seed([0.010, 0.012, 0.011, 0.013]), by_seed([0.011, 0.012, 0.010, 0.012]), "loss@8", "A", "B",
                   higher=False, bounds=(0.0, math.inf), margin=0.05)
    assert loss.outcome == "ceiling"
    floor = verdict(by_seed([0.010, 0.012, 0.011, 0.013]), by_seed([0.011, 0.012, 0.010, 0.012]), "accuracy@8", "A",
                    "B", higher=True, bounds=(0.0, 1.0), margin=0.05)
    assert floor.outcome == "floor" and floor.label.startswith("floor: the task does not separate them (both groups "
                                                               "lie within ±0.05 of the metric's worst value 0")


def test_a_holds_whose_loser_sits_below_the_level_its_claim_predicts_says_so():
    """position-direction's case: ALiBi, whose penalty is the same on both sides, is predicted to reach
    the side-blind level (0.667) and no further; at 0.276 on every seed it fell short of that too, so
    'RoPE is better' holds but not for the claimed reason."""
    rope, alibi = by_seed([0.996, 0.997, 0.995, 0.996]), by_seed([0.27, 0.28, 0.275, 0.279])
    c = Comparison("accuracy@12", "rope", "alibi", rope, alibi, higher=True, bounds=(0.0, 1.0),
                   predicted=("side-blind", 0.667))
    v = verdicts([c])[0]
    assert v.outcome == "holds" and v.tests_claim
    assert v.label == ("holds (alibi at 0.276 stays below side-blind 0.667, the level the claim predicts for it: it "
                       "falls short for more than the claimed reason)")
    at_level = verdicts([replace(c, than_values=alibi + 0.39)])[0]  # about 0.667: as predicted
    assert at_level.label == "holds"


def test_a_look_under_four_seeds_decides_nothing_however_plain_the_difference():
    """Three seeds that each fall the same way between two modes (learned against not) give a paired t
    with 2 degrees of freedom an arbitrarily large t; no test at 3 seeds tells that from an effect every
    seed shows, so 3 seeds decide nothing and 4 do."""
    a, b = by_seed([0.99, 1.0, 0.995, 0.998]), by_seed([0.5, 0.49, 0.51, 0.5])
    three = verdict(a[:3], b[:3], "accuracy@8", "A", "B", higher=True, bounds=(0.0, 1.0))
    assert three.outcome == "inconclusive" and three.reason.startswith("3 seeds per group; a verdict needs 4")
    assert verdict(a, b, "accuracy@8", "A", "B", higher=True, bounds=(0.0, 1.0)).outcome == "holds"
    # the rules before 2026-12-06 decided it at 3 (min_seeds 2 reproduces them)
    c = Comparison("accuracy@8", "A", "B", a[:3], b[:3], higher=True, bounds=(0.0, 1.0))
    assert verdicts([c], min_seeds=2)[0].outcome == "holds"
