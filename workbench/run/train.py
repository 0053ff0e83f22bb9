"""Training one run with PyTorch Lightning (the run record is workbench.results).

    RunConfig --train_run--> RunResult (status, final metrics, curves, cost, environment)

The run loop (`train_here`) puts together a Lightning Trainer from the run's parts:

    TaskDataModule  the training batches (workbench.run.batches)
    RunModule       model, loss, optimizer and schedule, budgets, divergence (workbench.run.run_module)
    RunRecorder     curves, evaluations, time, tokens; ProgressFile, PeakMemory (workbench.run.recording)
    environment     device, versions, the checks before training (workbench.run.environment)

A run folder holds config.json, checkpoints/last.ckpt (resume), logs/ (Lightning CSV or
TensorBoard logger), final.safetensors (weights, with the config as metadata, for reports)
and result.json. Nothing read back from a run folder can execute code: checkpoints load with
`weights_only=True` (tensors and plain data only), final weights are safetensors
(workbench.model.weights, which reports read without loading Lightning).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import logging
import math
import os
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.plugins.io import TorchCheckpointIO
from pytorch_lightning.profilers import PassThroughProfiler
from pytorch_lightning.utilities.exceptions import SIGTERMException

from workbench import stopping
from workbench.errors import WorkbenchError
from workbench.hardware import cpu_seconds, machine_load, run_threads
from workbench.cost.budget import BUDGET_STEP_CAP, step_cost
from workbench.registry import run_providers
from workbench.study.keys import digest
from workbench.results import CONFIG_FILE, FINAL_WEIGHTS, LAST_CHECKPOINT, RESULT_FILE, RunResult, Status
from workbench.results import UnsafeFile, check_regular, open_regular, write_json_atomic, write_text_atomic
from workbench.run.batches import TaskDataModule, steps_per_call
from workbench.run.distributed import cluster_environment, lightning_strategy, needs_processes, rank_zero
from workbench.run.distributed import train_in_processes
from workbench.run.jobs import Job
from workbench.run.environment import device_name, environment, matmul_precision, resolve_accelerator, user_callbacks
from workbench.run.recording import Evaluations, PeakMemory, ProgressFile, RunRecorder
from workbench.run.run_module import RunModule
from workbench.run.tracking import TrackerRun, close_logger, make_logger
from workbench.model.weights import make_task, refuse_or_explain, save_final_weights


def quiet_lightning() -> None:
    """Lightning's per-Trainer banners and tips, and warnings that do not apply here, off."""
    for name in ("pytorch_lightning", "lightning_fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in (
        r".*does not have many workers.*",  # batches are generated in-process on purpose
        r".*resuming from a checkpoint that ended before the epoch ended.*",  # our sampler resumes
        r".*isinstance\(treespec, LeafSpec\).*",
        r".*GPU available but not used.*",
        r".*The number of training batches .* is smaller than the logging interval.*",
        r".*Experiment logs directory .* exists and is not empty.*",
        r".*`training_step` returned `None`.*",  # how a diverged step skips its update
        r".*we have not yet implemented the batching rule for.*",  # batched seeds: vmap loops that op (workbench.run.batched)
    ):
        warnings.filterwarnings("ignore", message=message)


# ---- checkpoints: atomic, and never code ---------------------------------------------------


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoints, written atomically (a temporary file renamed over the old
    one: a kill leaves the old checkpoint or the new one, never half) and loaded with
    weights_only=True whatever the caller asks (a crafted checkpoint cannot run code)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        super().save_checkpoint(checkpoint, tmp, storage_options)
        os.replace(tmp, path)

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None) -> dict[str, Any]:
        try:
            with open_regular(path) as file:  # a link or FIFO planted there is refused, never followed or waited on
                return torch.load(file, map_location=map_location or "cpu", weights_only=True)
        except UnsafeFile:
            raise
        except Exception as err:
            raise refuse_or_explain(Path(path), err, "delete it to train this run from the start") from None


class NoProfiler(PassThroughProfiler):
    """Lightning's default profiler records nothing, yet opens a generator-made context around
    every hook call (84 a step, 1.3 us each: about 0.1 ms of a 15 ms step of the quickstart's
    model); this one records the same nothing through one reusable context."""

    def profile(self, action_name: str) -> contextlib.AbstractContextManager:
        return NOTHING


NOTHING = contextlib.nullcontext()


