"""Resident memory of a text_lm study against the size of its corpus, and tokenizing throughput.

    python -m benchmarks.text_memory [--sizes-mb 10 1000] [--steps 20] [--bpe-mb 16] [--out PATH]

For each size, a text file of that many MB is generated (English-like lines of random words;
an 8 MB block written again and again) and tokenized (bytes) into shards in this process
(`workbench.tasks.tokens.prepare`, as `workbench prepare` does: MB per wall and per CPU
second), then in a fresh process

    workbench run study.yaml --set task.path=FILE ...      trains one tiny run and writes the report

The peak resident set of the largest process of `workbench run` (ru_maxrss of the children
it waited for: the sweep's driver, its run workers, the report with its n-gram baselines) is
the figure; the check is the issue's bound: the largest corpus within 300 MB of the smallest.
BPE throughput is measured in this process on `--bpe-mb` MB of the same text: training the
tokenizer (`train_bpe`), then encoding (`HFTokenizer.encode`, the `tokenizers` library's
threads on every core).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import Check, write_json

BLOCK_MB = 8
STUDY = """\
name: text-memory
task: {name: text_lm, train_length: 128, n_eval: 64, decode_samples: 0}
model: {family: decoder, d_model: 64, n_layers: 2, n_heads: 4}
train: {steps: 20, batch_size: 16, eval_every: 10}
seeds: [0]
"""


def prose_block(size: int, seed: int = 0) -> bytes:
    """`size` bytes of lines of random words from a 2,000-word vocabulary of Zipf frequencies."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    words = ["".join(rng.choice(letters, rng.integers(1, 9))) for _ in range(2000)]
    ranks = np.minimum(rng.zipf(1.2, size // 4), len(words)) - 1
    text = "\n".join(" ".join(words[r] for r in line) for line in np.array_split(ranks, len(ranks) // 12))
    return text.encode()[:size]


def write_corpus(path: Path, size_mb: int, block: bytes) -> None:
    with open(path, "wb") as out:
        for _ in range(size_mb // BLOCK_MB):
            out.write(block)
        out.write(block[: (size_mb % BLOCK_MB) << 20])


def measured(command: list[str], cwd: Path) -> dict[str, float]:
    """Wall seconds and the peak RSS (MB) of the largest process of `command`, in a fresh wrapper
    process (ru_maxrss over children is a maximum since that process started)."""
    wrapper = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", wrapper, *command], check=True, capture_output=True, text=True, cwd=cwd)
    return {"wall_s": time.perf_counter() - start, "peak_rss_mb": int(out.stdout.split()[-1]) / 1024}


def clocked(work) -> tuple[object, float, float]:
    """work()'s result, wall seconds, CPU seconds of this process (every thread)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def bytes_throughput(corpus: Path, size_mb: int) -> dict[str, float]:
    from workbench.tasks.corpus import Source
    from workbench.tasks.tokens import prepare
    from workbench_plugins.task_text_lm import source_texts

    _, wall, cpu = clocked(lambda: prepare(source_texts(Source(str(corpus)), 0.1), "bytes", 0))
    return {"prepare_s": wall, "prepare_mb_per_s": size_mb / wall, "prepare_mb_per_cpu_s": size_mb / cpu}


def bpe_throughput(text: bytes) -> dict[str, float]:
    from workbench.tasks.corpus import pieces
    from workbench.tasks.tokens import train_bpe

    parts = list(pieces(text))
    tokenizer, train_wall, train_cpu = clocked(lambda: train_bpe(iter(parts), 4096))
    n_tokens, wall, cpu = clocked(lambda: sum(len(ids) for ids in tokenizer.encode(parts)))
    mb = len(text) / 2**20
    return {"mb": mb, "train_mb_per_s": mb / train_wall, "train_mb_per_cpu_s": mb / train_cpu,
            "encode_mb_per_s": mb / wall, "encode_mb_per_cpu_s": mb / cpu, "tokens_per_byte": n_tokens / len(text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[10, 1000])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--bpe-mb", type=int, default=16)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    workbench = str(Path(sys.executable).with_name("workbench"))
    block = prose_block(BLOCK_MB << 20)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="text-memory-") as tmp:
        root = Path(tmp)
        (root / "study.yaml").write_text(STUDY)
        os.environ["WORKBENCH_DATA_DIR"] = str(root / "shards")
        for size in args.sizes_mb:
            corpus = root / f"corpus-{size}mb.txt"
            write_corpus(corpus, size, block)
            overrides = ["--set", f"task.path={corpus}", "--set", f"train.steps={args.steps}"]
            prepared = bytes_throughput(corpus, size)
            run = measured([workbench, "run", "study.yaml", "--quiet", "--out", f"runs-{size}", *overrides], root)
            rows[size] = {**prepared, "run_s": run["wall_s"], "run_peak_rss_mb": run["peak_rss_mb"]}
            print(f"{size:>6} MB: prepare {prepared['prepare_s']:.1f} s ({prepared['prepare_mb_per_s']:.0f} MB/s, "
                  f"{prepared['prepare_mb_per_cpu_s']:.0f} MB per CPU s); run {run['wall_s']:.1f} s, peak RSS "
                  f"{run['peak_rss_mb']:.0f} MB")
            corpus.unlink()
            for shard in (root / "shards").rglob("*.bin"):
                shard.unlink()
    bpe = bpe_throughput(prose_block(args.bpe_mb << 20, seed=1))
    print(f"BPE (4,096 tokens) on {bpe['mb']:.0f} MB: training {bpe['train_mb_per_s']:.2f} MB/s "
          f"({bpe['train_mb_per_cpu_s']:.2f} per CPU s), encoding {bpe['encode_mb_per_s']:.2f} MB/s "
          f"({bpe['encode_mb_per_cpu_s']:.2f} per CPU s); {bpe['tokens_per_byte']:.3f} tokens per byte")
    smallest, largest = min(args.sizes_mb), max(args.sizes_mb)
    growth = rows[largest]["run_peak_rss_mb"] - rows[smallest]["run_peak_rss_mb"]
    checks = [Check(f"peak RSS of `workbench run` at {largest} MB minus at {smallest} MB (MB)", growth, "<=", 300)]
    for check in checks:
        print(check.line())
    path = write_json("text_memory", {"sizes": rows, "bpe": bpe, "cpus": os.cpu_count(), "checks": checks}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
