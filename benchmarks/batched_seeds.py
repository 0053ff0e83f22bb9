"""Several seeds as one batched model (`train.batch_seeds`): a training step's time per seed, K
seeds as one model against one seed alone.

    python -m benchmarks.batched_seeds [--k 1 3 8] [--steps 40] [--rounds 3] [--device cpu]

For each model size (the quickstart's decoder, d64 x 2 layers; a d32 x 1 layer one) and batch
layout (the quickstart's reverse task as it is, padded, where each member runs its own call; at
fixed length, min_length = train_length, where the members go through vmap together), the
training step of workbench.run.batched.BatchedRunModule (every member's loss on its own batch,
backward, per-member clipping, AdamW over the stacked weights), K seeds at once, alternated in
this one process with K = 1: one seed's step alone, as RunModule takes it (the model itself,
torch's clip_grad_norm_, AdamW over its parameters). Lightning's loop is around neither; a
batched run pays it once a step for all K seeds, so a run gains more than the step does. Per seed: the step's seconds / K (CPU:
process CPU seconds at one thread; CUDA: wall seconds, synchronised); speed-up = K = 1's per
seed over K's. benchmarks/gpu.py's `batched_seeds` section runs the same at K = 1, 4, 16, 64.

`--runs STEPS`: also whole runs, Lightning's loop, evaluations and checkpoints included: the
quickstart's rope point at seeds 0..K-1 trained as one batched run (workbench.run.batched) and
as K runs alone (workbench.run.train.train_run), alternated, process CPU seconds per seed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks import write_json

QUICKSTART = Path(__file__).resolve().parent.parent / "studies" / "quickstart.yaml"
SIZES = {"quickstart (d64, 2 layers)": (), "tiny (d32, 1 layer)": ("model.d_model=32", "model.n_layers=1", "model.n_heads=2")}
LAYOUTS = {"padded (lengths 4-12)": (), "fixed length 12": ("task.min_length=12",)}


def stepper(overrides: Sequence[str], k: int, device: torch.device):
    """A function that takes one training step of K seeds (0..K-1) of the quickstart's rope
    point with `overrides`, as one batched module on `device`."""
    import pytorch_lightning as pl

    from workbench.model.weights import make_task
    from workbench.recipes.train.sweep import expand
    from workbench.run.batched import BatchedRunModule
    from workbench.model.optimizers import build_optimizer
    from workbench.run.run_module import RunModule
    from workbench.study import load_study

    seeds = f"seeds=[{', '.join(map(str, range(k)))}]"
    runs = [r for r in expand(load_study(QUICKSTART, overrides=(*overrides, seeds)))
            if r.swept.get("model.position") == "rope"]
    members, tasks = [], []
    for run in runs:
        pl.seed_everything(run.config["seed"], verbose=False)
        tasks.append(make_task(run.config))
        members.append(RunModule(run.config, tasks[-1]))
    train = runs[0].config["train"]
    batches = [[{name: t.to(device) for name, t in task.train_batch(i, train["batch_size"], "decoder").items()}
                for task in tasks] for i in range(8)]
    step = [0]
    if k == 1:  # a seed alone
        model, task = members[0].model.to(device), tasks[0]
        optimizer = build_optimizer(train["optimizer"], model, lr=train["lr"], weight_decay=train["weight_decay"])
        ordered = [p for group in optimizer.param_groups for p in group["params"]]

        def alone() -> None:
            loss = task.loss(model, batches[step[0] % len(batches)][0], "decoder")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ordered, train["grad_clip"])
            optimizer.step()
            step[0] += 1

        return alone, None
    module = BatchedRunModule(members, tasks, None).to(device)
    module.parts = [part.to(device) for part in module.parts]
    optimizer = module.configure_optimizers()["optimizer"]
    alive = list(range(k))

    def together() -> None:
        losses, _ = module.losses(batches[step[0] % len(batches)], alive)
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        module.configure_gradient_clipping(optimizer, train["grad_clip"])
        optimizer.step()
        step[0] += 1

    return together, module


def time_steps(one, steps: int, device: torch.device) -> float:
    """Seconds per step: CPU seconds of this process on a CPU, synchronised wall seconds on CUDA."""
    one()  # warm: first-call costs, optimizer state
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(steps):
            one()
        torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / steps
    start = time.process_time()
    for _ in range(steps):
        one()
    return (time.process_time() - start) / steps


def measure(ks: Sequence[int], steps: int, rounds: int, device: torch.device,
            sizes: dict[str, tuple[str, ...]] = SIZES, layouts: dict[str, tuple[str, ...]] = LAYOUTS) -> dict[str, Any]:
    """Per size and layout: per-seed step seconds at each K (median over `rounds`, each K
    alternated with K = 1 in the order of the round), the speed-ups, and whether vmap ran."""
    rows: dict[str, Any] = {}
    for size, size_overrides in sizes.items():
        for layout, layout_overrides in layouts.items():
            overrides = (*size_overrides, *layout_overrides)
            steppers = {k: stepper(overrides, k, device) for k in sorted({1, *ks})}
            per_seed: dict[int, list[float]] = {k: [] for k in steppers}
            for r in range(rounds):
                order = list(steppers) if r % 2 == 0 else list(reversed(steppers))
                for k in order:
                    per_seed[k].append(time_steps(steppers[k][0], steps, device) / k)
            median = {k: statistics.median(v) for k, v in per_seed.items()}
            rows[f"{size}, {layout}"] = {
                "ms_per_seed_step": {k: 1e3 * v for k, v in median.items()},
                "speed_up": {k: median[1] / v for k, v in median.items()},
                "vmap": {k: steppers[k][1].vmap_steps > 0 for k in steppers if k > 1},
            }
            print(f"{size}, {layout}: " + ", ".join(
                f"K={k} {1e3 * median[k]:.2f} ms/seed ({median[1] / median[k]:.2f}x"
                f"{', vmap' if k > 1 and steppers[k][1].vmap_steps else ''})" for k in median), flush=True)
    return rows


def whole_runs(k: int, steps: int, rounds: int) -> dict[str, Any]:
    """CPU seconds per seed of the quickstart's rope point trained for `steps`: K seeds batched
    against the same K runs alone, alternated in this process (one thread)."""
    import tempfile

    from workbench.recipes.train.sweep import expand
    from workbench.run.batched import train_batched
    from workbench.run.executor import Job
    from workbench.run.train import quiet_lightning, train_run
    from workbench.study import load_study

    quiet_lightning()
    seeds = f"seeds=[{', '.join(map(str, range(k)))}]"
    runs = [r for r in expand(load_study(QUICKSTART, overrides=(f"train.steps={steps}", seeds)))
            if r.swept.get("model.position") == "rope"]

    def batched_cpu() -> float:
        with tempfile.TemporaryDirectory() as tmp:
            jobs = [Job(r.run_id, r.config, Path(tmp) / r.run_id) for r in runs]
            start = time.process_time()
            train_batched(Job(jobs[0].run_id, jobs[0].config, jobs[0].run_dir, batch=tuple(jobs[1:])))
            return (time.process_time() - start) / k

    def alone_cpu() -> float:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.process_time()
            for r in runs:
                train_run(r.run_id, r.config, Path(tmp) / r.run_id)
            return (time.process_time() - start) / k

    out: dict[str, list[float]] = {"batched": [], "alone": []}
    for r in range(rounds):
        for name, side in ((("batched", batched_cpu), ("alone", alone_cpu)) if r % 2 == 0
                           else (("alone", alone_cpu), ("batched", batched_cpu))):
            out[name].append(side())
    median = {name: statistics.median(v) for name, v in out.items()}
    print(f"whole runs, quickstart rope, {steps} steps, K={k}: {median['alone']:.2f} s CPU per seed alone, "
          f"{median['batched']:.2f} batched ({median['alone'] / median['batched']:.2f}x)", flush=True)
    return {"k": k, "steps": steps, "cpu_s_per_seed": median, "rounds": out, "speed_up": median["alone"] / median["batched"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batched_seeds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, nargs="+", default=[3, 8])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=None, metavar="STEPS", help="also whole runs of STEPS steps")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    import os
    result = dict(device=str(device), threads=torch.get_num_threads(), steps=args.steps, rounds=args.rounds,
                  load_before=os.getloadavg()[0], rows=measure(args.k, args.steps, args.rounds, device))
    if args.runs:
        result["whole_runs"] = [whole_runs(k, args.runs, args.rounds) for k in args.k]
    result["load_after"] = os.getloadavg()[0]
    print(f"written: {write_json('batched_seeds', result, args.out)}")
    return result


if __name__ == "__main__":
    main()
