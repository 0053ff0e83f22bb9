"""Runs a sweep's runs as Ray tasks, one run per task, on a Ray cluster.

Ray schedules, places and retries; the workbench only submits. What the local executors
guarantee holds here too, because it lives in the runner (the driver): finished runs are
skipped, results are written to the store by the driver alone (workers return them), and an
interrupted run resumes from the checkpoint in its run folder. A task whose worker dies
(node lost, process killed) is retried by Ray up to `max_retries` times; the retry resumes
from the run's last checkpoint when the run folder is on storage the new worker can reach
(on a multi-node cluster: put the output folder or `--checkpoint-root` on shared storage).

The study's hardware needs are checked against the cluster (its GPUs, from `ray.nodes()`), not
against the driver, so a CPU head node can send GPU runs to GPU workers. Each task reserves
`--gpus-per-run` GPUs, by default what the run trains on: its `train.devices` when it trains on
a GPU of the cluster, none on the CPU. Ray shows a task only the GPUs it reserved.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from workbench.errors import WorkbenchError
from workbench.hardware import Machine, gpus_per_run
from workbench.run.executor import Executor, Job, execute
from workbench.results import RunResult, Status

INSTALL_HINT = "pip install 'transformer-workbench[ray]'"


def import_ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise WorkbenchError(f"--executor ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def execute_with_threads(job: Job, threads: int):
    import torch

    torch.set_num_threads(threads)  # Ray also sets OMP_NUM_THREADS to the task's CPUs
    return execute(job)


class RayExecutor(Executor):
    """One Ray task per run, with `cpus` and `gpus` reserved for each (`gpus` None: what each
    run trains on, see the module docstring)."""

    def __init__(self, address: str | None = None, cpus: float = 1, gpus: float | None = None,
                 max_retries: int = 3, on_start=None):
        self.address, self.cpus, self.gpus = address, cpus, gpus
        self.cluster = address is not None
        self.max_retries = max_retries
        self.on_start = on_start
        self.started_here = False  # this executor started the (private) cluster, and stops it
        self._machine: Machine | None = None

    def _connect(self, ray) -> None:
        if ray.is_initialized():
            return
        try:
            # No address: start a private single-machine cluster (and stop it afterwards).
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            self.started_here = True
        except ConnectionError as err:
            raise WorkbenchError(f"--address: cannot reach a Ray cluster at {self.address!r} ({err}); "
                                 "start one with `ray start --head` or omit --address") from None

    def machine(self) -> Machine:
        """The cluster as one machine: CUDA when any node has a GPU, a run at most the GPUs of
        one node; bfloat16 is assumed (Ampere or newer), which only the worker can tell."""
        if self._machine is None:
            ray = import_ray()
            self._connect(ray)
            per_node = [int((node.get("Resources") or {}).get("GPU", 0)) for node in ray.nodes() if node.get("Alive")]
            total = sum(per_node)
            self._machine = (Machine("the Ray cluster", f"{total} GPUs, at most {max(per_node)} on one node, "
                                     "assumed Ampere or newer", cuda=True, bf16=True, gpu_count=max(per_node),
                                     cluster=self.cluster)
                             if total else Machine("the Ray cluster", "no GPU on any node", cluster=self.cluster))
        return self._machine

    def gpus_for(self, train: dict[str, Any]) -> float:
        """GPUs a run's task reserves: --gpus-per-run, else the GPUs it trains on in the cluster."""
        if self.gpus is not None:
            return self.gpus
        gpus = gpus_per_run(train, self.machine())
        if gpus is None:
            raise WorkbenchError(f"train.devices: {train['devices']!r} is not a number of GPUs, and a Ray task sees "
                                 "only the GPUs it reserves: set train.devices to a count, or give --gpus-per-run")
        return gpus

    def place(self, trains: Sequence[dict[str, Any]]) -> str:
        reserved = sorted({self.gpus_for(train) for train in trains})
        source = "--gpus-per-run" if self.gpus is not None else "train.devices of runs that train on a GPU"
        machine = self.machine()
        return (f"ray: each run reserves {' or '.join(f'{g:g}' for g in reserved)} GPU(s) ({source}) and "
                f"{self.cpus:g} CPU(s); {machine.name}: {machine.description}")

    def run(self, jobs: Sequence[Job]) -> Iterator[Any]:
        ray = import_ray()
        self._connect(ray)
        remote = ray.remote(num_cpus=self.cpus, max_retries=self.max_retries)(execute_with_threads)
        threads = max(1, int(self.cpus))
        pending = {}
        try:
            for job in jobs:
                if self.on_start:
                    self.on_start(job)
                task = remote.options(num_gpus=self.gpus_for(job.config["train"]))
                pending[task.remote(job, threads)] = job
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                job = pending.pop(done[0])
                try:
                    yield ray.get(done[0])
                except ray.exceptions.RayError as err:  # retries exhausted, or the task itself crashed
                    yield RunResult(job.run_id, Status.FAILED, error=f"ray: {type(err).__name__}: {err}".strip()[:2000])
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            if self.started_here:
                ray.shutdown()
                self.started_here, self._machine = False, None