class Checkpoints(Callback):
    """checkpoints/last.ckpt, the run's resume point: written every `every` steps, and at the
    step where a stop request (SIGTERM/SIGINT, workbench.stopping) ends training; the run then
    ends with RunInterrupted and records nothing. One callback for both, in place of Lightning's
    ModelCheckpoint: the Trainer calls every hook of every callback at every step, and
    ModelCheckpoint rebuilds its state key at each call."""

    def __init__(self, path: Path, every: int):
        self.path, self.every = path, every
        self.saved_step: int | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        stopping.handle_during_training()  # after Lightning installed its SIGTERM handler, which checkpoints nothing

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step  # a call ends with a whole step: a checkpoint holds whole steps
        stop = stopping.stop_requested()
        if trainer.world_size > 1:  # the ranks stop at the same step, or one waits for the others forever
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop:
            if outputs and outputs["steps"] and step < trainer.max_steps:  # nothing to keep otherwise
                trainer.save_checkpoint(self.path)
                raise stopping.RunInterrupted(f"stopped at step {step} and checkpointed it")
            raise stopping.RunInterrupted(f"stopped at step {step}")
        if step % self.every == 0 and step != self.saved_step:  # a step that took no update saved nothing new
            trainer.save_checkpoint(self.path)
            self.saved_step = step


# ---- one run --------------------------------------------------------------------------------


CPU_ALLOCATOR_FAILED = "DefaultCPUAllocator: can't allocate memory"


def train_run(run_id: str, config: dict[str, Any], run_dir: Path, tracker: TrackerRun | None = None) -> RunResult:
    """Train one run to completion (or divergence / error) and write its result.json and
    final weights. Continues from checkpoints/last.ckpt when an earlier attempt left one.
    Never raises for a run's own failure: outcomes are data. `tracker` names the run in an
    experiment tracker (workbench.run.tracking). A run on several devices or nodes trains in a
    process group of its own (workbench.run.distributed)."""
    if stopping.stop_requested():
        raise stopping.RunInterrupted("had not begun training")
    if needs_processes(config["train"]):
        return train_in_processes(run_id, config, run_dir, tracker)
    return train_here(run_id, config, run_dir, tracker)[0]


def train_together(job: Job) -> list[RunResult]:
    """A job's run and the runs trained with it (Job.together: they differ from it only in how
    they evaluate, workbench.recipes.train.sweep.training_groups): the model is trained once and
    evaluated for each; every run gets its result, the job's own first."""
    if stopping.stop_requested():
        raise stopping.RunInterrupted("had not begun training")
    return train_here(job.run_id, job.config, job.run_dir, job.tracker, job.together)


def shared_checkpoint(run_dir: Path, siblings: Sequence[Job]) -> Path:
    """The checkpoint of a run trained with `siblings`: its own file for that set of runs, so a
    later attempt resumes it only with the same siblings, whose evaluations it holds."""
    if not siblings:
        return run_dir / LAST_CHECKPOINT
    return (run_dir / LAST_CHECKPOINT).with_name(f"shared-{digest(sorted(s.run_id for s in siblings))}.ckpt")


def resume_point(run_dir: Path, siblings: Sequence[Job], writer: bool) -> tuple[Path, bool]:
    """The run's checkpoint file, and whether it holds a session to resume (a save that a kill cut
    short is removed by the writer)."""
    ckpt = shared_checkpoint(run_dir, siblings)
    if writer:
        ckpt.with_name(ckpt.name + ".tmp").unlink(missing_ok=True)
    return ckpt, check_regular(ckpt)


