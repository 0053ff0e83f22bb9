"""`python -m benchmarks [--quick] [--out PATH] [--only SECTION ...]`: the workbench against
x-transformers and against this machine's matmul limit. Prints rich tables, writes JSON.

Sections (issue 7): train (throughput + MFU), local (long-sequence sliding window),
decode (cached greedy generation), overhead (Lightning runner vs a plain loop); (issue 44)
decide (seeds and CPU minutes to a verdict, today's rule beside the earlier one: benchmarks/decide.py);
and (issue 63) study (the quickstart study's CPU against a plain loop training the same runs:
benchmarks/study.py).
Every comparison alternates the implementations in this one process and reports medians,
so load from other processes on a shared machine falls on both alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from benchmarks import RESULTS_DIR, Check, decide, machine, mfu, study
from benchmarks.minimal import MinimalGPT
from benchmarks.vs_xtransformers import (CONFIGS, IMPLS, build_pair, decode_throughput,
                                         make_train_step, parameter_check, random_tokens, train_throughput,
                                         xtransformers_available)
from workbench.errors import WorkbenchError
from workbench.model.spec import parse_spec

SECTIONS = ("train", "local", "decode", "overhead", "decide", "study")
RESULTS = RESULTS_DIR / "vs_xtransformers.json"


@dataclass(frozen=True)
class Sizes:
    """Problem sizes: the issue's, or tiny ones for a smoke run."""

    d_model: int = 256
    batch: int = 16
    seq: int = 256
    warmup: int = 2
    repeats: int = 7
    local_lengths: tuple[int, ...] = (4096, 8192)
    local_window: int = 256
    local_repeats: int = 3
    decode_batches: tuple[int, ...] = (1, 8)
    prompt: int = 256
    new_tokens: int = 256
    decode_repeats: int = 3


QUICK = Sizes(d_model=64, batch=2, seq=32, warmup=1, repeats=2, local_lengths=(256,), local_window=32,
              local_repeats=1, decode_batches=(1, 2), prompt=16, new_tokens=8, decode_repeats=1)

# Targets of issue 7, as ratios (the machine is shared, absolute figures drift).
TRAIN_RATIO, MFU_TARGET, LOCAL_RATIO, DECODE_RATIO, OVERHEAD_LIMIT = 1.0, 0.65, 4.0, 1.0, 0.15
MINIMAL_RATIO = 0.95  # issue 18: config a within 5% of the minimal nanoGPT-style model's tokens/s


def config(name: str, sizes: Sizes, **changes: Any) -> dict[str, Any]:
    return {**CONFIGS[name], "d_model": sizes.d_model, **changes}


def minimal_model(spec) -> MinimalGPT:
    """The minimal nanoGPT-style reference at the shape of `spec` (benchmarks/minimal.py)."""
    return MinimalGPT(spec.vocab_size, spec.d_model, spec.n_layers, spec.n_heads, max_len=4096)


