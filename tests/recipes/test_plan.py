"""What `workbench plan` reads from its pilot (workbench.recipes.train.plan): the noise pooled per
metric and its upper confidence bound, the pilot's seeds (the study's first), and each
comparison's goal.
The command itself, pilot included, is tests/cli/test_cli_plan.py."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from workbench.recipes.train.plan import Noise, metric_noise, pilot_seeds, planned_family, recorded_seconds
from workbench.stats.planning import Goal
from workbench.stats.rule import Comparison
from workbench.recipes.train.study import TrainStudy


def comparison(better, than, metric="bpc", margin=None, counts=False) -> Comparison:
    seeds = range(len(better))
    return Comparison(metric, f"b{id(better)}", f"t{id(than)}", pd.Series(better, index=seeds),
                      pd.Series(than, index=seeds), False, margin=margin, counts=counts, seeds_run=len(better))


def test_the_noise_is_the_sd_of_the_paired_differences_pooled_over_a_metrics_comparisons():
    first = comparison([3.0, 3.4], [2.9, 3.1])  # differences 0.1, 0.3: variance 0.02
    second = comparison([2.0, 2.0], [1.8, 1.6])  # differences 0.2, 0.4: variance 0.02
    other = comparison([5.0, 6.0], [5.0, 5.5], metric="loss")  # differences 0, 0.5: variance 0.125
    noise = metric_noise([first, second, other])
    assert noise["bpc"].sd == pytest.approx(math.sqrt(0.02)) and noise["bpc"].df == 2
    assert noise["loss"].sd == pytest.approx(math.sqrt(0.125)) and noise["loss"].df == 1
    # the groups' own spread, pooled: variances 0.08, 0.02, 0, 0.02 over 4 df
    assert noise["bpc"].group_sd == pytest.approx(math.sqrt(0.03))


def test_pairs_are_by_seed_and_a_pilot_without_spread_or_a_second_seed_measures_no_noise():
    unordered = Comparison("bpc", "a", "b", pd.Series([3.4, 3.0], index=[1, 0]), pd.Series([2.9, 3.1], index=[0, 1]),
                           False, seeds_run=2)
    assert metric_noise([unordered])["bpc"].sd == pytest.approx(math.sqrt(0.02))  # seed 0: 0.1, seed 1: 0.3
    assert metric_noise([comparison([3.0], [2.9])]) == {}
    assert metric_noise([comparison([3.0, 3.2], [2.9, 3.1])]) == {}  # the same difference on both seeds


def test_the_upper_bound_is_browne_1995s_80_percent_confidence_limit():
    assert Noise(1.0, 2.0, 1).upper().sd == pytest.approx(3.947, abs=1e-3)  # sqrt(1 / 0.0642)
    assert Noise(1.0, 2.0, 8).upper().sd == pytest.approx(1.320, abs=1e-3)  # sqrt(8 / 4.594), chi2_0.2(8) of the tables
    assert Noise(1.0, 2.0, 8).upper().group_sd == pytest.approx(2 * 1.320, abs=2e-3)


def study(seeds) -> TrainStudy:
    return TrainStudy.model_validate({"name": "s", "task": {"name": "copy", "train_length": 4},
                                      "train": {"steps": 2, "batch_size": 4}, "seeds": seeds,
                                      "tune": {"train.lr": [1e-3, 3e-3], "metric": "loss@4", "seeds": 2}})


def test_pilot_seeds_are_the_studys_own_first_seeds():
    """An internal pilot: its runs are the study's first runs, which the study then reuses."""
    assert pilot_seeds(study([0, 1, 2]), 2) == [0, 1]
    assert pilot_seeds(study([7, 3, 9]), 2) == [7, 3]  # the listed order
    assert pilot_seeds(study({"first": 3, "max": 12, "start": 100}), 2) == [100, 101]
    assert pilot_seeds(study([5]), 2) == [5, 6]  # a one-seed study: one more past it (no run of the study)
    # the largest seeds a study may list (issue 64: a pilot past them failed, blamed on `seeds.0`)
    top = TrainStudy.model_validate({"name": "s", "task": {"name": "copy", "train_length": 4},
                                     "train": {"steps": 2, "batch_size": 4}, "seeds": [2**32 - 1]})
    assert pilot_seeds(top, 2) == [2**32 - 1, 2**32 - 2]
    # tuned: the pilot's tuning seeds follow its largest seed, so the one added stays below them
    assert pilot_seeds(study([2**32 - 3]), 2) == [2**32 - 3, 2**32 - 4]
    assert pilot_seeds(study([2**32 - 5]), 2) == [2**32 - 5, 2**32 - 4]


def test_a_stored_command_cost_is_data():
    assert recorded_seconds({"a": "2.5", "b": "1"}, ["a", "b"]) == 3.5
    assert recorded_seconds({"a": "nan", "b": "-4", "c": "many"}, ["a", "b", "c", "d"]) == 0.0


def test_a_tuned_study_leaves_room_for_its_tuning_seeds():
    """Its tuning seeds follow its largest seed: past 2^32-1 every tuning run failed in numpy."""
    assert study([2**32 - 3]).tuning_seeds == [2**32 - 2, 2**32 - 1]
    with pytest.raises(ValueError, match=r"seeds: seed 4294967294: tune: trains on the 2 seed\(s\) after the largest "
                                        r"one, past 4294967295; give seeds up to 4294967293"):
        study([0, 2**32 - 2])


def test_each_comparison_is_planned_for_its_margin_the_effect_or_what_the_seeds_detect():
    noise = {"bpc": Noise(0.2, 0.3, 4)}
    with_margin, without = comparison([1.0, 2.0], [1.0, 2.0], margin=0.05), comparison([1.0, 2.0], [1.5, 2.0])
    failures = comparison([0.0, 1.0], [0.0, 0.0], counts=True)
    planned, why = planned_family([with_margin, without, failures], noise, None, None)
    assert [p.goal for p in planned] == [Goal.EQUIVALENT, Goal.DETECT, None] and "counts" in why[2]
    assert planned[0].shift == 0 and planned[0].sd == 0.2
    planned, _ = planned_family([with_margin, without], noise, 0.1, None)
    assert [p.goal for p in planned] == [Goal.EQUIVALENT, Goal.HOLDS] and planned[1].shift == 0.1
    planned, _ = planned_family([with_margin, without], noise, None, 1.5)
    assert planned[1].shift == pytest.approx(0.3)  # 1.5 noise SDs
    unknown, why = planned_family([with_margin, without], {}, None, 1.5)  # one pilot seed: no noise
    assert unknown[0].goal is None and "no noise" in why[0]
    assert unknown[1].goal is Goal.HOLDS and unknown[1].shift == 1.5 and unknown[1].sd == 1.0  # in noise SDs
