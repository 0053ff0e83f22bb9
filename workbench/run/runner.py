"""Running a study: expand, skip what is done, execute the rest, record every outcome.

    load_study -> its kind (workbench.kinds) expands it -> out_dir/results.db (study hash
    checked) -> pending runs -> executor (in-process, N processes, Ray, or the scaling kind's
    measuring processes) -> store.record, one run at a time

`workbench.api.run_study` is the same for every kind; a kind's `run` puts together the pieces
here: check_study, `sweeping` (summary, progress, signals) and `execute_runs` (skip, execute, record).

Resume is by construction: a run is recorded only when it ends (one transaction), finished
and diverged runs are skipped next time, an interrupted run continues from its last
checkpoint, and a run whose result.json was written but not recorded (the driver died in
between) is recorded from that file without training again. Failed and oom runs are retried.

A train study with `tune:` runs in two stages through the same executor: its tuning runs,
then the final runs at each point's chosen values (workbench.recipes.train.tuning); both resume the same way.

One sweep writes a folder at a time (folder.WriterLock, taken before --fresh clears anything), and
follows no symbolic link a received folder holds (folder.refuse_links).
SIGTERM/SIGINT stop the sweep cleanly (workbench.stopping): the running runs checkpoint their
current step, finished ones are recorded, and RunInterrupted says what each running run did.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import sys
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.progress import TimeRemainingColumn

from workbench import stopping
from workbench.errors import DiskError, WorkbenchError
from workbench.run.executor import Executor, Job
from workbench.kinds import RunOptions
from workbench.registry import run_providers
from workbench.results import CONFIG_FILE, FINAL_WEIGHTS, KEPT, PROGRESS_FILE, RESULT_FILE, Count, Number, RunConfig
from workbench.results import RunResult, Status, UnsafeFile, check_regular, first_problem, flatten, load_json
from workbench.results import read_regular, write_json_atomic, write_text_atomic
from workbench.run.folder import RUN_ID, refuse_links
from workbench.run.store import DB_FILE, PILOT_CPU, RUNS_DIR, Store, run_dir, runs_root
from workbench.run.tracking import TENSORBOARD_DIR
from workbench.study import StudyFile
from workbench.study.keys import canonical_json
from workbench.study.train_section import PROCESSES_CHANGE_NUMBERS


@dataclass
class Summary:
    out_dir: Path
    total: int
    skipped: int = 0
    statuses: Counter = field(default_factory=Counter)
    study: str | None = None  # the study's name
    kept: frozenset = KEPT  # outcomes that are results (a scaling study's oom and timeout too)

    @property
    def failures(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != Status.FINISHED)

    @property
    def incomplete(self) -> int:
        """Runs of this sweep with no result to keep (a training run failed, oom or untuned; a
        failed measurement); a rerun retries them."""
        return sum(n for status, n in self.statuses.items() if status not in self.kept)


MAX_RESULT_BYTES = 16 * 2**20  # a result.json is read up to this size (curves of a 100k-step run: a few MiB)
STORE_FILES = (DB_FILE, f"{DB_FILE}-wal", f"{DB_FILE}-shm")


def default_out_dir(study_file: StudyFile) -> Path:
    return Path("runs") / study_file.study.name


PILOT_SUFFIX = "-pilot"  # `workbench plan`'s pilot of the study in OUT trains into OUT-pilot (its name: <name>-pilot)


def pilot_folder(out: Path, study_name: str, warn=print) -> Path | None:
    """The folder of the pilot `workbench plan` trained for the study that runs into `out`
    (OUT-pilot beside it, holding the study under the name <name>-pilot), or None. Its runs are
    the study's first seeds, with the same ids (workbench.recipes.train.plan). A received
    folder is data: one that cannot be read is a line, and no run is reused from it."""
    folder = out.with_name(out.name + PILOT_SUFFIX)
    if not (folder / DB_FILE).is_file():
        return None
    try:
        name = Store(folder, create=False).study_record().get("name")
    except WorkbenchError as err:
        warn(f"{folder} holds no readable pilot ({str(err).splitlines()[0][:160]}): no run is reused from it")
        return None
    return folder if name == study_name + PILOT_SUFFIX else None


def pilot_result(run: RunConfig, pilot: Path, out: Path, warn=print, mark: str = "pilot") -> RunResult | None:
    """`run`'s result in the study's pilot (None when it has none there, or one that cannot be
    read: the run trains), with the run's folder made in `out` as its training would have left
    it: its config, the pilot's final weights (reports read them), its result. The result's
    environment names the folder under `mark`: "pilot", or "reused_from" for another study's
    folder (`--reuse`), whose runs the ledger does not count as this study's pilot."""
    try:
        result = recorded_result(run, pilot, warn)
        source, folder = run_dir(pilot, run.run_id), run_dir(out, run.run_id)
    except WorkbenchError as err:  # the pilot's store says its runs are elsewhere, unclaimed
        warn(f"{pilot}: its run {run.run_id} is not reused ({str(err).splitlines()[0][:160]})")
        return None
    if result is None:
        return None
    try:
        weights = check_regular(source / FINAL_WEIGHTS)
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder / CONFIG_FILE, json.dumps(run.config, indent=2, sort_keys=True))
        if weights:
            shutil.copyfile(source / FINAL_WEIGHTS, folder / FINAL_WEIGHTS)
        result.environment[mark] = str(pilot)
        write_json_atomic(folder / RESULT_FILE, result.to_json())
    except (OSError, UnsafeFile) as err:
        warn(f"{source}: cannot reuse the pilot's run ({err}): training it again")
        return None
    return result


