"""End-to-end: tiny studies trained with Lightning on the CPU (d_model 32, one layer, 20-80
steps). The flat results table, a diverging sibling, --jobs 2 == --jobs 1, resume from a
checkpoint with the next batch, and a SIGKILLed sweep that loses and repeats nothing."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import HANG_GUARD_S

from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.api import run_study
from workbench.run.runner import check_study
from workbench.run.store import DB_FILE, Store, load_curves, load_results, run_dir
from workbench.study import load_study
from workbench.recipes.train.sweep import expand
from workbench.results import LAST_CHECKPOINT, RESULT_FILE, Status
from workbench.run.batches import StepBatches
from workbench.run.evaluate import evaluate_lengths
from workbench.run.recording import PeakMemory
from workbench.run.run_module import RunModule
from workbench.run.train import train_run
from workbench.model.weights import load_final_model, make_task

STUDY = """\
name: tiny-e2e
task: {name: copy, train_length: 6, eval_lengths: [6, 9], n_eval: 32, alphabet_size: 6}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope}
train: {steps: 20, batch_size: 8, lr: 3.0e-3, warmup_steps: 2, eval_every: 10, log_every: 5, checkpoint_every: 5}
seeds: [0]
sweep:
  train.lr: [3.0e-3, 1.0e+6]
