"""Reliability and security (issue 17): nothing in a run folder executes code, one writer per
output folder, exact resume, signals, bounded validation, damaged folders. Each case asserts
the one-line message and that nothing finished was lost."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from workbench import stopping
from workbench.errors import WorkbenchError
from workbench.runner import run_study
from workbench.store import DB_FILE, Store, load_results, run_dir
from workbench.study import load_study
from workbench.sweep import expand
from workbench.train import FINISHED, LAST_CHECKPOINT, RESULT_FILE, RunModule, StepBatches
from workbench.train import load_final_model, train_run

STUDY = """\
name: tiny-reliability
task: {name: copy, train_length: 6, eval_lengths: [6], n_eval: 32, alphabet_size: 6}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope, dropout: 0.1}
train: {steps: 20, batch_size: 8, lr: 3.0e-3, warmup_steps: 2, eval_every: 10, log_every: 5, checkpoint_every: 5}
seeds: [0]
sweep:
  model.position: [none, rope]
"""


@pytest.fixture(autouse=True)
def one_thread_and_no_stop():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    stopping.reset()
    yield
    stopping.reset()
    torch.set_num_threads(before)


def write(tmp_path: Path, text: str = STUDY, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- exact resume, and a stop request in the middle of a run ---------------------------------


@pytest.mark.parametrize("stop_at", [3, 13])  # below and above half the budget
def test_a_run_stopped_at_any_step_resumes_exactly(tmp_path, monkeypatch, stop_at):
    run = expand(load_study(write(tmp_path)))[0]
    reference = train_run(run.run_id, run.config, tmp_path / "uninterrupted")

    original_step = RunModule.training_step

    def stop_during(self, batch, batch_idx):
        if self.global_step == stop_at - 1:  # a signal arrives while step `stop_at` runs
            stopping.request_stop("SIGTERM")
        return original_step(self, batch, batch_idx)

    monkeypatch.setattr(RunModule, "training_step", stop_during)
    with pytest.raises(stopping.RunInterrupted, match=f"stopped at step {stop_at}"):
        train_run(run.run_id, run.config, tmp_path / "resumed")
    assert not (tmp_path / "resumed" / RESULT_FILE).exists()  # nothing recorded for a stopped run
    monkeypatch.setattr(RunModule, "training_step", original_step)
    stopping.reset()

    seen: list[int] = []
    original_item = StepBatches.__getitem__
    monkeypatch.setattr(StepBatches, "__getitem__", lambda self, i: seen.append(i) or original_item(self, i))
    resumed = train_run(run.run_id, run.config, tmp_path / "resumed")
    assert resumed.status == FINISHED and resumed.resumed_from_step == stop_at
    assert seen == list(range(stop_at, 20))  # each batch once, in order
    assert resumed.metrics == reference.metrics  # exact on the CPU (dropout included)
    assert resumed.curves == reference.curves
    a, _ = load_final_model(tmp_path / "uninterrupted")
    b, _ = load_final_model(tmp_path / "resumed")
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
