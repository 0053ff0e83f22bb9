"""What a whole study costs against the training it does: the quickstart study's CPU seconds (the
whole `workbench run` command: start-up, every run, the report) against a minimal plain-torch
loop that trains the same runs, with the same data, initial weights, optimizer, schedule,
clipping and evaluations, in one process on one thread.

    python -m benchmarks --only study [--quick]               the section (two rounds, --jobs 1)
    python -m benchmarks.study [--rounds 2] [--jobs 1 2] [--study PATH] [--set KEY=VALUE ...]
    python -m benchmarks.study --plain STUDY [--set ...] --out FILE.json    one plain side alone

Rounds alternate the sides (ABBA...), each a fresh subprocess whose CPU seconds (user + system,
its children included) are read from RUSAGE_CHILDREN, so the load of other work falls on both
sides alike; the ratio study / plain is the figure (goal: at most 1.05). The runs' own CPU
seconds (the store's) split the study's side into training and the rest (start-up, recording,
the report). The plain side's final metrics are compared with the study's run by run: equal bit
for bit means both sides trained the same models the same way.

The per-step figure (`per_step`): one run of the study trained by `workbench.run.train.train_run`
and by the plain loop in this one process, alternated, at two step counts; the difference of
the CPU seconds over the difference of the steps is each side's cost per step, with the run's
fixed costs (set-up, final evaluation) left out, and those fixed costs (the CPU at 0 steps,
extrapolated).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import Check, write_json

HERE = Path(__file__).resolve().parent.parent
QUICKSTART = HERE / "studies" / "quickstart.yaml"
RATIO_GOAL = 1.05  # issue 63: the whole study within 5% of its training in a plain loop
QUICK = ("train.steps=30", "train.eval_every=15", "train.log_every=5", "train.warmup_steps=3", "seeds=[0]",
         "task.n_eval=32")


# ---- the plain side ------------------------------------------------------------------------------


def lr_factor(step: int, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """Warmup then decay, as workbench.run.run_module.lr_factor (not imported: it loads Lightning)."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
    return min_ratio + (1 - min_ratio) * decay