def reuse_folders(folders: Sequence[str | Path], out: Path) -> list[Path]:
    """`--reuse` folders, each another study's output folder (one with a results store), checked
    before anything runs; a folder that is not one is named in one line."""
    checked = []
    for folder in map(Path, folders):
        if not (folder / DB_FILE).is_file():
            raise WorkbenchError(f"--reuse: {folder} holds no results store ({DB_FILE}); name the output folder of "
                                 "another study (`workbench run --out`), whose finished runs this study may reuse")
        if folder.resolve() == out.resolve():
            raise WorkbenchError(f"--reuse: {folder} is this study's own folder; its finished runs are kept anyway")
        checked.append(folder)
    return checked


def reused_result(run: RunConfig, folders: Sequence[Path], out: Path, warn=print) -> RunResult | None:
    """`run`'s finished result in the first of `folders` that has it (copied into `out` as a
    pilot's is), or None: the run id is a digest of the settings that change what it computes,
    and the run's whole config must match too (settings the id leaves out, such as
    train.attention_entropy, change what it records)."""
    for folder in folders:
        if same_config(run, folder) and (result := pilot_result(run, folder, out, warn, mark="reused_from")):
            return result
    return None


def same_config(run: RunConfig, folder: Path) -> bool:
    """Whether `folder`'s run of `run`'s id was given the same resolved config (its config.json,
    read as data: a missing, oversized or unreadable file is not the same)."""
    try:
        stored = load_json(read_regular(run_dir(folder, run.run_id) / CONFIG_FILE, MAX_RESULT_BYTES), CONFIG_FILE)
    except (OSError, ValueError, TypeError, WorkbenchError):
        return False
    return canonical_json(stored) == canonical_json(run.config)


def record_pilot_spend(store: Store, pilot: Path) -> None:
    """What the study's pilot cost that the study did not reuse (runs of seeds it never ran, or
    trained again): into the study's record, for the ledger (workbench.report.index)."""
    ran = {r["run_id"]: r for r in Store(pilot, create=False).runs() if r["status"] in KEPT}
    reused = {r["run_id"] for r in store.runs() if (r.get("environment") or {}).get("pilot") == str(pilot)}
    left = sum(float(r.get("cpu_time_s") or 0.0) for run_id, r in ran.items() if run_id not in reused)
    store.save_study({"pilot": str(pilot), "pilot_runs_reused": str(len(reused & set(ran))),
                      PILOT_CPU: f"{left:.1f}"})


