"""Compute-matched studies across scale: flops_to_target, the ladder's per-rung verdicts and
cross-scale line, and the saturating power-law fits (constructed results with known answers)."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
import torch

from workbench.cost.fit import PowerLaw, fit_power_law, power_law_crossing
from workbench.errors import WorkbenchError
from workbench.api import write_report
from workbench.recipes.train.compute_curves import to_target
from workbench.recipes.train.report.ladder import cross_scale_line
from workbench.results import RunResult
from workbench.run.store import Store
from workbench.study import load_study
from workbench.recipes.train.sweep import expand

from test_report import parse, save_study


# ---- flops_to_target ----------------------------------------------------------------------


def test_to_target_interpolates_between_the_evaluations_around_the_target():
    # loss 3.0 at 100 FLOPs, 2.0 at 200: 2.5 is reached halfway, at 150.
    assert to_target([(100, 3.0), (200, 2.0), (300, 1.0)], 2.5, higher=False) == pytest.approx(150)
    assert to_target([(10, 0.2), (20, 0.6)], 0.5, higher=True) == pytest.approx(17.5)


def test_to_target_at_the_first_evaluation_and_not_reached():
    assert to_target([(100, 1.0), (200, 0.5)], 2.0, higher=False) == 100  # nothing earlier to interpolate from
    assert math.isnan(to_target([(100, 3.0), (200, 2.6)], 2.5, higher=False))
    assert to_target([(100, 3.0), (150, math.nan), (200, 2.0)], 2.5, higher=False) == pytest.approx(150)


# ---- the cross-scale line -----------------------------------------------------------------


@pytest.mark.parametrize("outcomes, line", [
    (["holds", "holds", "holds"], "holds at 3 of 3 rungs"),
    (["holds", "holds", "does not hold"], "flips between 64 and 128"),
    (["inconclusive", "inconclusive", "holds"], "decided only at 128 (holds)"),
    (["holds", "inconclusive", "holds"], "holds at 2 of 3 rungs (decided only at 32 and 128)"),
    (["does not hold", "not tested", "holds"], "flips between 32 and 128"),
    (["inconclusive", "not reached", "not tested"], "decided at no rung"),
])
def test_cross_scale_line(outcomes, line):
    assert cross_scale_line(list(zip(["32", "64", "128"], outcomes))) == line


# ---- fits ---------------------------------------------------------------------------------


def synthetic(E: float, A: float, alpha: float, seeds: int = 4, noise: float = 0.003) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    compute = np.array([1e9, 4e9, 1.6e10, 6.4e10, 2.56e11])
    rows = [{"compute": c, "seed": s, "loss": E + A * (c / compute[0]) ** -alpha + rng.normal(0, noise)}
            for s in range(seeds) for c in compute]
    return pd.DataFrame(rows)


def test_power_law_fit_recovers_a_known_exponent_with_an_interval_around_it():
    fit = fit_power_law(synthetic(E=1.5, A=2.0, alpha=0.3), n_boot=200)
    assert fit.law.alpha == pytest.approx(0.3, abs=0.03)
    assert fit.law.E == pytest.approx(1.5, abs=0.05)
    lo, hi = fit.intervals["alpha"]
    assert lo <= 0.3 <= hi and hi - lo < 0.1
    assert fit.n_seeds == 4 and fit.n_points == 20


def test_power_law_fit_needs_three_compute_values():
    with pytest.raises(ValueError, match="3 distinct compute values"):
        fit_power_law(pd.DataFrame({"compute": [1e9, 2e9] * 2, "loss": [2.0, 1.9] * 2, "seed": [0, 0, 1, 1]}))


def test_crossing_of_two_laws_or_none_within_the_range():
    a, b = PowerLaw(E=1.0, A=1.0, alpha=0.5, C0=1.0), PowerLaw(E=1.2, A=0.5, alpha=0.5, C0=1.0)
    # 1 + x^-0.5 = 1.2 + 0.5 x^-0.5  <=>  x^-0.5 = 0.4  <=>  x = 6.25
    assert power_law_crossing(a, b, 1.0, 100.0) == pytest.approx(6.25, rel=1e-6)
    assert power_law_crossing(a, b, 10.0, 100.0) is None


# ---- a ladder study's report --------------------------------------------------------------

LADDER = """
name: ladder
task: {name: copy, train_length: 8, n_eval: 16, alphabet_size: 6}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {budget: {flops: 1.0e+8}, batch_size: 8}
seeds: [0, 1, 2, 3]
sweep: {model.ffn: [gelu, swiglu]}
scale: {model.d_model: [16, 32, 64], train.budget.flops: [1.0e+8, 4.0e+8, 1.6e+9]}
expect:
  - {metric: loss@8, better: swiglu, than: gelu}
  - {metric: flops_to_target, target: {metric: loss@8, value: 0.2}, better: swiglu, than: gelu}
