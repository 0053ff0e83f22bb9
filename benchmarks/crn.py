"""Common random numbers (issue 44): does `train.init: paired` make paired differences less noisy?

    python -m benchmarks.crn [--seeds 16] [--jobs 2] [--only reverse sort text] [--steps N] [--out DIR] [--json PATH]

The verdicts pair two groups over seeds: one seed gives both arms the same data stream, so the
seed-to-seed noise they share cancels in the difference. `train.init: paired` also gives them the
same initial values for every parameter they share by name and shape (the default draws every
matrix in turn from one stream, so an arm with a parameter more starts with other values in all
of them). Each study below runs through the workbench's own runner (`run_study`, as `workbench
run --jobs N`) with `train.init: [sequential, paired]` swept over the same seeds, and per
comparison and metric this prints, for each init:
  * r: the Pearson correlation of the two arms' outcomes across seeds (workbench.stats.intervals.
    paired_correlation, as the report shows it);
  * the SD of the paired differences;
and the ratio of the SDs (paired / sequential) with a 95% bootstrap interval over seeds (scipy's,
resampling seeds with all four of their runs together) and the p-value of equal SDs (Pitman-Morgan
test for paired samples: the sum and the difference of the two inits' differences uncorrelated). The seeds a paired t test needs for a
given power scale with the variance of the differences: ratio^2 is the share of seeds that
paired init needs. The rope-vs-alibi comparison is the control: the two schemes have no
parameters, so both inits already start the arms equal and the ratio should be about 1.
`--out DIR` keeps the runs (a second call with the same DIR trains only what is missing).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table
from scipy import stats as st

from benchmarks import write_json
from workbench.stats.intervals import paired_correlation

INITS = ("sequential", "paired")


@dataclass(frozen=True)
class CrnStudy:
    """A small study whose arms differ in `key`; `pairs` are the (better, than) arms compared."""

    name: str
    body: str  # the study YAML without seeds and sweep
    key: str  # the swept key that tells the arms apart
    arms: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]
    metrics: tuple[str, ...]

    def yaml(self, seeds: int) -> str:
        expect = "".join(f"  - {{metric: {self.metrics[0]}, better: {{{self.key}: {a}}}, than: {{{self.key}: {b}}}}}\n"
                         for a, b in self.pairs)
        return (f"name: crn-{self.name}\n{self.body}seeds: {list(range(seeds))}\n"
                f"sweep:\n  {self.key}: [{', '.join(self.arms)}]\n  train.init: [{', '.join(INITS)}]\n"
                f"expect:\n{expect}")


# Small enough for CPU minutes (25k parameters, 400 steps), large enough that every arm learns
# part of the task: reverse, seed 0, paired init: rope accuracy@8 0.82, learned 0.55.
def train(steps: int, batch_size: int) -> str:
    """The train: line: one evaluation, at the end."""
    return (f"train: {{steps: {steps}, batch_size: {batch_size}, lr: 3.0e-3, warmup_steps: 20, eval_every: {steps}, "
            "log_every: 50}\n")


MODEL = "model: {family: decoder, d_model: 32, n_layers: 2, n_heads: 2, position: rope, attention: full, norm: pre, ffn: gelu}\n"
STUDIES = {
    "reverse": CrnStudy(
        "reverse", "task: {name: reverse, train_length: 8, min_length: 4, eval_lengths: [8], n_eval: 256, "
        "alphabet_size: 10}\n" + MODEL + train(400, 32), "model.position", ("rope", "learned", "alibi"),
        (("rope", "learned"), ("rope", "alibi")), ("loss@8", "accuracy@8")),
    "sort": CrnStudy(
        "sort", "task: {name: sort, train_length: 8, min_length: 4, eval_lengths: [8], n_eval: 256, "
        "alphabet_size: 10}\n" + MODEL + train(400, 32), "model.ffn", ("swiglu", "gelu"),
        (("swiglu", "gelu"),), ("loss@8", "accuracy@8")),
    # A byte-level LM on the default corpus (Python's standard library sources): seed 0, paired
    # init, 300 steps: rope 3.6 bpc, learned 3.8 (a unigram ~5).
    "text": CrnStudy(
        "text", "task: {name: text_lm, train_length: 32, eval_lengths: [32], n_eval: 128, decode_samples: 0}\n"
        + MODEL + train(300, 16),
        "model.position", ("rope", "learned"), (("rope", "learned"),), ("bpc@32",)),
}


def outcomes(out: Path, key: str) -> pd.DataFrame:
    """The finished runs of a store as rows (arm, init, seed, metrics...)."""
    from workbench.run.store import Store

    rows = [{"arm": run["swept"][key], "init": run["swept"]["train.init"], "seed": run["seed"], **run["metrics"]}
            for run in Store(out, create=False).runs() if run["status"] == "finished"]
    return pd.DataFrame(rows)


def paired_figures(runs: pd.DataFrame, better: str, than: str, metric: str) -> dict[str, float]:
    """Per init, r and the SD (and mean) of the paired differences better - than over the seeds all
    four runs finished; the SD ratio paired / sequential with its 95% bootstrap interval over seeds
    and the p-value of equal SDs."""
    values = runs.pivot_table(index="seed", columns=["init", "arm"], values=metric)
    values = values[[(init, arm) for init in INITS for arm in (better, than)]].dropna()
    out: dict[str, float] = {"seeds": len(values)}
    differences = {}
    for init in INITS:
        a, b = values[(init, better)], values[(init, than)]
        differences[init] = (a - b).to_numpy()
        out[f"r_{init}"] = paired_correlation(a, b)
        out[f"sd_{init}"] = float(np.std(differences[init], ddof=1)) if len(values) > 1 else math.nan
        out[f"mean_{init}"] = float(np.mean(differences[init])) if len(values) else math.nan
    out["sd_ratio"] = out["sd_paired"] / out["sd_sequential"] if out["sd_sequential"] > 0 else math.nan
    out["sd_ratio_lo"] = out["sd_ratio_hi"] = out["equal_sd_p"] = math.nan
    if len(values) >= 3 and math.isfinite(out["sd_ratio"]):
        # Pitman-Morgan: two correlated samples have equal variances iff their sum and difference are uncorrelated
        both = differences["paired"], differences["sequential"]
        out["equal_sd_p"] = float(st.pearsonr(both[0] + both[1], both[0] - both[1]).pvalue)
        ci = st.bootstrap(both, lambda p, s: np.std(p, ddof=1) / np.std(s, ddof=1), paired=True, vectorized=False,
                          n_resamples=4000, method="percentile", rng=np.random.default_rng(0)).confidence_interval
        out["sd_ratio_lo"], out["sd_ratio_hi"] = float(ci.low), float(ci.high)
    out["seed_share"] = out["sd_ratio"] ** 2  # seeds paired init needs per seed the default needs
    return out


def table(rows: list[dict], seeds: int) -> Table:
    t = Table(title=f"Paired differences over {seeds} seeds: train.init sequential (default) vs paired")
    for col in ("comparison", "metric", "seeds", "r seq", "r paired", "SD diff seq", "SD diff paired",
                "SD ratio [95% bootstrap]", "equal SDs p", "seeds needed x", "mean diff seq / paired"):
        t.add_column(col, justify="left" if col in ("comparison", "metric") else "right")
    for row in rows:
        t.add_row(row["comparison"], row["metric"], str(row["seeds"]), f"{row['r_sequential']:.2f}",
                  f"{row['r_paired']:.2f}", f"{row['sd_sequential']:.4f}", f"{row['sd_paired']:.4f}",
                  f"{row['sd_ratio']:.2f} [{row['sd_ratio_lo']:.2f}, {row['sd_ratio_hi']:.2f}]", f"{row['equal_sd_p']:.2g}",
                  f"{row['seed_share']:.2f}", f"{row['mean_sequential']:+.4f} / {row['mean_paired']:+.4f}")
    return t


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=16, help="seeds per arm and init (default 16)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (workbench run --jobs)")
    parser.add_argument("--only", nargs="+", choices=list(STUDIES), default=list(STUDIES))
    parser.add_argument("--steps", type=int, default=None, help="train.steps of every run (default: each study's)")
    parser.add_argument("--out", type=Path, help="keep the stores here (OUT/<study>); default: a temporary folder")
    parser.add_argument("--json", help="where to write the figures (default: benchmarks/results/crn.json)")
    args = parser.parse_args(argv)
    from workbench.api import run_study

    console = Console(width=200)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = (args.out or Path(tmp)).resolve()
        for name in args.only:
            study = STUDIES[name]
            folder = root / name
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / "study.yaml"
            path.write_text(study.yaml(args.seeds))
            overrides = (f"train.steps={args.steps}",) if args.steps else ()
            run_study(str(path), str(folder / "out"), jobs=args.jobs, quiet=True, overrides=overrides)
            runs = outcomes(folder / "out", study.key)
            for better, than in study.pairs:
                for metric in study.metrics:
                    rows.append({"comparison": f"{name}: {better} vs {than}", "metric": metric,
                                 **paired_figures(runs, better, than, metric)})
    console.print(table(rows, args.seeds))
    path = write_json("crn", {"seeds": args.seeds, "steps": args.steps,
                              "studies": {name: STUDIES[name].yaml(args.seeds) for name in args.only},
                              "rows": rows}, args.json)
    console.print(f"written: {path}")


if __name__ == "__main__":
    main()
