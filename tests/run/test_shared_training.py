"""Train once, evaluate many: runs that differ only in how they evaluate (the decoding study's
strategies, a task's evaluation_params) train one model per seed, and each gets the result it
would have got trained alone, bit for bit; run ids stay those of the runs."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.api import run_study
from workbench.recipes.train.sweep import expand, training_groups
from workbench.results import RESULT_FILE, RunResult
from workbench.run import train as train_module
from workbench.run.store import Store, run_dir
from workbench.run.train import train_run
from workbench.study import load_study

DECODING = """\
name: tiny-decoding
task: {name: text_lm, train_length: 24, n_eval: 8, decode_samples: 4, decode_tokens: 8}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2, position: rope}
train: {steps: 8, batch_size: 4, lr: 3.0e-3, warmup_steps: 2, eval_every: 4, log_every: 2}
seeds: [0, 1]
sweep:
  zip:
    - {task.decode_strategy: [greedy, sample, sample], task.temperature: [1.0, 0.8, 1.0], task.top_p: [null, null, 0.9]}
"""


def without_seconds(result: dict) -> dict:
    """A result's numbers, without what the clock and the training's company decide."""
    skip = {"wall_time_s", "cpu_time_s", "train_time_s", "eval_time_s", "tokens_per_s", "environment"}
    out = {k: v for k, v in result.items() if k not in skip}
    out["curves"] = [c for c in result["curves"] if c[2] != "seconds"]
    return out


def test_decoding_strategies_train_one_model_per_seed_each_with_its_own_result(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    study = tmp_path / "study.yaml"
    study.write_text(DECODING)
    runs = expand(load_study(study))
    assert [len(group) for group in training_groups(runs)] == [3, 3]  # a group per seed
    assert {run.seed for run in training_groups(runs)[0]} == {0}
    trainings = []
    original = train_module.train_here
    monkeypatch.setattr(train_module, "train_here", lambda *a, **kw: trainings.append(a[0]) or original(*a, **kw))
    summary = run_study(study, tmp_path / "out", quiet=True)
    assert summary.statuses == {"finished": 6} and len(trainings) == 2  # 6 runs, 2 trainings

    out = tmp_path / "out"
    stored = {r["run_id"]: r for r in Store(out, create=False).runs()}
    assert sorted(stored) == sorted(run.run_id for run in runs)  # every run recorded under its own id
    for run in runs:
        shared = json.loads((run_dir(out, run.run_id) / RESULT_FILE).read_text())
        assert len(shared["environment"]["trained_with"]) == 2
        alone = train_run(run.run_id, run.config, tmp_path / "alone" / run.run_id)
        assert without_seconds(shared) == without_seconds(json.loads(json.dumps(RunResult.to_json(alone))))
    greedy, warm, top_p = (stored[run.run_id]["metrics"] for run in runs if run.seed == 0)
    assert greedy["bpc@24"] == warm["bpc@24"] == top_p["bpc@24"]  # one model ...
    assert greedy["distinct_2@24"] != warm["distinct_2@24"]  # ... decoded its own way for each run
    # the training's CPU is shared between its runs, so the study's total is what it cost
    assert all(r["cpu_time_s"] > 0 for r in stored.values())


def test_runs_that_train_differently_or_stop_on_their_own_evaluations_train_alone(tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text(DECODING.replace("seeds: [0, 1]", "seeds: [0]").replace(
        "log_every: 2}", "log_every: 2, early_stopping: {metric: bpc@24, patience: 1}}"))
    assert [len(group) for group in training_groups(expand(load_study(study)))] == [1, 1, 1]
    other = tmp_path / "other.yaml"  # a sweep over what the model trains on: one training per run
    other.write_text(DECODING.replace("seeds: [0, 1]", "seeds: [0]").replace(
        "zip:\n    - {task.decode_strategy: [greedy, sample, sample], task.temperature: [1.0, 0.8, 1.0], "
        "task.top_p: [null, null, 0.9]}", "train.lr: [1.0e-3, 3.0e-3]"))
    assert [len(group) for group in training_groups(expand(load_study(other)))] == [1, 1]


def test_a_shared_training_cut_short_resumes_with_every_runs_evaluations(tmp_path, monkeypatch):
    from workbench.run.executor import Job
    from workbench.run.run_module import RunModule
    from workbench.run.train import train_together

    torch.set_num_threads(1)
    study = tmp_path / "study.yaml"
    study.write_text(DECODING.replace("seeds: [0, 1]", "seeds: [0]").replace("steps: 8", "steps: 12"))
    first, *rest = expand(load_study(study))

    def job(folder: Path) -> Job:
        return Job(first.run_id, first.config, folder / first.run_id,
                   together=tuple(Job(r.run_id, r.config, folder / r.run_id) for r in rest))

    reference = train_together(job(tmp_path / "uninterrupted"))
    original = RunModule.take_step

    def crash_at_9(self, *args):
        if self.global_step == 9:
            raise RuntimeError("simulated crash")
        return original(self, *args)

    monkeypatch.setattr(RunModule, "take_step", crash_at_9)
    crashed = train_together(job(tmp_path / "resumed"))
    assert [r.status for r in crashed] == ["failed"] * 3
    monkeypatch.setattr(RunModule, "take_step", original)
    resumed = train_together(job(tmp_path / "resumed"))
    assert [r.resumed_from_step for r in resumed] == [8, 8, 8]  # the checkpoint of step 8 (eval_every 4)
    for a, b in zip(reference, resumed):
        assert without_seconds(json.loads(json.dumps(a.to_json()))) == without_seconds(
            {**json.loads(json.dumps(b.to_json())), "resumed_from_step": None})


def test_the_decoding_study_trains_one_model_per_seed():
    study = Path(__file__).resolve().parents[2] / "studies" / "decoding.yaml"
    runs = expand(load_study(study))
    groups = training_groups(runs)
    assert len(runs) == 9 and [len(g) for g in groups] == [3, 3, 3]
    assert [sorted({run.seed for run in g}) for g in groups] == [[0], [1], [2]]
