"""Where runs execute. An executor takes jobs and yields their results as they finish; what
to run, skipping, resuming and recording stay in the runner (the driver process), so a
cluster executor (Ray, ...) only has to implement `run`.

    InProcessExecutor       --jobs 1: one run after another in this process, every core its share
    LocalProcessExecutor    --jobs N: N worker processes, each with cores // N torch threads

The workers of a Linux machine without a GPU are forked from a forkserver that has loaded
torch, Lightning and the training code once (workbench.run.preload), so --jobs N pays those
imports once, as --jobs 1 does, not once a worker (worker_context).

Either way a run's share of the cores is the torch threads of the process that trains it, and
the run trains on as many of them as its model can keep busy (workbench.hardware.run_threads:
one for a small model), so --jobs 1 and --jobs N cost the same CPU per run.

On a stop request (workbench.stopping: the driver's SIGTERM/SIGINT) an executor starts no new
run, lets the running ones checkpoint and end, and raises RunInterrupted saying what each
running run did. Workers ignore signals themselves: they follow the event the driver shares
with them, and a watchdog on its pid, so none outlives it. A worker that dies (the OOM
killer, a segfault, a kill) costs only its own run, recorded with the reason; a fresh worker
takes its place.

Where runs execute is also what the study is checked against: `machine()` is the hardware
(this machine; a cluster's for Ray), and `place()` decides which GPUs each run gets before the
first one starts. LocalProcessExecutor gives each worker its own GPUs (`gpu_slots`).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from multiprocessing import forkserver, resource_tracker
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from workbench import stopping
from workbench.errors import WorkbenchError
from workbench.hardware import Machine, gpus_per_run
from workbench.importing import loading, own_process
from workbench.results import RunResult, Status
from workbench.run.jobs import Job

STOP_GRACE_S = 60  # after a stop request, a run gets this long to checkpoint before its worker is killed
JOIN_S = 5  # an idle worker told to leave has this long before it is killed


class Executor(ABC):
    """Runs jobs; yields one RunResult per job, in completion order."""

    on_start: Callable[[Job], None] | None = None  # called as each job starts (progress)
    cluster = False  # runs go to other machines (a named cluster), which serve their devices and nodes

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


def execute(job: Job) -> list[RunResult]:
    """The job's runs, trained; one result each."""
    with loading("workbench.run.train"):
        from workbench.run.train import train_run, train_together  # here: workers load torch and Lightning lazily

    if job.batch:
        from workbench.run.batched import train_batched  # torch.func's vmap path: only jobs that batch seeds load it

        return train_batched(job)
    if job.together:
        return train_together(job)
    return [train_run(job.run_id, job.config, job.run_dir, job.tracker)]


class InProcessExecutor(Executor):
    def __init__(self, on_start=None):
        self.on_start = on_start

    def run(self, jobs: Sequence[Job]) -> Iterator[Any]:
        for job in jobs:
            if stopping.stop_requested():
                raise stopping.RunInterrupted("no run was training")
            if self.on_start:
                self.on_start(job)
            yield from execute(job)


# ---- worker processes ------------------------------------------------------------------------


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


def worker_context(gpu: bool):
    """The multiprocessing context workers start in. On Linux without a GPU, a forkserver that
    imports workbench.run.preload (torch, Lightning, the training code) once, before it forks
    any worker: about 6 s of CPU per sweep on a 2-core CPU, not per worker. Elsewhere spawn, each worker
    loading them itself: a process whose imports may have touched CUDA must not be forked, nor
    one that loaded macOS's system frameworks. The forkserver's environment is the driver's
    when the first worker starts; close_all stops it, so the next sweep starts a fresh one."""
    if gpu or sys.platform != "linux":
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["workbench.run.preload"])
    return context


def worker_main(conn, stop_conn, threads: int, gpus: str | None = None) -> None:
    """A worker: runs the jobs the driver sends, one at a time, and sends back ("started",),
    then ("result", RunResult) or ("interrupted", "stopped at step N ..."); leaves on None or
    when the driver is gone. `stop_conn` carries the driver's stop request (relay_stop);
    `gpus`, its CUDA_VISIBLE_DEVICES (None: every GPU)."""
    stopping.ignore_signals()  # blocked since before this process existed (Worker, stopping.signals_blocked)
    relay_stop(stop_conn)
    own_process()
    if gpus is not None:  # before this worker's first CUDA call, which reads it
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus
    with loading("torch"):
        import torch  # a spawned worker loads torch here, once, before its first run (a forked one has it)

    torch.set_num_threads(threads)  # N workers share the cores instead of oversubscribing them
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the driver is gone
            job = None
        if job is None:  # leave now: nothing to flush, and an interpreter's teardown takes seconds
            os._exit(0)
        try:
            conn.send(("started",))
            try:
                outcome: tuple = ("result", execute(job))
            except stopping.RunInterrupted as err:
                outcome = ("interrupted", str(err))
            except Exception as err:  # a run's outcome, sent as text (an exception may not pickle)
                status = Status.OOM if isinstance(err, MemoryError) else Status.FAILED
                outcome = ("result", job.failed(status, f"{type(err).__name__}: {err}".splitlines()[0]))
            conn.send(outcome)
        except (BrokenPipeError, EOFError, OSError):  # the driver is gone: nobody reads the result
            os._exit(1)


