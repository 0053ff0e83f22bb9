"""benchmarks/crn.py: its studies are valid studies that sweep train.init over the same seeds,
and its figures (r, SD of the paired differences, their ratio) are computed from the right runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from benchmarks.crn import INITS, STUDIES, paired_figures
from workbench.study import load_study
from workbench.recipes.train.sweep import expand


@pytest.mark.parametrize("name", list(STUDIES))
def test_each_study_runs_every_arm_under_both_inits_on_the_same_seeds(tmp_path, name):
    study = STUDIES[name]
    path = tmp_path / "s.yaml"
    path.write_text(study.yaml(seeds=3))
    runs = expand(load_study(path))
    cells = {(r.swept[study.key], r.swept["train.init"], r.seed) for r in runs}
    assert cells == {(arm, init, seed) for arm in study.arms for init in INITS for seed in range(3)}
    assert {r.config["train"]["init"] for r in runs} == set(INITS)
    assert all(a in study.arms and b in study.arms for a, b in study.pairs)


def constructed_runs(seeds: int = 12) -> pd.DataFrame:
    """Outcomes with seed noise the arms share (the data stream) in both inits, and an init noise
    shared under paired init only: paired differences are less noisy by construction."""
    rng = np.random.default_rng(1)
    data = rng.normal(size=seeds)
    shared_init = rng.normal(size=seeds)  # paired init: one draw per seed, both arms; sequential: one per run
    rows = []
    for seed in range(seeds):
        for arm, shift in (("a", 0.5), ("b", 0.0)):
            rows.append({"arm": arm, "init": "paired", "seed": seed,
                         "m": shift + data[seed] + shared_init[seed] + 0.1 * rng.normal()})
            rows.append({"arm": arm, "init": "sequential", "seed": seed,
                         "m": shift + data[seed] + rng.normal() + 0.1 * rng.normal()})
    return pd.DataFrame(rows)


def test_figures_find_the_noise_that_paired_init_removes():
    runs = constructed_runs()
    f = paired_figures(runs, "a", "b", "m")
    assert f["seeds"] == 12
    assert f["r_paired"] > 0.95 and f["r_sequential"] < f["r_paired"]
    for init in INITS:
        a = runs[(runs.init == init) & (runs.arm == "a")].set_index("seed")["m"]
        b = runs[(runs.init == init) & (runs.arm == "b")].set_index("seed")["m"]
        assert f[f"sd_{init}"] == pytest.approx(np.std(a - b, ddof=1))
        assert f[f"mean_{init}"] == pytest.approx(np.mean(a - b))
    assert f["sd_ratio"] == pytest.approx(f["sd_paired"] / f["sd_sequential"]) and f["sd_ratio"] < 0.3
    assert f["sd_ratio_lo"] < f["sd_ratio"] < f["sd_ratio_hi"] < 1 and f["equal_sd_p"] < 0.01
    assert f["seed_share"] == pytest.approx(f["sd_ratio"] ** 2)


def test_a_seed_that_failed_in_any_of_its_four_runs_is_left_out():
    runs = constructed_runs()
    runs = runs[~((runs.seed == 3) & (runs.init == "sequential") & (runs.arm == "b"))]
    assert paired_figures(runs, "a", "b", "m")["seeds"] == 11
