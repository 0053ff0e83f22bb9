"""What the workbench costs around the training it measures.

    python -m benchmarks.overhead [--steps 200] [--repeats 3] [--threads 1]

Prints, for a tiny and a small decoder on the copy task:
  * time per training step under the workbench's Lightning runner (`train_run`) vs a plain
    PyTorch loop doing the same steps (same model, batches, AdamW, schedule, clipping);
    the target is within 15%;
  * per-run time outside training steps (Trainer set-up, checkpoint, final save; evaluation
    excluded, reported separately);
  * time from process start to the first training step of `workbench run`-equivalent code.
Both sides generate their batches in the loop, so data time is in both. Figures are medians
of `--repeats` alternating trials; on a shared machine they are noisy.
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from workbench.model.transformer import build_model
from workbench.study.train_section import TrainConfig
from workbench.model.optimizers import decay_groups
from workbench.run.run_module import lr_factor
from workbench.run.train import quiet_lightning, train_run
from workbench.model.weights import make_task

TASK = {"name": "copy", "train_length": 16, "eval_lengths": [16], "n_eval": 64, "alphabet_size": 16,
        "min_length": 1}
SIZES = {
    "tiny (d32, 1 layer)": {"d_model": 32, "n_layers": 1, "n_heads": 2},
    "small (d128, 2 layers)": {"d_model": 128, "n_layers": 2, "n_heads": 4},
}


def run_config(size: dict, steps: int) -> dict:
    """A resolved run config; evaluation and checkpoint only once, at the end."""
    task = make_task({"task": TASK, "seed": 0})
    model = build_model({"family": "decoder", "vocab_size": len(task.vocab), **size}).spec.resolved()
    train = TrainConfig(steps=steps, batch_size=32, lr=1e-3, warmup_steps=10, eval_every=steps,
                        checkpoint_every=steps, accelerator="cpu").resolved(TASK["train_length"])
    return {"task": {**TASK, "name": "copy"}, "model": model, "train": train, "seed": 0}


def plain_loop(config: dict) -> float:
    """Seconds per step of a hand-written loop doing what the Lightning run does."""
    torch.manual_seed(config["seed"])
    task = make_task(config)
    model = build_model(config["model"]).train()
    cfg, family = config["train"], config["model"]["family"]
    opt = torch.optim.AdamW(decay_groups(list(model.parameters()), cfg["weight_decay"]), lr=cfg["lr"], betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(
        lr_factor, warmup=cfg["warmup_steps"], total=cfg["steps"], schedule=cfg["schedule"],
        min_ratio=cfg["min_lr_ratio"]))
    start = time.perf_counter()
    for i in range(cfg["steps"]):
        batch = task.train_batch(i, cfg["batch_size"], family)
        loss = task.loss(model, batch, family)
        if not torch.isfinite(loss):  # the runner checks this every step too
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        sched.step()
    return (time.perf_counter() - start) / cfg["steps"]


def lightning_run(config: dict) -> tuple[float, float, float]:
    """(seconds per training step, seconds outside training steps and evaluation, eval seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = train_run("bench", config, Path(tmp) / "run")
    assert result.status == "finished", result.error
    outside = result.wall_time_s - result.train_time_s - result.eval_time_s
    return result.train_time_s / result.steps_done, outside, result.eval_time_s


def time_to_first_step(threads: int) -> float:
    """Process start -> first training step, for the code path of `workbench run`."""
    probe = f"""
import time, sys
t0 = float(sys.argv[1])
import torch; torch.set_num_threads({threads})
from workbench.study import load_study
from workbench.recipes.train.sweep import expand
from workbench.run.recording import RunRecorder
from workbench.run.train import train_run
import tempfile, pathlib, os
def first_step(self, trainer, module):
    print(time.time() - t0, flush=True); os._exit(0)
RunRecorder.on_train_start = first_step
run = expand(load_study(sys.argv[2]))[0]
train_run(run.run_id, run.config, pathlib.Path(tempfile.mkdtemp()) / "run")
"""
    study = Path(__file__).resolve().parent.parent / "studies" / "tiny.yaml"
    out = subprocess.run([sys.executable, "-c", probe, repr(time.time()), str(study)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: tiny models, shared machines)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quiet_lightning()
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.steps} steps, median of {args.repeats}")
    for label, size in SIZES.items():
        config = run_config(size, args.steps)
        plain, light, outside, evals = [], [], [], []
        lightning_run(copy.deepcopy(run_config(size, 20)))  # warm caches and lazy imports once
        for _ in range(args.repeats):
            plain.append(plain_loop(copy.deepcopy(config)))
            step, out, ev = lightning_run(copy.deepcopy(config))
            light.append(step), outside.append(out), evals.append(ev)
        p, lt = statistics.median(plain), statistics.median(light)
        print(f"{label:24s} plain {p * 1e3:7.2f} ms/step   lightning {lt * 1e3:7.2f} ms/step   "
              f"overhead {100 * (lt / p - 1):+5.1f}%   outside steps {statistics.median(outside):.2f} s/run "
              f"(eval {statistics.median(evals):.2f} s)")
    print(f"process start -> first training step: {time_to_first_step(args.threads):.2f} s")


if __name__ == "__main__":
    main()