def study_changes(old: dict[str, Any], new: dict[str, Any], limit: int = 4) -> str:
    a, b = flatten(old), flatten(new)
    changes = [f"{key}: {json.dumps(a.get(key, '(absent)'))} -> {json.dumps(b.get(key, '(absent)'))}"
               for key in sorted(set(a) | set(b)) if a.get(key, "(absent)") != b.get(key, "(absent)")]
    more = f"; and {len(changes) - limit} more" if len(changes) > limit else ""
    return "; ".join(changes[:limit]) + more


def with_one_process(defining: dict[str, Any]) -> dict[str, Any]:
    """A study's run-defining fields with `train.processes` spelled out where it is 1 (absent)."""
    train = defining.get("train")
    return {**defining, "train": {"processes": 1, **train}} if isinstance(train, dict) else defining


def processes_of(defining: dict[str, Any]) -> Any:
    return (with_one_process(defining).get("train") or {}).get("processes")


def refuse_other_study(out_dir: Path, info: dict[str, Any], runs: int, name: str) -> None:
    """One line when `out_dir`'s store holds another study's results (another name, or runs
    under no name): what it holds and where to go instead. Never --fresh: that would delete them."""
    held = info.get("name")
    if held == name or (held is None and not runs):
        return
    what = f"the results of study {str(held)[:100]!r}" if held is not None else "results of no named study"
    raise WorkbenchError(f"{out_dir} holds {what} ({runs} run{'s' * (runs != 1)} recorded), not of {name!r}; "
                         "use --out for another folder (nothing there was changed)")


def check_study(store: Store, study_file: StudyFile) -> None:
    """Refuse another study's folder, and to mix two versions of a study in one folder; record
    the current one. Only what defines the runs counts (description, notes, expectations may change)."""
    info = store.study_record()
    refuse_other_study(store.out_dir, info, len(store.statuses()), study_file.study.name)
    new = study_file.study.run_defining()
    if info and info.get("hash") != study_file.study_hash:
        old = info.get("run_defining", {})
        processes = processes_of(old) != processes_of(new)
        raise WorkbenchError(
            f"{store.out_dir} holds results of a different version of study {info.get('name')!r} "
            f"(changed: {study_changes(with_one_process(old), with_one_process(new))}); finished runs there would "
            "not match the file"
            + (f", and are not reused: {PROCESSES_CHANGE_NUMBERS}" if processes else "")
            + ". Run with --fresh to start that folder over, or --out to use another folder"
        )
    store.save_study({
        "name": study_file.study.name,
        "kind": study_file.study.kind,
        "hash": study_file.study_hash,
        "run_defining": canonical_json(new),
        "study": json.dumps(study_file.study.model_dump(mode="json"), default=str),
        "yaml": study_file.text,
        "source": str(study_file.path),
        "profile": study_file.profile or "",
        "overrides": json.dumps(list(study_file.overrides)),
    })


def check_providers(store: Store, runs: list[RunConfig]) -> None:
    """Refuse to resume when a variant now comes from another package or version than the
    one the folder's runs trained with (a plugin reusing a built-in name changes results
    under an unchanged study file), or when an installed plugin's code changed since (its
    digest, `code.<axis>.<name>`; folders written before digests were recorded have none to
    compare); record the current providers otherwise."""
    current: dict[str, str] = {}
    for run in runs:
        for key, value in run_providers(run.config).items():
            if key.startswith("code."):
                current[key] = value
            else:  # one entry per variant: a per-layer pattern lists several
                current.update({f"{key} {one.split(' (')[0]}": one for one in value.split(", ")})
    before = store.study_record().get("providers", {})
    changed = [f"the code of {k.split('.', 1)[1].replace('.', ' ', 1)} ({before[k]} -> {v})"
               if k.startswith("code.") else f"{before[k]} -> {v}"
               for k, v in sorted(current.items()) if k in before and before[k] != v]
    if changed:
        raise WorkbenchError(
            f"{store.out_dir} holds runs trained with other implementations ({'; '.join(changed[:4])}); "
            "their results would not match. Run with --fresh to start that folder over, or --out to use another folder")
    store.save_study({"providers": canonical_json({**before, **current})})