def relay_stop(stop_conn) -> None:
    """In a worker: a message from the driver stops the run in progress (it checkpoints); the
    pipe closing means the driver is gone: the run stops too and the worker exits, at the
    latest stopping.ORPHAN_GRACE_S later (never an orphan)."""

    def relay() -> None:
        try:
            stop_conn.recv()
        except (EOFError, OSError):
            stopping.request_stop("the driver process ended")
            time.sleep(stopping.ORPHAN_GRACE_S)
            os._exit(1)
        stopping.request_stop("the driver's stop request")

    threading.Thread(target=relay, name="workbench-stop-relay", daemon=True).start()


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup
    (v2: memory.events, v1: memory.oom_control), None where that is not readable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if controllers == "":  # cgroup v2
            root, name = Path("/sys/fs/cgroup"), "memory.events"
        elif "memory" in controllers.split(","):
            root, name = Path("/sys/fs/cgroup/memory"), "memory.oom_control"
        else:
            continue
        for path in (root / group.lstrip("/") / name, root / name):  # in a container its own group is the root
            try:
                counts = dict(entry.split()[:2] for entry in path.read_text().splitlines() if len(entry.split()) == 2)
            except OSError:
                continue
            if counts.get("oom_kill", "").isdigit():
                return int(counts["oom_kill"])
    return None


def death_result(job: Job, exitcode: int | None, oom_before: int | None) -> list[RunResult]:
    """The outcome of the runs whose worker process died, with the true reason."""
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else str(-exitcode)
        how = f"killed by signal {-exitcode} ({name})"
    else:
        how = f"exited with code {exitcode}"
    now = oom_kills()
    if exitcode == -signal.SIGKILL and None not in (now, oom_before) and now > oom_before:
        return job.failed(Status.OOM, f"its worker process was {how} by the kernel's OOM killer (out of memory); run "
                          "the study again to retry it, with a smaller batch or model")
    return job.failed(Status.FAILED, f"its worker process was {how} while it trained; run the study again to retry "
                      "it (it resumes from its last checkpoint)")


