"""Cost measurements of one workload at one size: time, FLOPs, activation and peak memory.

A `Point` names what to measure: a model spec, a `scope` (how much of the model), a `mode`
and a sequence length (workbench.cost.workload builds it). `measure_point` applies four
instruments, each of which labels its figures with what it is:

    time        perf_counter around each call (CUDA: synchronized), warm-up then repeats;
                median, quartiles, min and max (workbench.cost.timing)
    FLOPs       two accountings, computed the same way for every attention variant:
                `flops` (useful work) and `flops_executed` (what the kernels compute), per
                cost group (workbench.cost.flops)
    activation  bytes of the tensors autograd saves for backward (workbench.cost.memory_figures)
    peak memory CUDA: max_memory_allocated over the allocation at call start;
                CPU: peak live tensor bytes allocated during the call (workbench.cost.memory);
                the process' peak-RSS growth is kept apart as `process_peak_rss_delta_bytes`
                (allocator and library noise included: a label, never the headline)

`run_points` measures each point in a fresh spawned process, so allocator caches, lazy
kernel initialisation and fragmentation from one point never reach the next; a point that
runs out of memory or past its time budget is recorded with status "oom" / "timeout" and
the remaining points still run.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import platform
import queue
import resource
import signal
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

import torch

from workbench.cost.flops import FLASH_BACKWARD_RATIO, analytic_attention_flops, count_flops, flex_tile_flops
from workbench.cost.flops import flop_figures, module_groups
from workbench.cost.memory_figures import peak_memory, process_peak_rss_delta, return_freed_memory_to_os, rss_bytes
from workbench.cost.memory_figures import saved_tensor_bytes
from workbench.cost.timing import time_call
from workbench.cost.workload import Point, build_workload, parameters_of
from workbench.hardware import cpu_seconds, machine_load
from workbench.registry import get_variant, plugin_manager
from workbench.results import Status, git_commit
from workbench.model.spec import parse_spec


def measure_point(point: Point) -> dict[str, Any]:
    """Build the workload and measure it: one flat row of figures, each with its label."""
    if point.threads:
        torch.set_num_threads(point.threads)
    device = torch.device(point.device)
    workload = build_workload(point)
    row: dict[str, Any] = {"status": Status.FINISHED, "error": None}

    # Warm-up first: lazy initialisation (thread pools, kernel selection) is not the point's
    # memory. Peak memory is measured before the timed repeats, once per clean state.
    timing_warmup = time_call(workload.run, warmup=point.warmup, repeats=1, device=device)
    peak, peak_instrument = peak_memory(workload.run, device)
    row.update(peak_bytes=peak, peak_instrument=peak_instrument,
               process_peak_rss_delta_bytes=None if device.type == "cuda" else process_peak_rss_delta(workload.run))

    if point.mode == "train_step":
        row.update(activation_bytes=saved_tensor_bytes(workload.run, exclude=parameters_of(workload.root)),
                   activation_instrument="saved_tensors_hooks")
    else:
        row.update(activation_bytes=None, activation_instrument=None)

    with analytic_attention_flops(workload.root) as analytic, flex_tile_flops(workload.root) as flex_tiles:
        counted = count_flops(workload.run)
    flex_factor = 1 + (FLASH_BACKWARD_RATIO if workload.backward_factor > 1 else 0)
    row.update(flop_figures(counted, module_groups(workload.root), sum(analytic) * workload.backward_factor,
                            {name: round(f * flex_factor) for name, f in flex_tiles.items()}))

    timing = time_call(workload.run, warmup=0, repeats=point.repeats, device=device)
    row.update(
        time_median_s=timing.median_s, time_q25_s=timing.q25_s, time_q75_s=timing.q75_s,
        time_min_s=timing.min_s, time_max_s=timing.max_s, time_repeats=timing.repeats,
        time_instrument=timing.instrument, time_first_call_s=timing_warmup.max_s,
        kv_cache_bytes=workload.kv_cache_bytes, kv_cache_bytes_formula=workload.kv_cache_bytes_formula,
    )
    return row


# ---- many points, each in a clean process --------------------------------------------------

def _child(point: Point, results: mp.Queue) -> None:
    """Entry point of a spawned measuring process: reports ("ready",) then ("row", row)."""
    return_freed_memory_to_os()
    limit_memory(point)
    results.put(("ready",))
    results.put(("row", measure_point_safely(point)))


def limit_memory(point: Point) -> str | None:
    """Bound this (measuring) process's memory by `point.memory_limit_gb`, so a size that does not
    fit fails with an allocation error (recorded "oom") instead of the kernel's OOM killer; which
    bound it set: "address_space" on the CPU, "cuda_memory_fraction" on CUDA, None without a limit.

    CUDA maps far more virtual memory than it allocates (its context, the caching allocator), so
    an address-space cap would fail every CUDA point: there the caching allocator is capped
    instead, and past the cap torch raises torch.OutOfMemoryError."""
    if not point.memory_limit_gb:
        return None
    limit = int(point.memory_limit_gb * 2**30)
    device = torch.device(point.device)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
        return "cuda_memory_fraction"
    # Import every plugin first (some load scipy, whose BLAS threads cannot start under the cap),
    # then cap the address space above what the interpreter, torch and plugins already hold.
    plugin_manager()
    resource.setrlimit(resource.RLIMIT_AS, (rss_bytes("VmSize") + limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return "address_space"


def is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    # The CPU allocator raises a plain RuntimeError when malloc fails.
    return isinstance(err, RuntimeError) and ("can't allocate memory" in str(err) or "out of memory" in str(err))


def measure_point_safely(point: Point) -> dict[str, Any]:
    """measure_point, with failures as data: "oom" for allocation failures, "failed" otherwise."""
    try:
        return measure_point(point)
    except Exception as err:  # noqa: BLE001 - every failure of a point is recorded, not raised
        status = Status.OOM if is_out_of_memory(err) else Status.FAILED
        detail = f"{type(err).__name__}: {err}"
        if status == Status.FAILED:
            detail += "\n" + traceback.format_exc(limit=-3)
        return {"status": status, "error": detail[:2000]}
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run_points(points: Iterable[Point], *, time_budget_s: float = 600.0, isolate: bool = True,
               startup_timeout_s: float = 300.0,
               on_row: Callable[[Point, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Measure each point; each row is the point's fields, figures and status.

    isolate: each point in a fresh spawned process (allocator and RSS state start clean);
    a process still measuring after `time_budget_s` is killed and recorded as "timeout",
    one that dies from SIGKILL (the kernel's OOM killer) as "oom". Without isolation the
    points run here, one after the other, and the time budget is not enforced.
    """
    rows = []
    for point in points:
        started, cpu_started = time.perf_counter(), cpu_seconds()
        figures = _run_isolated(point, time_budget_s, startup_timeout_s) if isolate else measure_point_safely(point)
        row = {**point_columns(point), **figures, "wall_s": time.perf_counter() - started,
               "cpu_s": cpu_seconds() - cpu_started,
               **environment_columns(point)}
        rows.append(row)
        if on_row is not None:
            on_row(point, row)
    return rows


