"""Cost measurements of one workload at one size: time, FLOPs, activation and peak memory.

A `Point` names what to measure: a model spec, a `scope` (how much of the model), a `mode`
and a sequence length. `measure_point` builds the workload and applies four instruments,
each of which labels its figures with what it is:

    time        perf_counter around each call (CUDA: synchronized), warm-up then repeats;
                median, quartiles, min and max
    FLOPs       two accountings, computed the same way for every attention variant:
                `flops` (useful work): FlopCounterMode's count outside the attention
                variant (projections, FFN, head) plus 4 * h * hd FLOPs per (query, key)
                pair the variant's pattern allows (x3 for a training step);
                `flops_executed` (what the kernels compute): FlopCounterMode's count of
                everything, masked scores of an explicit n x n matrix and whole tiles of
                blocked or fused kernels included (the CPU flash-attention kernel, which
                torch's counter does not know, by its tiles: `cpu_flash_attention_flops`)
    activation  bytes of the tensors autograd saves for backward (saved_tensors_hooks,
                one count per storage so views are not counted twice): exact on any device
    peak memory CUDA: max_memory_allocated over the allocation at call start;
                CPU: peak live tensor bytes allocated during the call (workbench.cost.memory,
                a TorchDispatchMode over storages); the process' peak-RSS growth is kept
                apart as `process_peak_rss_delta_bytes` (allocator and library noise
                included: a label, never the headline)

`run_points` measures each point in a fresh spawned process, so allocator caches, lazy
kernel initialisation and fragmentation from one point never reach the next; a point that
runs out of memory or past its time budget is recorded with status "oom" / "timeout" and
the remaining points still run.

Scopes:  attention  the attention variant alone on given q, k, v (no projections)
         layer      one self-attention layer: QKV projection, position rotation,
                    attention, output projection
         block      one Transformer block: the layer above, norms and the FFN
         model      the whole model of the spec (embedding, every block, LM head)
Modes:   forward    inference forward (no autograd graph)
         train_step forward + backward of the output's sum (parameter and input grads)
         decode     one generated token at context `length`, with or without the KV
                    cache (scope model, decoder family); without the cache the model
                    recomputes the whole context but, like nanoGPT's generate, applies the
                    LM head to the last position only
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import os
import platform
import queue
import resource
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from workbench.attention import FLEX_BLOCK, AttentionVariant, arange_positions, flex_disabled, flex_eligible
from workbench.cache import KVCache
from workbench.ffn import FeedForward
from workbench.hardware import cpu_seconds, machine_load
from workbench.cost.memory import INSTRUMENT as TENSOR_BYTES_INSTRUMENT
from workbench.cost.memory import peak_tensor_bytes
from workbench.model import Block, CrossAttention, DecoderModel, Positions, SelfAttention, build_model
from workbench.registry import get_variant, plugin_manager
from workbench.results import Status
from workbench.spec import ModelSpec, parse_spec

Scope = Literal["attention", "layer", "block", "model"]
Mode = Literal["forward", "train_step", "decode"]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Point(BaseModel):
    """One measurement: what to build, at which size, in which mode."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: dict[str, Any] = Field(description="model spec mapping (as a study's `model:` section)")
    scope: Scope = "layer"
    mode: Mode = "forward"
    length: int = Field(gt=0, description="sequence length; for decode, the context length")
    batch_size: int = Field(1, gt=0)
    kv_cache: bool | None = Field(None, description="decode only: read past K/V from the cache")
    warmup: int = Field(1, ge=0, description="untimed calls before the timed ones")
    repeats: int = Field(5, gt=0, description="timed calls")
    seed: int = Field(0, description="seed of the parameters and inputs")
    device: str = "cpu"
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    threads: int | None = Field(None, gt=0, description="torch CPU threads (None: torch's default)")
    memory_limit_gb: float | None = Field(
        None, gt=0, description="cap on the point's memory (isolated runs only): its address-space growth on "
        "the CPU, what PyTorch's caching allocator may reserve on CUDA"
    )


# ---- instruments ---------------------------------------------------------------------------


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


@dataclass(frozen=True)
class FlopCount:
    total: int
    by_module: dict[str, int]  # FlopCounterMode's module names ("Block.attn.qkv") -> FLOPs
    by_op: dict[str, int] = field(default_factory=dict)  # operator name ("aten.mm") -> FLOPs


# The CPU flash-attention kernel (ATen native/cpu/FlashAttentionKernel.cpp, float32 path) cuts
# queries into blocks of 32, 64 or 256 rows (by query length) and keys into blocks of 512; a
# causal call skips the key blocks that start after its query block's last row.
def _cpu_flash_blocks(n_queries: int) -> int:
    return 256 if n_queries >= 768 else 64 if n_queries >= 192 else 32


CPU_FLASH_KEY_BLOCK = 512


def cpu_flash_pairs(n_queries: int, n_keys: int, causal: bool) -> int:
    """(query, key) pairs one head of the CPU flash kernel computes scores for: whole tiles,
    the masked part of the diagonal tiles included."""
    q_block, kv_block = min(_cpu_flash_blocks(n_queries), n_queries), min(CPU_FLASH_KEY_BLOCK, n_keys)
    pairs = 0
    for start in range(0, n_queries, q_block):
        rows = min(q_block, n_queries - start)
        reach = min(start + rows, n_keys) if causal else n_keys
        pairs += rows * min(-(-reach // kv_block) * kv_block, n_keys)
    return pairs


def cpu_flash_attention_flops(query, key, value, dropout_p=0.0, is_causal=False, *args, out_shape=None,
                              **kwargs) -> int:
    """Forward: q.k^T and weights.v over the tiles (2 FLOPs per multiply-add each)."""
    b, h, nq, d = query
    return 2 * b * h * cpu_flash_pairs(nq, key[2], is_causal) * (d + value[3])


def cpu_flash_attention_backward_flops(grad_out, query, key, value, out, logsumexp, dropout_p=0.0,
                                       is_causal=False, *args, out_shape=None, **kwargs) -> int:
    """Backward over the same tiles: the scores recomputed, then dV, dP, dQ and dK (five
    matrix products, 2.5 x the forward), as the kernel's backward loop does."""
    b, h, nq, d = query
    return 2 * b * h * cpu_flash_pairs(nq, key[2], is_causal) * (3 * d + 2 * value[3])


KERNEL_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash_attention_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_flash_attention_backward_flops,
}


def count_flops(fn: Callable[[], Any]) -> FlopCount:
    """FLOPs of one call of `fn` as FlopCounterMode counts them (matmul-like ops), with the
    CPU flash-attention kernel counted by its tiles (KERNEL_FLOPS). FlexAttention, which the
    counter cannot run under it, is switched off for the call: variants take their own path
    (`flex_tile_flops` counts what the FlexAttention kernel computes instead)."""
    with flex_disabled(), FlopCounterMode(display=False, custom_mapping=KERNEL_FLOPS) as counter:
        fn()
    counts = counter.get_flop_counts()
    by_module = {name: sum(ops.values()) for name, ops in counts.items()}
    by_op = {str(op): flops for op, flops in counts.get("Global", {}).items()}
    return FlopCount(total=counter.get_total_flops(), by_module=by_module, by_op=by_op)


@contextmanager
def on_attention_calls(root: nn.Module, hook: Callable[[AttentionVariant, tuple, dict], None]) -> Iterator[None]:
    """Within the block, `hook(variant, args, kwargs)` runs before every attention-variant call in root."""
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True)
               for m in root.modules() if isinstance(m, AttentionVariant)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# Backward of a flash-style kernel over the same tiles: scores recomputed, then dV, dP, dQ and dK
# (five matrix products against the forward's two).
FLASH_BACKWARD_RATIO = 2.5


@contextmanager
def flex_tile_flops(root: nn.Module) -> Iterator[dict[str, int]]:
    """Within the block, each attention-variant call that would run FlexAttention adds the
    forward FLOPs of the tiles its block mask computes (partial and full 128 x 128 tiles, each
    whole: 4 * hd per (query, key) pair of a tile, per head) to the yielded mapping, under the
    FlopCounterMode name of the variant's module (`module_groups`)."""
    prefix = type(root).__name__
    names = {module: f"{prefix}.{name}" if name else prefix for name, module in root.named_modules()}
    flops: dict[str, int] = {}

    def hook(module: AttentionVariant, args, kwargs) -> None:
        q = args[0]  # [B, h, n, hd]
        if not flex_eligible(q, kwargs["q_pos"], kwargs["k_pos"], kwargs["key_mask"]):
            return
        mask = module.flex_block_mask(q.shape[2], kwargs["causal"], q.device)
        tiles = mask.kv_num_blocks.sum() + (0 if mask.full_kv_num_blocks is None else mask.full_kv_num_blocks.sum())
        heads_per_mask = q.shape[1] // mask.kv_num_blocks.shape[1]  # a pattern shared by all heads, or one per head
        pairs = int(tiles) * heads_per_mask * FLEX_BLOCK * FLEX_BLOCK * q.shape[0]
        flops[names[module]] = flops.get(names[module], 0) + 4 * q.shape[3] * pairs

    with on_attention_calls(root, hook):
        yield flops


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


def _rss_bytes(field_name: str) -> int:
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
    base = _rss_bytes("VmRSS") if _reset_peak_rss() else _ru_maxrss_bytes()
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


def is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    # The CPU allocator raises a plain RuntimeError when malloc fails.
    return isinstance(err, RuntimeError) and ("can't allocate memory" in str(err) or "out of memory" in str(err))


# ---- analytic attention FLOPs --------------------------------------------------------------


def allowed_pairs(variant: AttentionVariant, q_pos: Tensor, k_pos: Tensor, causal: bool,
                  key_mask: Tensor | None = None, chunk: int = 1024) -> int:
    """Number of (query, key) pairs the variant lets interact, summed over the batch.

    q_pos [B, nq], k_pos [B, nk]; evaluated in row chunks so n x n never lives in memory.
    A pattern that differs per head (sparse) counts its pairs per head, averaged over heads."""
    total, heads = 0, 1
    for start in range(0, q_pos.shape[1], chunk):
        rows = q_pos[:, None, start : start + chunk, None]  # [B, 1, c, 1]
        keep = variant.allowed(rows, k_pos[:, None, None, :], causal)  # [B, 1 or h, c, nk]
        if key_mask is not None:
            keep = keep & key_mask[:, None, None, :]
        heads = keep.shape[1]
        total += int(keep.expand(rows.shape[0], heads, rows.shape[2], k_pos.shape[1]).sum())
    return round(total / heads)


@contextmanager
def analytic_attention_flops(root: nn.Module) -> Iterator[list[int]]:
    """Within the block, each attention-variant call adds its forward FLOPs to the yielded
    list: 4 * h * hd per allowed (query, key) pair (q.k and the weighted sum of v, 2 FLOPs
    per multiply-add each). This is the work the variant's pattern requires; a kernel that
    computes whole tiles, or masks a full matrix, does more."""
    flops: list[int] = []

    def hook(module: AttentionVariant, args, kwargs) -> None:
        q = args[0]  # [B, h, nq, hd]
        pairs = allowed_pairs(module, kwargs["q_pos"], kwargs["k_pos"], kwargs["causal"], kwargs["key_mask"])
        flops.append(4 * q.shape[1] * q.shape[3] * pairs)

    with on_attention_calls(root, hook):
        yield flops


def module_groups(root: nn.Module) -> dict[str, str]:
    """FlopCounterMode module name -> cost group ("attention", "projections", "ffn") for the
    outermost module of each group, so that no FLOP is counted in two groups."""
    prefix = type(root).__name__
    groups: dict[str, str] = {}
    for name, module in root.named_modules():
        if isinstance(module, AttentionVariant):
            group = "attention"
        elif isinstance(module, FeedForward):
            group = "ffn"
        elif isinstance(module, nn.Linear) and isinstance(_parent(root, name), (SelfAttention, CrossAttention)):
            group = "projections"
        else:
            continue
        groups[f"{prefix}.{name}" if name else prefix] = group
    return groups


def _parent(root: nn.Module, name: str) -> nn.Module | None:
    if not name:
        return None
    parent = name.rpartition(".")[0]
    return root.get_submodule(parent) if parent else root


# ---- workloads -----------------------------------------------------------------------------


@dataclass
class Workload:
    """A built module and a zero-argument call that runs the measured computation once."""

    root: nn.Module
    run: Callable[[], None]
    backward_factor: int = 1  # analytic FLOPs: forward only (1) or forward + backward (3)
    kv_cache_bytes: int | None = None
    kv_cache_bytes_formula: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)


