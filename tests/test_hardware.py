"""Hardware needs are not study mistakes: `validate` checks a study fully and lists what this
machine lacks as notes (exit 0); `validate --device` checks against a named machine; `run`
refuses what this machine lacks before touching the output folder, in one line, naming the
option that set it. Every shipped study validates with each of its profiles (the guard that
keeps GPU profiles runnable), here and as on a CUDA machine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from conftest import run_within_cpu

from workbench.cli import main
from workbench.hardware import FLOPS_PER_THREAD, Machine, run_threads, scaling_needs, train_needs
from workbench.study import load_study

STUDIES = Path(__file__).resolve().parent.parent / "studies"
SHIPPED = sorted(STUDIES.glob("*.yaml"))
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a CPU-only machine says")

STUDY = """\
name: t
task: {name: copy, train_length: 8, n_eval: 16, alphabet_size: 8}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2}
train: {steps: 20, batch_size: 8}
seeds: [0]
profiles:
  gpu: {train.precision: bf16-mixed, train.batch_size: 64}
"""
TRAIN = {"accelerator": "auto", "precision": "32", "devices": 1}
CPU, CUDA = Machine.target("cpu"), Machine.target("cuda")


def write(tmp_path: Path, text: str = STUDY) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def profiles_of(path: Path) -> list[str]:
    return sorted((yaml.safe_load(path.read_text()) or {}).get("profiles") or {})


def test_studies_ship():
    assert SHIPPED, "no study ships in studies/"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_study_validates_here_with_and_without_each_profile(path):
    """Each study declares a gpu profile; it and every other profile validate on this machine
    (exit 0, whatever hardware notes remain) and as on the CUDA machine they are meant for."""
    profiles = profiles_of(path)
    assert "gpu" in profiles, f"{path.name} has no gpu profile (profiles: {profiles})"
    for options in ([], *(["--profile", p] for p in profiles)):
        result = invoke("validate", path, *options)
        assert result.exit_code == 0, (options, result.output)
        assert result.stdout.startswith(f"ok: {path}"), result.stdout
    result = invoke("validate", path, "--profile", "gpu", "--device", "cuda")
    assert result.exit_code == 0 and "note:" not in result.stderr, result.output


# ---- validate: notes, not errors ---------------------------------------------------------------


@cpu_only
def test_validate_notes_a_gpu_setting_on_a_cpu_machine_and_exits_0(tmp_path):
    result = invoke("validate", write(tmp_path), "--profile", "gpu")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok: ") and "note:" not in result.stdout
    assert result.stderr == ("note: needs a GPU: train.precision 'bf16-mixed' (this machine: CPU only); "
                             "`workbench run` here would refuse\n")


def test_validate_still_fails_for_a_real_mistake_next_to_a_hardware_need(tmp_path):
    result = invoke("validate", write(tmp_path, STUDY.replace("n_heads: 2", "n_heads: 3")), "--profile", "gpu")
    assert result.exit_code == 2 and "model" in result.stderr and "note:" not in result.output


def test_validate_against_a_named_device_makes_its_needs_errors(tmp_path):
    path = write(tmp_path)
    on_gpu = invoke("validate", path, "--profile", "gpu", "--device", "cuda")
    assert on_gpu.exit_code == 0 and on_gpu.stderr == "", on_gpu.output
    on_cpu = invoke("validate", path, "--profile", "gpu", "--device", "cpu")
    assert on_cpu.exit_code == 2
    assert on_cpu.stderr.startswith("error: train.precision: 'bf16-mixed' runs on a GPU; a --device cpu machine "
                                    "trains on the CPU"), on_cpu.stderr
    assert invoke("validate", path, "--device", "cpu").exit_code == 0  # without the profile: '32'


@cpu_only
def test_a_scaling_study_on_cuda_is_a_note_for_validate_and_refused_by_run(tmp_path):
    path = write(tmp_path, "name: s\nkind: scaling\nmodel: {d_model: 32, n_heads: 2, n_layers: 1}\n"
                           "scaling: {lengths: [16], device: cuda}\n")
    result = invoke("validate", path)
    assert result.exit_code == 0 and "note: needs a CUDA GPU: scaling.device 'cuda'" in result.stderr, result.output
    ran = invoke("run", path, "--out", tmp_path / "out", "--reports", tmp_path / "reports")
    assert ran.exit_code == 2 and "Traceback" not in ran.output
    assert ran.stderr.startswith("error: scaling.device: 'cuda' measures on a CUDA GPU"), ran.stderr


# ---- run: refuses, with advice that fits where the setting came from ---------------------------


@cpu_only
def test_run_refuses_a_gpu_profile_on_the_cpu_in_one_line_without_a_traceback(tmp_path):
    """The installed command, not the test runner; the advice names the profile, it does not
    suggest the flag that was given; nothing is written to the output folder."""
    proc = run_within_cpu([sys.executable, "-m", "workbench.cli", "run", str(write(tmp_path)), "--profile", "gpu",
                           "--out", str(tmp_path / "out"), "--reports", str(tmp_path / "reports")],
                          300, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr == ("error: train.precision: 'bf16-mixed' runs on a GPU; this machine trains on the CPU, "
                           "where only '32' is supported (it comes from --profile gpu, for a machine with a GPU: "
                           "run it on one, or leave --profile gpu out on this machine)\n")
    assert not (tmp_path / "out" / "runs").exists() and not (tmp_path / "out" / "results.db").exists()


@cpu_only
def test_run_advice_names_the_set_option_or_the_file(tmp_path):
    path = write(tmp_path)
    by_set = invoke("run", path, "--set", "train.precision=16-mixed", "--out", tmp_path / "a")
    assert by_set.exit_code == 2
    assert "'16-mixed' runs on a GPU" in by_set.stderr and "it comes from --set train.precision=16-mixed" in by_set.stderr
    in_file = invoke("run", write(tmp_path, STUDY.replace("batch_size: 8}", "batch_size: 8, precision: bf16-mixed}")),
                     "--out", tmp_path / "b")
    assert in_file.exit_code == 2
    assert ('(set precision: "32", or put the setting in a profile, e.g. profiles: {gpu: {train.precision: '
            'bf16-mixed}}, and run with --profile gpu on a machine with a GPU)') in in_file.stderr, in_file.stderr


def test_source_of_a_setting_is_the_last_option_that_set_it(tmp_path):
    path = write(tmp_path)
    assert load_study(path).source_of("train.precision") is None
    assert load_study(path, "gpu").source_of("train.precision") == "--profile gpu"
    assert load_study(path, "gpu").source_of("train.lr") is None
    overridden = load_study(path, "gpu", ["train.precision=32"])
    assert overridden.source_of("train.precision") == "--set train.precision=32"


# ---- what each setting needs (one place: workbench.hardware) -----------------------------------


def fields(needs) -> list[str]:
    return [need.field for need in needs]


def test_precision_needs_a_gpu_and_bf16_needs_ampere():
    assert train_needs(TRAIN, CPU) == []
    assert fields(train_needs({**TRAIN, "precision": "16-mixed"}, CPU)) == ["train.precision"]
    assert train_needs({**TRAIN, "precision": "bf16-mixed"}, CUDA) == []
    turing = Machine("this machine", "CUDA: Tesla T4 x1", cuda=True, bf16=False, gpu_count=1)
    [need] = train_needs({**TRAIN, "precision": "bf16-mixed"}, turing)
    assert need.needs == "a GPU with bfloat16 (Ampere or newer)"
    assert train_needs({**TRAIN, "precision": "16-mixed"}, turing) == []


def test_an_accelerator_asked_for_by_name_needs_that_device():
    assert fields(train_needs({**TRAIN, "accelerator": "gpu"}, CPU)) == ["train.accelerator"]
    assert fields(train_needs({**TRAIN, "accelerator": "mps"}, CUDA)) == ["train.accelerator"]
    assert train_needs({**TRAIN, "accelerator": "cpu"}, CUDA) == []
    # a GPU precision with the CPU chosen by name is refused on any machine
    assert fields(train_needs({**TRAIN, "accelerator": "cpu", "precision": "bf16-mixed"}, CUDA)) == ["train.precision"]


def test_more_devices_than_gpus_is_a_need_where_the_count_is_known():
    two = Machine("this machine", "CUDA x2", cuda=True, bf16=True, gpu_count=2)
    [need] = train_needs({**TRAIN, "devices": 4}, two)
    assert need.field == "train.devices" and "has 2" in need.problem
    assert train_needs({**TRAIN, "devices": 2}, two) == [] and train_needs({**TRAIN, "devices": 4}, CUDA) == []


def test_scaling_device_needs():
    assert fields(scaling_needs("cuda", CPU)) == ["scaling.device"]
    assert scaling_needs("cuda", CUDA) == [] and scaling_needs("auto", CPU) == []


def test_devices_and_nodes_a_machine_cannot_serve_are_refused_unless_a_cluster_is_named(tmp_path):
    two_cores = Machine("this machine", "CPU only", cpus=2)
    cpu = {**TRAIN, "accelerator": "cpu"}
    assert train_needs({**cpu, "devices": 2}, two_cores) == []  # two CPU processes: servable here
    [need] = train_needs({**cpu, "devices": 1000}, two_cores)
    assert need.unservable and "1000 CPU processes per run; this machine has 2 cores" in need.problem
    [need] = train_needs({**cpu, "num_nodes": 2}, two_cores)
    assert need.unservable and need.field == "train.num_nodes"
    cluster = Machine("this machine", "CPU only", cpus=2, cluster=True)
    assert train_needs({**cpu, "devices": 1000, "num_nodes": 2}, cluster) == []

    study = tmp_path / "study.yaml"
    study.write_text("name: s\ntask: {name: copy, train_length: 6, eval_lengths: [6], n_eval: 32, alphabet_size: 6}\n"
                     "model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}\n"
                     "train: {steps: 10, batch_size: 1000, accelerator: cpu}\nseeds: [0]\n")  # shareable by 1000
    runner = CliRunner()
    assert runner.invoke(main, ["validate", str(study), "--set", "train.devices=2"]).exit_code == (
        0 if (os.cpu_count() or 1) >= 2 else 2)
    for setting, message in (("train.devices=1000", "train.devices: 1000 asks for 1000 CPU processes per run"),
                             ("train.num_nodes=2", "train.num_nodes: 2 spreads each run over 2 machines")):
        result = runner.invoke(main, ["validate", str(study), "--set", setting])
        assert result.exit_code == 2 and message in result.output and len(result.output.splitlines()) == 1
        assert runner.invoke(main, ["validate", str(study), "--set", setting, "--address", "head:6379"]).exit_code == 0


def test_a_ddp_strategy_gets_the_rendezvous_timeout():
    from workbench.run.distributed import RENDEZVOUS_TIMEOUT, lightning_strategy

    one = {**TRAIN, "strategy": "auto", "devices": 1, "num_nodes": 1}
    assert lightning_strategy(one) == "auto"
    for train in ({**one, "devices": 2}, {**one, "strategy": "ddp_spawn", "devices": "0,1"}, {**one, "num_nodes": 2}):
        strategy = lightning_strategy(train)
        assert strategy._timeout == RENDEZVOUS_TIMEOUT
    assert lightning_strategy({**one, "strategy": "ddp_spawn", "devices": 2})._start_method == "spawn"


def test_a_cpu_run_takes_one_thread_per_share_of_work_within_its_share_of_the_cores():
    quickstart_step = 0.53e9  # training FLOPs of one step of studies/quickstart.yaml
    assert run_threads(quickstart_step, share=2) == 1
    assert run_threads(quickstart_step, share=16) == 1
    assert run_threads(3.5 * FLOPS_PER_THREAD, share=16) == 3
    assert run_threads(100 * FLOPS_PER_THREAD, share=2) == 2  # never past the executor's share
    assert run_threads(0, share=1) == 1
