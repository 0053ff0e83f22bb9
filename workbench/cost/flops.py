"""FLOPs of a call, in two accountings computed the same way for every attention variant.

    flops           useful work: FlopCounterMode's count outside the attention variant
                    (projections, FFN, head) plus 4 * h * hd FLOPs per (query, key) pair the
                    variant's pattern allows (x3 for a training step)
    flops_executed  what the kernels compute: FlopCounterMode's count of everything, masked
                    scores of an explicit n x n matrix and whole tiles of blocked or fused
                    kernels included (the CPU flash-attention kernel, which torch's counter
                    does not know, by its tiles: `cpu_flash_attention_flops`; FlexAttention by
                    the tiles of its block mask: `flex_tile_flops`)

`flop_figures` puts the two together per cost group (attention, projections, FFN);
`counted_forward` counts a training step's forward as it runs (compute budgets).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from workbench.model.attention import AttentionVariant
from workbench.model.ffn import FeedForward
from workbench.model.flex import FLEX_BLOCK, flex_disabled, flex_eligible
from workbench.model.mixer import TokenMixer
from workbench.model.transformer import CrossAttention


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


def triangular_solve_flops(a, b, *args, out_shape=None, **kwargs) -> int:
    """A triangular system of n unknowns, solved for each column of the right-hand side by
    substitution: a multiply-add per entry of the triangle, n^2 FLOPs per column (chunkwise
    linear-time mixers: plugins/attention_gated_deltanet.py). torch's counter has no formula for it."""
    return a[-1] * torch.Size(out_shape).numel()


KERNEL_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash_attention_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_flash_attention_backward_flops,
    torch.ops.aten.linalg_solve_triangular: triangular_solve_flops,
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
        elif isinstance(module, nn.Linear) and isinstance(_parent(root, name), (TokenMixer, CrossAttention)):
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
