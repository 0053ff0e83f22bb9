"""The Ray executor on a real local cluster (loopback): same results as the local executor,
and a sweep survives a killed worker with every run recorded once (skipped without Ray);
without Ray, `--executor ray` says how to install it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from click.testing import CliRunner

from workbench.cli import main
from workbench.run.store import Store, load_results

STUDY = """\
name: ray-e2e
task: {{name: copy, train_length: 6, eval_lengths: [6], n_eval: 32, alphabet_size: 6}}
model: {{family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope}}
train: {{steps: {steps}, batch_size: 8, lr: 3.0e-3, warmup_steps: 2, eval_every: {steps}, log_every: 5,
        checkpoint_every: 5}}
seeds: {seeds}
sweep:
  model.position: [none, rope]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}


def ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


@pytest.fixture(scope="module")
def cluster():
    """A two-CPU Ray head node on 127.0.0.1, stopped at the end of the module."""
    pytest.importorskip("ray")
    port = free_port()
    subprocess.run(
        [ray_cli(), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats"],
        check=True, env=env(), capture_output=True, timeout=120,
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray_cli(), "stop", "--force"], env=env(), capture_output=True, timeout=120)


def workbench(*args: str, reports: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workbench.cli", *args, "--reports", str(reports)], env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def metrics_by_run(out: Path):
    frame = load_results(out).set_index("run_id").sort_index()
    return frame[["status", "accuracy@6", "loss@6"]]


def test_without_ray_the_executor_explains_how_to_install_it(tmp_path, monkeypatch):
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.format(steps=2, seeds=[0]))
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if not installed
    result = CliRunner().invoke(main, ["run", str(study), "--out", str(tmp_path / "out"), "--executor", "ray",
                                       "--reports", str(tmp_path / "reports")])
    assert result.exit_code == 2
    assert "pip install 'transformer-workbench[ray]'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_ray_executor_matches_local_executor(cluster, tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.format(steps=10, seeds=[0]))
    local = workbench("run", str(study), "--out", str(tmp_path / "local"), "--quiet", reports=tmp_path / "reports")
    assert local.wait(timeout=600) == 0, local.stdout.read()
    remote = workbench("run", str(study), "--out", str(tmp_path / "ray"), "--quiet",
                       "--executor", "ray", "--address", cluster, reports=tmp_path / "reports")
    assert remote.wait(timeout=600) == 0, remote.stdout.read()

    a, b = metrics_by_run(tmp_path / "local"), metrics_by_run(tmp_path / "ray")
    assert list(a.index) == list(b.index) and len(a) == 2
    assert (a["status"] == "finished").all() and (b["status"] == "finished").all()
    for column in ("accuracy@6", "loss@6"):
        assert a[column].to_numpy() == pytest.approx(b[column].to_numpy(), abs=1e-4)


def ray_task_pids() -> list[int]:
    """Worker processes currently executing a workbench run (Ray renames them after the task)."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "ray::execute_with_threads" in line]


@pytest.mark.slow
def test_sweep_survives_a_killed_worker(cluster, tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.format(steps=60, seeds=[0, 1]))
    out = tmp_path / "out"
    sweep = workbench("run", str(study), "--out", str(out), "--quiet", "--executor", "ray", "--address", cluster,
                      reports=tmp_path / "reports")
    deadline = time.monotonic() + 300
    killed = None
    while killed is None and time.monotonic() < deadline and sweep.poll() is None:
        # Wait until a run has trained far enough to checkpoint, then kill its worker.
        if any((out / "runs").glob("*/checkpoints/*.ckpt")) and (pids := ray_task_pids()):
            killed = pids[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.2)
    assert killed is not None, "no Ray worker was seen running a workbench task"
    assert sweep.wait(timeout=600) == 0, sweep.stdout.read()

    runs = Store(out, create=False).runs()
    assert len(runs) == 4 and len({r["run_id"] for r in runs}) == 4
    assert all(r["status"] == "finished" for r in runs), [(r["status"], r["error"]) for r in runs]
    assert all(r["attempts"] == 1 for r in runs)  # each recorded once: Ray retried, the driver wrote once
    assert all(r["steps_done"] == 60 for r in runs)
