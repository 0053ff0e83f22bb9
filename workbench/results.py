"""What a run is and what it records: the record every layer reads, without torch or Lightning.

    RunConfig  one run of a sweep (id, sweep index, seed, swept labels, resolved config)
    RunResult  its outcome (status, final metrics, curves, cost, environment), written by the
               run as result.json and recorded by the driver in the store
    Status     the one vocabulary of outcomes, stored as its plain value ("finished", ...)

A run folder holds CONFIG_FILE, LAST_CHECKPOINT (resume), logs/, FINAL_WEIGHTS (for reports),
PROGRESS_FILE (step and loss while it trains) and RESULT_FILE. They are written atomically
(write_text_atomic) and read back as regular files only (read_regular, load_json): a folder
may come from someone else.

Every record also names its source: `git_commit`, the commit of the workbench tree that trained
or measured it (in its environment), which every report states beside the one that built it.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationError

from workbench.errors import WorkbenchError, write_error


class Status(StrEnum):
    """How a run (or a measurement) ended; a StrEnum, so stored and printed as its value."""

    FINISHED = "finished"
    DIVERGED = "diverged"  # a NaN/inf loss stopped training: a result, kept on rerun
    OOM = "oom"
    FAILED = "failed"
    TIMEOUT = "timeout"  # a measurement past its time budget
    UNTUNED = "untuned"  # a final run whose point found no tuned value (counted, never stored)


KEPT = frozenset({Status.FINISHED, Status.DIVERGED})  # outcomes a rerun keeps; failed and oom are retried
FAILURES = (Status.DIVERGED, Status.OOM, Status.FAILED)  # a training run that produced no final model

RESULT_FILE = "result.json"
CONFIG_FILE = "config.json"
FINAL_WEIGHTS = "final.safetensors"
OLD_FINAL_WEIGHTS = "final.pt"  # run folders written before safetensors (loaded with weights_only=True)
LAST_CHECKPOINT = "checkpoints/last.ckpt"
PROGRESS_FILE = "progress.json"  # a running run's step and loss, for the driver's display

# The split a run evaluates on: tuning runs evaluate on validation sets, every other on eval sets.
EVAL, VALIDATION = "eval", "validation"


@dataclass(frozen=True)
class Metric:
    """What a recorded number means to a report, as whoever records it declares (a task its
    scores: workbench.tasks.Task.metrics; a run its measures: RUN_MEASURES). The one rule for
    which end is better: every report, tuning and early-stopping decision asks this."""

    higher_is_better: bool | None  # None: a descriptive measure, neither end is better
    # (lowest, highest) possible value: reports keep intervals inside it, and the better end is
    # the perfect score the learned-at-all margin is measured towards
    range: tuple[float, float] = (-math.inf, math.inf)
    # what the number is and how it is computed, in a sentence a report prints ("" : not explained)
    description: str = ""


# What a run spends (time, memory, parameters, FLOPs): never negative, lower is better.
SPENT = Metric(higher_is_better=False, range=(0.0, math.inf))
# Columns every run records (besides metrics), usable in `expect` records.
RUN_MEASURES: dict[str, Metric] = {
    "tokens_per_s": Metric(higher_is_better=True, range=(0.0, math.inf)), "peak_memory_bytes": SPENT,
    "n_params": SPENT, "wall_time_s": SPENT, "train_time_s": SPENT,
}

# Normalised attention entropy at the training length (workbench.model.transformer.attention_entropy),
# recorded when a study sets `train.attention_entropy: true`. Descriptive: no better direction.
ATTENTION_ENTROPY = "attention_entropy"
# The mean attention weight on the first key (the "attention sink": Xiao et al. 2023; Qiu et al.
# 2025 report 47% -> 5% with gated attention), recorded in the same pass.
FIRST_TOKEN_ATTENTION = "first_token_attention"
DESCRIPTIVE_METRICS = (ATTENTION_ENTROPY, FIRST_TOKEN_ATTENTION)
# An `expect:` metric computed by the report, not recorded by runs: the share of a group's
# seeds that diverged or did not learn (lower is better).
FAILURE_SHARE = "failure_share"
SHARE_OF_FAILED = Metric(higher_is_better=False, range=(0.0, 1.0))

# What a run has spent, recorded with every logged and evaluated step (curves split "progress"),
# so curves can be drawn against training tokens, counted FLOPs or training seconds.
PROGRESS = "progress"
PROGRESS_MEASURES = ("tokens", "flops", "seconds")
# What a run spent until its evaluations first reached a stated score (workbench.recipes.train.compute_curves);
# each is SPENT.
TO_TARGET = {f"{measure}_to_target": measure for measure in PROGRESS_MEASURES}

TUNE, FINAL = "tune", "final"  # the stage of a run: a tuning run, or a final one


def run_stage(config: dict[str, Any]) -> str:
    return TUNE if config.get("split") == VALIDATION else FINAL


@dataclass(frozen=True)
class RunConfig:
    """One run of a sweep: plain data, picklable, the same on every machine."""

    run_id: str  # hash of what the run computes (task, model, training, seed)
    index: int  # position in the sweep, for stable ordering in tables
    seed: int
    swept: dict[str, Any]  # dotted key -> value label (a flat column of the results table)
    config: dict[str, Any] = field(repr=False)  # {"task": ..., "model": ..., "train": ..., "seed": ...}

    @property
    def stage(self) -> str:
        """"tune" for a tuning run (it evaluates on validation sets), else "final"."""
        return run_stage(self.config)

    @property
    def describe(self) -> str:
        values = " ".join(f"{k}={v}" for k, v in self.swept.items())
        return f"{'tuning ' if self.stage == TUNE else ''}{values} seed={self.seed}".strip()


@dataclass
class RunResult:
    """Everything a run records; the driver writes it to the store."""

    run_id: str
    status: Status
    steps_done: int = 0
    last_step: str | None = None  # under a FLOP or token budget: "whole", "partial" or "dropped" (workbench.cost.budget)
    metrics: dict[str, float] = field(default_factory=dict)  # final, per eval length
    not_applicable: dict[str, str] = field(default_factory=dict)  # eval length -> reason
    curves: list[tuple[int, str, str, float]] = field(default_factory=list)
    n_params: int | None = None
    diverged_step: int | None = None
    error: str | None = None
    wall_time_s: float = 0.0
    cpu_time_s: float | None = None  # CPU time of the run's process(es) (workbench.hardware.cpu_seconds); None: not recorded
    train_time_s: float = 0.0  # training steps only (evaluation excluded), over every attempt
    eval_time_s: float = 0.0  # evaluation, this attempt
    tokens: int = 0
    train_flops: int | None = None  # counted training FLOPs spent (workbench.cost.budget); None: not counted
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_instrument: str | None = None
    resumed_from_step: int | None = None
    environment: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.status = Status(self.status)  # a plain string read back becomes the enum (or fails here)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data; a metric or curve value that is not a finite number (a diverging
        loss) is null, so every result.json reads back under StoredResult's finite floats."""
        data = asdict(self)
        data["metrics"] = finite_metrics(self.metrics)
        data["curves"] = [(step, split, metric, finite_or_none(value)) for step, split, metric, value in self.curves]
        return data

    @classmethod
    def from_json(cls, data: Any) -> RunResult:
        """A result read back (result.json), checked field by field (pydantic.ValidationError)."""
        return cls(**StoredResult.model_validate(data).model_dump())