def recorded_run_ids(out_dir: Path, study_name: str) -> list[str]:
    """The runs the store of `out_dir` records, once it is known to be this study's (another
    study's is refused: refuse_other_study); none without a store or from a damaged one."""
    if not (out_dir / DB_FILE).exists():
        return []
    store = Store(out_dir, create=False)
    try:
        info, recorded = store.study_record(), store.statuses()
    except DiskError:
        raise
    except WorkbenchError:  # a damaged store: --fresh is how to start over from it
        return []
    refuse_other_study(out_dir, info, len(recorded), study_name)
    return [run_id for run_id in recorded if RUN_ID.fullmatch(run_id)]


def clear_outputs(out_dir: Path, study_name: str, run_ids: list[str]) -> None:
    """--fresh: remove what this study wrote there (the store, its run folders and TensorBoard
    logs) only. `run_ids`: every run the study could have, to which the runs its store recorded
    (an earlier version's) are added. Another study's store is refused before anything is
    deleted; a damaged store is removed, and run folders it may have named are kept: they are
    not known to be this study's, and their result.json is what recovers their runs."""
    run_ids = [*run_ids, *recorded_run_ids(out_dir, study_name)]
    try:
        root = runs_root(out_dir)
    except WorkbenchError:  # a damaged store
        root = out_dir / RUNS_DIR
    for run_id in dict.fromkeys(run_ids):
        shutil.rmtree(root / run_id, ignore_errors=True)
    with suppress(OSError):
        (out_dir / RUNS_DIR).rmdir()  # only when empty: a folder there no store names is kept
    for name in STORE_FILES:
        (out_dir / name).unlink(missing_ok=True)
    shutil.rmtree(out_dir / TENSORBOARD_DIR / study_name, ignore_errors=True)  # the runs' logs (tracking.py)


def recorded_result(run: RunConfig, out_dir: Path, warn=print):
    """The result.json of a run that ended but was not recorded (the driver died between);
    None when there is none, or when it cannot be read (then the run trains again): a link, a
    FIFO, a file over MAX_RESULT_BYTES, JSON too deep or with a value of the wrong type or not
    finite is refused before anything is recorded."""
    path = run_dir(out_dir, run.run_id) / RESULT_FILE
    try:
        result = RunResult.from_json(load_json(read_regular(path, MAX_RESULT_BYTES), RESULT_FILE))
    except FileNotFoundError:
        return None
    except ValidationError as err:
        warn(f"{path} is not a readable result ({first_problem(err)}): training that run again")
        return None
    except (OSError, ValueError, TypeError, WorkbenchError) as err:
        reason = str(err).splitlines()[0].removeprefix(f"{path} ")  # the path is said once, a long one too
        warn(f"{path} is not a readable result ({reason[:160]}): training that run again")
        return None
    return result if result.status in KEPT and result.run_id == run.run_id else None


MAX_PROGRESS_BYTES = 4096  # {"step", "steps", "loss", "seconds"}


class ProgressState(BaseModel):
    """What the display reads from a running run's progress.json (workbench.run.recording.ProgressFile)."""

    step: Count
    loss: Number | None


