"""The Ray executor on a real local cluster of two nodes on one host (loopback): same results as
the local executor, a sweep survives a killed worker with every run recorded once, a run over
both nodes trains on both (gloo) and a run over more nodes than the cluster has is refused at
once; connecting names the cause (nothing at the address, a token the cluster requires, another
Ray version) against a real head node. Skipped without Ray; without it, `--executor ray` says
how to install it."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from click.testing import CliRunner
from conftest import HANG_GUARD_S, run_within_cpu, wait_within_cpu

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
    """Two Ray nodes of one CPU each on this host (ray.cluster_utils: a head and a worker node,
    each its own raylet), stopped at the end of the module; only its own processes are stopped,
    so clusters of other test processes live on."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        nodes.add_node(num_cpus=1)
        nodes.wait_for_nodes()
        yield nodes.address
    finally:
        nodes.shutdown()


@pytest.fixture(scope="module")
def token_head(tmp_path_factory):
    """A head node started as the README says (`ray start --head`) that requires Ray's token
    authentication: (address, its token). Killed with its process group at the end."""
    pytest.importorskip("ray")
    token, port = secrets.token_hex(32), free_port()
    home = tmp_path_factory.mktemp("head-home")
    log = home / "ray-start.log"
    with open(log, "w") as out:
        head = subprocess.Popen(
            [ray_cli(), "start", "--head", "--block", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
             "--disable-usage-stats"], env={**env(), "HOME": str(home), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while "will now block" not in log.read_text():  # `ray start --block` prints it once the node is up
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", token
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()


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
    done = wait_within_cpu(local, 600)
    assert done.returncode == 0, done.stdout
    remote = workbench("run", str(study), "--out", str(tmp_path / "ray"), "--quiet",
                       "--executor", "ray", "--address", cluster, reports=tmp_path / "reports")
    done = wait_within_cpu(remote, 600)
    assert done.returncode == 0, done.stdout

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
    deadline = time.monotonic() + HANG_GUARD_S
    killed = None
    while killed is None and time.monotonic() < deadline and sweep.poll() is None:
        # Wait until a run has trained far enough to checkpoint, then kill its worker.
        if any((out / "runs").glob("*/checkpoints/*.ckpt")) and (pids := ray_task_pids()):
            killed = pids[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.2)
    assert killed is not None, "no Ray worker was seen running a workbench task"
    done = wait_within_cpu(sweep, 600)
    assert done.returncode == 0, done.stdout

    runs = Store(out, create=False).runs()
    assert len(runs) == 4 and len({r["run_id"] for r in runs}) == 4
    assert all(r["status"] == "finished" for r in runs), [(r["status"], r["error"]) for r in runs]
    assert all(r["attempts"] == 1 for r in runs)  # each recorded once: Ray retried, the driver wrote once
    assert all(r["steps_done"] == 60 for r in runs)


NODES_STUDY = """\
name: nodes-e2e
task: {name: copy, train_length: 6, eval_lengths: [6], n_eval: 32, alphabet_size: 6}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope}
train: {steps: 12, batch_size: 8, lr: 3.0e-3, eval_every: 6, log_every: 3, checkpoint_every: 3,
        accelerator: cpu, devices: 1, num_nodes: 2, strategy: ddp}
seeds: [0]
"""


@pytest.mark.slow
def test_a_run_over_two_nodes_trains_on_both_and_node_zero_records_it(cluster, tmp_path):
    """`train.num_nodes: 2` on a two-node cluster: one bundle per node, a rank on each (gloo);
    the run finishes with both processes in one process group, recorded once by node 0."""
    study, out = tmp_path / "study.yaml", tmp_path / "out"
    study.write_text(NODES_STUDY)
    proc = workbench("run", str(study), "--out", str(out), "--quiet", "--executor", "ray", "--address", cluster,
                     reports=tmp_path / "reports")
    output = wait_within_cpu(proc, 600).stdout
    assert proc.returncode == 0, output[-3000:]
    [run] = Store(out, create=False).runs()
    folder = out / "runs" / run["run_id"]
    result = json.loads((folder / "result.json").read_text())
    assert result["status"] == "finished" and result["steps_done"] == 12, result.get("error")
    assert result["environment"]["processes"] == 2
    assert (folder / "distributed-node1.log").exists()  # node 1's ranks ran, and wrote only their log
    assert result["metrics"]["accuracy@6"] > 0


@pytest.mark.slow
def test_a_two_node_rerun_into_a_folder_of_one_node_results_reuses_none_and_says_why(cluster, tmp_path):
    """The same study on 1 node, then on 2 into that folder: "2 finished; 0 already done" with
    the one-node numbers kept as the two-node ones (issue 47). The process count is part of the
    runs' identity and the study's, so the rerun is one line naming it and why, and keeps them."""
    study, out = tmp_path / "study.yaml", tmp_path / "out"
    study.write_text(NODES_STUDY)
    # one process needs no process group (strategy auto): no port to collide with another test's
    one = workbench("run", str(study), "--out", str(out), "--quiet", "--executor", "ray", "--address", cluster,
                    "--set", "train.num_nodes=1", "--set", "train.strategy=auto", reports=tmp_path / "reports")
    done = wait_within_cpu(one, 600)
    assert done.returncode == 0, done.stdout
    [before] = Store(out, create=False).runs()
    two = workbench("run", str(study), "--out", str(out), "--quiet", "--executor", "ray", "--address", cluster,
                    reports=tmp_path / "reports")
    output = wait_within_cpu(two, 600).stdout
    assert two.returncode == 2, output
    [line] = [text for text in output.splitlines() if text.startswith("error: ")]
    assert "(changed: train.processes: 1 -> 2; " in line and "are not reused: runs over several processes" in line
    [after] = Store(out, create=False).runs()
    assert after["run_id"] == before["run_id"] and after["config"]["train"]["num_nodes"] == 1


@pytest.mark.slow
def test_a_run_over_more_nodes_than_the_cluster_has_is_refused_at_once(cluster, tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text(NODES_STUDY)
    proc = workbench("run", str(study), "--out", str(tmp_path / "out"), "--executor", "ray", "--address", cluster,
                     "--set", "train.num_nodes=3", "--set", "train.batch_size=9", reports=tmp_path / "reports")
    output = wait_within_cpu(proc, 300).stdout
    assert proc.returncode == 2, output
    assert "train.num_nodes: 3 nodes, each with 1 CPU(s) and 0 GPU(s)" in output and "has 2 such node(s)" in output
    assert "Traceback" not in output
    # refused when planning: no run started, so none waited for a rendezvous of nodes that cannot come
    assert not list((tmp_path / "out").glob("runs/*"))


def test_a_run_over_nodes_without_a_named_cluster_is_refused_at_once(tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text(NODES_STUDY)
    result = CliRunner().invoke(main, ["run", str(study), "--out", str(tmp_path / "out"), "--reports",
                                       str(tmp_path / "reports")])
    assert result.exit_code == 2
    assert "train.num_nodes: 2 spreads each run over 2 machines" in result.output
    assert "--executor ray --address HOST:PORT" in result.output


def test_a_node_that_cannot_see_the_run_folder_fails_at_once(tmp_path):
    """On a cluster whose nodes do not share the run folder, node 1 would train from its own
    (empty) copy; it fails before training and says to share the folder."""
    pytest.importorskip("ray")
    from workbench.run.executor import Job
    from workbench.run.executor_ray import RENDEZVOUS_FILE, train_node

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / RENDEZVOUS_FILE).write_text(json.dumps({"address": "10.0.0.9", "port": 4000}))  # an earlier launch's
    result = train_node(Job("r1", {}, folder), 1, 1, ("10.0.0.7", 5000))
    assert result.status == "failed"
    assert result.error.startswith("train.num_nodes: node 1") and "--runs-dir" in result.error


def test_nothing_at_the_address_is_named_within_seconds(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.format(steps=2, seeds=[0]))
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    connected = []  # ray.init would retry for minutes: the probe must answer before it is called
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: connected.append(args) or pytest.fail("ray.init called"))
    result = CliRunner().invoke(main, ["run", str(study), "--out", str(tmp_path / "out"), "--executor", "ray",
                                       "--address", address, "--reports", str(tmp_path / "reports")])
    assert result.exit_code == 2
    assert f"--address: nothing answers at {address} (Connection refused)" in result.output
    assert not connected


def connect(address: str, tmp_path: Path, ray_version: str | None = None, **environ: str) -> tuple[int, str]:
    """`workbench run --executor ray --address ADDRESS` in a fresh process with this environment
    (HOME a fresh folder: no token file), as Ray `ray_version` when given; its exit code and output."""
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.format(steps=2, seeds=[0]))
    patch = f"import ray; ray.__version__ = {ray_version!r}; " if ray_version else ""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    clean = {k: v for k, v in env().items() if not k.startswith("RAY_AUTH")}
    proc = run_within_cpu(
        [sys.executable, "-c", f"{patch}from workbench.cli import main; main()", "run", str(study), "--out",
         str(tmp_path / "out"), "--executor", "ray", "--address", address, "--reports", str(tmp_path / "reports")],
        300, env={**clean, "HOME": str(home), **environ}, text=True)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_cluster_that_requires_a_token_says_so_and_how_to_give_it(token_head, tmp_path):
    address, _ = token_head
    code, output = connect(address, tmp_path)
    assert code == 2, output[-3000:]
    assert "requires Ray's token authentication" in output
    assert "this process has no token: run `ray get-auth-token` on the head" in output
    assert "cannot reach" not in output and "Traceback" not in output


@pytest.mark.slow
def test_another_ray_version_than_the_clusters_is_named_with_both_versions(token_head, tmp_path):
    import ray

    address, token = token_head
    code, output = connect(address, tmp_path, ray_version="2.0.0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    assert code == 2, output[-3000:]
    python = ".".join(map(str, sys.version_info[:3]))
    assert (f"runs Ray {ray.__version__} on Python {python}, this environment Ray 2.0.0 on Python {python}"
            in output), output[-3000:]
    assert f"install ray=={ray.__version__}" in output and "Traceback" not in output


@pytest.mark.parametrize("environ, token_file, advice", [
    ({}, False, "this process has no token"),
    ({}, True, "export RAY_AUTH_MODE=token"),  # what `ray start --head` after a private cluster leads to
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "x"}, False, "the token here is not the cluster's"),
])
def test_the_token_advice_fits_what_this_process_has(tmp_path, monkeypatch, environ, token_file, advice):
    pytest.importorskip("ray")
    from workbench.run.executor_ray import auth_fix

    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", str(tmp_path))
    if token_file:
        (tmp_path / ".ray").mkdir()
        (tmp_path / ".ray" / "auth_token").write_text("t" * 64)
    assert advice in auth_fix()
