"""Model FLOPs utilisation: counted FLOPs per training step / step time / this machine's
measured fp32 GEMM peak (a 2048 x 2048 matmul on the same number of threads).

FLOPs come from torch.utils.flop_counter.FlopCounterMode (matmuls, convolutions and attention
kernels; element-wise work and the optimizer count zero, as in the usual MFU definition).
Its registry knows the CUDA attention kernels but not the CPU one that F.scaled_dot_product_
attention dispatches to, so `CPU_ATTENTION_FLOPS` adds it. For causal attention only the
allowed (query, key) pairs are counted: a causal kernel skips the rest, and counting them
would inflate the utilisation.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode


def _attention_pairs(q_shape, k_shape, is_causal: bool) -> int:
    """Number of (query, key) score entries computed per head, summed over batch and heads."""
    b, h, n_q, _ = q_shape
    n_k = k_shape[2]
    if not is_causal:
        return b * h * n_q * n_k
    # query i (aligned to the last keys) reads keys 0 .. i + n_k - n_q
    offset = n_k - n_q
    allowed = sum(min(n_k, i + offset + 1) for i in range(n_q))
    return b * h * allowed


def _cpu_sdpa_flop(q_shape, k_shape, v_shape, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                   scale=None, out_shape=None) -> int:
    # scores q k^T and weights @ v: 2 multiply-adds per pair and head dimension each
    return 2 * _attention_pairs(q_shape, k_shape, is_causal) * (q_shape[-1] + v_shape[-1])


def _cpu_sdpa_backward_flop(grad_out_shape, q_shape, k_shape, v_shape, out_shape_, lse_shape,
                            dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None,
                            out_shape=None) -> int:
    # dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: twice the forward's matmuls
    return 2 * _cpu_sdpa_flop(q_shape, k_shape, v_shape, is_causal=is_causal)


CPU_ATTENTION_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flop,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flop,
}


def count_flops(run: Callable[[], object]) -> int:
    """FLOPs of one call of `run` (e.g. a training step)."""
    counter = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS)
    with counter:
        run()
    return counter.get_total_flops()


GEMM_SIZE = 2048


def gemm(size: int = GEMM_SIZE) -> tuple[Callable[[], object], int]:
    """A size x size fp32 matmul to time, and its FLOPs. Timed interleaved with the training
    steps, it measures the peak under the same load from other processes as the model."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    return (lambda: torch.mm(a, b, out=out)), 2 * size**3


def gemm_peak(size: int = GEMM_SIZE, repeats: int = 10) -> dict[str, float]:
    """fp32 FLOP/s of a size x size matmul with torch's current thread count, measured alone:
    the best of `repeats` and the median."""
    run, flops = gemm(size)
    run()  # warm-up: thread pool, caches
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    seconds.sort()
    return dict(size=size, threads=torch.get_num_threads(), peak_flops=flops / seconds[0],
                median_flops=flops / seconds[len(seconds) // 2])
