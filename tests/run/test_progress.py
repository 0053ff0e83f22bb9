"""Live progress: each running run's step, loss and ETA in the sweep display, read from the
progress.json its worker writes."""

from __future__ import annotations

import io
import json

import torch
from rich.console import Console

from workbench.run.executor import Job
from workbench.results import PROGRESS_FILE, RunResult
from workbench.run.runner import SweepProgress
from workbench.study import load_study
from workbench.recipes.train.sweep import expand
from workbench.run.train import train_run

STUDY = """\
name: live
task: {name: copy, train_length: 4, n_eval: 8, alphabet_size: 4}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {steps: 4, batch_size: 4}
"""


def run_of(tmp_path):
    (tmp_path / "s.yaml").write_text(STUDY)
    return expand(load_study(tmp_path / "s.yaml"))[0]


def test_a_run_writes_its_step_and_loss(tmp_path):
    run = run_of(tmp_path)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train_run(run.run_id, run.config, tmp_path / "run")
    finally:
        torch.set_num_threads(before)
    state = json.loads((tmp_path / "run" / PROGRESS_FILE).read_text())
    assert state["step"] == state["steps"] == 4 and state["loss"] > 0 and state["seconds"] > 0
    assert result.status == "finished"


def test_the_display_shows_each_running_run_and_drops_it_when_done(tmp_path):
    run = run_of(tmp_path)
    out = io.StringIO()
    progress = SweepProgress("live", 1, quiet=False, console=Console(file=out, force_terminal=True, width=140),
                             poll_s=3600)  # refreshed by hand below
    try:
        progress.started(Job(run.run_id, run.config, tmp_path / "run"), run.describe)
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / PROGRESS_FILE).write_text(json.dumps({"step": 3, "steps": 4, "loss": 1.234, "seconds": 2.0}))
        progress.refresh_runs()
        row = next(t for t in progress.progress.tasks if t.id != progress.task)
        assert (row.completed, row.total, row.fields["info"]) == (3, 4, "loss 1.23")
        progress.progress.refresh()
        assert "loss 1.23" in out.getvalue() and "3/4" in out.getvalue()
        progress.run_done(run, RunResult(run.run_id, "finished", metrics={"accuracy@4": 1.0}, wall_time_s=1.0))
        assert [t.id for t in progress.progress.tasks] == [progress.task]
    finally:
        progress.close()


def test_a_run_line_leaves_out_the_metrics_the_run_did_not_measure(tmp_path):
    from workbench.results import Status
    from workbench.run.runner import run_line

    result = RunResult(run_id="r", status=Status.FINISHED, wall_time_s=1.0,
                       metrics={"bpc@64": 1.71, "bpc_tail@64": float("nan"), "distinct_2@64": float("nan")})
    line = run_line(run_of(tmp_path), result)
    assert "bpc@64=1.71" in line
    assert "nan" not in line and "bpc_tail" not in line and "distinct_2" not in line
