"""The shipped `gpu` profiles train in bf16-mixed (a study about numerics keeps full float32 and
says why), CUDA runs use TF32 for their float32 matmuls unless the study asks for full float32,
and none of it moves the run ids of the default (CPU) profile: the shipped results stay valid."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from workbench.run.environment import matmul_precision
from workbench.recipes.train.study import TrainStudy
from workbench.study import load_study
from workbench.study.keys import label
from workbench.study.task_paths import with_task_paths
from workbench.recipes.train.sweep import expand, point_key, tuning_runs

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "studies").glob("*.yaml"))
# Studies about numerics: their gpu profile keeps full float32, with a comment saying why.
FULL_FLOAT32 = {"attention-scaling-factor", "attention-scaling-lr", "attention-scaling-replication"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_gpu_profile_computes_in_bfloat16_unless_the_study_is_about_numerics(path):
    study = load_study(path, "gpu").study
    if not isinstance(study, TrainStudy):
        assert study.scaling.dtype == "bfloat16"
        return
    if path.stem in FULL_FLOAT32:
        assert (study.train.precision, study.train.matmul_precision) == ("32", "highest")
        assert "Full float32 on purpose" in path.read_text()
    else:
        assert study.train.precision == "bf16-mixed"


@pytest.mark.parametrize("path", [p for p in SHIPPED if (ROOT / "reports" / p.stem / "results.csv").exists()],
                         ids=lambda p: p.stem)
def test_the_default_profile_keeps_the_run_ids_of_the_shipped_results(path, tmp_path):
    """Profiles are not part of a run's id: the study without --profile expands to the runs its
    shipped report was computed from. A tuned study's tuning runs moved to seeds disjoint from the
    final ones (issue 22) after its report was made: there the check is that the same file without
    its profiles expands to the same runs."""
    study = load_study(path)
    if not isinstance(study.study, TrainStudy):
        pytest.skip("a scaling study: its measurements have no run ids")
    if study.study.task.get("if_missing") == "default":  # kept only when the declared fallback was taken
        pytest.skip("its corpus is not on this machine: the runs are the fallback's, with ids of their own")
    if study.study.tune is not None:
        data = with_task_paths(yaml.safe_load(path.read_text()), path.absolute().parent)  # its corpus stays where it is
        data.pop("profiles", None)
        bare = tmp_path / path.name
        bare.write_text(yaml.safe_dump(data, sort_keys=False))
        assert [r.run_id for r in tuning_runs(study)] == [r.run_id for r in tuning_runs(load_study(bare))]
        return
    with (ROOT / "reports" / path.stem / "results.csv").open() as f:
        shipped = {row["run_id"] for row in csv.DictReader(f)}
    if study.study.seed_plan is None:
        assert {r.run_id for r in expand(study)} == shipped
        return
    # adaptive seeds: the first seeds of every point ran, and every other run is a point at a later seed
    points = [point_key({k: label(v) for k, v in p.items()}, study.study.sweep.keys) for p in study.study.sweep.points()]
    every_seed = {r.run_id for r in expand(study, None, dict.fromkeys(points, len(study.study.every_seed)))}
    assert {r.run_id for r in expand(study)} <= shipped <= every_seed


def test_matmul_precision_is_where_a_run_executes_not_what_it_computes(tmp_path):
    path = tmp_path / "t.yaml"
    text = {"name": "t", "task": {"name": "copy", "train_length": 8, "n_eval": 16, "alphabet_size": 8},
            "model": {"d_model": 32, "n_layers": 1, "n_heads": 2}, "train": {"steps": 20, "batch_size": 8},
            "seeds": [0, 1]}
    path.write_text(yaml.safe_dump(text))
    default = load_study(path)
    text["train"]["matmul_precision"] = "highest"
    path.write_text(yaml.safe_dump(text))
    full = load_study(path)
    assert [r.run_id for r in expand(full)] == [r.run_id for r in expand(default)]
    assert full.study_hash == default.study_hash
    train = expand(default)[0].config["train"]
    assert matmul_precision(train, "cuda") == "high"  # TF32 on CUDA by default
    assert matmul_precision(expand(full)[0].config["train"], "cuda") == "highest"
    assert matmul_precision(train, "cpu") == "highest"  # the CPU always computes in full float32
