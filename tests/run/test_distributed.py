"""One run on several processes: Lightning's DDP on 2 CPU processes over gloo, started from a
sweep (the path a multi-GPU run takes, with NCCL in place of gloo), its stop on a signal, and
the settings a multi-process run needs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import HANG_GUARD_S, LEAVE_S, wait_within_cpu
from test_reliability import alive, kill_group

from workbench.cost.budget import count_tokens, step_cost
from workbench.errors import WorkbenchError
from workbench.model.transformer import build_model
from workbench.results import LAST_CHECKPOINT, RESULT_FILE
from workbench.run.distributed import LOG_FILE, shard
from workbench.run.folder import WriterLock
from workbench.run.store import Store, run_dir
from workbench.study import load_study
from workbench.recipes.train.sweep import expand
from workbench.model.weights import make_task

STUDY = """\
name: ddp-e2e
task: {name: copy, train_length: 6, eval_lengths: [6], n_eval: 32, alphabet_size: 6}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope}
train: {steps: 12, batch_size: 8, lr: 3.0e-3, eval_every: 6, log_every: 3, checkpoint_every: 3,
        accelerator: cpu, devices: 2, strategy: ddp}
seeds: [0]
"""


def write(tmp_path: Path, text: str = STUDY) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def workbench_run(study: Path, out: Path, tmp_path: Path, **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", str(study), "--out", str(out), "--quiet",
                             "--jobs", "1", "--reports", str(tmp_path / "reports")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **popen)


def processes_of(folder: Path) -> list[int]:
    """Live processes whose command line names `folder` (the run's ranks)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(folder) in cmdline.read_bytes().decode(errors="replace") and alive(int(cmdline.parent.name)):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize("micro", ["", ", grad_accumulation: 2"])  # micro-batches: all-reduce at the last only
def test_a_ddp_run_on_two_cpu_processes_finishes_and_leaves_the_folder_free(tmp_path, micro):
    """`train: {accelerator: cpu, devices: 2, strategy: ddp}`: Lightning starts rank 1 by running
    a command again; that command is the run's own (not the sweep's), so no rank meets the
    folder's writer lock, rank 0 alone records, and both ranks trained the run's steps (3 a call
    of the training step, with and without micro-batches)."""
    study, out = write(tmp_path, STUDY.replace("strategy: ddp}", f"strategy: ddp{micro}}}")), tmp_path / "out"
    proc = workbench_run(study, out, tmp_path)
    err = wait_within_cpu(proc, 300).stderr
    assert proc.returncode == 0, err.decode()[-2000:]
    [run] = expand(load_study(study))
    assert Store(out, create=False).statuses() == {run.run_id: "finished"}
    folder = run_dir(out, run.run_id)
    result = json.loads((folder / RESULT_FILE).read_text())
    assert result["steps_done"] == 12 and result["metrics"]["accuracy@6"] > 0
    task = make_task(run.config)  # every rank's share of each step counted once: the whole batches
    assert result["tokens"] == sum(count_tokens(task.train_batch(i, 8, "decoder")) for i in range(12))
    model = build_model(run.config["model"])  # FLOPs too: a rank's share times the 2 processes
    cost = step_cost(model, lambda b: task.loss(model, b, "decoder"), task.train_batch(0, 8, "decoder"))
    assert result["train_flops"] == 12 * cost.flops
    assert result["environment"]["processes"] == 2, (folder / LOG_FILE).read_text()[-2000:]
    assert result["environment"]["steps_per_call"] == 3
    with WriterLock(out):  # nobody holds the folder any more
        pass


def test_a_stop_reaches_every_rank_which_checkpoint_and_leave(tmp_path):
    """SIGTERM to the driver: the run's process group gets it, the ranks agree on a step,
    checkpoint it and end; the sweep exits 130 with nothing recorded and no process left."""
    study, out = write(tmp_path, STUDY.replace("steps: 12", "steps: 5000").replace("eval_every: 6", "eval_every: 2500")), tmp_path / "out"
    [run] = expand(load_study(study))
    proc = workbench_run(study, out, tmp_path)
    checkpoint = run_dir(out, run.run_id) / LAST_CHECKPOINT
    deadline = time.monotonic() + HANG_GUARD_S
    while not checkpoint.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_group(proc)
            pytest.fail(f"the run did not start training: {proc.communicate()}")
        time.sleep(0.1)
    assert len(processes_of(run_dir(out, run.run_id))) == 2  # rank 0 and rank 1
    try:
        proc.send_signal(signal.SIGTERM)
        err = wait_within_cpu(proc, 300).stderr
    finally:
        kill_group(proc)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "Traceback" not in err.decode()
    assert Store(out, create=False).statuses() == {}
    assert torch.load(checkpoint, weights_only=True)["global_step"] > 0
    assert not (run_dir(out, run.run_id) / RESULT_FILE).exists()
    deadline = time.monotonic() + LEAVE_S
    while processes_of(run_dir(out, run.run_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_of(run_dir(out, run.run_id))


def test_ranks_share_each_batch_exactly():
    batch = {"tokens": torch.arange(24).view(8, 3), "padding_mask": torch.ones(8, 3, dtype=torch.bool)}
    parts = [shard(batch, rank, 2) for rank in range(2)]
    assert all(p["tokens"].shape == (4, 3) for p in parts)
    assert torch.equal(torch.cat([p["tokens"] for p in parts]), batch["tokens"])


@pytest.mark.parametrize("change, message", [
    ("batch_size: 8", None),
    ("batch_size: 9", r"train\.batch_size: 9 sequences cannot be shared equally by the 2 processes"),
    ("strategy: ddp_spawn", r"train\.strategy: 'ddp_spawn' trains rank 0 in a process started by multiprocessing"),
])
def test_multi_process_settings_are_checked(tmp_path, change, message):
    key = change.split(":")[0]
    text = STUDY.replace("batch_size: 8" if key == "batch_size" else "strategy: ddp", change)
    if message is None:
        load_study(write(tmp_path, text))
        return
    with pytest.raises(WorkbenchError, match=message):
        load_study(write(tmp_path, text))


# ---- the process count is part of a run's identity (issue 47) --------------------------------


def test_the_process_count_is_part_of_a_runs_identity_and_one_process_keeps_its_id(tmp_path):
    """Each rank averages the loss of its share of a batch: 2 processes compute other numbers than
    one, so they are other runs (and another version of the study); one process, however it is
    spelled, keeps the id a study without these settings always had."""
    def identity(text: str) -> tuple[str, str]:
        study_file = load_study(write(tmp_path, text))
        return expand(study_file)[0].run_id, study_file.study_hash

    plain = identity(STUDY.replace(", devices: 2, strategy: ddp", ""))
    assert identity(STUDY.replace("devices: 2", "devices: 1")) == plain
    two_devices, two_nodes = identity(STUDY), identity(STUDY.replace("devices: 2", "devices: 1, num_nodes: 2"))
    assert len({plain[0], two_devices[0]}) == 2 and len({plain[1], two_devices[1]}) == 2
    assert two_nodes == two_devices  # 2 processes either way: the same batches, shared and averaged alike


def test_a_rerun_on_two_processes_into_one_process_results_says_why_it_reuses_none(tmp_path):
    from click.testing import CliRunner

    from workbench.cli import main
    from workbench.api import run_study

    study, out = write(tmp_path, STUDY.replace("devices: 2", "devices: 1")), tmp_path / "out"
    assert run_study(study, out, quiet=True).statuses == {"finished": 1}
    result = CliRunner().invoke(main, ["run", str(study), "--out", str(out), "--quiet", "--set", "train.devices=2"])
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert "(changed: train.processes: 1 -> 2; " in result.output
    assert "are not reused: runs over several processes (train.devices x train.num_nodes) average" in result.output
    assert len(Store(out, create=False).runs()) == 1  # the one-process result is kept
