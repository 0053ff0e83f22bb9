"""The memory figures of one measured call, each labelled with its instrument.

    activation  bytes of the tensors autograd saves for backward (saved_tensors_hooks,
                one count per storage so views are not counted twice): exact on any device
    peak memory CUDA: max_memory_allocated over the allocation at call start;
                CPU: peak live tensor bytes allocated during the call (workbench.cost.memory,
                a TorchDispatchMode over storages)
    process     the process' peak-RSS growth (`process_peak_rss_delta`): allocator and
                library noise included, a label, never the headline
"""

from __future__ import annotations

import ctypes
import gc
import resource
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from workbench.cost.memory import INSTRUMENT as TENSOR_BYTES_INSTRUMENT
from workbench.cost.memory import peak_tensor_bytes


def _storage_key(t: Tensor) -> tuple[str, int]:
    return str(t.device), t.untyped_storage().data_ptr()


def saved_tensor_bytes(fn: Callable[[], Any], exclude: Iterable[Tensor] = ()) -> int:
    """Bytes of the storages autograd saves for backward while `fn` runs.

    Each storage counts once, whole: a saved view keeps its entire storage alive, and two
    views of one storage are one allocation. Storages of `exclude` (the parameters) are
    not activations and are left out.
    """
    skip = {_storage_key(t) for t in exclude}
    seen: dict[tuple[str, int], int] = {}

    def pack(t: Tensor) -> Tensor:
        key = _storage_key(t)
        if key not in skip:
            seen[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def rss_bytes(field_name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{field_name} not in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Linux: reset the peak-RSS mark (VmHWM, which ru_maxrss reads) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _ru_maxrss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def peak_memory(fn: Callable[[], Any], device: torch.device) -> tuple[int, str]:
    """Peak memory growth during one call of `fn`, and the name of the instrument.

    CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus the memory
    allocated when the call starts (parameters, inputs). CPU: the peak of live tensor bytes
    allocated during the call (workbench.cost.memory.LiveTensorBytes): exact, and blind to the
    allocator, the interpreter and libraries, which the process RSS is not.
    """
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base, "cuda_max_allocated_delta"
    return peak_tensor_bytes(fn, device.type), TENSOR_BYTES_INSTRUMENT


def process_peak_rss_delta(fn: Callable[[], Any]) -> int:
    """Growth of the process' peak RSS (getrusage ru_maxrss, its mark reset to the current
    RSS first) over the RSS when the call starts: the whole process (allocator caches,
    libraries, page granularity), not the computation. Where the mark cannot be reset, the
    baseline is the peak so far."""
    gc.collect()
    base = rss_bytes("VmRSS") if _reset_peak_rss() else _ru_maxrss_bytes()
    fn()
    return max(_ru_maxrss_bytes() - base, 0)


def return_freed_memory_to_os() -> None:
    """glibc: serve every allocation over 128 KiB by mmap, so freed buffers leave the RSS.

    glibc otherwise raises its mmap threshold after the first large free and keeps later
    buffers in the heap; the RSS would then stay high after a warm-up and hide the next
    call's peak. Setting the threshold explicitly switches that adjustment off.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_mmap_threshold = -3
    libc.mallopt(m_mmap_threshold, 128 * 1024)