def finite_or_none(value: Any) -> float | None:
    """A number as stored: None for one that is not finite (NaN: nothing measured), or already None
    (a result read back from result.json, where it was written as null)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def finite_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics as recorded: a float that is not finite (NaN: nothing measured) becomes None."""
    return {key: finite_or_none(value) if isinstance(value, float) else value for key, value in metrics.items()}


# Values read back from a file or store the workbench did not necessarily write: what it writes
# is finite, whole numbers are never booleans, and every count fits SQLite's 64-bit INTEGER.
MAX_COUNT = 2**63 - 1
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]
Number = Annotated[float, Field(allow_inf_nan=False)]
Value = Annotated[bool, Strict()] | Annotated[int, Strict()] | Number | str | None  # a metric, or a scaling study's instrument label
# A run's final metrics: a few per eval length (26 at most in the shipped stores); the report
# makes a column of each, so a crafted store of 99,000 per run took it minutes.
MAX_METRICS = 1000
Metrics = Annotated[dict[str, Value], Field(max_length=MAX_METRICS)]


class StoredResult(BaseModel):
    """The shape of a RunResult read back from a file the workbench did not necessarily write."""

    model_config = ConfigDict(extra="forbid")
    run_id: str
    status: Status
    steps_done: Count = 0
    last_step: Literal["whole", "partial", "dropped"] | None = None
    metrics: Metrics = {}
    not_applicable: dict[str, str] = {}
    curves: list[tuple[Count, str, str, Number | None]] = []
    n_params: Count | None = None
    diverged_step: Count | None = None
    error: str | None = None
    wall_time_s: Seconds = 0.0
    cpu_time_s: Seconds | None = None
    train_time_s: Seconds = 0.0
    eval_time_s: Seconds = 0.0
    tokens: Count = 0
    train_flops: Count | None = None
    tokens_per_s: Seconds | None = None
    peak_memory_bytes: Count | None = None
    peak_memory_instrument: str | None = None
    resumed_from_step: Count | None = None
    environment: dict[str, Any] = {}