def train_section(sizes: Sizes, console: Console) -> dict[str, Any]:
    """(1) train-step tokens/s of both implementations and of the minimal model, and (2) MFU,
    per architecture."""
    gemm_run, gemm_flops = mfu.gemm()
    table = Table(title=f"Train step: batch {sizes.batch} x seq {sizes.seq}, fwd+bwd+AdamW "
                        f"(median of {sizes.repeats}); MFU vs fp32 {mfu.GEMM_SIZE}^2 GEMM, {torch.get_num_threads()} threads")
    for col in ("config", "params ours / x-tf", "tok/s ours", "tok/s x-tf", "ours/x-tf", "tok/s minimal",
                "ours/minimal", "GFLOP/step", "MFU ours", "MFU x-tf"):
        table.add_column(col, justify="left" if col == "config" else "right")
    rows = {}
    for name in CONFIGS:
        pair = build_pair(name, config(name, sizes), max_seq_len=sizes.seq)
        params = parameter_check(pair)
        tokens = random_tokens(sizes.batch, sizes.seq + 1, pair.spec.vocab_size)
        flops = {impl: mfu.count_flops(make_train_step(model, tokens))
                 for impl, model in zip(IMPLS, (pair.ours, pair.theirs))}
        minimal = make_train_step(minimal_model(pair.spec), tokens)
        result = train_throughput(pair, sizes.batch, sizes.seq, sizes.warmup, sizes.repeats,
                                  alongside={"gemm": gemm_run, "minimal": minimal})
        peak = gemm_flops / result["alongside_s"]["gemm"]  # FLOP/s of the GEMM under the same load
        utilisation = {impl: flops[impl] / result["step_s"][impl] / peak for impl in IMPLS}
        minimal_s = result["alongside_s"]["minimal"]
        rows[name] = dict(result, parameters=params, flops_per_step=flops, gemm_flops_per_s=peak,
                          mfu=utilisation, minimal_tokens_per_s=sizes.batch * sizes.seq / minimal_s,
                          ratio_to_minimal=minimal_s / result["step_s"]["ours"])
        note = "" if params["difference"] == 0 else f" ({params['difference']:+d}: {params['note']})"
        table.add_row(
            name, f"{params['ours']:,} / {params['theirs']:,}{note}",
            *(f"{result['tokens_per_s'][impl]:,.0f}" for impl in IMPLS), f"{result['ratio']:.2f}",
            f"{rows[name]['minimal_tokens_per_s']:,.0f}", f"{rows[name]['ratio_to_minimal']:.2f}",
            f"{flops['ours'] / 1e9:.1f}", *(f"{utilisation[impl]:.2f}" for impl in IMPLS),
        )
        if not params["matches"]:
            console.print(f"[red]{name}: parameter counts differ beyond the documented difference: {params}")
    console.print(table)
    return rows


def local_section(sizes: Sizes, console: Console) -> dict[str, Any]:
    """(3) long sequences: our blocked sliding window vs x-transformers' masked local attention."""
    attention = {"name": "sliding_window", "window": sizes.local_window}
    name = "a: rope+swiglu+pre-rms"
    try:
        parse_spec(config(name, sizes, attention=attention))
    except WorkbenchError as err:
        console.print(f"[yellow]local attention skipped: {err}")
        return {"skipped": str(err)}
    table = Table(title=f"Long-sequence train step, batch 1, window {sizes.local_window} "
                        f"(config {name}; median of {sizes.local_repeats})")
    for col in ("n", "step s ours", "step s x-tf", "x-tf / ours"):
        table.add_column(col, justify="right")
    rows = {}
    for n in sizes.local_lengths:
        pair = build_pair(name, config(name, sizes, attention=attention), max_seq_len=n)
        result = train_throughput(pair, 1, n, warmup=1, repeats=sizes.local_repeats)
        rows[str(n)] = result
        table.add_row(str(n), *(f"{result['step_s'][impl]:.2f}" for impl in IMPLS), f"{result['ratio']:.2f}")
        del pair
    console.print(table)
    return rows


def decode_section(sizes: Sizes, console: Console) -> dict[str, Any]:
    """(4) greedy generation with a KV cache."""
    name = "a: rope+swiglu+pre-rms"
    pair = build_pair(name, config(name, sizes), max_seq_len=sizes.prompt + sizes.new_tokens)
    table = Table(title=f"Greedy decoding, KV cache: {sizes.prompt}-token prompt + {sizes.new_tokens} new "
                        f"(config {name}; median of {sizes.decode_repeats}, prefill included)")
    for col in ("batch", "tok/s ours", "tok/s x-tf", "ours/x-tf"):
        table.add_column(col, justify="right")
    rows = {}
    for batch in sizes.decode_batches:
        result = decode_throughput(pair, batch, sizes.prompt, sizes.new_tokens, sizes.decode_repeats)
        rows[str(batch)] = result
        table.add_row(str(batch), *(f"{result['tokens_per_s'][impl]:,.0f}" for impl in IMPLS),
                      f"{result['ratio']:.2f}")
    console.print(table)
    return rows


