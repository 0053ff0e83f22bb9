"""Runs land on the GPUs they are meant for, checked on the CPU with a faked GPU count:
`--jobs N` gives each worker process its own GPUs (seen through the environment each spawned
worker actually has), the Ray executor checks the study against the cluster rather than the
driver and reserves each run's `train.devices` GPUs unless `--gpus-per-run` says otherwise."""

from __future__ import annotations

import io
import sys
import types
from pathlib import Path

import pytest
from rich.console import Console
from test_hardware import STUDY  # a tiny study with a bf16 gpu profile

from workbench.errors import WorkbenchError
from workbench.hardware import Machine, gpus_per_run
from workbench.results import RunResult, Status
from workbench.study import load_study
from workbench.recipes.train.sweep import expand
from workbench.run.executor import Executor, Job, LocalProcessExecutor, gpu_slots, visible_gpu_ids
from workbench.run.executor_ray import RayExecutor
from workbench.api import run_study

TRAIN = {"accelerator": "auto", "precision": "32", "devices": 1}
GPUS = Machine("this machine", "CUDA: fake x2", cuda=True, bf16=True, gpu_count=2)


def two_gpus(monkeypatch, count: int = 2) -> None:
    """This process sees `count` CUDA GPUs (the one function that counts them, faked)."""
    machine = Machine("this machine", f"CUDA: fake x{count}", cuda=True, bf16=True, gpu_count=count)
    monkeypatch.setattr(Machine, "here", classmethod(lambda cls: machine))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_gpus_per_run_follows_the_device_a_run_trains_on():
    cpu = Machine("this machine", "CPU only")
    assert gpus_per_run(TRAIN, GPUS) == 1
    assert gpus_per_run({**TRAIN, "devices": 2}, GPUS) == 2
    assert gpus_per_run(TRAIN, cpu) == 0  # auto without a GPU: the CPU
    assert gpus_per_run({**TRAIN, "accelerator": "cpu"}, GPUS) == 0
    assert gpus_per_run({**TRAIN, "devices": -1}, GPUS) is None  # every GPU it sees: not a count
    assert gpus_per_run({**TRAIN, "devices": "0,1"}, GPUS) is None


def test_gpu_slots_go_round_robin_over_the_visible_gpus(monkeypatch):
    assert gpu_slots(2, 1, ["0", "1"]) == ["0", "1"]
    assert gpu_slots(2, 2, ["0", "1", "2", "3"]) == ["0,1", "2,3"]
    assert gpu_slots(4, 1, ["0", "1"]) == ["0", "1", "0", "1"]  # more workers than GPUs: they share
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert visible_gpu_ids(2) == ["3", "5"]  # a machine already narrowed down keeps its numbering
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpu_ids(2) == ["0", "1"]


def test_local_placement_says_what_it_chose_and_warns_when_runs_must_share(monkeypatch):
    two_gpus(monkeypatch)
    two = LocalProcessExecutor(2, threads=1)
    assert two.place([TRAIN]) == "GPUs: 1 per run (train.devices); worker 1: GPU 0, worker 2: GPU 1"
    assert two.gpus == ["0", "1"]
    four = LocalProcessExecutor(4, threads=1)
    line = four.place([TRAIN])
    assert four.gpus == ["0", "1", "0", "1"]
    assert "warning: --jobs 4 x 1 GPUs is more than the 2 this machine has, so runs share GPUs" in line
    cpu_runs = LocalProcessExecutor(2, threads=1)
    assert cpu_runs.place([{**TRAIN, "accelerator": "cpu"}]) is None and cpu_runs.gpus is None
    every = LocalProcessExecutor(2, threads=1)
    assert "every worker sees all 2" in every.place([{**TRAIN, "devices": -1}]) and every.gpus is None


TINY_RUN = """\
name: placement
task: {name: copy, train_length: 6, eval_lengths: [6], n_eval: 16, alphabet_size: 6}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2, position: rope}
train: {steps: 2, batch_size: 4, eval_every: 2, accelerator: cpu}
seeds: [0, 1]
"""


@pytest.mark.slow
def test_two_workers_get_different_gpus(monkeypatch, tmp_path):
    """--jobs 2 on two (faked) GPUs: each worker process sets its own CUDA_VISIBLE_DEVICES before
    its first run, which records what it saw (the runs train on the CPU: nothing here has CUDA)."""
    two_gpus(monkeypatch)
    executor = LocalProcessExecutor(2, threads=1)
    executor.place([TRAIN])
    study = tmp_path / "study.yaml"
    study.write_text(TINY_RUN)
    jobs = [Job(run.run_id, run.config, tmp_path / run.run_id) for run in expand(load_study(study))]
    seen = [result.environment["cuda_visible_devices"] for result in executor.run(jobs)]  # one job per worker
    assert sorted(seen) == ["0", "1"], seen  # each its own GPU


# ---- Ray: a fake `ray` module with the calls the executor makes ------------------------------