class SweepProgress:
    """One bar for the sweep (done/total, ETA, failures), a live row per running run (step,
    last training loss, ETA; read from the run's progress.json) and one line per finished
    run; plain lines only with quiet=True (for logs)."""

    def __init__(self, study_name: str, total: int, quiet: bool, console: Console | None = None,
                 poll_s: float = 0.5, line: Callable[[RunConfig, RunResult], str] | None = None):
        self.console = console or Console(highlight=False)
        self.line = line or run_line  # the printed line of a run that ended
        self.quiet = quiet
        self.failures = 0
        self.done = 0
        self.total = total
        self.progress = None
        self.running: dict[str, tuple[Any, Path]] = {}  # run id -> (row, progress file)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        if not quiet:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(), console=self.console, transient=False,
            )
            self.task = self.progress.add_task(study_name, total=total, info="0 failed")
            self.progress.start()
            self.poller = threading.Thread(target=self._poll, args=(poll_s,), daemon=True)
            self.poller.start()

    def print(self, text: str) -> None:
        if self.quiet:
            print(text, flush=True)
        else:
            self.console.print(text, markup=False, soft_wrap=True)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.progress is not None:
            self.progress.update(self.task, advance=n, info=f"{self.failures} failed")

    def grow(self, n: int) -> None:
        """n more runs than planned (tuning past a grid edge, adaptive seeds)."""
        self.total += n
        if self.progress is not None:
            self.progress.update(self.task, total=self.total)

    def started(self, job: Job, describe: str) -> None:
        """A run began: give it a live row (a resumed run restarts its row at its step)."""
        if self.progress is None:
            return
        train = job.config["train"]
        timed = (train.get("budget") or {}).get("seconds") is not None  # its step count is not known ahead
        row = self.progress.add_task(f"  {escape(describe)}", total=None if timed else train["steps"], info="starting")
        with self.lock:
            self.running[job.run_id] = (row, job.run_dir / PROGRESS_FILE)

    def refresh_runs(self) -> None:
        """Move each running run's row to the step and loss its progress file says."""
        with self.lock:
            rows = list(self.running.values())
        for row, path in rows:
            try:  # not written yet, a run on another machine, or a file the run did not write
                state = ProgressState.model_validate(load_json(read_regular(path, MAX_PROGRESS_BYTES), PROGRESS_FILE,
                                                                   non_finite_as_null=True))
            except (OSError, ValueError, WorkbenchError):  # pydantic's ValidationError is a ValueError
                continue
            loss = "not finite" if state.loss is None else f"{state.loss:.3g}"
            self.progress.update(row, completed=state.step, info=f"loss {loss}")

    def _poll(self, every_s: float) -> None:
        while not self.stop.wait(every_s):
            self.refresh_runs()

    def run_done(self, run: RunConfig, result) -> None:
        if result.status != Status.FINISHED:
            self.failures += 1
        with self.lock:
            row = self.running.pop(run.run_id, (None, None))[0]
        if row is not None:
            self.progress.remove_task(row)
        self.advance()
        self.print(f"[{self.done}/{self.total}] {self.line(run, result)}")

    def close(self) -> None:
        if self.progress is not None:
            self.stop.set()
            self.poller.join()
            self.progress.stop()


def run_line(run: RunConfig, result) -> str:
    """`finished  model.position=rope seed=0  accuracy@16=0.981 loss@16=0.05  3.2s 41k tok/s`"""
    head = f"{result.status:<8} {run.describe}"
    if result.status == Status.DIVERGED:
        return f"{head}  at step {result.diverged_step}"
    if result.status != Status.FINISHED:
        return f"{head}  {result.error}"
    # a metric this run did not measure (NaN: no generation, no tail at that length) is left out, not printed as nan
    shown = [f"{k}={v:.3g}" for k, v in result.metrics.items()
             if not k.startswith("exact_match") and not (isinstance(v, float) and math.isnan(v))][:4]
    shown += [f"@{n} n/a" for n in result.not_applicable]
    speed = f"{result.tokens_per_s / 1000:.0f}k tok/s" if result.tokens_per_s else ""
    resumed = f" (resumed at step {result.resumed_from_step})" if result.resumed_from_step else ""
    return f"{head}  {' '.join(shown)}  {result.wall_time_s:.1f}s {speed}{resumed}"