def first_problem(err: ValidationError) -> str:
    """pydantic's first problem as `field.path: message`, for a one-line refusal."""
    problem = err.errors()[0]
    where = '.'.join(map(str, problem['loc']))[:80]
    return f"{where}: {problem['msg'][:120]}" if where else problem["msg"][:120]


def iso_timestamp(text: str) -> str:
    datetime.fromisoformat(text)  # ValueError for what is not one
    return text


MAX_TEXT_CHARS = 100_000  # a run's error message is one line; a report prints it whole


class StoredRow(BaseModel):
    """A store's `runs` row, its JSON columns decoded, checked before any table is built from it
    (the report computes spans and counts from its numbers)."""

    error: Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | None
    last_step: Literal["whole", "partial", "dropped"] | None
    peak_memory_instrument: Annotated[str, Field(max_length=200)] | None
    swept: dict[str, Any]
    config: dict[str, Any]
    metrics: Metrics
    not_applicable: dict[str, str]
    environment: dict[str, Any]
    status: Status
    recorded_at: Annotated[str, AfterValidator(iso_timestamp)]
    index: Count
    seed: Count
    attempts: Count
    n_params: Count | None
    steps_done: Count | None
    diverged_step: Count | None
    train_tokens: Count | None
    train_flops: Count | None
    peak_memory_bytes: Count | None
    resumed_from_step: Count | None
    wall_time_s: Seconds | None
    cpu_time_s: Seconds | None
    train_time_s: Seconds | None
    eval_time_s: Seconds | None
    tokens_per_s: Seconds | None