"""


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared machine: one thread is fastest and keeps timings sane."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write(tmp_path: Path, text: str = STUDY, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def sweep_out(tmp_path_factory):
    """The two-run study (one sane lr, one that diverges) run once with --jobs 1."""
    tmp = tmp_path_factory.mktemp("sweep")
    torch.set_num_threads(1)
    summary = run_study(write(tmp), tmp / "out", jobs=1, quiet=True)
    return tmp, summary


def test_peak_memory_measures_the_sessions_second_training_step():
    memory = PeakMemory(on_cuda=False)
    sizes = iter([1000, 3000, 5000])  # floats allocated by three steps
    for _ in range(3):
        memory.on_train_batch_start(None, None, None, 0)
        activations = torch.empty(next(sizes))
        del activations
        memory.on_train_batch_end(None, None, None, None, 0)
    assert memory.peak_bytes() == 3000 * 4  # the second step; the third runs unmeasured
    assert memory.instrument == "train_step_live_tensor_bytes"


def session(memory: PeakMemory, steps: list[tuple[int | None, int]]) -> None:
    """Steps as RunModule takes them: (the session's steps left, floats the step allocates)."""
    for steps_left, floats in steps:
        with memory.step(steps_left):
            activations = torch.empty(floats)
            del activations


def test_peak_memory_measures_a_sessions_first_step_only_where_it_may_be_its_last():
    memory = PeakMemory(on_cuda=False)
    assert not memory.measures(3)  # the first of three: its optimizer state is not there yet
    session(memory, [(3, 7000)])
    assert memory.peak_bytes() is None  # not measured: no dispatch mode around it
    session(memory, [(2, 3000), (1, 5000)])
    assert memory.peak_bytes() == 3000 * 4  # the second step
    for steps_left in (1, None):  # one step left, or a budget that ends the run when it is spent
        memory = PeakMemory(on_cuda=False)
        session(memory, [(steps_left, 1000)])
        assert memory.peak_bytes() == 1000 * 4


def test_flat_results_table_and_a_diverging_sibling(sweep_out):
    tmp, summary = sweep_out
    out = tmp / "out"
    assert summary.statuses == {"finished": 1, "diverged": 1}
    table = load_results(out)
    assert list(table["train.lr"]) == [3.0e-3, 1.0e6]
    assert list(table["status"]) == ["finished", "diverged"]
    for column in ("run_id", "seed", "accuracy@6", "exact_match@6", "loss@6", "accuracy@9", "loss@9",
                   "n_params", "tokens_per_s", "peak_memory_bytes", "peak_memory_instrument", "wall_time_s", "cpu_time_s"):
        assert column in table.columns, column
    ok, bad = table.iloc[0], table.iloc[1]
    assert 0 <= ok["accuracy@6"] <= 1 and ok["loss@6"] > 0 and ok["tokens_per_s"] > 0
    assert ok["peak_memory_bytes"] > 0 and ok["peak_memory_instrument"] == "train_step_live_tensor_bytes"
    assert ok["steps_done"] == 20 and ok["n_params"] > 0
    assert 0 < ok["cpu_time_s"] < 50 * ok["wall_time_s"]  # this process's CPU seconds, not the machine's
    # the diverged run stopped at the step whose loss was not finite, with no final metrics
    assert 1 <= bad["diverged_step"] < 20 and bad["steps_done"] < 20 and math.isnan(bad["accuracy@6"])

    curves = load_curves(out, ok["run_id"])
    train_loss = curves[(curves.split == "train") & (curves.metric == "loss")]
    assert list(train_loss.step) == [5, 10, 15, 20]
    evals = curves[(curves.split == "eval") & (curves.metric == "accuracy@9")]
    assert list(evals.step) == [10, 20]
    assert evals.value.iloc[-1] == pytest.approx(ok["accuracy@9"])

    # the CLI prints the same table
    result = CliRunner().invoke(main, ["results", str(out), "--format", "json"])
    assert result.exit_code == 0
    rows = json.loads(result.output)
    assert [r["status"] for r in rows] == ["finished", "diverged"]
    assert CliRunner().invoke(main, ["results", str(out)]).output.splitlines()[0].startswith("run_id,index,seed,train.lr,status")


def test_final_weights_reproduce_the_recorded_metrics(sweep_out):
    tmp, _ = sweep_out
    row = load_results(tmp / "out").iloc[0]
    model, config = load_final_model(run_dir(tmp / "out", row["run_id"]))
    task = make_task(config)
    metrics, _ = evaluate_lengths(task, model, "decoder", config["train"]["eval_batch_size"], {})
    assert metrics["accuracy@9"] == pytest.approx(row["accuracy@9"], abs=1e-6)
    env = json.loads(Path(run_dir(tmp / "out", row["run_id"]), RESULT_FILE).read_text())["environment"]
    assert {"torch", "lightning", "python", "device", "workbench", "git_commit"} <= set(env)
    assert env["float32_matmul_precision"] == "highest"  # the CPU: full float32 (CUDA: train.matmul_precision)


def test_rerun_skips_every_done_run(sweep_out):
    tmp, _ = sweep_out
    again = run_study(tmp / "study.yaml", tmp / "out", quiet=True)
    assert again.skipped == 2 and not again.statuses
    assert {r["attempts"] for r in Store(tmp / "out").runs()} == {1}


def run_threads_of(out: Path) -> list[int]:
    return [record["environment"]["threads"] for record in Store(out, create=False).runs()]


def test_jobs_2_gives_the_results_of_jobs_1(sweep_out):
    tmp, _ = sweep_out
    summary = run_study(tmp / "study.yaml", tmp / "out2", jobs=2, quiet=True)
    assert summary.statuses == {"finished": 1, "diverged": 1}
    assert run_threads_of(tmp / "out2") == [1, 1]  # its worker's share is cores // 2; a tiny model takes one
    one, two = load_results(tmp / "out"), load_results(tmp / "out2")
    assert list(one.run_id) == list(two.run_id)
    assert list(one.diverged_step.fillna(-1)) == list(two.diverged_step.fillna(-1))
    for column in ("accuracy@6", "loss@6", "accuracy@9", "loss@9"):
        assert one[column].iloc[0] == pytest.approx(two[column].iloc[0], rel=1e-4, abs=1e-5), column


def test_a_run_in_this_process_trains_on_the_threads_its_model_can_use_and_gives_the_share_back(tmp_path):
    """--jobs 1 trains in the driver, whose torch threads are every core: a tiny model takes one
    thread of them (more would wait for each other), as it does in a --jobs N worker."""
    torch.set_num_threads(2)
    run_study(write(tmp_path), tmp_path / "out", jobs=1, quiet=True)
    assert run_threads_of(tmp_path / "out") == [1, 1]
    assert torch.get_num_threads() == 2  # the next run in this process has the whole share again


def test_interrupted_run_continues_from_its_checkpoint_with_the_next_batch(tmp_path, monkeypatch):
    run = expand(load_study(write(tmp_path)))[0]
    reference = train_run(run.run_id, run.config, tmp_path / "uninterrupted")

    original_step = RunModule.take_step

    def crash_at_13(self, *args):
        if self.global_step == 13:
            raise RuntimeError("simulated crash")
        return original_step(self, *args)

    monkeypatch.setattr(RunModule, "take_step", crash_at_13)
    crashed = train_run(run.run_id, run.config, tmp_path / "resumed")
    assert crashed.status == "failed" and "simulated crash" in crashed.error
    assert (tmp_path / "resumed" / LAST_CHECKPOINT).exists()
    monkeypatch.setattr(RunModule, "take_step", original_step)

    seen: list[int] = []
    original_item = StepBatches.__getitem__
    monkeypatch.setattr(StepBatches, "__getitem__", lambda self, i: seen.append(i) or original_item(self, i))
    resumed = train_run(run.run_id, run.config, tmp_path / "resumed")
    assert resumed.status == Status.FINISHED and resumed.resumed_from_step == 10
    assert seen == list(range(10, 20))  # batches continue where the checkpoint left off
    assert resumed.metrics == pytest.approx(reference.metrics, rel=1e-5)
    assert [c[:3] for c in resumed.curves] == [c[:3] for c in reference.curves]  # the whole history kept
    a, _ = load_final_model(tmp_path / "uninterrupted")
    b, _ = load_final_model(tmp_path / "resumed")
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-6), name