def _causal(spec: ModelSpec) -> bool:
    return spec.family != "encoder"


def _inputs_and_module(spec: ModelSpec, scope: Scope, n: int, B: int, device, dtype):
    """(module, forward callable taking nothing and returning the output tensor)."""
    causal = _causal(spec)
    seq = Positions(arange_positions(B, n, device), None)
    make_position = lambda: spec.position.cls(  # noqa: E731
        spec.position.params, d_model=spec.d_model, n_heads=spec.n_heads, head_dim=spec.head_dim)
    if scope == "attention":
        module = spec.attention.cls(spec.attention.params, n_heads=spec.n_heads,
                                    n_kv_heads=spec.n_kv_heads, head_dim=spec.head_dim)
        q = torch.randn(B, spec.n_heads, n, spec.head_dim, device=device, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(B, spec.n_kv_heads, n, spec.head_dim, device=device, dtype=dtype,
                            requires_grad=True) for _ in range(2))
        return module.to(device), lambda: module(q, k, v, q_pos=seq.pos, k_pos=seq.pos, key_mask=None,
                                                 causal=causal, score_bias=None)
    if scope in ("layer", "block"):
        position = make_position()
        module = SelfAttention(spec, position) if scope == "layer" else Block(spec, position, causal, cross=False)
        module = module.to(device=device, dtype=dtype)
        x = torch.randn(B, n, spec.d_model, device=device, dtype=dtype, requires_grad=True)
        if scope == "layer":
            return module, lambda: module(x, seq, causal)
        return module, lambda: module(x, seq)
    model = build_model(spec).to(device=device, dtype=dtype)
    tokens = torch.randint(spec.vocab_size, (B, n), device=device)
    if spec.family == "encoder_decoder":
        return model, lambda: model(tokens, tokens)
    return model, lambda: model(tokens)


