"""`python -m benchmarks.decode`: per-token decode latency against context length, with and
without the KV cache, and cache bytes for MHA / GQA / MQA at equal d_model.

A 4-layer decoder (d_model 256, 8 query heads of 32) with 8, 2 and 1 K/V heads. Latency is
one generated token at context n (workbench.cost.measure, mode decode, each point in a fresh
process): with the cache, a single-token step against the cached K/V; without it, a forward
over all n + 1 tokens. Cache bytes are read from `model.generate(...).last_cache` and must
equal 2 * layers * n_kv_heads * head_dim * tokens * batch * element size exactly (P9), so
they shrink by n_heads / n_kv_heads (P10).
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
import torch
from rich.console import Console
from rich.table import Table

from benchmarks import Check, write_json
from workbench.cost.fit import fit_exponents
from workbench.model.transformer import build_model
from workbench.recipes.scaling.study import ScalingStudy
from workbench.recipes.scaling.measuring import run_scaling

ATTENTIONS = {"MHA": 8, "GQA": 2, "MQA": 1}  # name -> n_kv_heads, with 8 query heads
MODEL = {"family": "decoder", "d_model": 256, "n_heads": 8, "n_layers": 4, "position": "rope", "vocab_size": 256}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 512, 1024, 2048])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--top", type=int, default=3, help="fit exponents over this many largest contexts")
    p.add_argument("--batch", type=int, default=2, help="batch of the cache-bytes check")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def cache_bytes_rows(contexts: list[int], batch: int, new_tokens: int = 3) -> list[dict]:
    """Generate with the cache and compare last_cache.nbytes with the formula, per layer too."""
    rows = []
    for name, kv in ATTENTIONS.items():
        torch.manual_seed(0)
        model = build_model({**MODEL, "n_kv_heads": kv}).eval()
        spec = model.spec
        for n in contexts:
            prompt = torch.randint(spec.vocab_size, (batch, n))
            model.generate(prompt, max_new_tokens=new_tokens, use_cache=True)
            cache = model.last_cache
            tokens = n + new_tokens
            element = cache.self_attn[0].k.element_size()
            per_layer = 2 * spec.n_kv_heads * spec.head_dim * tokens * batch * element
            rows.append({
                "attention": name, "n_kv_heads": kv, "tokens": tokens, "batch": batch,
                "cache_bytes": cache.nbytes, "formula_bytes": spec.decoder_layers * per_layer,
                "every_layer_exact": all(layer.nbytes == per_layer for layer in cache.self_attn),
            })
    return rows


def study(args: argparse.Namespace) -> ScalingStudy:
    return ScalingStudy.model_validate({
        "kind": "scaling", "name": "decode", "model": MODEL,
        "sweep": {"model.n_kv_heads": list(ATTENTIONS.values())},
        "scaling": {"lengths": args.contexts, "modes": ["decode"], "decode_cache": [True, False],
                    "repeats": args.repeats, "warmup": 2, "threads": args.threads, "device": "auto"},
    })


def main(argv=None) -> int:
    args = parse_args(argv)
    console = Console(highlight=False)
    name_of = {kv: name for name, kv in ATTENTIONS.items()}

    bytes_rows = pd.DataFrame(cache_bytes_rows(args.contexts, args.batch))
    table = Table(title=f"KV-cache bytes after generate (batch {args.batch}, prompt + 3 new tokens, float32)")
    for col in ("attention", "n_kv_heads", "tokens", "cache bytes", "formula", "exact"):
        table.add_column(col, justify="right")
    for r in bytes_rows.itertuples():
        table.add_row(r.attention, str(r.n_kv_heads), str(r.tokens), f"{r.cache_bytes:,}", f"{r.formula_bytes:,}",
                      str(r.cache_bytes == r.formula_bytes and r.every_layer_exact))
    console.print(table)

    def progress(row: dict) -> None:
        timing = f"{row['time_median_s'] * 1e3:.2f} ms" if row["status"] == "ok" else row.get("error", "")
        console.print(f"  {name_of[row['n_kv_heads']]} cache={row['kv_cache']!s:<5} n={row['length']:<6} "
                      f"{row['status']:<8} {timing}", markup=False)

    rows = pd.DataFrame(run_scaling(study(args), on_row=progress))
    rows["attention"] = rows["n_kv_heads"].map(name_of)
    latency = Table(title="per-token decode latency (ms, median) against context length")
    latency.add_column("attention")
    latency.add_column("cache")
    for n in args.contexts:
        latency.add_column(f"n={n}", justify="right")
    for (attention, cached), part in rows.groupby(["attention", "kv_cache"], sort=False):
        by_n = part.set_index("length")
        latency.add_row(attention, "yes" if cached else "no",
                        *[f"{by_n.loc[n, 'time_median_s'] * 1e3:.2f}" if by_n.loc[n, "status"] == "ok" else by_n.loc[n, "status"]
                          for n in args.contexts])
    console.print(latency)

    fits = fit_exponents(rows, by=("attention", "kv_cache"), metrics=("time_median_s", "kv_cache_bytes"), top=args.top)
    exponents = fits[fits["metric"] == "time_median_s"].set_index(["attention", "kv_cache"])["exponent"]
    console.print(f"time exponents over the top {args.top} contexts:")
    for (attention, cached), value in exponents.items():
        console.print(f"  {attention} cache={cached}: {value:.2f}")

    top = max(args.contexts)
    verdicts = [
        Check("cache bytes == 2*layers*n_kv_heads*head_dim*tokens*batch*elem (generate; mismatches)",
              float((~((bytes_rows.cache_bytes == bytes_rows.formula_bytes) & bytes_rows.every_layer_exact)).sum()),
              "==", 0),
        Check("cache bytes == formula (decode measurements; mismatches)",
              float((rows.kv_cache_bytes.notna() & (rows.kv_cache_bytes != rows.kv_cache_bytes_formula)).sum()),
              "==", 0),
    ]
    for attention in ATTENTIONS:
        cached, uncached = exponents[(attention, True)], exponents[(attention, False)]
        verdicts.append(Check(f"{attention}: cached time exponent / uncached time exponent", cached / uncached, "<=", 0.5))
        at_top = rows[(rows.attention == attention) & (rows.length == top)].set_index("kv_cache")["time_median_s"]
        verdicts.append(Check(f"{attention}: uncached / cached latency at n={top}", at_top[False] / at_top[True], ">=", 5))
    mha = bytes_rows[bytes_rows.attention == "MHA"].set_index("tokens").cache_bytes
    for attention, kv in ATTENTIONS.items():
        other = bytes_rows[bytes_rows.attention == attention].set_index("tokens").cache_bytes
        verdicts.append(Check(f"MHA bytes / {attention} bytes (n_heads / n_kv_heads = {8 // kv})",
                              float((mha / other).min()), "==", 8 / kv))
    for c in verdicts:
        console.print(c.line(), markup=False)
    path = write_json("decode", {"cache_bytes": bytes_rows.to_dict(orient="records"),
                                 "rows": rows.to_dict(orient="records"), "fits": fits.to_dict(orient="records"),
                                 "checks": verdicts}, args.out)
    console.print(f"wrote {path}")
    return 0 if all(c.passed for c in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
