"""The GPU check: one command that proves the GPU path and measures it (about 5 minutes on one GPU).

    python -m benchmarks.gpu                     # CUDA, GPU sizes
    python -m benchmarks.gpu --device cpu --tiny # the same sections at toy sizes (the test suite runs it)
    bash benchmarks/gpu_check.sh OUT             # on a fresh GPU machine: install, this, the CUDA tests, a study

Writes benchmarks/results/gpu-<device>.json (or --out), again after every section, so a run
stopped part-way keeps what it finished. Sections, each recorded even when another fails (its
error is kept, its check fails):

  train_quickstart  the quickstart study with `--profile gpu` (bf16-mixed), shortened to a few
                    hundred steps, one seed: every run finishes, peak memory comes from
                    `cuda_max_allocated`
  sdpa_backend      full attention's training step inside `sdpa_kernel([FLASH])`, then
                    `[EFFICIENT]`: a fallback to the math kernel raises instead of passing silently
  train_mfu         training tokens/s of the four benchmark configs (benchmarks/vs_xtransformers.py)
                    at d_model 1024, 8 layers, 16 heads, sequence 2048, batch 8, bf16 autocast;
                    MFU = model FLOPs (`train_flops`) / step time / the device's bf16 GEMM peak
                    (an 8192^2 matmul, best of 10)
  local_attention   one attention layer's forward + backward (B 1, 16 heads, head_dim 64, bf16):
                    sliding window (w 1024) and sparse (block 128) through FlexAttention against
                    full attention (flash SDPA), n = 8k, 16k, 32k, with each one's peak memory; at the
                    smallest n both equal the dense reference in values and gradients (on the CPU
                    also the FlexAttention path's forward, eager)
  scaling_points    a scaling study's measurement of FlexAttention variants (full + ALiBi, sliding
                    window): one layer's training step at the first attention length, each point in a
                    fresh measuring process; FlexAttention's executed FLOPs counted by its tiles
  decode            greedy generation with the KV cache (prompt 256, 256 new tokens, batch 1 and 8):
                    ours against x-transformers' `generate(cache_kv=True)` (skipped when it is not
                    installed)
  batched_seeds     several seeds as one batched model (`train.batch_seeds`, workbench.run.batched):
                    a training step's time per seed at K = 1, 4, 16, 64, the quickstart's decoder
                    and a d32 x 1 layer one, padded batches (a call per member) and fixed-length
                    ones (vmap): benchmarks/batched_seeds.py, float32 matmuls at 'high' (TF32)

Targets on an H100/H200-class GPU, reported as checks, not asserted: MFU >= 0.45;
sliding window and sparse >= 5x faster than full at n = 32k, with at most 2x its peak memory.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from torch import nn

from benchmarks import RESULTS_DIR, Check, write_json
from workbench.model.flex import arange_positions
from benchmarks.vs_xtransformers import BASE, CONFIGS, alternate, random_tokens, xtransformers_available

QUICKSTART = Path(__file__).resolve().parent.parent / "studies" / "quickstart.yaml"


@dataclass(frozen=True)
class Sizes:
    d_model: int = 1024
    n_layers: int = 8
    n_heads: int = 16
    seq: int = 2048
    batch: int = 8
    train_steps: int = 200  # of the quickstart under --profile gpu
    gemm: int = 8192
    attention_heads: int = 16
    attention_lengths: tuple[int, ...] = (8192, 16384, 32768)
    window: int = 1024
    sparse_block: int = 128
    prompt: int = 256
    new_tokens: int = 256
    decode_batches: tuple[int, ...] = (1, 8)
    decode_repeats: int = 3
    warmup: int = 2
    repeats: int = 5
    batched_ks: tuple[int, ...] = (1, 4, 16, 64)
    batched_steps: int = 20
    batched_rounds: int = 3


TINY = Sizes(d_model=64, n_layers=2, n_heads=4, seq=64, batch=4, train_steps=4, gemm=256, attention_heads=4,
             attention_lengths=(256, 512), window=32, sparse_block=16, prompt=8, new_tokens=8,
             decode_batches=(1, 2), decode_repeats=1, warmup=1, repeats=2, batched_ks=(1, 2), batched_steps=2,
             batched_rounds=1)


@dataclass(frozen=True)
class Setup:
    device: torch.device
    sizes: Sizes

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.cuda else torch.float32

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.cuda else nullcontext()

    def synced(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """fn, waiting for the GPU to finish, so wall-clock timing measures the work."""
        if not self.cuda:
            return fn

        def run():
            out = fn()
            torch.cuda.synchronize(self.device)
            return out

        return run


def median_s(times: list[float]) -> float:
    return statistics.median(times)


# ---- 1. the quickstart under --profile gpu ------------------------------------------------------


def quickstart_study(setup: Setup, folder: Path) -> tuple[Path, str | None]:
    """The quickstart study file, shortened (one seed, a few hundred steps), and the profile to run.
    On the CPU (--tiny) the gpu profile cannot run (bf16-mixed needs a GPU): no profile, 32-bit."""
    data = yaml.safe_load(QUICKSTART.read_text())
    data["seeds"] = data["seeds"][:1]
    steps = {"train.steps": setup.sizes.train_steps, "train.warmup_steps": max(1, setup.sizes.train_steps // 10),
             "train.eval_every": setup.sizes.train_steps, "train.log_every": max(1, setup.sizes.train_steps // 4)}
    if setup.cuda:
        data["profiles"]["gpu"].update(steps)
        data["profiles"]["gpu"]["train.accelerator"] = "gpu"
        profile = "gpu"
    else:
        data["train"].update({key.split(".", 1)[1]: value for key, value in steps.items()})
        data["train"].update(accelerator="cpu", precision="32")
        data["task"]["n_eval"] = 32
        profile = None
    path = folder / "quickstart-short.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, profile


def train_quickstart(setup: Setup) -> dict[str, Any]:
    from workbench.api import run_study
    from workbench.run.store import Store

    with tempfile.TemporaryDirectory() as folder:
        path, profile = quickstart_study(setup, Path(folder))
        start = time.perf_counter()
        run_study(path, Path(folder) / "out", jobs=1, fresh=True, profile=profile, quiet=True)
        seconds = time.perf_counter() - start
        runs = Store(Path(folder) / "out").runs()
    keep = ("run_id", "swept", "status", "peak_memory_bytes", "peak_memory_instrument", "tokens_per_s", "train_time_s")
    rows = [{key: run.get(key) for key in keep} | {"precision": run["config"]["train"]["precision"],
                                                    "metrics": run["metrics"]} for run in runs]
    return dict(profile=profile, seconds=seconds, runs=rows)


def quickstart_checks(setup: Setup, result: dict[str, Any]) -> list[Check]:
    runs = result["runs"]
    checks = [Check("quickstart runs finished", sum(r["status"] == "finished" for r in runs), ">=", 4)]
    if setup.cuda:
        checks.append(Check("quickstart runs measured with cuda_max_allocated",
                            sum(r["peak_memory_instrument"] == "cuda_max_allocated" for r in runs), ">=", 4))
    return checks


# ---- 2. full attention on a fused SDPA backend --------------------------------------------------


def build_decoder(setup: Setup, config: dict[str, Any], **changes) -> nn.Module:
    from workbench import build_model

    s = setup.sizes
    spec = {**config, "d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads, **changes}
    return build_model(spec).to(setup.device)


def train_step(setup: Setup, model: nn.Module, tokens: torch.Tensor) -> Callable[[], None]:
    """Forward (bf16 autocast on CUDA) + backward + fused AdamW on next-token prediction."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    model.train()

    def step() -> None:
        with setup.autocast():
            logits = model(inputs)  # (B, n, vocab)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return setup.synced(step)