class NextTokenLogits(nn.Module):
    """The decoding step of a decoder model as one module, so that the FLOP counter names its
    parts from one root: the blocks over the new tokens, then the LM head on the last
    position only (as nanoGPT's generate; the head over the whole context is not decoding)."""

    def __init__(self, model: DecoderModel):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, seq: Positions, cache: KVCache | None) -> Tensor:
        return self.model.head(self.model.decoder(tokens, seq, cache=cache)[:, -1])  # [B, vocab]


def _decode_workload(spec: ModelSpec, point: Point, device, dtype) -> Workload:
    """One new token at context `length`: with the cache, a single-token step against the
    cached K/V of the prefilled context; without it, a forward over context + 1 tokens."""
    if point.scope != "model" or spec.family != "decoder":
        raise ValueError(f"decode measures a decoder model at scope 'model' (got scope {point.scope!r}, "
                         f"family {spec.family!r})")
    model = build_model(spec).to(device=device, dtype=dtype).eval()
    B, L = point.batch_size, point.length
    n_layers = len(model.decoder.blocks)
    logits = NextTokenLogits(model)

    if not point.kv_cache:
        tokens = torch.randint(spec.vocab_size, (B, L + 1), device=device)
        seq = Positions.of(tokens, None)
        return Workload(logits, torch.no_grad()(lambda: logits(tokens, seq, None)))

    # Every call appends one token: room for all calls measure_point makes (warm-up, peak,
    # RSS, FLOPs, repeats). The context thus grows from L to at most L + calls during measurement.
    calls = point.warmup + point.repeats + 6
    window = model._cache_window()
    capacity = min(L + calls, window) if window else L + calls
    cache = KVCache(n_layers, capacity)
    prompt = torch.randint(spec.vocab_size, (B, L), device=device)
    with torch.no_grad():
        logits(prompt, Positions.of(prompt, None), cache)
    held_tokens = min(L, window) if window else L
    formula = 2 * n_layers * spec.n_kv_heads * spec.head_dim * held_tokens * B * torch.empty((), dtype=dtype).element_size()
    measured = cache.nbytes  # after the prompt: exactly the context's K/V
    next_pos = [L]

    @torch.no_grad()
    def step() -> None:
        token = torch.randint(spec.vocab_size, (B, 1), device=device)
        logits(token, Positions(torch.full((B, 1), next_pos[0], device=device), None), cache)
        next_pos[0] += 1

    return Workload(logits, step, kv_cache_bytes=measured, kv_cache_bytes_formula=formula)


