"""`python -m benchmarks.attention_scaling`: how attention's cost grows with sequence length.

One self-attention layer (QKV and output projections + attention; no position scheme),
forward + backward, batch 1, 4 heads of 64, causal, at n = 1024 .. 8192, for

    full            fused SDPA kernel (exact; never holds the n x n matrix)
    naive           explicit n x n scores (what fused kernels save: claim E3)
    sliding_window  window 256 (claim E4)
    sparse          BigBird blocks of 64: local + 1 global + 2 random (about as many keys
                    per query as the window)

Each (variant, n) is measured in a fresh process (workbench.cost.measure). Exponents are fitted
over the top `--top` lengths (workbench.cost.fit) and checked against the issue's thresholds.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
from rich.console import Console
from rich.table import Table

from benchmarks import Check, write_json
from workbench.cost.fit import fit_exponents
from workbench.recipes.scaling.study import ScalingStudy
from workbench.recipes.scaling.measuring import run_scaling

VARIANTS = [
    "full",
    "naive",
    {"name": "sliding_window", "window": 256},
    {"name": "sparse", "block": 64, "n_global_blocks": 1, "n_random_blocks": 2},
]
MODEL = {"family": "decoder", "d_model": 256, "n_heads": 4, "head_dim": 64, "n_layers": 1, "position": "none"}
# (variant prefix, metric, op, bound): the acceptance thresholds.
THRESHOLDS = [
    ("full", "time_median_s", ">=", 1.6),
    ("full", "activation_bytes", "<=", 1.1),
    ("naive", "activation_bytes", ">=", 1.8),
    ("sliding_window", "time_median_s", "<=", 1.2),
    ("sliding_window", "activation_bytes", "<=", 1.1),
    ("sparse", "time_median_s", "<=", 1.2),
    ("sparse", "activation_bytes", "<=", 1.1),
]
MiB = 2**20


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per measurement (1: least noise)")
    p.add_argument("--top", type=int, default=3, help="fit exponents over this many largest lengths")
    p.add_argument("--time-budget", type=float, default=600, help="seconds per measurement before 'timeout'")
    p.add_argument("--memory-limit-gb", type=float, default=10, help="memory per measurement before 'oom'")
    p.add_argument("--out", default=None, help="JSON file (default benchmarks/results/attention_scaling.json)")
    return p.parse_args(argv)


def study(args: argparse.Namespace) -> ScalingStudy:
    return ScalingStudy.model_validate({
        "kind": "scaling", "name": "attention-scaling", "model": MODEL,
        "sweep": {"model.attention": VARIANTS},
        "scaling": {"lengths": args.lengths, "modes": ["train_step"], "scope": "layer", "batch_size": 1,
                    "warmup": args.warmup, "repeats": args.repeats, "threads": args.threads,
                    "time_budget_s": args.time_budget, "memory_limit_gb": args.memory_limit_gb, "device": "auto"},
    })


def points_table(rows: pd.DataFrame) -> Table:
    table = Table(title="one attention layer, forward + backward (batch 1, 4 x 64 heads, causal)")
    for col in ("variant", "n", "status", "time ms (median [q25, q75])", "activation MiB", "peak MiB",
                "GFLOP", "keys/query"):
        table.add_column(col, justify="left" if col in ("variant", "status") else "right")
    for r in rows.itertuples():
        if r.status != "finished":
            table.add_row(r.variant, str(r.length), r.status, *[""] * 5)
            continue
        # Analytic attention FLOPs of one forward are 4 * h * hd per allowed pair (x3 with backward).
        keys = r.flops_attention / 3 / (4 * r.n_heads * r.head_dim) / r.length
        table.add_row(
            r.variant, str(r.length), r.status,
            f"{r.time_median_s * 1e3:.1f} [{r.time_q25_s * 1e3:.1f}, {r.time_q75_s * 1e3:.1f}]",
            f"{r.activation_bytes / MiB:.1f}", f"{r.peak_bytes / MiB:.1f}",
            f"{r.flops / 1e9:.2f}", f"{keys:.0f}",
        )
    return table


def fits_table(fits: pd.DataFrame, top: int) -> Table:
    table = Table(title=f"log-log exponents over the top {top} lengths (± standard error)")
    metrics = ["time_median_s", "activation_bytes", "peak_bytes", "flops"]
    table.add_column("variant")
    for m in metrics:
        table.add_column(m, justify="right")
    for variant, part in fits.groupby("variant", sort=False):
        by_metric = part.set_index("metric")
        cells = []
        for m in metrics:
            if m in by_metric.index:
                fit = by_metric.loc[m]
                cells.append(f"{fit.exponent:.2f} ± {fit.stderr:.2f}")
            else:
                cells.append("n/a")
        table.add_row(variant, *cells)
    return table


def checks(fits: pd.DataFrame) -> list[Check]:
    out = []
    for prefix, metric, op, bound in THRESHOLDS:
        match = fits[(fits["variant"].str.split("(").str[0] == prefix) & (fits["metric"] == metric)]
        value = float(match["exponent"].iloc[0]) if len(match) else float("nan")
        out.append(Check(f"{prefix} {metric} exponent", value, op, bound))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    console = Console(highlight=False)
    console.print(f"measuring {len(VARIANTS)} variants x {len(args.lengths)} lengths, each in a fresh process")

    def progress(row: dict) -> None:
        timing = f"{row['time_median_s'] * 1e3:.1f} ms" if row["status"] == "finished" else row.get("error", "")
        console.print(f"  {row['variant']:<45} n={row['length']:<6} {row['status']:<8} {timing}", markup=False)

    rows = pd.DataFrame(run_scaling(study(args), on_row=progress))
    fits = fit_exponents(rows, by=("variant",), metrics=("time_median_s", "activation_bytes", "peak_bytes", "flops"),
                         top=args.top)
    console.print(points_table(rows))
    console.print(fits_table(fits, args.top))
    verdicts = checks(fits)
    for c in verdicts:
        console.print(c.line(), markup=False)
    path = write_json("attention_scaling", {"rows": rows.to_dict(orient="records"),
                                            "fits": fits.to_dict(orient="records"), "checks": verdicts}, args.out)
    console.print(f"wrote {path}")
    return 0 if all(c.passed for c in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
