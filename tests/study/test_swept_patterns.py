"""A per-layer pattern is a value a sweep may compare (the 2026 table's nope-interleave study:
RoPE in every layer against RoPE with every fourth layer NoPE): it validates, expands to its own
sweep point and run ids, trains, and an `expect:` entry may name it."""

from __future__ import annotations

import pytest

from workbench.errors import WorkbenchError
from workbench.recipes.train.sweep import expand
from workbench.run.train import train_run
from workbench.study import load_study

STUDY = """\
name: swept-pattern
task: {name: copy, train_length: 8, n_eval: 16, alphabet_size: 8}
model: {family: decoder, d_model: 16, n_layers: 4, n_heads: 2, position: rope}
train: {steps: 6, batch_size: 8, log_every: 3, eval_every: 6}
seeds: [0]
sweep: {model.position: [rope, {repeat: [rope, rope, rope, none]}]}
baseline: rope
expect:
  - {metric: accuracy@8, better: {repeat: [rope, rope, rope, none]}, than: rope}
"""


def test_a_swept_pattern_is_a_sweep_point_of_its_own_and_trains(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(STUDY)
    runs = expand(load_study(path))
    assert len({r.run_id for r in runs}) == 2
    patterned = next(r for r in runs if "repeat" in r.config["model"]["position"])
    assert [p["name"] for p in patterned.config["model"]["position"]["repeat"]] == ["rope", "rope", "rope", "none"]
    result = train_run(patterned.run_id, patterned.config, tmp_path / "run")
    assert result.status == "finished", result.error


def test_a_misspelt_variant_inside_a_swept_pattern_names_the_sweep_line(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(STUDY.replace("rope, rope, none]}]", "rope, nope]}]"))
    with pytest.raises(WorkbenchError, match=r"sweep\.model\.position.*nope"):
        load_study(path)