def parameters_of(module: nn.Module) -> list[Tensor]:
    # Not module.parameters(): on variant classes the Variant mixin's `parameters()` (the
    # listing of declared Params) shadows nn.Module's.
    return [p for _, p in module.named_parameters()]


def build_workload(point: Point) -> Workload:
    spec = parse_spec(point.model)
    device, dtype = torch.device(point.device), DTYPES[point.dtype]
    torch.manual_seed(point.seed)
    if point.mode == "decode":
        return _decode_workload(spec, point, device, dtype)
    module, forward = _inputs_and_module(spec, point.scope, point.length, point.batch_size, device, dtype)
    if point.mode == "forward":
        module.eval()

        @torch.no_grad()
        def infer() -> None:
            forward()

        return Workload(module, infer)
    module.train()
    params = parameters_of(module)

    def train_step() -> None:
        for p in params:
            p.grad = None  # free last step's grads first: their memory is not this step's
        forward().float().sum().backward()

    # Backward of attention: grads of scores, of v, of q and of k: twice the forward's work.
    return Workload(module, train_step, backward_factor=3)


def counted_forward(model: nn.Module, forward: Callable[[], Any]) -> tuple[Any, int]:
    """`forward()`'s result and its useful FLOPs, counted as `flop_figures` counts `flops`
    (the counter outside the attention variant, the allowed pairs inside). Counting changes
    nothing the forward computes, so a training step can be counted as it runs."""
    out: list[Any] = []
    with analytic_attention_flops(model) as analytic:
        counted = count_flops(lambda: out.append(forward()))
    return out[0], flop_figures(counted, module_groups(model), sum(analytic))["flops"]