def train_here(run_id: str, config: dict[str, Any], run_dir: Path, tracker: TrackerRun | None = None,
               siblings: Sequence[Job] = ()) -> list[RunResult]:
    """train_run in this process: every rank of a multi-process run runs it; rank 0 alone
    writes the run folder's files."""
    quiet_lightning()
    start, cpu_start, share = time.perf_counter(), cpu_seconds(), torch.get_num_threads()  # share: the executor's, per run
    if writer := rank_zero():
        for run in [Job(run_id, config, run_dir), *siblings]:
            start_run_folder(run.run_dir, run.config)
    train, device = config["train"], resolve_accelerator(config["train"])
    memory = PeakMemory(on_cuda=device == "cuda")
    matmul, globals_before = matmul_precision(train, device), torch_globals()
    result = RunResult(run_id=run_id, status=Status.FAILED, peak_memory_instrument=memory.instrument,
                       environment=run_environment(config, device, matmul))
    recorder = logger = module = trainer = None
    try:
        torch.set_float32_matmul_precision(matmul)
        pl.seed_everything(config["seed"], workers=True, verbose=False)
        task = make_task(config)
        module = RunModule(config, task, measure_step=memory.step)
        result.n_params = module.model.num_parameters()
        batch = task.train_batch(0, train["batch_size"], module.family)
        cost = step_cost(module.model, lambda b: task.loss(module.model, b, module.family), batch)
        if device == "cpu":  # a small model trains on one thread: more would wait for each other
            torch.set_num_threads(run_threads(cost.flops, share))
        result.environment["threads"] = torch.get_num_threads()
        recorder = RunRecorder(task, module.family, train, cost,
                               [(make_task(s.config), s.config["train"]) for s in siblings])
        if module.budget_kind is not None:
            module.spent = functools.partial(recorder.spent, module.budget_kind)
        ckpt, resume = resume_point(run_dir, siblings, writer)
        max_steps = train["steps"] if module.budget_kind is None else BUDGET_STEP_CAP  # a budget stops the run
        logger = make_logger(train["logger"], run_dir, config, tracker)
        extra = user_callbacks(train)
        trainer = lightning_trainer(train, run_dir, device == "cpu", max_steps, logger,
                                    [recorder, Checkpoints(ckpt, train["checkpoint_every"])], extra)
        datamodule = TaskDataModule(task, module.family, train["batch_size"], max_steps, train["grad_accumulation"],
                                    session_steps_per_call(train, bool(extra), ckpt if resume else None))
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt if resume else None, weights_only=True)
        record_outcome(result, trainer, module, recorder.runs[0])
    except (stopping.RunInterrupted, SIGTERMException) as err:
        # Stopped by a signal: the checkpoint holds the run; nothing is recorded for it.
        raise stopping.RunInterrupted(str(err) or "stopped") from None
    except (torch.OutOfMemoryError, MemoryError) as err:
        result.status, result.error = Status.OOM, f"{type(err).__name__}: {err}".splitlines()[0]
    except Exception as err:  # any other error is this run's outcome; the sweep goes on
        record_error(result, err, run_dir if writer else None)
    finally:
        set_torch_globals(*globals_before)
        if logger is not None:
            close_tracker(logger, train["logger"], result)
    if recorder is not None:
        record_spending(result, recorder)
    result.peak_memory_bytes = memory.peak_bytes()
    results = [result, *(sibling_result(result, s, recorder.runs[i + 1] if recorder else None)
                         for i, s in enumerate(siblings))]
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    write_results([Job(run_id, config, run_dir), *siblings], results, wall, cpu / len(results),
                  lambda _: (module.model, trainer.global_step), writer)
    return results


def session_steps_per_call(train: dict[str, Any], user_callbacks: bool, checkpoint: Path | None) -> int:
    """The run's steps per call (workbench.run.batches.steps_per_call); resuming `checkpoint`, a
    divisor of its step: one written by the code before calls of several steps may end anywhere."""
    per_call = steps_per_call(train, user_callbacks)
    return math.gcd(per_call, SafeCheckpointIO().load_checkpoint(checkpoint)["global_step"]) if checkpoint else per_call


def torch_globals() -> tuple[bool, str, int]:
    """What a training changes process-wide (Trainer(deterministic=True), the matmul precision, the
    thread count), to be set back for the next run in this process."""
    return torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision(), torch.get_num_threads()


def set_torch_globals(deterministic: bool, matmul: str, threads: int) -> None:
    torch.use_deterministic_algorithms(deterministic)
    torch.set_float32_matmul_precision(matmul)
    torch.set_num_threads(threads)


def write_results(runs: Sequence[Job], results: Sequence[RunResult], wall: float, cpu_each: float,
                  final: Callable[[int], tuple[torch.nn.Module, int]], writer: bool = True) -> None:
    """The results of runs trained together, each with the training's cost shared among them and
    the others' ids, its final weights (`final(i)`: run i's model and its step) where it finished, written
    to its folder."""
    trained = [run.run_id for run in runs]
    for i, (run, each) in enumerate(zip(runs, results)):
        each.wall_time_s, each.cpu_time_s = wall, cpu_each
        each.environment.update(machine_load())
        if len(runs) > 1:
            each.environment["trained_with"] = sorted(r for r in trained if r != run.run_id)
        if writer:
            if each.status == Status.FINISHED:
                model, step = final(i)
                save_final_weights(model, run.config, step, run.run_dir / FINAL_WEIGHTS)
            write_result(run.run_dir, each)


def sibling_result(trained: RunResult, sibling: Job, evaluations: Evaluations | None) -> RunResult:
    """A sibling's result: the training's (status, steps, cost, training curves) with its own
    evaluations (metrics, curves) and evaluation time."""
    result = dataclasses.replace(copy.deepcopy(trained), run_id=sibling.run_id)
    if evaluations is not None:
        result.curves = evaluations.curves
        result.eval_time_s = evaluations.session_time
        if result.status == Status.FINISHED:
            result.metrics = evaluations.last_eval["metrics"]
            result.not_applicable = evaluations.last_eval["not_applicable"]
    return result