def recorded(out: Path) -> int:
    try:
        with sqlite3.connect(out / DB_FILE, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def test_sigkilled_sweep_loses_and_repeats_nothing(tmp_path):
    text = STUDY.replace("steps: 20", "steps: 80").replace("train.lr: [3.0e-3, 1.0e+6]", "model.position: [none, rope]")
    study, out = write(tmp_path, text), tmp_path / "out"
    first, second = expand(load_study(study))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", str(study), "--out", str(out), "--quiet",
                             "--reports", str(tmp_path / "reports")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + HANG_GUARD_S
    try:
        # kill once the first run is recorded and the second has a checkpoint (it is training)
        while not (recorded(out) == 1 and (run_dir(out, second.run_id) / LAST_CHECKPOINT).exists()):
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the sweep did not get to its second run in time"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert recorded(out) == 1, "the second run finished before the kill: make it longer"
    first_result = run_dir(out, first.run_id) / RESULT_FILE
    first_mtime = first_result.stat().st_mtime_ns

    summary = run_study(study, out, quiet=True)
    assert summary.skipped == 1 and summary.statuses == {"finished": 1}
    runs = {r["run_id"]: r for r in Store(out).runs()}
    assert set(runs) == {first.run_id, second.run_id}
    assert all(r["attempts"] == 1 and r["status"] == "finished" for r in runs.values())
    assert first_result.stat().st_mtime_ns == first_mtime  # the finished run was not retrained
    assert runs[second.run_id]["resumed_from_step"] in range(5, 80, 5)  # continued from its checkpoint
    curves = load_curves(out, second.run_id)
    loss_steps = list(curves[(curves.split == "train") & (curves.metric == "loss")].step)
    assert loss_steps == list(range(5, 81, 5))  # steps before the kill are kept, none twice


def test_a_changed_study_is_explained_and_fresh_starts_over(tmp_path):
    study = write(tmp_path)
    store = Store(tmp_path / "out")
    check_study(store, load_study(study))
    check_study(store, load_study(write(tmp_path, STUDY.replace("name: tiny-e2e", "name: tiny-e2e\ndescription: why"))))
    changed = write(tmp_path, STUDY.replace("batch_size: 8", "batch_size: 4"), "changed.yaml")
    with pytest.raises(WorkbenchError, match=r"train\.batch_size: 8 -> 4.*--fresh"):
        check_study(store, load_study(changed))
    result = CliRunner().invoke(main, ["run", str(changed), "--out", str(tmp_path / "out"), "--quiet",
                                       "--reports", str(tmp_path / "reports")])
    assert result.exit_code == 2 and "different version of study 'tiny-e2e'" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU message")
def test_mixed_precision_on_cpu_is_refused_before_training(tmp_path):
    study = write(tmp_path, STUDY.replace("checkpoint_every: 5}", "checkpoint_every: 5, precision: bf16-mixed}"))
    result = CliRunner().invoke(main, ["run", str(study), "--out", str(tmp_path / "out"),
                                       "--reports", str(tmp_path / "reports")])
    assert result.exit_code == 2
    assert "train.precision: 'bf16-mixed' runs on a GPU" in result.stderr
    assert not (tmp_path / "out" / "runs").exists()