"""
# Final loss@8 per (ffn, d_model) and seed: swiglu clearly lower at 16, mixed at 32, clearly
# higher at 64: the entry flips between 16 and 64. Seed 3 at each group's mean (a verdict needs 4 seeds).
# Every group beats the copy task's order-blind baseline (loss 0.863), so the learned gate passes.
LOSS = {("gelu", 16): [0.5, 0.51, 0.52, 0.51], ("swiglu", 16): [0.4, 0.405, 0.41, 0.405],
        ("gelu", 32): [0.35, 0.3, 0.4, 0.35], ("swiglu", 32): [0.325, 0.375, 0.35, 0.35],
        ("gelu", 64): [0.15, 0.155, 0.16, 0.155], ("swiglu", 64): [0.25, 0.26, 0.255, 0.255]}


@pytest.fixture(scope="module")
def ladder_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("ladder")
    (root / "study.yaml").write_text(LADDER)
    study_file = load_study(root / "study.yaml")
    store = Store(root / "out")
    save_study(store, study_file)
    runs = expand(study_file)
    for run in runs:
        ffn, d = run.swept["model.ffn"], run.swept["model.d_model"]
        loss = LOSS[(ffn, d)][run.seed]
        flops = run.config["train"]["budget"]["flops"]
        # Two evaluations: loss 1.5 at half the budget, the final loss at the end.
        curves = [(5, "eval", "loss@8", 1.5), (5, "progress", "flops", flops / 2),
                  (10, "eval", "loss@8", loss), (10, "progress", "flops", flops)]
        store.record(run, RunResult(run_id=run.run_id, status="finished", steps_done=10, metrics={"loss@8": loss,
                     "accuracy@8": 0.9}, curves=curves, train_flops=int(flops), last_step="partial", tokens=800,
                     environment={"torch": torch.__version__}))
    index = write_report(root / "out", root / "reports")
    return runs, index


def test_a_ladder_runs_every_point_at_every_rung_with_its_budget(ladder_report):
    runs, _ = ladder_report
    assert len(runs) == 2 * 3 * 4
    budgets = {r.swept["model.d_model"]: r.config["train"]["budget"]["flops"] for r in runs}
    assert budgets == {16: 1.0e8, 32: 4.0e8, 64: 1.6e9}


def test_every_entry_is_decided_at_each_rung_with_a_cross_scale_line(ladder_report):
    _, index = ladder_report
    html = index.read_text()
    verdicts = re.findall(r'class="outcome [\w-]+">([^<]+)</span>\s*([^<]+)', html)
    on_loss = [(label.split(" (")[0], statement.strip()) for label, statement in verdicts if "on loss@8" in statement]
    rungs = [f"d_model={d}, flops={f}" for d, f in ((16, 1e8), (32, 4e8), (64, 1.6e9))]
    assert on_loss == [(outcome, f"ffn=swiglu, {rung} is better than ffn=gelu, {rung} on loss@8")
                       for outcome, rung in zip(("holds", "inconclusive", "does not hold"), rungs)]
    page = parse(html)
    table = next(t for t in page.tables if t[0][0] == "expectation")
    assert table[0] == ["expectation", "d_model = 16", "d_model = 32", "d_model = 64", "across scale"]
    assert table[1][0] == "swiglu is better than gelu on loss@8" and table[1][-1] == "flips between 16 and 64"
    # flops_to_target: only gelu at 64 reaches loss 0.2, so every rung reads 'not reached'.
    assert table[2][0] == "swiglu is better than gelu on flops_to_target: loss@8 ≤ 0.2"
    assert table[2][1].startswith("not reached (ffn=swiglu, d_model=16, flops=100000000.0: 4 of 4 finished seeds "
                                  "never reached loss@8 ≤ 0.2; ffn=gelu")
    assert table[2][3].startswith("not reached (ffn=swiglu, d_model=64") and "ffn=gelu" not in table[2][3]
    assert table[2][-1] == "decided at no rung"


def test_the_ladder_report_fits_each_variant_and_says_where_they_cross(ladder_report):
    _, index = ladder_report
    page = parse(index.read_text())
    fits = next(t for t in page.tables if t[0][:2] == ["variant", "E [95% CI]"])
    assert [row[0] for row in fits[1:]] == ["ffn=gelu", "ffn=swiglu"]
    text = " ".join(page.text)
    assert re.search(r"ffn=gelu and ffn=swiglu: the fitted curves "
                     r"(cross at [\d.,e+]+ FLOPs|do not cross within the measured range)",
                     text)
    assert (index.parent / "figures" / "loss_vs_compute.png").exists()


def test_a_rung_key_also_swept_is_refused(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(LADDER.replace("sweep: {model.ffn: [gelu, swiglu]}", "sweep: {model.ffn: [gelu, swiglu], model.d_model: [16, 32]}"))
    with pytest.raises(WorkbenchError, match="scale.model.d_model.*also swept"):
        load_study(path)


def test_ladder_lists_must_have_one_value_per_rung(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(LADDER.replace("train.budget.flops: [1.0e+8, 4.0e+8, 1.6e+9]", "train.budget.flops: [1.0e+8, 4.0e+8]"))
    with pytest.raises(WorkbenchError, match="one value per rung"):
        load_study(path)