class FakeRay(types.ModuleType):
    """A Ray cluster of `nodes`; a task "runs" by returning the GPUs it reserved."""

    class exceptions:  # noqa: N801 - mirrors ray.exceptions
        RayError = RuntimeError

    def __init__(self, nodes: list[dict]):
        super().__init__("ray")
        self._nodes, self.initialized, self.reserved = nodes, False, {}

    def is_initialized(self):
        return self.initialized

    def init(self, **kwargs):
        self.initialized = True

    def shutdown(self):
        self.initialized = False

    def nodes(self):
        return self._nodes

    def remote(self, **options):
        fake = self

        class Task:
            def __init__(self, options):
                self.options_ = options

            def options(self, **more):
                return Task({**self.options_, **more})

            def remote(self, job, threads):
                fake.reserved[job.run_id] = self.options_["num_gpus"]
                return job.run_id

        return lambda fn: Task(options)

    def wait(self, refs, num_returns):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        return RunResult(ref, Status.FAILED, error=f"reserved {self.reserved[ref]} GPUs")

    def cancel(self, ref, force):
        pass


CPU_HEAD_AND_GPU_WORKER = [{"Alive": True, "Resources": {"CPU": 8.0}},
                           {"Alive": True, "Resources": {"CPU": 32.0, "GPU": 4.0}},
                           {"Alive": False, "Resources": {"GPU": 8.0}}]  # a lost node counts for nothing


def fake_ray(monkeypatch, nodes=CPU_HEAD_AND_GPU_WORKER) -> FakeRay:
    ray = FakeRay(nodes)
    monkeypatch.setitem(sys.modules, "ray", ray)
    return ray


def test_ray_checks_against_the_cluster_and_reserves_each_runs_devices(monkeypatch):
    ray = fake_ray(monkeypatch)
    executor = RayExecutor()
    machine = executor.machine()
    assert machine.cuda and machine.bf16 and machine.gpu_count == 4
    assert "4 GPUs, at most 4 on one node" in machine.description
    assert executor.place([TRAIN, {**TRAIN, "devices": 2}]).startswith(
        "ray: each run reserves 1 or 2 GPU(s) (train.devices of runs that train on a GPU)")
    jobs = [Job("one", {"train": TRAIN}, Path("one")), Job("two", {"train": {**TRAIN, "devices": 2}}, Path("two")),
            Job("cpu", {"train": {**TRAIN, "accelerator": "cpu"}}, Path("cpu"))]
    list(executor.run(jobs))
    assert ray.reserved == {"one": 1, "two": 2, "cpu": 0}
    assert not ray.initialized  # the executor started the cluster, so it stops it


def test_ray_gpus_per_run_overrides_and_all_devices_is_refused(monkeypatch):
    ray = fake_ray(monkeypatch)
    shared = RayExecutor(gpus=0.5)
    assert "reserves 0.5 GPU(s) (--gpus-per-run)" in shared.place([TRAIN])
    list(shared.run([Job("one", {"train": TRAIN}, Path("one"))]))
    assert ray.reserved == {"one": 0.5}
    with pytest.raises(WorkbenchError, match="train.devices: -1 is not a number of GPUs"):
        RayExecutor().place([{**TRAIN, "devices": -1}])


def test_ray_cluster_without_gpus_trains_on_the_cpu(monkeypatch):
    ray = fake_ray(monkeypatch, [{"Alive": True, "Resources": {"CPU": 8.0}}])
    executor = RayExecutor()
    assert not executor.machine().cuda
    list(executor.run([Job("one", {"train": TRAIN}, Path("one"))]))
    assert ray.reserved == {"one": 0}




class ClusterWithGpus(Executor):
    """An executor whose runs train elsewhere, on GPUs: records what it was asked to run."""

    def __init__(self):
        self.ran: list[str] = []

    def machine(self) -> Machine:
        return Machine("the cluster", "1 GPU", cuda=True, bf16=True, gpu_count=1)

    def place(self, trains):
        return f"placed {len(trains)} train section(s)"

    def run(self, jobs):
        for job in jobs:
            self.ran.append(job.run_id)
            yield RunResult(job.run_id, Status.FAILED, error="not trained in this test")


@pytest.mark.skipif(Machine.here().cuda, reason="checks a CPU-only driver")
def test_a_gpu_profile_runs_from_a_cpu_driver_when_the_executor_has_gpus(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(STUDY)
    cluster, console = ClusterWithGpus(), Console(file=io.StringIO(), width=200)
    summary = run_study(path, tmp_path / "out", profile="gpu", executor=cluster, console=console)
    assert len(cluster.ran) == 1 and summary.statuses[Status.FAILED] == 1
    assert "placed 1 train section(s)" in console.file.getvalue()
    with pytest.raises(WorkbenchError, match="train.precision: 'bf16-mixed' runs on a GPU"):
        run_study(path, tmp_path / "local", profile="gpu")  # the local executor: this CPU machine
