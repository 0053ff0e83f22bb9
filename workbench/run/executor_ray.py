"""Runs a sweep's runs as Ray tasks, one run per task, on a Ray cluster.

Ray schedules, places and retries; the workbench only submits. What the local executors
guarantee holds here too, because it lives in the runner (the driver): finished runs are
skipped, results are written to the store by the driver alone (workers return them), and an
interrupted run resumes from the checkpoint in its run folder. A task whose worker dies
(node lost, process killed) is retried by Ray up to `max_retries` times; the retry resumes
from the run's last checkpoint when the run folder is on storage the new worker can reach
(on a multi-node cluster: put the output folder or `--checkpoint-root` on shared storage).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from workbench.errors import WorkbenchError
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
    """One Ray task per run, with `cpus` and `gpus` reserved for each."""

    def __init__(self, address: str | None = None, cpus: float = 1, gpus: float = 0,
                 max_retries: int = 3, on_start=None):
        self.address, self.cpus, self.gpus = address, cpus, gpus
        self.cluster = address is not None
        self.max_retries = max_retries
        self.on_start = on_start

    def _connect(self, ray) -> None:
        if ray.is_initialized():
            return
        try:
            # No address: start a private single-machine cluster (and stop it afterwards).
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        except ConnectionError as err:
            raise WorkbenchError(f"--address: cannot reach a Ray cluster at {self.address!r} ({err}); "
                                 "start one with `ray start --head` or omit --address") from None

    def run(self, jobs: Sequence[Job]) -> Iterator[Any]:
        ray = import_ray()
        started_here = not ray.is_initialized()
        self._connect(ray)
        remote = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus, max_retries=self.max_retries)(
            execute_with_threads
        )
        threads = max(1, int(self.cpus))
        pending = {}
        try:
            for job in jobs:
                if self.on_start:
                    self.on_start(job)
                pending[remote.remote(job, threads)] = job
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
            if started_here:
                ray.shutdown()