def train_step_flops(model: nn.Module, loss: Callable[[], Tensor]) -> int:
    """Useful FLOPs of one training step on a batch: the forward that `loss()` computes
    (`counted_forward`), x3 for forward + backward. Counted in eval mode without autograd
    and on a forked random state, so measuring a run's model changes nothing it computes."""
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            return 3 * counted_forward(model, loss)[1]
    finally:
        model.train(was_training)


# ---- one point -----------------------------------------------------------------------------


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


def flop_figures(counted: FlopCount, groups: dict[str, str], useful_attention: int,
                 flex_executed: dict[str, int] | None = None) -> dict[str, Any]:
    """The two FLOP accountings of one call (module docstring), per group, with their sources.

    useful_attention: FLOPs of the (query, key) pairs the pattern allows (analytic, backward
    included). flex_executed: FLOPs of the tiles FlexAttention computes, by variant module name
    (`flex_tile_flops`): they replace what the counter saw of those modules (their own path,
    counted while FlexAttention was off). Outside the attention variant both accountings are
    the counter's figures."""
    flex_executed = flex_executed or {}
    by_group = {"attention": 0, "projections": 0, "ffn": 0}
    for name, group in groups.items():
        by_group[group] += counted.by_module.get(name, 0)
    rest = counted.total - by_group["attention"]
    counted_attention = sum(flex_executed.get(name, counted.by_module.get(name, 0))
                            for name, group in groups.items() if group == "attention")
    if counted_attention == 0 and useful_attention > 0:
        # A kernel the counter has no formula for: its executed work is not known here, so
        # the executed figure falls back to the useful one and says so.
        executed_attention, executed_source = useful_attention, "flop_counter+allowed_pairs(kernel not counted)"
    else:
        tiles = any("flash_attention_for_cpu" in op for op in counted.by_op)
        executed_attention = counted_attention
        executed_source = ("flop_counter" + ("+cpu_flash_tiles" if tiles else "")
                           + ("+flex_block_mask_tiles" if flex_executed else ""))
    return {
        "flops": rest + useful_attention,
        "flops_source": "allowed_pairs+flop_counter(rest)",
        "flops_executed": rest + executed_attention,
        "flops_executed_source": executed_source,
        "flops_attention": useful_attention,
        "flops_executed_attention": executed_attention,
        "flops_projections": by_group["projections"],
        "flops_ffn": by_group["ffn"],
    }


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
    resource.setrlimit(resource.RLIMIT_AS, (_rss_bytes("VmSize") + limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return "address_space"


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
    attention = spec.attention.as_dict()
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
        "torch_version": torch.__version__, **machine_load(),
    }


def resolve_device(name: str) -> str:
    """'auto' is CUDA when present, else the CPU; whether a machine has the device named is
    workbench.hardware's question (`workbench run` refuses, `validate` notes it)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


__all__ = [
    "FlopCount", "Point", "Timing", "Workload", "allowed_pairs", "build_workload", "count_flops",
    "counted_forward", "measure_point", "peak_memory", "run_points", "saved_tensor_bytes", "time_call", "train_step_flops",
]
