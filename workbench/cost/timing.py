"""Time of a call: perf_counter around it (on CUDA, after the kernels finish), warm-up calls
first, then repeats; median, quartiles, min and max."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Timing:
    median_s: float
    q25_s: float
    q75_s: float
    min_s: float
    max_s: float
    repeats: int
    instrument: str


def time_call(fn: Callable[[], Any], *, warmup: int, repeats: int, device: torch.device) -> Timing:
    """Wall time of `fn`: `warmup` untimed calls, then `repeats` timed ones."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()  # CUDA launches are asynchronous: wait for the kernels, not just the launch
        times.append(time.perf_counter() - start)
    q25, _, q75 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else times * 3
    return Timing(
        median_s=statistics.median(times), q25_s=q25, q75_s=q75, min_s=min(times), max_s=max(times),
        repeats=repeats, instrument="perf_counter+cuda_synchronize" if cuda else "perf_counter",
    )
