"""What a run is and what it records: the record every layer reads, without torch or Lightning.

    RunConfig  one run of a sweep (id, sweep index, seed, swept labels, resolved config)
    RunResult  its outcome (status, final metrics, curves, cost, environment), written by the
               run as result.json and recorded by the driver in the store
    Status     the one vocabulary of outcomes, stored as its plain value ("finished", ...)

A run folder holds CONFIG_FILE, LAST_CHECKPOINT (resume), logs/, FINAL_WEIGHTS (for reports),
PROGRESS_FILE (step and loss while it trains) and RESULT_FILE.

Every record also names its source: `git_commit`, the commit of the workbench tree that trained
or measured it (in its environment), which every report states beside the one that built it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict


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

# Normalised attention entropy at the training length (workbench.model.transformer.attention_entropy),
# recorded when a study sets `train.attention_entropy: true`. Descriptive: no better direction.
ATTENTION_ENTROPY = "attention_entropy"
DESCRIPTIVE_METRICS = (ATTENTION_ENTROPY,)
# An `expect:` metric computed by the report, not recorded by runs: the share of a group's
# seeds that diverged or did not learn (lower is better).
FAILURE_SHARE = "failure_share"

# What a run has spent, recorded with every logged and evaluated step (curves split "progress"),
# so curves can be drawn against training tokens, counted FLOPs or training seconds.
PROGRESS = "progress"
PROGRESS_MEASURES = ("tokens", "flops", "seconds")
# What a run spent until its evaluations first reached a stated score (workbench.report.compute_curves).
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


class StoredResult(BaseModel):
    """The shape of a RunResult read back from a file the workbench did not necessarily write."""

    model_config = ConfigDict(extra="forbid")
    run_id: str
    status: Status
    steps_done: Count = 0
    last_step: Literal["whole", "partial", "dropped"] | None = None
    metrics: dict[str, Value] = {}
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


def iso_timestamp(text: str) -> str:
    datetime.fromisoformat(text)  # ValueError for what is not one
    return text


class StoredRow(BaseModel):
    """A store's `runs` row, its JSON columns decoded, checked before any table is built from it
    (the report computes spans and counts from its numbers)."""

    swept: dict[str, Any]
    config: dict[str, Any]
    metrics: dict[str, Value]
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


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted.key: value} (the keys sweeps and `--set` use)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


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
