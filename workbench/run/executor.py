"""Where runs execute. An executor takes jobs and yields their results as they finish; what
to run, skipping, resuming and recording stay in the runner (the driver process), so a
cluster executor (Ray, ...) only has to implement `run`.

    InProcessExecutor       --jobs 1: one run after another in this process
    LocalProcessExecutor    --jobs N: N spawned worker processes, torch threads = cores // N

Where runs execute is also what the study is checked against: `machine()` is the hardware
(this machine; a cluster's for Ray), and `place()` decides which GPUs each run gets before the
first one starts. LocalProcessExecutor gives each worker its own GPUs (`gpu_slots`).

On a stop request (workbench.stopping: SIGTERM/SIGINT) an executor starts no new run, lets
the running ones checkpoint and end, and raises RunInterrupted. Workers share the driver's
stop event and watch its pid, so none outlives it.
"""

from __future__ import annotations

import multiprocessing
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench import stopping
from workbench.errors import WorkbenchError
from workbench.hardware import Machine, gpus_per_run
from workbench.results import RunResult, Status


@dataclass(frozen=True)
class Job:
    """One run to execute: plain, picklable data."""

    run_id: str
    config: dict[str, Any]
    run_dir: Path


class Executor(ABC):
    """Runs jobs; yields one RunResult per job, in completion order."""

    on_start: Callable[[Job], None] | None = None  # called as each job starts (progress)

    @abstractmethod
    def run(self, jobs: Sequence[Job]) -> Iterator[Any]:
        ...

    def machine(self) -> Machine:
        """The hardware the runs are checked against (workbench.hardware.Machine): this machine."""
        return Machine.here()

    def place(self, trains: Sequence[dict[str, Any]]) -> str | None:
        """Decide which GPUs runs with these `train:` sections get; a line that says what was
        chosen, or None when there is nothing to choose."""
        return None


def execute(job: Job):
    from workbench.run.train import train_run  # imported here: workers pay for torch once, lazily

    return train_run(job.run_id, job.config, job.run_dir)


class InProcessExecutor(Executor):
    def __init__(self, on_start=None):
        self.on_start = on_start

    def run(self, jobs: Sequence[Job]) -> Iterator[Any]:
        for job in jobs:
            if stopping.stop_requested():
                raise stopping.RunInterrupted("stopped before the next run")
            if self.on_start:
                self.on_start(job)
            yield execute(job)