def _run_isolated(point: Point, time_budget_s: float, startup_timeout_s: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(target=_child, args=(point, results), daemon=True)
    process.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        ready = False
        while True:
            try:
                message = results.get(timeout=0.2)
            except queue.Empty:
                if not process.is_alive() and results.empty():
                    return _died(process)
                if time.monotonic() > deadline:
                    what = "measuring" if ready else "starting"
                    limit = time_budget_s if ready else startup_timeout_s
                    return {"status": Status.TIMEOUT, "error": f"still {what} after {limit:g} s"}
                continue
            if message[0] == "ready":
                ready, deadline = True, time.monotonic() + time_budget_s
            else:
                return message[1]
    finally:
        if process.is_alive():
            process.kill()
        process.join(timeout=30)
        results.close()


def _died(process) -> dict[str, Any]:
    process.join(timeout=5)
    code = process.exitcode
    if code == -signal.SIGKILL:
        return {"status": Status.OOM, "error": "measuring process killed by SIGKILL (the kernel's OOM killer)"}
    return {"status": Status.FAILED, "error": f"measuring process exited with code {code}"}


def point_columns(point: Point) -> dict[str, Any]:
    spec = parse_spec(point.model)
    attention = spec.uniform("attention", "a scaling study").as_dict()
    return {
        "variant": variant_label(attention),
        "scope": point.scope, "mode": point.mode, "length": point.length,
        "batch_size": point.batch_size, "kv_cache": point.kv_cache,
        "n_layers": spec.decoder_layers if spec.family != "encoder" else spec.encoder_layers,
        "d_model": spec.d_model, "n_heads": spec.n_heads, "n_kv_heads": spec.n_kv_heads,
        "head_dim": spec.head_dim, "dtype": point.dtype,
    }


def variant_label(attention: dict[str, Any]) -> str:
    """'sliding_window(window=256)': the attention name with its non-default parameters."""
    cls = get_variant("attention", attention["name"])
    defaults = cls.Params().model_dump() if _all_defaulted(cls) else {}
    shown = {k: v for k, v in attention.items() if k != "name" and defaults.get(k, object()) != v}
    inner = ",".join(f"{k}={v}" for k, v in shown.items())
    return f"{attention['name']}({inner})" if inner else attention["name"]


def _all_defaulted(cls) -> bool:
    return all(not f.is_required() for f in cls.Params.model_fields.values())


def environment_columns(point: Point) -> dict[str, Any]:
    return {
        "device": point.device, "threads": point.threads or torch.get_num_threads(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "torch_version": torch.__version__, "git_commit": git_commit(), **machine_load(),
    }


def resolve_device(name: str) -> str:
    """'auto' is CUDA when present, else the CPU; whether a machine has the device named is
    workbench.hardware's question (`workbench run` refuses, `validate` notes it)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


__all__ = ["measure_point", "run_points"]