def sdpa_backend(setup: Setup) -> dict[str, Any]:
    """Which fused SDPA kernel runs full attention's training step (RoPE and GQA configs):
    sdpa_kernel restricts the choice, so a fallback to the math kernel raises."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    s = setup.sizes
    out = {}
    for name in ("a: rope+swiglu+pre-rms", "d: gqa(kv=1)+rope"):
        model = build_decoder(setup, CONFIGS[name])
        tokens = random_tokens(2, s.seq + 1, BASE["vocab_size"]).to(setup.device)
        step = train_step(setup, model, tokens)
        out[name] = {}
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            try:
                with sdpa_kernel([backend]):
                    step()
                out[name][backend.name] = "ran"
            except RuntimeError as err:
                out[name][backend.name] = f"refused: {str(err).splitlines()[0][:200]}"
        del model
    return out


def sdpa_checks(result: dict[str, Any]) -> list[Check]:
    return [Check(f"{name}: training step on a fused SDPA kernel (flash or mem-efficient)",
                  float(any(v == "ran" for v in backends.values())), "==", 1.0)
            for name, backends in result.items()]


# ---- 3. training throughput and MFU -------------------------------------------------------------


def train_flops(model: nn.Module, n_heads: int, head_dim: int, batch: int, seq: int) -> int:
    """Matrix-multiply FLOPs of one causal training step (forward + backward = 3x forward):
    every nn.Linear (2 * in * out per token; the tied head once) and, in each self-attention
    layer, causal attention's two products over the n (n + 1) / 2 allowed pairs (2 * 2 * head_dim
    per pair and query head).
    Element-wise work, the loss and the optimizer count zero (the usual MFU definition).
    tests/benchmarks/test_benchmarks_smoke.py checks it against FlopCounterMode."""
    from workbench.model.transformer import SelfAttention

    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    layers = sum(isinstance(m, SelfAttention) for m in model.modules())
    attention = layers * 4 * n_heads * head_dim * (seq * (seq + 1) // 2)
    return 3 * batch * (2 * linear * seq + attention)


def gemm_peak(setup: Setup, repeats: int = 10) -> dict[str, Any]:
    """FLOP/s of a square matmul in the training dtype (bf16 on CUDA, fp32 on the CPU): the best
    of `repeats` after a warm-up."""
    size = setup.sizes.gemm
    a, b = (torch.randn(size, size, device=setup.device, dtype=setup.dtype) for _ in range(2))
    run = setup.synced(lambda: torch.mm(a, b))
    run()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return dict(size=size, dtype=str(setup.dtype), peak_flops=2 * size**3 / min(seconds))


def train_mfu(setup: Setup) -> dict[str, Any]:
    s = setup.sizes
    peak = gemm_peak(setup)
    rows = {}
    for name, config in CONFIGS.items():
        if setup.cuda:  # this config's peak alone, not an earlier section's or config's
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(setup.device)
        model = build_decoder(setup, config)
        tokens = random_tokens(s.batch, s.seq + 1, BASE["vocab_size"]).to(setup.device)
        times = alternate({"step": train_step(setup, model, tokens)}, s.warmup, s.repeats)["step"]
        step_s = median_s(times)
        flops = train_flops(model, s.n_heads, s.d_model // s.n_heads, s.batch, s.seq)
        rows[name] = dict(step_s=step_s, tokens_per_s=s.batch * s.seq / step_s, flops_per_step=flops,
                          mfu=flops / step_s / peak["peak_flops"], parameters=sum(p.numel() for p in model.parameters()))
        if setup.cuda:
            rows[name]["cuda_max_allocated"] = torch.cuda.max_memory_allocated(setup.device)
        del model
    return dict(sizes=dict(d_model=s.d_model, n_layers=s.n_layers, n_heads=s.n_heads, seq=s.seq, batch=s.batch),
                gemm=peak, configs=rows)


def mfu_checks(result: dict[str, Any]) -> list[Check]:
    return [Check(f"MFU {name}", row["mfu"], ">=", 0.45) for name, row in result["configs"].items()]


# ---- 4. sliding-window and sparse attention against full at long n -----------------------------


def attention_layer(setup: Setup, name: str, **params) -> nn.Module:
    from workbench.registry import get_variant

    cls = get_variant("attention", name)
    h = setup.sizes.attention_heads
    return cls(cls.Params.model_validate(params), n_heads=h, n_kv_heads=h, head_dim=64).to(setup.device)


def local_attention(setup: Setup) -> dict[str, Any]:
    s = setup.sizes
    variants = {
        "full": attention_layer(setup, "full"),
        "sliding_window": attention_layer(setup, "sliding_window", window=s.window),
        "sparse": attention_layer(setup, "sparse", block=s.sparse_block, n_global_blocks=1, n_random_blocks=2),
    }
    rows = {}
    for i, n in enumerate(s.attention_lengths):
        g = torch.Generator(device=setup.device).manual_seed(n)
        q, k, v = (torch.randn(1, s.attention_heads, n, 64, generator=g, device=setup.device, dtype=setup.dtype)
                   .requires_grad_() for _ in range(3))
        pos = arange_positions(1, n, setup.device)
        kwargs = dict(q_pos=pos, k_pos=pos, key_mask=None, causal=True, score_bias=None)

        def fwd_bwd(variant):
            return setup.synced(lambda: variant(q, k, v, **kwargs).sum().backward())

        times = alternate({name: fwd_bwd(variant) for name, variant in variants.items()}, s.warmup, s.repeats)
        seconds = {name: median_s(t) for name, t in times.items()}
        rows[n] = dict(seconds=seconds, speedup_vs_full={name: seconds["full"] / t for name, t in seconds.items()})
        if setup.cuda:  # peak bytes one forward + backward allocates on top of q, k, v
            rows[n]["peak_bytes"] = {name: cuda_peak_bytes(setup, fwd_bwd(variant)) for name, variant in variants.items()}
        if i == 0:
            rows[n]["max_error_vs_dense"] = {name: dense_error(variant, q, k, v, kwargs)
                                             for name, variant in variants.items()}
            if not setup.cuda:  # the CPU smoke run: the FlexAttention path's forward (eager) too
                rows[n]["flex_forward_error_vs_dense"] = {name: flex_forward_error(variant, q, k, v, kwargs)
                                                          for name, variant in variants.items() if name != "full"}
        del q, k, v
    return dict(window=s.window, sparse_block=s.sparse_block, heads=s.attention_heads, head_dim=64, lengths=rows)


def cuda_peak_bytes(setup: Setup, call: Callable[[], Any]) -> int:
    """torch.cuda.max_memory_allocated over one call, above what was allocated before it."""
    torch.cuda.synchronize(setup.device)
    torch.cuda.reset_peak_memory_stats(setup.device)
    before = torch.cuda.memory_allocated(setup.device)
    call()
    return torch.cuda.max_memory_allocated(setup.device) - before


def flex_forward_error(variant: nn.Module, q, k, v, kwargs) -> float:
    """Largest |FlexAttention - dense| / max |dense| of the forward, with the CPU standing in for
    CUDA (eager FlexAttention has no backward on the CPU): the CPU smoke run reaches that path."""
    from workbench.model import flex

    before = flex.FLEX_DEVICES
    flex.FLEX_DEVICES = (q.device.type,)
    try:
        with torch.no_grad():
            q, k, v = (x.detach() for x in (q, k, v))
            fast, dense = variant(q, k, v, **kwargs), variant.dense(q, k, v, **kwargs)
    finally:
        flex.FLEX_DEVICES = before
    return ((fast - dense).abs().max() / dense.abs().max()).item()


def dense_error(variant: nn.Module, q, k, v, kwargs) -> dict[str, float]:
    """Largest |fast - dense| of the output and of each gradient, the dense reference in fp32."""
    weight = torch.randn(q.shape, device=q.device, dtype=torch.float32)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = variant(*leaves, **kwargs).float()
    grads = torch.autograd.grad((out * weight).sum(), leaves)
    ref_leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    ref = variant.dense(*ref_leaves, **kwargs)
    ref_grads = torch.autograd.grad((ref * weight).sum(), ref_leaves)
    errors = {"out": (out - ref).abs().max().item()}
    errors |= {f"grad_{x}": (a.float() - b).abs().max().item() for x, a, b in zip("qkv", grads, ref_grads)}
    errors["scale"] = max(ref.abs().max().item(), *(g.abs().max().item() for g in ref_grads))
    return errors


def local_checks(setup: Setup, result: dict[str, Any]) -> list[Check]:
    lengths = result["lengths"]
    first, last = lengths[min(lengths)], lengths[max(lengths)]
    tolerance = 0.05 if setup.cuda else 1e-4  # bf16 inputs and kernels against an fp32 reference
    checks = [Check(f"{name} equals dense (max error / max value)",
                    max(v for key, v in err.items() if key != "scale") / err["scale"], "<=", tolerance)
              for name, err in first["max_error_vs_dense"].items()]
    checks += [Check(f"{name} (FlexAttention, eager) forward equals dense", error, "<=", tolerance)
               for name, error in first.get("flex_forward_error_vs_dense", {}).items()]
    checks += [Check(f"{name} speed-up over full at n = {max(lengths)}", last["speedup_vs_full"][name], ">=", 5.0)
               for name in ("sliding_window", "sparse")]
    if "peak_bytes" in last:  # O(n w) and O(n) memory against full attention's O(n) (flash)
        checks += [Check(f"{name} peak memory / full's at n = {max(lengths)}",
                         last["peak_bytes"][name] / last["peak_bytes"]["full"], "<=", 2.0)
                   for name in ("sliding_window", "sparse")]
    return checks


# ---- 5. a scaling study's points: the measuring child, the FLOP counter and FlexAttention -------


def scaling_points(setup: Setup) -> dict[str, Any]:
    """What a scaling study measures, on FlexAttention variants: one attention layer's training
    step (ALiBi with full attention, and the sliding window) at the first attention length, each
    point in a fresh measuring process on CUDA (workbench.cost.measure.run_points): time, the
    two FLOP accountings (FlexAttention's by its block mask's tiles) and peak memory."""
    from workbench.cost.measure import run_points
    from workbench.cost.workload import Point

    s = setup.sizes
    model = {"vocab_size": 256, "d_model": s.attention_heads * 64, "n_heads": s.attention_heads, "n_layers": 1}
    variants = {"full+alibi": {"position": "alibi", "attention": "full"},
                "sliding_window": {"position": "none", "attention": {"name": "sliding_window", "window": s.window}}}
    points = {name: Point(model={**model, **v}, scope="layer", mode="train_step", length=s.attention_lengths[0],
                          device=setup.device.type, dtype="bfloat16" if setup.cuda else "float32", warmup=1,
                          repeats=3, memory_limit_gb=8)
              for name, v in variants.items()}
    keep = ("status", "error", "time_median_s", "flops", "flops_executed", "flops_executed_source", "peak_bytes",
            "peak_instrument")
    rows = run_points(points.values(), time_budget_s=180, isolate=setup.cuda)
    return {name: {key: row.get(key) for key in keep} for name, row in zip(points, rows)}


def scaling_checks(setup: Setup, result: dict[str, Any]) -> list[Check]:
    checks = [Check(f"{name} scaling point finished", float(row["status"] == "finished"), "==", 1.0)
              for name, row in result.items() if isinstance(row, dict) and "status" in row]
    if setup.cuda:
        checks += [Check(f"{name}: executed FLOPs counted by FlexAttention's tiles",
                         float("flex_block_mask_tiles" in (row["flops_executed_source"] or "")), "==", 1.0)
                   for name, row in result.items() if isinstance(row, dict) and row.get("status") == "finished"]
    return checks


# ---- 6. cached decoding against x-transformers --------------------------------------------------


def decode(setup: Setup) -> dict[str, Any]:
    if not xtransformers_available():
        return dict(skipped="x-transformers not installed (pip install '.[bench]')")
    from x_transformers import AutoregressiveWrapper

    from benchmarks.vs_xtransformers import build_pair

    s = setup.sizes
    config = {**CONFIGS["a: rope+swiglu+pre-rms"], "d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads}
    pair = build_pair("a", config, max_seq_len=s.prompt + s.new_tokens)
    ours, theirs = pair.ours.to(setup.device).eval(), AutoregressiveWrapper(pair.theirs.to(setup.device)).eval()
    rows = {}
    for batch in s.decode_batches:
        prompt = random_tokens(batch, s.prompt, BASE["vocab_size"], seed=1).to(setup.device)
        runs = {
            "ours": setup.synced(lambda: ours.generate(prompt, max_new_tokens=s.new_tokens, strategy="greedy")),
            "x-transformers": setup.synced(lambda: theirs.generate(prompt, s.new_tokens, temperature=0.0, cache_kv=True)),
        }
        with torch.inference_mode(), setup.autocast():
            times = alternate(runs, warmup=1, repeats=s.decode_repeats)
        seconds = {name: median_s(t) for name, t in times.items()}
        rows[batch] = dict(seconds=seconds, tokens_per_s={name: batch * s.new_tokens / t for name, t in seconds.items()},
                           ours_over_xtransformers=seconds["x-transformers"] / seconds["ours"])
    return dict(prompt=s.prompt, new_tokens=s.new_tokens, batches=rows)


# ---- 7. several seeds as one batched model --------------------------------------------------------


def batched_seeds(setup: Setup) -> dict[str, Any]:
    from benchmarks.batched_seeds import SIZES, measure

    s = setup.sizes
    sizes = SIZES if s is not TINY else {name: v for name, v in SIZES.items() if name.startswith("tiny")}
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # as the workbench's runs on CUDA (train.matmul_precision)
    try:
        rows = measure(s.batched_ks, s.batched_steps, s.batched_rounds, setup.device, sizes)
    finally:
        torch.set_float32_matmul_precision(before)
    return dict(ks=list(s.batched_ks), steps=s.batched_steps, rounds=s.batched_rounds, rows=rows)


def batched_checks(setup: Setup, result: dict[str, Any]) -> list[Check]:
    """On a GPU, K seeds as one model are to take less time per seed than one alone where they go
    through vmap together (fixed-length batches); reported, not asserted."""
    if not setup.cuda:
        return []
    largest = max(result["ks"])
    return [Check(f"batched seeds: speed-up per seed at K={largest}, {name}", row["speed_up"][largest], ">=", 1.0)
            for name, row in result["rows"].items() if "fixed length" in name]


# ---- the command ---------------------------------------------------------------------------------


def device_name(device: torch.device) -> str:
    """File-name slug of the device: 'nvidia-h200', 'cpu'."""
    if device.type != "cuda":
        return device.type
    return "-".join(torch.cuda.get_device_name(device).lower().replace("_", " ").split())


SECTIONS: dict[str, tuple[Callable[[Setup], dict], Callable[[Setup, dict], list[Check]]]] = {
    "sdpa_backend": (sdpa_backend, lambda setup, r: sdpa_checks(r)),
    "local_attention": (local_attention, local_checks),
    "train_quickstart": (train_quickstart, quickstart_checks),
    "train_mfu": (train_mfu, lambda setup, r: mfu_checks(r)),
    "scaling_points": (scaling_points, scaling_checks),
    "decode": (decode, lambda setup, r: []),
    "batched_seeds": (batched_seeds, batched_checks),
}


def run_sections(setup: Setup, only: list[str] | None = None,
                 save: Callable[[dict[str, Any], list[Check]], Any] | None = None) -> tuple[dict[str, Any], list[Check]]:
    """Every section in order; one that raises is recorded with its error and a failed check,
    and the others still run. `save` receives what is measured so far after each section."""
    results, checks = {}, []
    for name, (measure, judge) in SECTIONS.items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        try:
            results[name] = measure(setup)
            checks += judge(setup, results[name])
        except Exception as err:  # a failed section is a finding of the check, not the end of it
            results[name] = dict(error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
            checks.append(Check(f"{name} ran", 0.0, "==", 1.0))
        results[name]["section_s"] = time.perf_counter() - start
        print(f"{name}: {results[name]['section_s']:.1f} s" + (" (failed)" if "error" in results[name] else ""),
              flush=True)
        if save:
            save(results, checks)
    return results, checks


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--tiny", action="store_true", help="toy sizes: a smoke run of every section")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), help="run only these sections")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gpu-<device>.json)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: PyTorch sees no CUDA GPU here (use --device cpu --tiny for the smoke run)")
    setup = Setup(device, TINY if args.tiny else Sizes())
    info = dict(device=torch.cuda.get_device_name(device) if setup.cuda else "cpu", tiny=args.tiny,
                torch=torch.__version__, cuda=torch.version.cuda,
                sections=[name for name in SECTIONS if not args.only or name in args.only])
    out = args.out or RESULTS_DIR / f"gpu-{device_name(device)}{'-tiny' if args.tiny else ''}.json"

    def save(results: dict[str, Any], checks: list[Check]) -> Path:
        """The JSON so far: a run stopped from outside (benchmarks/gpu_check.sh's time budget)
        keeps every section it finished; `sections` lists those it was asked for."""
        return write_json("gpu", dict(info, **results, checks=checks), out)

    save({}, [])
    results, checks = run_sections(setup, args.only, save)
    for check in checks:
        print(check.line())
    print(f"wrote {save(results, checks)}")
    return dict(info, **results, checks=checks)


if __name__ == "__main__":
    main()