def gpu_slots(workers: int, per_run: int, gpu_ids: Sequence[str]) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each of `workers` processes: `per_run` GPUs each, round-robin over
    `gpu_ids`, so N workers on N GPUs get one each (more workers than GPUs share them)."""
    return [",".join(gpu_ids[(worker * per_run + i) % len(gpu_ids)] for i in range(per_run))
            for worker in range(workers)]


def visible_gpu_ids(count: int) -> list[str]:
    """The ids of this machine's `count` GPUs as CUDA_VISIBLE_DEVICES names them (it may already
    narrow them down), else 0..count-1."""
    named = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return named[:count] if len(named) >= count else [str(i) for i in range(count)]


def init_worker(threads: int, stop_event: Any, parent_pid: int, slots: Any = None) -> None:
    if slots is not None:  # before this worker's first CUDA call, which reads it: its own GPUs, from the queue
        os.environ["CUDA_VISIBLE_DEVICES"] = slots.get()
    import torch  # a spawned worker loads torch here, once, before its first run

    torch.set_num_threads(threads)  # N workers share the cores instead of oversubscribing them
    stopping.register_event(stop_event)  # the driver's stop request reaches this worker's run
    stopping.install_handlers()  # a signal to the whole group (Ctrl-C) stops the run the same way
    stopping.watch_parent(parent_pid)


def execute_in_worker(job: Job, parent_pid: int):
    try:
        return execute(job)
    except stopping.RunInterrupted:
        if stopping.orphaned(parent_pid):  # nobody reads the result: leave now
            os._exit(1)
        raise


class LocalProcessExecutor(Executor):
    """N runs at once, each in a spawned process (a fresh CUDA context, no forked state).

    At most N jobs are submitted at a time, so every submitted job is running: if a worker
    dies (killed by the OS, a segfault), the jobs that were running are reported failed and
    the rest go on in a fresh pool.
    """

    def __init__(self, jobs: int, threads: int | None = None, on_start=None):
        self.n = jobs
        self.threads = threads or max(1, (os.cpu_count() or 1) // jobs)
        self.on_start = on_start
        self.gpus: list[str] | None = None  # CUDA_VISIBLE_DEVICES of each worker (place); None: all GPUs

    def place(self, trains: Sequence[dict[str, Any]]) -> str | None:
        machine = self.machine()
        counts = {gpus_per_run(train, machine) for train in trains} - {0}
        if not counts:
            return None
        if None in counts:
            self.gpus = None
            return (f"GPUs: every worker sees all {machine.gpu_count} (train.devices is not a count); "
                    "set train.devices to N to give each of the --jobs its own N GPUs")
        per_run, ids = max(counts), visible_gpu_ids(machine.gpu_count or 0)
        self.gpus = gpu_slots(self.n, per_run, ids)
        line = f"GPUs: {per_run} per run (train.devices); " + ", ".join(
            f"worker {i + 1}: {'GPUs' if per_run > 1 else 'GPU'} {slot}" for i, slot in enumerate(self.gpus))
        if self.n * per_run > len(ids):
            line += (f"; warning: --jobs {self.n} x {per_run} GPUs is more than the {len(ids)} this machine has, "
                     "so runs share GPUs (use fewer --jobs to give each run its own)")
        return line

    def _pool(self) -> ProcessPoolExecutor:
        slots = None
        if self.gpus is not None:  # one slot per worker: initializers all get the same arguments
            slots = self.context.Queue()
            for slot in self.gpus:
                slots.put(slot)
        return ProcessPoolExecutor(max_workers=self.n, mp_context=self.context, initializer=init_worker,
                                   initargs=(self.threads, self.stop_event, os.getpid(), slots))

    def run(self, jobs: Sequence[Job]) -> Iterator[Any]:
        self.context = multiprocessing.get_context("spawn")
        self.stop_event = self.context.Event()
        stopping.register_event(self.stop_event)
        queue = list(jobs)
        pool = self._pool()
        running: dict[Future, Job] = {}
        interrupted = False
        try:
            while queue or running:
                while queue and len(running) < self.n and not stopping.stop_requested():
                    job = queue.pop(0)
                    if self.on_start:
                        self.on_start(job)
                    running[pool.submit(execute_in_worker, job, os.getpid())] = job
                if not running:
                    break
                # a timeout, so a stop request is seen while runs train (a signal does not end the wait)
                done, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in done:
                    job = running.pop(future)
                    try:
                        yield future.result()
                    except stopping.RunInterrupted:
                        interrupted = True
                    except BrokenProcessPool:
                        yield RunResult(job.run_id, Status.FAILED, error=(
                            f"a worker process died while {len(running) + 1} run(s) were training "
                            "(killed by the OS, e.g. out of memory?); run the study again to retry"))
                        for other, other_job in list(running.items()):
                            running.pop(other)
                            yield RunResult(other_job.run_id, Status.FAILED, error="its worker pool broke (see above)")
                        pool.shutdown(wait=False, cancel_futures=True)
                        pool = self._pool()
                        break
                    except Exception as err:  # pickling errors and the like: this run's outcome
                        yield RunResult(job.run_id, Status.FAILED, error=f"{type(err).__name__}: {err}")
            if interrupted or stopping.stop_requested():
                raise stopping.RunInterrupted("stopped")
        finally:
            if running:  # the driver failed or stopped reading: the workers' runs checkpoint and end
                self.stop_event.set()
            pool.shutdown(wait=True, cancel_futures=True)
            stopping.unregister_event(self.stop_event)


def make_executor(jobs: int, on_start=None) -> Executor:
    if jobs < 1:
        raise WorkbenchError(f"--jobs: must be at least 1, got {jobs}")
    return InProcessExecutor(on_start) if jobs == 1 else LocalProcessExecutor(jobs, on_start=on_start)
