"""The report's "Did the budget suffice?" check: a verdict metric's change over the last 20% of
the steps, against its spread over seeds."""

import math

import pandas as pd
import pytest

from workbench.recipes.train.report.convergence import settling, settling_section


def curves_of(runs: dict[str, list[tuple[int, float]]], metric: str = "accuracy@12") -> pd.DataFrame:
    return pd.DataFrame([{"run_id": run_id, "step": step, "split": "eval", "metric": metric, "value": value}
                         for run_id, points in runs.items() for step, value in points])


def test_flat_rising_and_unchecked_groups():
    runs = pd.DataFrame({"run_id": ["a0", "a1", "a2", "b0", "b1", "b2", "c0", "c1"],
                         "variant": ["flat"] * 3 + ["rising"] * 3 + ["coarse"] * 2})
    curves = curves_of({
        # flat: +0.01 on average in the last 20%, final values 0.90, 0.95, 0.85 (SD 0.05)
        "a0": [(400, 0.5), (800, 0.89), (1000, 0.90)], "a1": [(400, 0.5), (800, 0.94), (1000, 0.95)],
        "a2": [(400, 0.5), (800, 0.84), (1000, 0.85)],
        # rising: +0.2 in the last 20% on every seed, final spread 0.01
        "b0": [(800, 0.6), (1000, 0.80)], "b1": [(800, 0.61), (1000, 0.81)], "b2": [(800, 0.59), (1000, 0.79)],
        # only evaluated at the end: nothing to compare with
        "c0": [(1000, 0.7)], "c1": [(1000, 0.8)],
        "ignored": [(800, 0.0), (1000, 1.0)],  # not a finished run of the report
    })
    found = {s.variant: s for s in settling(curves, runs, ["accuracy@12", "bleu@12"])}
    assert set(found) == {"flat", "rising", "coarse"}  # bleu@12 is not in the curves: skipped
    assert found["flat"].change == pytest.approx(0.01) and found["flat"].spread == pytest.approx(0.05)
    assert found["flat"].step_before == 800 and found["flat"].outcome == "flat"
    assert found["rising"].change == pytest.approx(0.2) and found["rising"].outcome == "still changing"
    assert found["coarse"].seeds == 0 and math.isnan(found["coarse"].change)
    assert found["coarse"].outcome.startswith("not checked")
    section = settling_section(list(found.values()))
    assert "2 of 3 group and metric pairs are flat, at the ceiling or unchecked; still changing: rising on " \
        "accuracy@12 (+0.2)" in \
        section.items[0].text
    assert [row[-1] for row in section.items[1].rows] == ["flat", "still changing",
                                                          "not checked (no evaluation in the first 80% of the steps)"]


def test_a_run_longer_than_another_is_compared_at_its_own_80_percent():
    runs = pd.DataFrame({"run_id": ["short", "long"], "variant": ["v", "v"]})
    curves = curves_of({"short": [(400, 0.5), (500, 0.6)], "long": [(400, 0.5), (800, 0.7), (1000, 0.7)]})
    (only,) = settling(curves, runs, ["accuracy@12"])
    assert only.step_before == 600  # 400 (80% of 500) and 800 (80% of 1000)
    assert only.change == pytest.approx(0.05)  # +0.1 and 0.0


def test_a_group_at_the_best_value_on_every_seed_is_at_the_ceiling_not_still_changing():
    # Seen in families (2026-12-01): every seed ends at 1.0, a last rise of 1e-4 and a spread of 0
    # read "still changing"; more steps cannot improve a perfect score.
    runs = pd.DataFrame({"run_id": ["p0", "p1", "q0", "q1"], "variant": ["perfect"] * 2 + ["almost"] * 2})
    curves = curves_of({"p0": [(800, 0.9998), (1000, 1.0)], "p1": [(800, 1.0), (1000, 1.0)],
                        "q0": [(800, 0.9), (1000, 0.9999)], "q1": [(800, 0.9), (1000, 0.9999)]})
    found = {s.variant: s for s in settling(curves, runs, ["accuracy@12"], scales={"accuracy@12": (True, (0.0, 1.0))})}
    assert found["perfect"].outcome == "at the ceiling (every seed at the best value)"
    assert found["almost"].outcome == "still changing"  # 0.9999 is not the best value: still rising
    unbounded = {s.variant: s for s in settling(curves, runs, ["accuracy@12"])}
    assert unbounded["perfect"].outcome == "still changing"  # without a declared best value, no ceiling
    open_ended = {s.variant: s for s in settling(curves, runs, ["accuracy@12"],
                                                 scales={"accuracy@12": (True, (0.0, math.inf))})}
    assert open_ended["perfect"].outcome == "still changing"  # an unbounded metric has no ceiling
    section = settling_section(list(found.values()))
    assert "1 of 2 group and metric pairs are flat, at the ceiling or unchecked" in section.items[0].text
