"""benchmarks/study.py's plain loop is the workbench's training without Lightning: trained on the
same runs it gives every curve and final metric bit for bit, so the study / plain CPU ratio
compares the same arithmetic (and a change to either side that changes a number fails here)."""

from __future__ import annotations

import math

import torch

from benchmarks.study import metric_difference, plain_study
from workbench.api import run_study
from workbench.run.store import Store, load_curves

STUDY = """\
name: tiny-plain
task: {name: reverse, train_length: 6, min_length: 2, eval_lengths: [6, 8], n_eval: 16, alphabet_size: 6}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2, position: rope, ffn: gelu}
train: {steps: 12, batch_size: 8, lr: 3.0e-3, warmup_steps: 2, eval_every: 5, log_every: 4}
seeds: [0, 1]
sweep:
  model.position: [none, alibi]
"""


def test_the_plain_loop_trains_the_studys_runs_to_the_same_numbers_bit_for_bit(tmp_path):
    torch.set_num_threads(1)
    study = tmp_path / "study.yaml"
    study.write_text(STUDY)
    run_study(study, tmp_path / "out", quiet=True)
    stored = {r["run_id"]: r for r in Store(tmp_path / "out", create=False).runs()}
    plain = plain_study(study)
    assert sorted(plain) == sorted(stored)
    curves = load_curves(tmp_path / "out")
    for run_id, run in stored.items():
        assert plain[run_id]["metrics"] == run["metrics"]
        mine = {(step, split, metric): value for step, split, metric, value in plain[run_id]["curves"]}
        theirs = {(r.step, r.split, r.metric): r.value for r in curves[curves.run_id == run_id].itertuples()
                  if r.split in ("train", "eval")}
        assert mine == theirs and len(mine) == 3 * 2 + 3 * len(run["metrics"])  # loss, lr at 4, 8, 12; evaluations at 5, 10, 12
    study_metrics = {run_id: run["metrics"] for run_id, run in stored.items()}
    plain_metrics = {run_id: run["metrics"] for run_id, run in plain.items()}
    compared = sum(len(metrics) for metrics in study_metrics.values())
    assert metric_difference(study_metrics, plain_metrics) == {"compared": compared, "equal": True, "largest_difference": 0.0}


def test_a_difference_in_one_metric_is_found_and_measured():
    study = {"a": {"loss@6": 1.0, "accuracy@6": math.nan}}
    assert metric_difference(study, {"a": {"loss@6": 1.0, "accuracy@6": math.nan}})["equal"]
    off = metric_difference(study, {"a": {"loss@6": 1.25, "accuracy@6": math.nan}})
    assert not off["equal"] and off["largest_difference"] == 0.25
    assert not metric_difference(study, {})["equal"]  # nothing compared is not "equal"