def overhead_section(sizes: Sizes, console: Console, quick: bool) -> dict[str, Any]:
    """(5) Lightning runner vs a plain loop: benchmarks/overhead.py (the studies runner's) in a
    child process, since it prints rather than returns; its "overhead +x%" lines are parsed."""
    if importlib.util.find_spec("benchmarks.overhead") is None:
        console.print("[yellow]overhead skipped: benchmarks/overhead.py is not there")
        return {"skipped": "benchmarks/overhead.py missing"}
    steps, repeats = ("20", "1") if quick else ("200", "3")
    out = subprocess.run([sys.executable, "-m", "benchmarks.overhead", "--steps", steps, "--repeats", repeats],
                         capture_output=True, text=True, check=True).stdout
    console.print(out)
    overheads = [float(x) / 100 for x in re.findall(r"overhead\s+([+-]?[\d.]+)%", out)]
    result: dict[str, Any] = {"output": out}
    if overheads:
        result["lightning_over_plain"] = 1 + max(overheads)  # the worst model size
    return result


def checks(results: dict[str, Any]) -> list[Check]:
    """The issue-7 targets that the measured sections allow to judge."""
    out = []
    for name, row in results.get("train", {}).items():
        out.append(Check(f"(1) train tok/s ours/x-tf, {name}", row["ratio"], ">=", TRAIN_RATIO))
    if "a: rope+swiglu+pre-rms" in results.get("train", {}):
        out.append(Check("(1b) train tok/s ours/minimal model, config a",
                         results["train"]["a: rope+swiglu+pre-rms"]["ratio_to_minimal"], ">=", MINIMAL_RATIO))
        out.append(Check("(2) MFU ours, config a", results["train"]["a: rope+swiglu+pre-rms"]["mfu"]["ours"],
                         ">=", MFU_TARGET))
    local = results.get("local", {})
    if local and "skipped" not in local:
        longest = max(local, key=int)
        out.append(Check(f"(3) local attention step x-tf/ours, n={longest}", local[longest]["ratio"], ">=",
                         LOCAL_RATIO))
    for batch, row in results.get("decode", {}).items():
        out.append(Check(f"(4) decode tok/s ours/x-tf, batch {batch}", row["ratio"], ">=", DECODE_RATIO))
    overhead = results.get("overhead", {})
    if "lightning_over_plain" in overhead:
        out.append(Check("(5) Lightning step / plain loop step - 1", overhead["lightning_over_plain"] - 1, "<=",
                         OVERHEAD_LIMIT))
    return out


def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of the harness (~1 min)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON output (default {RESULTS})")
    parser.add_argument("--batch", type=int, default=None, help="train-section batch size (default 16)")
    parser.add_argument("--repeats", type=int, default=None, help="timed train steps per implementation (default 7)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=150)  # wide enough for the tables when piped to a file
    comparisons = [s for s in args.only if s not in ("overhead", "decide", "study")]
    if comparisons and not xtransformers_available():
        console.print("x-transformers is not installed: pip install 'transformer-workbench[bench]'")
        return 2
    sizes = QUICK if args.quick else Sizes()
    sizes = replace(sizes, **{k: v for k, v in (("batch", args.batch), ("repeats", args.repeats)) if v})
    torch.manual_seed(0)
    results: dict[str, Any] = dict(machine=machine(), cpu=cpu_name(), threads=torch.get_num_threads(),
                                   torch=torch.__version__, cpu_capability=torch.backends.cpu.get_cpu_capability(),
                                   sizes=asdict(sizes), quick=args.quick,
                                   command="python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv))
    if "train" in args.only:
        results["train"] = train_section(sizes, console)
    if "local" in args.only:
        results["local"] = local_section(sizes, console)
    if "decode" in args.only:
        results["decode"] = decode_section(sizes, console)
    if "overhead" in args.only:
        results["overhead"] = overhead_section(sizes, console, args.quick)
    if "decide" in args.only:  # the verdict rule's cost to decide: benchmarks/decide.py
        results["decide"] = decide.section(console, args.quick)
    if "study" in args.only:  # a whole study against a plain loop: benchmarks/study.py
        results["study"] = study.section(console, args.quick)
    targets = checks(results) + (study.checks(results["study"]) if "study" in results else [])
    results["checks"] = [dict(asdict(c), passed=c.passed) for c in targets]
    table = Table(title="Targets (issues 7 and 63)")
    for col in ("target", "value", "required", "met"):
        table.add_column(col)
    for c in targets:
        table.add_row(c.what, f"{c.value:.3f}", f"{c.op} {c.bound:g}", "yes" if c.passed else "[red]no")
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
