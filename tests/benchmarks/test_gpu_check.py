"""benchmarks/gpu_check.sh, the GPU check in one call, rehearsed on the CPU: every step writes
into the one output folder, check.json records the machine and each step's outcome, a step
over its budget is stopped and recorded as a timeout, and a failing step does not stop the
next. Only the script's wiring is checked here: tests/benchmarks/test_benchmarks_smoke.py runs every
section of `python -m benchmarks.gpu --device cpu --tiny`, so the rehearsal runs one."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check
from conftest import run_within_cpu

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


# The script's wall-clock limits (its steps' budgets, its helper calls' limit) are meant for a GPU
# lease. Here they only guard against a hang: a loaded test machine must not turn wiring into
# timeouts (240 s steps did, at a load average of 25-30). What a call may cost is its CPU budget,
# about five times what it spends on a quiet machine (21.5 s for the rehearsal, 5.4 s for the cut step).
STEP_BUDGET_S = 1000
HELPER_LIMIT_S = 600


def gpu_check_sh(*args: str, cpu_budget_s: float) -> subprocess.CompletedProcess:
    return run_within_cpu(["bash", str(SCRIPT), "--python", sys.executable, "--helper-limit", str(HELPER_LIMIT_S),
                           *args], cpu_budget_s, cwd=ROOT, text=True)


@pytest.mark.slow
def test_the_cpu_rehearsal_writes_every_steps_record_into_one_folder(tmp_path):
    # One CUDA test function (24 cases, skipped here): the other one's module imports Lightning.
    budgets = [arg for step in ("tests", "benchmark", "study") for arg in ("--budget", f"{step}={STEP_BUDGET_S}")]
    done = gpu_check_sh("--device", "cpu", "--tiny", "--no-install", "--sections", "sdpa_backend batched_seeds",
                        "--tests", "tests/model/test_flex_attention.py::test_flex_equals_dense_on_cuda",
                        "--total", str(3 * STEP_BUDGET_S + 100), *budgets, str(tmp_path), cpu_budget_s=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "check.json", "gpu.json", "gpu.log", "study.json", "study.log", "tests.log", "tests.xml"]  # <= 8: all come back
    check = json.loads((tmp_path / "check.json").read_text())
    assert (check["device"], check["torch"], check["cuda"]) == ("cpu", torch.__version__, torch.version.cuda)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:
        assert (check["commit"], check["commit_source"]) == (head.stdout.strip(), "git")
    assert check["steps"]["install"] == dict(status="skipped", rc=None, seconds=0.0, budget_s=None, log=None,
                                             note="--no-install")
    for name, log in (("tests", "tests.log"), ("benchmark", "gpu.log"), ("study", "study.log")):
        step = check["steps"][name]
        assert (step["status"], step["rc"], step["budget_s"], step["log"]) == ("passed", 0, STEP_BUDGET_S, log), step
        assert 0 < step["seconds"] <= step["budget_s"]
    tests = check["tests"]  # CUDA cases: on the CPU every one skips
    assert tests["source"] == "tests.xml" and tests["skipped"] == 24
    assert (tests["passed"], tests["failed"], tests["errors"], tests["problems"]) == (0, 0, 0, [])
    bench = check["benchmark"]
    assert (bench["device"], bench["finished"], bench["failed"], bench["not_reached"]) == (
        "cpu", ["sdpa_backend", "batched_seeds"], {}, [])
    assert any(line.startswith("PASS") and "fused SDPA kernel" in line for line in bench["checks"])
    # the batched seeds' speed-up per K (1 and 2 at --tiny), for each batch layout of the d32 model
    speed_ups = bench["batched_seeds_speed_up"]
    assert sorted(speed_ups) == ["tiny (d32, 1 layer), fixed length 12", "tiny (d32, 1 layer), padded (lengths 4-12)"]
    assert all(row["1"] == 1.0 and row["2"] > 0 for row in speed_ups.values())
    assert check["study"]["statuses"] == {"finished": 2}
    assert {run["peak_memory_instrument"] for run in check["study"]["runs"]} <= {"train_step_live_tensor_bytes"}
    assert check["passed"] is True
    assert "all steps passed: True" in done.stdout


@pytest.mark.slow
def test_a_step_over_its_budget_is_a_recorded_timeout_and_a_failed_step_does_not_stop_the_next(tmp_path):
    done = gpu_check_sh("--device", "cpu", "--tiny", "--no-install", "--steps", "tests,benchmark",
                        "--tests", "tests/no_such_test_file.py", "--budget", f"tests={STEP_BUDGET_S}", "--budget", "benchmark=1",
                        str(tmp_path), cpu_budget_s=30)
    assert done.returncode == 1, done.stdout + done.stderr
    steps = json.loads((tmp_path / "check.json").read_text())["steps"]
    assert (steps["tests"]["status"], steps["tests"]["rc"]) == ("failed", 4)  # pytest: no such file
    assert (steps["benchmark"]["status"], steps["benchmark"]["rc"], steps["benchmark"]["budget_s"]) == ("timeout", 124, 1)
    # its budget, the SIGKILL grace, and a minute for a loaded machine to deliver the signals
    assert 1 <= steps["benchmark"]["seconds"] < 1 + 5 + 60
    assert steps["study"] == dict(status="skipped", rc=None, seconds=0.0, budget_s=None, log=None, note="not in --steps")
    assert "benchmark: timeout (exit status 124)" in done.stdout


def test_bad_options_are_refused_before_anything_runs(tmp_path):
    done = gpu_check_sh("--total", "10", str(tmp_path), cpu_budget_s=10)
    assert done.returncode == 2 and "--total: 10 s leaves nothing after the 15 s kept for the results" in done.stderr
    for args, message in ((["--budget", "tests=soon"], "--budget: expected STEP=SECONDS"),
                          (["--steps", "install,train"], "--steps: unknown step 'train'"),
                          (["--device", "tpu"], "--device: expected cuda or cpu, got 'tpu'"),
                          (["--wheels", str(tmp_path / "none")], "is not a folder (benchmarks/gpu_wheels.sh makes one)")):
        done = gpu_check_sh(*args, str(tmp_path), cpu_budget_s=10)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
    assert not any(tmp_path.iterdir())


def test_the_tiny_test_selection_names_tests_that_exist():
    """--tiny names CUDA test cases by node id; a renamed test must fail here, not on the GPU."""
    ids = re.findall(r"(tests/[\w/]+\.py)::(\w+)", SCRIPT.read_text())
    assert len(ids) >= 2
    for path, name in ids:
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), flags=re.M), f"{path}::{name}"


def test_the_install_keeps_torch_and_says_when_it_was_replaced():
    before = dict(torch="2.11.0+cu130", cuda="13.0", distribution="2.11.0+cu130", location="/opt/torch")
    assert gpu_check.constraint(before) == "torch==2.11.0+cu130\n"
    assert gpu_check.torch_replaced(before, dict(before)) is None
    cpu = dict(before, torch="2.13.0+cpu", cuda=None, distribution="2.13.0+cpu")
    assert gpu_check.torch_replaced(before, cpu) == (
        "torch was replaced by the install: before torch 2.11.0+cu130 (CUDA 13.0) in /opt/torch, "
        "after torch 2.13.0+cpu (CUDA None) in /opt/torch")
    assert "after no torch record" in gpu_check.torch_replaced(before, gpu_check.read_info(Path("/nonexistent.json")))


def test_offline_the_install_takes_the_dev_extras_only_when_each_is_installed_or_carried(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(gpu_check, "pip", lambda *args: calls.append(args) or 0)
    monkeypatch.setattr(gpu_check, "dev_requirements", lambda: ["pytest>=1", "no-such-package>=1"])
    record, before = tmp_path / "install.json", dict(torch="2.11.0+cu130", distribution="2.11.0+cu130")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "pydantic-2.0-py3-none-any.whl").touch()
    assert gpu_check.install(before, wheels, record) == 0  # no-such-package: neither installed nor carried
    assert calls[-1][-3:] == ("-e", ".", str(wheels / "pydantic-2.0-py3-none-any.whl"))
    assert calls[-1][:1] == ("-c",) and calls[-1][2:5] == ("--no-index", "--find-links", str(wheels))
    written = json.loads(record.read_text())
    assert (written["mode"], written["constraint"], written["dev_missing"]) == (
        f"project and the wheels in {wheels}", "torch==2.11.0+cu130", ["no-such-package>=1"])
    (wheels / "no_such_package-1.0-py3-none-any.whl").touch()  # now carried: the dev extras resolve offline
    assert gpu_check.install(before, wheels, record) == 0
    assert len(calls) == 2 and calls[-1][-2:] == ("-e", ".[dev]")
    assert json.loads(record.read_text())["mode"] == "project with its dev extras"


def test_dev_requirements_expand_the_projects_own_extras():
    requirements = gpu_check.dev_requirements()
    assert {"ray>=2.9", "wandb>=0.16", "lion-pytorch>=0.2", "pytest>=8"} <= set(requirements)
    assert not any(r.startswith("transformer-workbench") for r in requirements)


def test_pytest_counts_come_from_the_log_when_pytest_was_stopped_before_its_xml(tmp_path):
    (tmp_path / "tests.log").write_text(
        "collecting ... collected 4 items\n\n"
        "tests/test_a.py::test_one PASSED                 [ 25%]\n"
        "[gw1] [ 50%] SKIPPED tests/test_a.py::test_two[cuda] \n"
        "tests/test_b.py::test_three FAILED               [ 75%]\n")
    counts = gpu_check.pytest_counts(tmp_path / "tests.xml", tmp_path / "tests.log")
    assert (counts["passed"], counts["skipped"], counts["failed"], counts["errors"]) == (1, 1, 1, 0)
    assert counts["source"].startswith("tests.log (no junit XML")


def test_the_record_is_written_whatever_a_stopped_step_left(tmp_path, capsys):
    """A step killed while writing its file (a truncated JSON, a half junit XML) costs that
    part of check.json, never the record itself."""
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    out.mkdir(), scratch.mkdir()
    (scratch / "torch-before.json").write_text(json.dumps(dict(torch="2.11.0+cu130", cuda="13.0", device="NVIDIA H200")))
    (scratch / "steps.tsv").write_text("tests\tpassed\t0\t12.5\t90\ttests.log\t\nbenchmark\ttimeout\t124\t270.4\t270\tgpu.log\t\n")
    (out / "gpu.json").write_text('{"device": "NVIDIA H200", "sections": ["sdpa_backend"], "sdpa_b')
    (out / "tests.xml").write_text("<testsuites><testsuite tests=")
    args = argparse.Namespace(argv="bash benchmarks/gpu_check.sh", started=0.0, total=480, device="cuda", tiny=False,
                              commit="abc1234")
    record = gpu_check.summary(out, scratch, args)
    assert json.loads((out / "check.json").read_text()) == json.loads(json.dumps(record, default=str))
    assert (record["device"], record["torch"], record["cuda"], record["commit"]) == ("NVIDIA H200", "2.11.0+cu130", "13.0", "abc1234")
    assert record["benchmark"]["error"].startswith("unreadable: JSONDecodeError")
    assert record["tests"]["error"].startswith("unreadable: ParseError")
    assert record["steps"]["benchmark"]["status"] == "timeout" and record["passed"] is False
    gpu_check.print_summary(record)
    assert "benchmark: gpu.json unreadable: JSONDecodeError" in capsys.readouterr().out
