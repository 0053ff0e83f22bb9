"""Planning seeds by simulating the verdict rule (workbench.stats.planning): the synthetic
values have the noise and shift asked for, the searched seeds reach the power and fewer do not,
a larger family and more noise need more seeds, adaptive seeds stop early on a large effect."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.stats.planning import Goal, Planned, SeedSearch, drawn, simulate
from workbench.stats.power import POWER
from workbench.stats.rule import Comparison

FEW = 200  # replications: enough for the orderings tested here, and quick


def comparison(k: int = 0, higher: bool = True, margin: float | None = None) -> Comparison:
    return Comparison("score", f"a{k}", f"b{k}", [], [], higher, margin=margin, seeds_run=2)


@pytest.mark.parametrize("higher", [True, False])
def test_drawn_values_have_the_planned_noise_and_shift_in_the_expected_direction(higher):
    p = Planned(comparison(higher=higher), sd=0.3, group_sd=0.5, shift=0.2, goal=Goal.HOLDS)
    family = drawn([p], seeds=4, replications=10_000)
    better, than = family.better[:, 0].ravel(), family.than[:, 0].ravel()
    diff = better - than
    assert diff.std() == pytest.approx(0.3, rel=0.03)
    assert better.std() == pytest.approx(0.5, rel=0.03) and than.std() == pytest.approx(0.5, rel=0.03)
    assert diff.mean() == pytest.approx(0.2 if higher else -0.2, abs=0.01)  # better by 0.2 in the metric's direction
    assert family.gate_needed.shape == (1, 0) and family.better.shape == (10_000, 1, 4)
    # replication r's first seeds are the same whatever the seeds drawn: common random numbers across seed counts
    assert np.array_equal(drawn([p], seeds=6, replications=3).better[:, :, :4], drawn([p], 4, 3).better)


def test_a_comparison_without_groups_stays_empty():
    empty = Comparison("score", "a", "b", [], [], True)  # seeds_run 0: no point of the study
    family = drawn([Planned(empty)], seeds=3, replications=5)
    assert np.isnan(family.better).all() and np.isnan(family.than).all()


def test_the_searched_seeds_reach_the_power_and_one_fewer_does_not():
    search = SeedSearch([Planned(comparison(), shift=1.0, goal=Goal.HOLDS)], groups=["a0", "b0"], replications=FEW)
    n = search.smallest()[0]
    assert 4 <= n <= 30
    assert search.at(n).power[0] >= POWER > search.at(n - 1).power[0]
    assert search.at(n).group_seeds == {"a0": n, "b0": n}  # a fixed list of seeds: every group runs them all


def test_equivalence_is_planned_at_a_true_difference_of_zero():
    search = SeedSearch([Planned(comparison(margin=1.0), goal=Goal.EQUIVALENT)], replications=FEW)
    n = search.smallest()[0]
    assert n is not None and search.at(n).power[0] >= POWER > search.at(n - 1).power[0]
    drifted = SeedSearch([Planned(comparison(margin=1.0), shift=0.9, goal=Goal.EQUIVALENT)], replications=FEW)
    assert drifted.at(n).power[0] < search.at(n).power[0]  # a true difference near the margin is rarely "equivalent"


def test_more_comparisons_in_the_family_and_more_noise_need_more_seeds():
    alone = SeedSearch([Planned(comparison(), shift=1.0, goal=Goal.HOLDS)], replications=FEW).smallest()[0]
    family = [Planned(comparison(), shift=1.0, goal=Goal.HOLDS), *(Planned(comparison(k)) for k in range(1, 5))]
    among_five = SeedSearch(family, replications=FEW).smallest()[0]
    noisier = SeedSearch([Planned(comparison(), sd=1.5, group_sd=1.5, shift=1.0, goal=Goal.HOLDS)],
                         replications=FEW).smallest()[0]
    assert alone < among_five  # Holm's m counts every comparison of the study
    assert alone < noisier


def test_adaptive_seeds_stop_early_on_a_large_effect_and_groups_run_what_their_comparisons_ask():
    planned = [Planned(comparison(0), shift=2.0, goal=Goal.HOLDS), Planned(comparison(1))]
    s = simulate(planned, 24, first=3, groups=["a0", "b0", "a1", "b1", "alone"], replications=FEW)
    assert s.power[0] >= POWER and np.isnan(s.power[1])
    assert 3 < s.spent[0] < 24  # decided before the last look on average
    assert s.group_seeds["a0"] == pytest.approx(s.spent[0])
    assert s.group_seeds["alone"] == 3  # in no comparison: the first seeds only


def test_the_detectable_effect_is_the_smallest_shift_with_the_power():
    planned = [Planned(comparison(0), sd=0.5, group_sd=0.5, goal=Goal.DETECT), Planned(comparison(1))]
    search = SeedSearch(planned, replications=FEW)
    shift_sd, at = search.detectable(6)
    assert shift_sd is not None and at.power[0] >= POWER

    def power_at(shift: float) -> float:
        return simulate([Planned(comparison(0), sd=0.5, group_sd=0.5, shift=shift * 0.5, goal=Goal.HOLDS),
                         planned[1]], 6, replications=FEW).power[0]

    assert power_at(0.95 * shift_sd) < POWER <= power_at(shift_sd)