def write_text_atomic(path: Path, text: str) -> None:
    """Write `path` through a temporary file renamed over it: a reader sees the old file or the
    whole new one, never half, and a symbolic link planted at either name is replaced, never
    followed (a received run folder cannot make the workbench write outside it)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(tmp, path)


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, default=str))


def write_folder_atomically(out: str | Path, write: Callable[[Path], None], what: str = "OUT") -> Path:
    """Write the folder `out` whole or not at all, never through a link: `write(folder)` fills
    a fresh temporary sibling (mkdtemp creates a new name, so nothing planted there is
    followed), which is then renamed to `out`. `out` must be absent or an empty folder (a
    rename replaces only that); a link, a file or a folder holding anything is refused, naming
    `what`, before anything is written. An OSError is one line (errors.write_error: a full disk
    told apart from a place that cannot be written) and leaves no temporary folder behind."""
    refuse_as_new_folder(out, what)
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent))
    except OSError as err:
        raise write_error(out, err, "create the folder") from None
    try:
        try:
            write(folder)
        except Exception as err:  # a library in Rust (safetensors, tokenizers) words an OSError as text
            code = re.search(r"\(os error (\d+)\)", str(err))
            if isinstance(err, OSError) or code is None:
                raise
            raise OSError(int(code[1]), os.strerror(int(code[1]))) from None
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(folder, 0o777 & ~umask)  # mkdtemp's 0700, made as a plain mkdir would make it
        os.rename(folder, out)  # replaces an empty folder, or a link planted meanwhile (never followed)
    except OSError as err:
        raise write_error(out, err) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # gone after the rename; a failed write's leftovers
    return out


def refuse_as_new_folder(out: str | Path, what: str) -> None:
    """WorkbenchError unless `out` names a folder to create: absent, or an empty folder."""
    if not str(out) or Path(out).name in ("", ".", ".."):
        raise WorkbenchError(f"{what}: {str(out)!r} names no new folder; give the path of a folder to create")
    try:
        mode = os.lstat(out).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise write_error(out, err, "create the folder") from None
    if stat.S_ISLNK(mode):
        raise WorkbenchError(f"{what}: {out} is a symbolic link (to {os.readlink(out)}); the workbench follows no "
                             "link where it writes: give a new folder (or an empty one)")
    if not stat.S_ISDIR(mode):
        raise WorkbenchError(f"{what}: {out} exists and is not a folder; give a new folder (or an empty one)")
    if any(os.scandir(out)):
        raise WorkbenchError(f"{what}: {out} already holds files; give a new folder (or an empty one), or move "
                             "that one away first")


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted.key: value} (the keys sweeps and `--set` use)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


# ---- reading back what a folder holds -----------------------------------------------------
#
# Reading what a received folder holds: a results folder, a run folder, a report folder may
# come from someone else, and hold links, FIFOs, devices, huge or deeply nested files planted to
# make a command read or write elsewhere, block forever, or exhaust memory.
#
#     check_regular(path)      lstat only: a regular file, absent, or refused (link, FIFO, ...)
#     open_regular(path)       opened without following a link and without blocking on a FIFO
#     read_regular(path, max)  its bytes, at most `max`
#     load_json(data, what)    JSON bounded in depth and values, without NaN or Infinity,
#                              refused with `what` named
#
# Every refusal is one UnsafeFile (a WorkbenchError) or ValueError naming the file or field.


class UnsafeFile(WorkbenchError):
    """A file a command would read is a link, a FIFO, a device or a folder, or is too large."""


def check_regular(path: str | Path) -> bool:
    """True when `path` is a regular file, False when it is absent; UnsafeFile for a symbolic
    link or anything else (lstat: nothing is opened, so a FIFO cannot block)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(mode):
        raise UnsafeFile(link_error(Path(path), Path(path).parent).args[0])
    if not stat.S_ISREG(mode):
        raise not_regular(path, mode)
    return True


def file_kind(mode: int) -> str:
    """What an lstat/stat mode names, in words: 'folder', 'FIFO', 'character device', ..."""
    return next((name for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "folder"),
                                         (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                                         (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))
                 if test(mode)), "special file")


def not_regular(path: str | Path, mode: int) -> UnsafeFile:
    return UnsafeFile(f"{path} is not a regular file (a {file_kind(mode)}); the workbench reads only files it wrote "
                      "there: remove it (or copy the folder without it) and run again")