def start_run_folder(run_dir: Path, config: dict[str, Any]) -> None:
    """The run folder with the run's config, before anything trains."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True))
    except OSError as err:  # a full disk, a read-only folder: the sweep cannot go on
        raise WorkbenchError(f"{run_dir}: cannot write the run folder ({err.strerror}); free some space (or make the "
                             "folder writable) and run again: finished runs are kept") from None


def run_environment(config: dict[str, Any], device: str, matmul: str) -> dict[str, Any]:
    """What a run records of where it trained, and which package provided each of its variants."""
    return {**environment(device_name(device)), "float32_matmul_precision": matmul,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), **run_providers(config)}


def record_error(result: RunResult, err: Exception, run_dir: Path | None) -> None:
    """A run that raised: failed, or out of memory; the traceback goes to error.txt in `run_dir`
    (the writer's; None on the other ranks)."""
    # PyTorch's CPU allocator raises a RuntimeError, not a MemoryError, when memory runs out
    result.status = Status.OOM if CPU_ALLOCATOR_FAILED in str(err) else Status.FAILED
    result.error = f"{type(err).__name__}: {err}".splitlines()[0]
    if run_dir is not None:
        with contextlib.suppress(OSError):  # a full disk fails this too; the error is in the result already
            write_text_atomic(run_dir / "error.txt", traceback.format_exc())


def lightning_trainer(train: dict[str, Any], run_dir: Path, deterministic: bool, max_steps: int, logger,
                      callbacks: list, extra: list[Callback]) -> pl.Trainer:
    """The Lightning Trainer of one run's `train:` section, with the run's own callbacks first
    (recording, checkpoints), then its progress file and the study's callbacks (`extra`).
    Clipping, micro-batches and the peak memory's step are RunModule's (its training step takes
    several steps)."""
    return pl.Trainer(
        max_steps=max_steps, max_epochs=-1, limit_val_batches=0, num_sanity_val_steps=0,
        accelerator=train["accelerator"], devices=train["devices"], strategy=lightning_strategy(train),
        num_nodes=train["num_nodes"], precision=train["precision"],
        deterministic=deterministic, logger=logger,
        callbacks=[*callbacks, ProgressFile(run_dir, train["steps"]), *extra],
        # Lightning adds a ModelCheckpoint of its own unless told not to (Checkpoints writes the
        # run's); a study's own ModelCheckpoint in train.callbacks needs it on
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in extra),
        log_every_n_steps=train["log_every"], plugins=[SafeCheckpointIO(), *cluster_environment(train)],
        profiler=NoProfiler(),
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=run_dir,
        use_distributed_sampler=False,  # StepBatches shares each batch between the ranks
    )


def record_outcome(result: RunResult, trainer: pl.Trainer, module: RunModule, evaluations: Evaluations) -> None:
    """How a fit that returned ended: diverged at a step, or finished with its last evaluation."""
    result.steps_done = trainer.global_step
    result.environment["processes"] = trainer.world_size
    result.environment["steps_per_call"] = trainer.datamodule.per_call
    result.last_step = module.last_step
    if module.diverged_step is not None:
        result.status, result.diverged_step = Status.DIVERGED, module.diverged_step
    else:
        result.status = Status.FINISHED
        result.metrics = evaluations.last_eval["metrics"]
        result.not_applicable = evaluations.last_eval["not_applicable"]


def close_tracker(logger, name: str, result: RunResult) -> None:
    try:
        close_logger(logger, result.status, result.metrics)
    except Exception as err:  # noqa: BLE001 - a tracker that cannot be reached loses no result
        warnings.warn(f"train.logger {name}: could not close the tracker run "
                      f"({type(err).__name__}: {str(err).splitlines()[0][:120]})", stacklevel=1)


def record_spending(result: RunResult, recorder: RunRecorder) -> None:
    """What the run spent, as its recorder counted it (also for a run that failed part way)."""
    result.resumed_from_step = recorder.start_step or None
    result.curves = recorder.curves
    result.tokens = recorder.tokens
    result.train_flops = recorder.flops
    result.train_time_s = recorder.train_time()
    result.eval_time_s = recorder.runs[0].session_time
    result.tokens_per_s = result.tokens / result.train_time_s if result.tokens and result.train_time_s > 0 else None


def write_result(run_dir: Path, result: RunResult) -> None:
    try:
        write_json_atomic(run_dir / RESULT_FILE, result.to_json())
    except OSError as err:  # a full disk, a folder made read-only: the sweep cannot go on
        raise WorkbenchError(f"{run_dir / RESULT_FILE}: cannot write it ({err.strerror}); free some space (or make "
                             "the folder writable) and run again: finished runs are kept") from None
