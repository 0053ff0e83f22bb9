"""The measurements of a scaling study (`kind: scaling`, workbench.recipes.scaling): cost against
sequence length, one row per measurement.

    name: attention-cost
    kind: scaling
    model: {d_model: 256, n_heads: 4, n_layers: 1, position: none}
    sweep: {model.attention: [full, naive, {name: sliding_window, window: 256}]}
    scaling:
      lengths: [1024, 2048, 4096, 8192]
      modes: [forward, train_step]
      scope: layer
      time_budget_s: 300

Every sweep point (same sweep syntax as training studies, over `model.*` keys) is measured
at every length in every mode (workbench.cost.measure: time, FLOPs, activation and peak memory,
KV-cache bytes), each (point, length, mode) in a fresh process. A point that runs out of
memory or time is a row with status "oom" / "timeout"; the others still run. Rows go to the
same results store as training runs, so `workbench results` exports them flat; fits
(workbench.cost.fit) read that table.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from workbench import stopping
from workbench.run.executor import Executor, Job
from workbench.cost.measure import resolve_device, run_points
from workbench.cost.workload import Mode, Point, Scope
from workbench.results import RunConfig, RunResult, Status
from workbench.study.keys import digest, label

# limits are data: measuring them again gives the same
KEEP_ON_RERUN = frozenset({Status.FINISHED, Status.OOM, Status.TIMEOUT})


class ScalingSection(BaseModel):
    """What to measure at which lengths, and the limits of each measurement."""

    model_config = ConfigDict(extra="forbid")

    lengths: list[Annotated[int, Field(gt=0)]] = Field(min_length=1, description="sequence lengths (tokens)")
    modes: list[Mode] = Field(["forward", "train_step"], min_length=1,
                              description="forward (inference), train_step (forward + backward), decode (one token)")
    scope: Scope = Field("layer", description="attention (the kernel alone), layer (projections + attention), "
                         "block (+ norms and FFN), model (the whole model); decode always measures the model")
    batch_size: int = Field(1, gt=0, description="sequences per measured call")
    warmup: int = Field(1, ge=0, description="untimed calls before timing")
    repeats: int = Field(5, gt=0, description="timed calls; the median and quartiles are kept")
    time_budget_s: float = Field(600, gt=0, description="a measurement still running after this is recorded as timeout")
    memory_limit_gb: float | None = Field(
        None, gt=0, description="cap on each measurement's memory (the CPU: address-space growth; CUDA: what "
        "PyTorch's allocator may reserve); past it the point is recorded as oom")
    decode_lengths: list[Annotated[int, Field(gt=0)]] | None = Field(
        None, description="context lengths of decode measurements (default: lengths)")
    decode_cache: list[bool] = Field([True, False], min_length=1, description="decode with and/or without the KV cache")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when present")
    dtype: Literal["float32", "float16", "bfloat16"] = Field("float32", description="parameter and activation dtype")
    threads: int | None = Field(None, gt=0, description="torch CPU threads per measurement (default: torch's)")
    isolate: bool = Field(True, description="each measurement in a fresh process (false: in this one, no time budget)")

    def points(self, model: dict[str, Any], seed: int) -> list[Point]:
        """The measurements of one model: modes x lengths (decode: x cache on/off)."""
        common = dict(model=model, batch_size=self.batch_size, warmup=self.warmup, repeats=self.repeats,
                      device=resolve_device(self.device), dtype=self.dtype, threads=self.threads,
                      memory_limit_gb=self.memory_limit_gb, seed=seed)
        out = []
        for mode in self.modes:
            if mode == "decode":
                for cache, n in itertools.product(self.decode_cache, self.decode_lengths or self.lengths):
                    out.append(Point(scope="model", mode=mode, length=n, kv_cache=cache, **common))
            else:
                out.extend(Point(scope=self.scope, mode=mode, length=n, **common) for n in self.lengths)
        return out


class MeasuredStudy(Protocol):
    """What the measurements read of a scaling study (workbench.recipes.scaling.study.ScalingStudy)."""

    seeds: list[int]
    scaling: ScalingSection

    def sweep_points(self) -> list[dict[str, Any]]: ...

    def model_of(self, point: dict[str, Any]) -> dict[str, Any]: ...


def measurements(study: MeasuredStudy) -> list[tuple[dict[str, Any], Point]]:
    """(swept labels, point) for every sweep point x seed x mode x length, in that order."""
    out = []
    for point in study.sweep_points():
        model = study.model_of(point)
        swept = {key: label(value) for key, value in point.items()}
        for seed in study.seeds:
            out.extend((swept, p) for p in study.scaling.points(model, seed))
    return out


def run_scaling(study: MeasuredStudy, on_row: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Measure every point of the study; one flat row each (swept keys, the measurement's
    coordinates, figures with their instrument labels, status). No store involved."""
    rows = []
    for swept, point in measurements(study):
        row = {**swept, "seed": point.seed,
               **run_points([point], time_budget_s=study.scaling.time_budget_s, isolate=study.scaling.isolate)[0]}
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