def open_regular(path: str | Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file: never through a link, and without
    blocking (O_NONBLOCK: opening a FIFO returns at once, then fstat refuses it); UnsafeFile
    for a link or a file that is not regular, FileNotFoundError when it is absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            check_regular(path)
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(path, mode)
    return os.fdopen(fd, "rb")


def read_regular(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of the regular file `path` (open_regular); UnsafeFile when over `max_bytes`."""
    with open_regular(path) as file:
        data = file.read(max_bytes + 1)  # a file growing meanwhile is cut here too
    if len(data) > max_bytes:
        raise UnsafeFile(f"{path} is over {max_bytes / 2**20:.3g} MiB, more than the workbench writes there: "
                         "move it away and run again")
    return data


MAX_JSON_DEPTH = 32  # a run config nests about 5 levels; a crafted file, thousands
MAX_JSON_VALUES = 2_000_000  # a long run's curves: a few hundred thousand values
# An integer's digits: a count or size the workbench writes has at most about 20 (FLOPs, bytes); one
# of hundreds would overflow a float (10**309) wherever it is read as one.
MAX_JSON_DIGITS = 100


def load_json(data: str | bytes, what: str, max_depth: int = MAX_JSON_DEPTH, max_values: int = MAX_JSON_VALUES,
              non_finite_as_null: bool = False):
    """JSON from a file or store column the workbench may not have written: ValueError naming
    `what` for invalid JSON, NaN or Infinity (never written: values that are not finite are
    recorded as null; `non_finite_as_null` reads them as null, as stores written before did
    write them; a number too large for a float, 1e400, is one too), an integer of more than
    MAX_JSON_DIGITS digits, nesting deeper than `max_depth` or more than `max_values` values."""

    def refuse_constant(name: str):
        if non_finite_as_null:
            return None
        raise ValueError(f"{what}: {name[:20]} is not a finite number")

    def finite_float(text: str):
        number = float(text)
        return number if math.isfinite(number) else refuse_constant(text)

    def bounded_int(text: str) -> int:
        if len(text.lstrip("-")) > MAX_JSON_DIGITS:
            raise ValueError(f"{what}: an integer of {len(text.lstrip('-'))} digits, more than the workbench writes")
        return int(text)

    try:
        value = json.loads(data, parse_constant=refuse_constant, parse_float=finite_float, parse_int=bounded_int)
    except RecursionError:  # the C parser's own bound (a thousand levels), met long before a stack overflow
        raise ValueError(f"{what}: nested over {max_depth} levels deep") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{what}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what}: not UTF-8 text") from None
    values, level = 0, [value]
    for depth in range(max_depth + 1):
        if not level:
            return value
        values += len(level)
        if values > max_values:
            raise ValueError(f"{what}: holds over {max_values} values, more than the workbench writes")
        level = [item for node in level if isinstance(node, (dict, list))
                 for item in (node.values() if isinstance(node, dict) else node)]
    raise ValueError(f"{what}: nested over {max_depth} levels deep")


def link_error(link: Path, root: Path) -> WorkbenchError:
    try:
        target = os.readlink(link)
    except OSError:
        target = "?"
    return WorkbenchError(f"{link} is a symbolic link (to {target}); the workbench writes only inside {root} and "
                          "follows no link there: remove the link (or copy the folder without links) and run again")


# ---- source ----------------------------------------------------------------------------------

SHORT = 12  # hex digits of a commit a report prints


SOURCE_ROOT = Path(__file__).resolve().parent.parent


def git_commit(root: Path = SOURCE_ROOT) -> str | None:
    """The commit of the workbench source tree, when it is a git checkout; "+dirty" when a tracked
    file outside `reports/` was edited (reports are what the tree produces, not its source: a
    report rebuilt beside others not yet committed is still built by clean code)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if commit.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)reports"],
                               cwd=root, capture_output=True, text=True, timeout=5)
        return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def short_commit(commit: str | None) -> str:
    """A commit as a report prints it: 12 hex digits, "+dirty" kept; "not recorded" for None."""
    if not commit:
        return "not recorded"
    head, _, dirty = commit.partition("+")
    return head[:SHORT] + (f"+{dirty}" if dirty else "")