def plain_run(config: dict[str, Any], fabric=None) -> dict[str, Any]:
    """Train one run's config in a plain loop; its final metrics, curves and CPU seconds. The
    run's arithmetic is the workbench's: Lightning's seeding, AdamW on the same two parameter
    groups, the gradient clipped over them in the optimizer's order, deterministic kernels.
    With a Lightning `fabric`, the same loop through it (`setup`, `backward`, `clip_gradients`:
    what a loop of the workbench's own on Fabric would add per step; per_step times it)."""
    from workbench.model.transformer import build_model
    from workbench.model.weights import make_task
    from workbench.run.evaluate import evaluate_lengths

    train = config["train"]
    if (train.get("init", "sequential"), train.get("init_stream", 0), train.get("budget"), train["grad_accumulation"],
            train["optimizer"]["name"]) != ("sequential", 0, None, 1, "adamw"):
        raise SystemExit("the plain loop trains AdamW runs with the default init, no budget and no micro-batches")
    start = time.process_time()
    random.seed(config["seed"]), np.random.seed(config["seed"]), torch.manual_seed(config["seed"])
    torch.use_deterministic_algorithms(True)  # as the workbench's Trainer(deterministic=True) on a CPU
    task, family = make_task(config), config["model"]["family"]
    model = build_model(config["model"]).train()
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": train["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    spec = train["optimizer"]
    optimizer = torch.optim.AdamW(groups, lr=train["lr"], betas=tuple(spec["betas"]), eps=spec["eps"])
    ordered = [p for group in optimizer.param_groups for p in group["params"]]
    if fabric is not None:
        model, optimizer = fabric.setup(model, optimizer)

    def factor(step: int) -> float:
        return lr_factor(step, train["warmup_steps"], train["steps"], train["schedule"], train["min_lr_ratio"])

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    curves, metrics, cache = [], {}, {}
    for step in range(1, train["steps"] + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = task.loss(model, task.train_batch(step - 1, train["batch_size"], family), family)
        if not torch.isfinite(loss):
            return {"status": "diverged", "diverged_step": step, "curves": curves, "cpu_s": time.process_time() - start}
        if fabric is None:
            loss.backward()
        else:
            fabric.backward(loss)
        if train["grad_clip"] is not None and fabric is None:
            torch.nn.utils.clip_grad_norm_(ordered, train["grad_clip"])
        elif train["grad_clip"] is not None:
            fabric.clip_gradients(model, optimizer, max_norm=train["grad_clip"])
        optimizer.step()
        schedule.step()
        last = step == train["steps"]
        if step % train["log_every"] == 0 or last:  # the lr of the next step, as the workbench records it
            curves += [[step, "train", "loss", float(loss.detach())], [step, "train", "lr", optimizer.param_groups[0]["lr"]]]
        if step % train["eval_every"] == 0 or last:
            metrics, _ = evaluate_lengths(task, model, family, train["eval_batch_size"], cache, None,
                                          train["attention_entropy"])
            curves += [[step, "eval", name, value] for name, value in metrics.items()]
    return {"status": "finished", "metrics": metrics, "curves": curves, "cpu_s": time.process_time() - start}


def plain_study(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Every run of a study (its final runs, no tuning), trained one after another in the plain loop."""
    from workbench.recipes.train.sweep import expand
    from workbench.study import load_study

    return {run.run_id: plain_run(run.config) for run in expand(load_study(path, overrides=tuple(overrides)))}


# ---- the two sides as subprocesses ------------------------------------------------------------------


def timed(command: list[str], env: dict[str, str]) -> dict[str, float]:
    """Wall and CPU seconds (user + system of the process and every child it waited for)."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env, cwd=HERE)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": time.perf_counter() - start,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def study_side(study: Path, overrides: Sequence[str], jobs: int, folder: Path) -> dict[str, Any]:
    """`workbench run STUDY --jobs N` into a fresh folder, report included; its runs' CPU seconds
    and final metrics from the store."""
    from workbench.run.store import Store

    out = folder / f"study-jobs{jobs}"
    command = [sys.executable, "-m", "workbench", "run", str(study), "--jobs", str(jobs), "--quiet", "--fresh",
               "--out", str(out), "--reports", str(folder / f"reports-jobs{jobs}"), *(f"--set={o}" for o in overrides)]
    cost = timed(command, dict(os.environ))
    runs = Store(out, create=False).runs()
    return {**cost, "runs_cpu_s": sum(r["cpu_time_s"] for r in runs), "runs": len(runs),
            "threads": sorted({r["environment"].get("threads") for r in runs}, key=str),
            "metrics": {r["run_id"]: r["metrics"] for r in runs}}


def plain_side(study: Path, overrides: Sequence[str], folder: Path) -> dict[str, Any]:
    """The plain loop over the same runs in a fresh process on one thread."""
    out = folder / "plain.json"
    command = [sys.executable, "-m", "benchmarks.study", "--plain", str(study), "--out", str(out),
               *(f"--set={o}" for o in overrides)]
    cost = timed(command, {**os.environ, "OMP_NUM_THREADS": "1"})
    runs = json.loads(out.read_text())
    return {**cost, "runs_cpu_s": sum(r["cpu_s"] for r in runs.values()), "runs": len(runs), "threads": [1],
            "metrics": {run_id: r.get("metrics", {}) for run_id, r in runs.items()}}


def metric_difference(study: dict[str, dict[str, float]], plain: dict[str, dict[str, float]]) -> dict[str, Any]:
    """How far the plain side's final metrics are from the study's: the largest absolute
    difference, and whether every one is equal bit for bit (NaN equal to NaN)."""
    worst, equal, compared = 0.0, True, 0
    for run_id, metrics in study.items():
        for name, value in metrics.items():
            other = plain.get(run_id, {}).get(name)
            if other is None:
                equal = False
                continue
            compared += 1
            if not (value == other or (math.isnan(value) and math.isnan(other))):
                equal, worst = False, max(worst, abs(value - other))
    return {"compared": compared, "equal": equal and compared > 0, "largest_difference": worst}


def alternated(study: Path, overrides: Sequence[str], jobs: Sequence[int], rounds: int) -> dict[str, Any]:
    """`rounds` rounds of every side, the order reversed every other round (ABBA)."""
    sides: dict[str, list[dict[str, Any]]] = {**{f"study --jobs {j}": [] for j in jobs}, "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                folder = Path(tmp) / f"round{r}"
                folder.mkdir(exist_ok=True)
                side = (plain_side(study, overrides, folder) if name == "plain"
                        else study_side(study, overrides, int(name.rsplit(" ", 1)[1]), folder))
                side["load_1m"] = os.getloadavg()[0]
                sides[name].append(side)
                print(f"round {r + 1} {name:16s} {side['cpu_s']:7.1f} s CPU ({side['runs_cpu_s']:.1f} s in its "
                      f"{side['runs']} runs), {side['wall_s']:.1f} s wall, threads {side['threads']}, "
                      f"load {side['load_1m']:.1f}", flush=True)
    plain = sides["plain"]
    ratios = {name: [s["cpu_s"] / p["cpu_s"] for s, p in zip(rows, plain)] for name, rows in sides.items()
              if name != "plain"}
    same = {name: metric_difference(rows[-1]["metrics"], plain[-1]["metrics"]) for name, rows in sides.items()
            if name != "plain"}
    for rows in sides.values():
        for row in rows:
            row.pop("metrics")
    return {"sides": sides, "ratios": ratios, "same_numbers": same}


# ---- the per-step figure ----------------------------------------------------------------------------


def per_step(study: Path, steps: tuple[int, int] = (100, 400), rounds: int = 3, index: int = 2) -> dict[str, Any]:
    """CPU milliseconds per training step of one run (the study's `index`-th, seed 0) under the
    workbench's Lightning loop, in the plain loop, and in the plain loop through Lightning Fabric
    (a lower bound for a loop of the workbench's own on Fabric: no callbacks, logger or
    checkpoints), in this process, alternated, one thread: the difference between `steps[1]`
    and `steps[0]` steps over the difference of the steps."""
    from workbench.recipes.train.sweep import expand
    from workbench.run.train import quiet_lightning, train_run
    from workbench.study import load_study

    torch.set_num_threads(1)
    quiet_lightning()

    def run(n: int):
        return expand(load_study(study, overrides=(f"train.steps={n}", f"train.eval_every={n}", "seeds=[0]")))[index]

    def config(n: int) -> dict[str, Any]:
        return run(n).config

    def lightning(cfg: dict[str, Any]) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.process_time()
            train_run("per-step", cfg, Path(tmp) / "run")
            return time.process_time() - start

    def plain(cfg: dict[str, Any], fabric=None) -> float:
        start = time.process_time()
        plain_run(cfg, fabric)
        return time.process_time() - start

    from lightning_fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
    sides = [("lightning", lightning), ("plain", plain), ("fabric", lambda cfg: plain(cfg, fabric))]
    short, long = config(steps[0]), config(steps[1])
    lightning(short)  # lazy imports and first-call costs, once
    out: dict[str, list[float]] = {name: [] for name, _ in sides}
    fixed: dict[str, list[float]] = {name: [] for name, _ in sides}
    for r in range(rounds):
        for name, side in (sides if r % 2 == 0 else sides[::-1]):
            a, b = side(short), side(long)
            per_step = (b - a) / (steps[1] - steps[0])
            out[name].append(per_step * 1e3)
            fixed[name].append(a - steps[0] * per_step)  # the run's cost at 0 steps: set-up, final evaluation
    result = {name: statistics.median(values) for name, values in out.items()}
    return {"ms_per_step": result, "rounds": out, "ratio": result["lightning"] / result["plain"],
            "overhead_ms": result["lightning"] - result["plain"],
            "fabric_ratio": result["fabric"] / result["plain"], "fabric_overhead_ms": result["fabric"] - result["plain"],
            "steps": steps, "run": run(steps[0]).describe,
            "fixed_s": {name: statistics.median(values) for name, values in fixed.items()}}


# ---- the section ----------------------------------------------------------------------------------------


def section(console, quick: bool = False, rounds: int = 2, jobs: Sequence[int] = (1,),
            study: Path = QUICKSTART, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The study section of `python -m benchmarks`: whole-study CPU against the plain loop, and per step."""
    overrides = [*overrides, *(QUICK if quick else ())]
    console.print(f"study: {study.name}{' (--quick)' if quick else ''}, {rounds} rounds of "
                  f"{', '.join(f'workbench run --jobs {j}' for j in jobs)} and the plain loop, alternated; "
                  f"load {os.getloadavg()[0]:.1f}")
    result = alternated(study, overrides, jobs, rounds)
    result["per_step"] = per_step(study, (10, 30) if quick else (100, 400), 1 if quick else 3)
    result["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    for name, ratios in result["ratios"].items():
        same = result["same_numbers"][name]
        console.print(f"{name} / plain: CPU ratio {statistics.median(ratios):.3f} (rounds: "
                      f"{', '.join(f'{x:.3f}' for x in ratios)}); final metrics "
                      + ("equal bit for bit" if same["equal"] else f"differ by up to {same['largest_difference']:.3g}"))
    step = result["per_step"]
    console.print(f"per step: Lightning {step['ms_per_step']['lightning']:.2f} ms, plain {step['ms_per_step']['plain']:.2f} "
                  f"ms CPU (ratio {step['ratio']:.3f}, {step['overhead_ms']:+.2f} ms); per run outside its steps: "
                  f"Lightning {step['fixed_s']['lightning']:.2f} s, plain {step['fixed_s']['plain']:.2f} s")
    console.print(f"per step through Lightning Fabric (the plain loop's `backward` and clipping through it): "
                  f"{step['ms_per_step']['fabric']:.2f} ms (ratio {step['fabric_ratio']:.3f}, "
                  f"{step['fabric_overhead_ms']:+.2f} ms)")
    console.print(f"uptime: {result['uptime']}")
    return result


def checks(result: dict[str, Any]) -> list[Check]:
    return [Check(f"(6) study CPU, {name} / plain loop", statistics.median(ratios), "<=", RATIO_GOAL)
            for name, ratios in result["ratios"].items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.study", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plain", metavar="STUDY", help="train STUDY's runs in the plain loop alone (one side)")
    parser.add_argument("--out", type=Path, help="--plain: where to write its runs as JSON; else the results JSON")
    parser.add_argument("--study", type=Path, default=QUICKSTART, help="the study (default: the quickstart)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1], help="`workbench run --jobs` of the study side(s)")
    parser.add_argument("--quick", action="store_true", help="a few steps of one seed: a smoke run of the harness")
    args = parser.parse_args(argv)
    if args.plain:
        torch.set_num_threads(1)
        args.out.write_text(json.dumps(plain_study(args.plain, args.overrides)))
        return 0
    from rich.console import Console

    result = section(Console(width=150), args.quick, args.rounds, args.jobs, args.study, args.overrides)
    path = write_json("study", {**result, "checks": checks(result)}, args.out)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