COORDINATES = ("scope", "mode", "length", "kv_cache")


def measurement_id(model: dict[str, Any], point: Point) -> str:
    """What a measurement computes (not where or under which limits it runs)."""
    what = point.model_dump(exclude={"time_budget_s", "memory_limit_gb", "device", "threads"})
    return digest({"model": model, "point": what})


def run_result(run_id: str, row: dict[str, Any]):
    """A measured row as the store's RunResult: figures and their labels as metrics, peak
    memory in the store's own peak-memory columns."""
    skip = {"status", "error", "peak_bytes", "peak_instrument", "wall_s", "cpu_s", "variant", "seed",
            "device", "threads", "machine", "torch_version", "git_commit", "load_1m", "cores", *COORDINATES}
    metrics = {k: v for k, v in row.items() if k not in skip and v is not None}
    return RunResult(
        run_id=run_id, status=row["status"], metrics=metrics, error=row.get("error"),
        wall_time_s=row["wall_s"], cpu_time_s=row.get("cpu_s"), peak_memory_bytes=row.get("peak_bytes"),
        peak_memory_instrument=row.get("peak_instrument"),
        environment={k: row.get(k) for k in ("device", "threads", "machine", "torch_version", "git_commit", "load_1m",
                                                  "cores")},
    )


def measurement_runs(study: MeasuredStudy) -> list[RunConfig]:
    """Every measurement as a run of the store: its id says what it computes, its swept
    labels include the measurement's coordinates (scope, mode, length, kv_cache)."""
    runs = []
    for index, (swept, point) in enumerate(measurements(study)):
        runs.append(RunConfig(run_id=measurement_id(point.model, point), index=index, seed=point.seed,
                              swept={**swept, **{c: getattr(point, c) for c in COORDINATES}},
                              config={"model": point.model, "scaling": point.model_dump(exclude={"model"})}))
    return runs


class MeasureExecutor(Executor):
    """Measures one job at a time, each in a fresh process (workbench.cost.measure.run_points) under
    the study's time budget; yields one RunResult per measurement, failures included."""

    def __init__(self, section: ScalingSection):
        self.section = section

    def run(self, jobs: Sequence[Job]) -> Iterator[RunResult]:
        for job in jobs:
            if stopping.stop_requested():
                raise stopping.RunInterrupted("stopped before the next measurement")
            point = Point(model=job.config["model"], **job.config["scaling"])
            started = time.perf_counter()
            row = run_points([point], time_budget_s=self.section.time_budget_s, isolate=self.section.isolate)[0]
            row["wall_s"] = time.perf_counter() - started
            yield run_result(job.run_id, row)


def measurement_line(run: RunConfig, result: RunResult) -> str:
    """`finished model.attention=full scope=layer mode=forward length=1024  3.1 ms  0.52 GFLOP`"""
    where = " ".join(f"{k}={v}" for k, v in run.swept.items() if v is not None)
    if result.status != Status.FINISHED:
        return f"{result.status:<8} {where}  {(result.error or '').splitlines()[0] if result.error else ''}"
    metrics = result.metrics
    return f"{result.status:<8} {where}  {metrics['time_median_s'] * 1e3:.1f} ms  {metrics['flops'] / 1e9:.2f} GFLOP"
