"""Where runs execute. An executor takes jobs and yields their results as they finish; what
to run, skipping, resuming and recording stay in the runner (the driver process), so a
cluster executor (Ray, ...) only has to implement `run`.

    InProcessExecutor       --jobs 1: one run after another in this process
    LocalProcessExecutor    --jobs N: N spawned worker processes, torch threads = cores // N

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
from workbench.results import RunResult, Status


@dataclass(frozen=True)
class Job:
    """One run to execute: plain, picklable data."""

    run_id: str
    config: dict[str, Any]
    run_dir: Path
    tracker: Any = None  # workbench.run.tracking.TrackerRun: the run's name in an experiment tracker


class Executor(ABC):
    """Runs jobs; yields one RunResult per job, in completion order."""

    on_start: Callable[[Job], None] | None = None  # called as each job starts (progress)

    @abstractmethod
    def run(self, jobs: Sequence[Job]) -> Iterator[Any]:
        ...


def execute(job: Job):
    from workbench.run.train import train_run  # imported here: workers pay for torch once, lazily

    return train_run(job.run_id, job.config, job.run_dir, job.tracker)


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


def init_worker(threads: int, stop_event: Any, parent_pid: int) -> None:
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

    def _pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.n, mp_context=self.context, initializer=init_worker,
                                   initargs=(self.threads, self.stop_event, os.getpid()))

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