class Worker:
    """One worker process, the pipe to it, and the job it runs (None: idle)."""

    def __init__(self, context, threads: int, slot: int | None = None, gpus: str | None = None):
        self.conn, child = context.Pipe()
        stop_reader, self.stop_conn = context.Pipe(duplex=False)
        self.slot = slot  # its place in LocalProcessExecutor.gpus, given to its successor if it dies
        self.process = context.Process(target=worker_main, args=(child, stop_reader, threads, gpus),
                                       name="workbench-worker")
        # Started now, not inside start(): multiprocessing unblocks SIGINT and SIGTERM in this process
        # once it has started its resource tracker, and the worker would inherit them unblocked.
        resource_tracker.ensure_running()
        # The worker ignores signals before any can reach it; a forked one inherits the forkserver's
        # mask, which the forkserver got here, as it started with the first worker. That first start
        # waits for the forkserver's imports (a stop request meanwhile acts when they end).
        with stopping.signals_blocked():
            self.process.start()
        child.close()
        stop_reader.close()
        self.job: Job | None = None
        self.started = False  # its job began training (the worker said so)
        self.stopping = False  # it was told to stop its run
        self.oom_before: int | None = None

    def stop(self) -> None:
        if not self.stopping:
            self.stopping = True
            with suppress(OSError):
                self.stop_conn.send("stop")

    def give(self, job: Job) -> None:
        self.job, self.started, self.oom_before = job, False, oom_kills()
        self.conn.send(job)

    def done(self) -> None:
        self.job, self.started, self.stopping = None, False, False

    def leave(self) -> None:
        """Tell it to leave (close_all waits for it)."""
        with suppress(OSError):
            self.conn.send(None)

    def end(self) -> None:
        """Kill it if it is still there, reap it, close its pipes."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()
        self.stop_conn.close()


def close_all(workers: list[Worker]) -> None:
    """Tell every worker to leave; kill those still there after JOIN_S; then stop the forkserver
    and the resource tracker."""
    for worker in workers:
        worker.leave()
    deadline = time.monotonic() + JOIN_S
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
        worker.end()
    stop_forkserver()
    reap_resource_tracker()


def stop_forkserver() -> None:
    """The forkserver (worker_context) ends once no worker and no driver holds its pipe; stopped
    and reaped here, so it is not left to end after the driver, and its CPU (its workers' too)
    counts in the driver's children's, as a spawned worker's does."""
    with suppress(Exception):  # a private API: at worst the forkserver ends on its own after the driver
        forkserver._forkserver._stop()


def reap_resource_tracker() -> None:
    """multiprocessing starts a resource tracker with the first spawned process; it would end
    only after the driver, as a zombie nobody reaps. Stopped here, once no worker is left."""
    with suppress(Exception):  # a private API: at worst the tracker ends after the driver, as before
        resource_tracker._resource_tracker._stop()


class LocalProcessExecutor(Executor):
    """N runs at once, each in a worker process (worker_context: forked from a forkserver that
    has loaded what a run needs, or spawned where a GPU needs a fresh CUDA context)."""

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

    def _new_worker(self, context, workers: list[Worker]) -> Worker:
        """A worker on the first GPU slot no live worker holds (a dead worker's, for its successor)."""
        if self.gpus is None:
            return Worker(context, self.threads)
        slot = min(set(range(len(self.gpus))) - {w.slot for w in workers})
        return Worker(context, self.threads, slot, self.gpus[slot])

    def run(self, jobs: Sequence[Job]) -> Iterator[Any]:
        context = worker_context(self.machine().cuda)
        queue = list(jobs)
        workers: list[Worker] = []
        stopped: list[str] = []  # what each running run did on the stop request
        stop_seen: float | None = None
        try:
            while True:
                while queue and not stopping.stop_requested():
                    idle = next((w for w in workers if w.job is None), None)
                    if idle is None and len(workers) < self.n:
                        idle = self._new_worker(context, workers)
                        workers.append(idle)
                    if idle is None:
                        break
                    job = queue.pop(0)
                    if self.on_start:
                        self.on_start(job)
                    idle.give(job)
                busy = [w for w in workers if w.job is not None]
                if not busy:
                    break
                # a timeout, so a stop request is seen while runs train (a signal does not end the wait)
                wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=0.5)
                for worker in busy:
                    yield from self._collect(worker, workers, stopped)
                if stopping.stop_requested():
                    stop_seen = stop_seen or time.monotonic()
                    for worker in [w for w in workers if w.job is not None]:
                        worker.stop()
                        # one that has not begun training holds nothing; one past the grace is stuck
                        if not worker.started or time.monotonic() - stop_seen > STOP_GRACE_S:
                            stopped.append("had not begun training" if not worker.started else
                                           f"did not end its step within {STOP_GRACE_S} s and was killed "
                                           "(its last periodic checkpoint stands)")
                            worker.end()
                            workers.remove(worker)
            if stopped or stopping.stop_requested():
                raise stopping.RunInterrupted(interrupted_runs(stopped))
        finally:
            for worker in workers:
                if worker.job is not None:  # the driver failed or stopped reading: the run checkpoints and ends
                    worker.stop()
            close_all(workers)

    def _collect(self, worker: Worker, workers: list[Worker], stopped: list[str]) -> Iterator[Any]:
        """The messages `worker` has sent; a result ends its job; a dead worker is replaced."""
        while worker.job is not None:
            try:
                if not worker.conn.poll():
                    if worker.process.is_alive():
                        return
                    raise EOFError
                message = worker.conn.recv()
            except (EOFError, OSError):  # died: its run is recorded, a fresh worker takes its place
                worker.end()
                workers.remove(worker)
                yield from death_result(worker.job, worker.process.exitcode, worker.oom_before)
                return
            if message[0] == "started":
                worker.started = True
            elif message[0] == "interrupted":
                stopped.append(message[1])
                worker.done()
                if not stopping.stop_requested():  # a signal to the worker alone stopped its run
                    stopping.request_stop("SIGTERM to a worker")
            else:
                job = worker.job
                worker.done()
                yield from job.results(message[1])


def interrupted_runs(stopped: list[str]) -> str:
    """'2 running run(s): stopped at step 57 and checkpointed it; ...', or that none was running."""
    if not stopped:
        return "no run was training"
    return f"{len(stopped)} running run(s): " + "; ".join(stopped)


def make_executor(jobs: int, on_start=None) -> Executor:
    if jobs < 1:
        raise WorkbenchError(f"--jobs: must be at least 1, got {jobs}")
    return InProcessExecutor(on_start) if jobs == 1 else LocalProcessExecutor(jobs, on_start=on_start)