@contextmanager
def sweeping(study_name: str, out: Path, total: int, options: RunOptions,
             line: Callable[[RunConfig, RunResult], str] | None = None) -> Iterator[tuple[Summary, SweepProgress]]:
    """The summary and progress display of one sweep, with SIGTERM/SIGINT turned into a clean
    stop: what ended is recorded, and RunInterrupted says how to continue."""
    summary = Summary(out_dir=out, total=total, study=study_name)
    progress = SweepProgress(study_name, total, options.quiet, options.console, line=line or run_line)
    handlers = stopping.install_handlers()  # `workbench run` installed them at start-up already
    stopping.defer()  # from here a stop lets the running runs checkpoint
    try:
        stopping.check()  # a signal during start-up
        yield summary, progress
    except stopping.RunInterrupted as err:
        done = summary.skipped + sum(summary.statuses.values())
        raise stopping.RunInterrupted(
            f"stopped by {stopping.reason()}: {done} of {summary.total} runs done and recorded in {out}; {err}; "
            "run the same command again to continue") from None
    finally:
        stopping.restore_handlers(handlers)
        progress.close()


def execute_runs(runs: list[RunConfig], what: str, store: Store, executor: Executor, summary: Summary,
                 progress: SweepProgress, kept: Collection[str] = KEPT,
                 tracker: Callable[[RunConfig], Any] | None = None,
                 trainings: Callable[[list[RunConfig]], list[list[list[RunConfig]]]] | None = None,
                 pilot: Path | None = None, reuse: Sequence[Path] = ()) -> None:
    """Run the pending ones of `runs` through `executor`, recording each outcome as it comes;
    runs whose recorded status is in `kept` are skipped, and a result.json left unrecorded is
    recorded without running again, as is a run the study's `pilot` folder holds (pilot_result)
    or one of the `reuse` folders finished (reused_result).
    `tracker(run)` names each job's experiment-tracker run. `trainings(pending)` groups the
    pending runs into jobs: each a list of trainings (one model each: several when seeds train
    as one batched model), each a list of the runs that share it."""
    out = store.out_dir
    summary.kept = frozenset(kept)
    statuses = store.statuses()
    pending: list[RunConfig] = []
    unrecorded: list[tuple[RunConfig, Any]] = []
    skipped = 0
    reused, shared = [], []  # from the study's pilot; from other studies' folders (--reuse)
    warn = functools.partial(print, file=sys.stderr, flush=True)
    for run in runs:
        if statuses.get(run.run_id) in kept:
            skipped += 1
        elif (result := recorded_result(run, out, warn)) is not None:
            unrecorded.append((run, result))
        elif pilot is not None and (result := pilot_result(run, pilot, out, warn)) is not None:
            reused.append((run, result))
        elif reuse and (result := reused_result(run, reuse, out, warn)) is not None:
            shared.append((run, result))
        else:
            pending.append(run)
    summary.skipped += skipped + len(reused) + len(shared)
    for count, how in ((skipped, f"already done in {out}: skipped"),
                       (len(reused), f"trained by the study's pilot in {pilot} (`workbench plan`, the study's first "
                                     "seeds): reused, not trained again"),
                       (len(shared), "finished in another study's folder (--reuse): copied in, not trained again")):
        if count:
            progress.print(f"{count} of {len(runs)} {what} {how}")
            progress.advance(count)
    for run, result in [*reused, *shared]:
        store.record(run, result)
    for run, result in unrecorded:
        store.record(run, result)
        summary.statuses[result.status] += 1
        progress.run_done(run, result)
    by_id = {run.run_id: run for run in pending}
    refuse_links(runs_root(out), *by_id)  # --runs-dir: folders outside `out`, checked here
    def job(training: list[RunConfig], batch: tuple[Job, ...] = ()) -> Job:
        first, *rest = training
        together = tuple(job([run]) for run in rest)
        return Job(first.run_id, first.config, run_dir(out, first.run_id), tracker(first) if tracker else None,
                   together, batch)

    jobs_ = [job(first, tuple(job(training) for training in rest))
             for first, *rest in (trainings(pending) if trainings else [[[run]] for run in pending])]
    for result in executor.run(jobs_) if jobs_ else ():  # (a Ray executor would start a cluster for nothing)
        run = by_id[result.run_id]
        store.record(run, result)  # the driver is the only writer of a sweep
        summary.statuses[result.status] += 1
        progress.run_done(run, result)
