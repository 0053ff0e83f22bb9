"""What `make quickstart` costs, where that time goes, and whether a change kept its numbers.

    python -m benchmarks.quickstart [--jobs 2] [--set KEY=VALUE ...] [--checkout DIR] [--out DIR] [--compare DIR]

Runs `workbench run studies/quickstart.yaml --jobs N --quiet` into a fresh folder in a
subprocess, then `workbench report` on the same store again alone, and prints:
  * sweep: wall and CPU seconds (user + sys of the driver and its workers, which it reaps);
  * runs: CPU seconds per run and training milliseconds per step (from the store);
  * report: wall and CPU seconds of building the report by itself;
  * data: milliseconds per training batch of the quickstart's task.
Everything runs in subprocesses, with the code of `--checkout` (default: this one; another
source tree, e.g. `git worktree add /tmp/before <commit>`, measures that commit with the same
command and this venv's packages).
`--compare DIR` checks, run by run, that this sweep's stored curves (training loss, learning
rate, evaluations, tokens, FLOPs) and final metrics equal those of another store of the same
study bit for bit; training seconds are left out. CPU time is the figure to compare on a
shared machine: wall time follows the other jobs' load.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import write_json

HERE = Path(__file__).resolve().parent.parent
STUDY = HERE / "studies" / "quickstart.yaml"
BATCHES = 300  # training batches timed by the data section
# Milliseconds per training batch of the study's task (CPU; median of 5 rounds of BATCHES).
DATA_PROBE = f"""
import statistics, sys, time
from workbench.model.weights import make_task
from workbench.study import load_study
from workbench.recipes.train.sweep import expand
config = expand(load_study(sys.argv[1]))[0].config
task = make_task(config)
size, family = config["train"]["batch_size"], config["model"]["family"]
task.train_batch(0, size, family)  # the held-out sets are drawn once, before timing
rounds = []
for _ in range(5):
    start = time.process_time()
    for index in range({BATCHES}):
        task.train_batch(index, size, family)
    rounds.append((time.process_time() - start) / {BATCHES} * 1e3)
print(statistics.median(rounds))
"""


def code_of(checkout: Path, folder: Path) -> dict[str, str]:
    """The environment that makes a subprocess import `checkout`'s code: `folder` gets links
    named as the packages install (workbench, and plugins/ as workbench_plugins) and goes
    first on the path (the subprocess also starts in it, so nothing else shadows them)."""
    for name, target in (("workbench", "workbench"), ("workbench_plugins", "plugins")):
        (folder / name).symlink_to(checkout.resolve() / target)
    return {**os.environ, "PYTHONPATH": str(folder)}


def timed(command: list[str], env: dict[str, str], cwd: Path) -> dict[str, float]:
    """Wall and CPU seconds (user + sys of the process and every child it waited for)."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env, cwd=cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": time.perf_counter() - start,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def stored_runs(out: Path) -> dict[str, dict[str, Any]]:
    """run id -> its record, with its curves as {(step, split, metric): value}."""
    from workbench.run.store import Store, load_curves

    curves: dict[str, dict[tuple, float]] = {}
    for row in load_curves(out).itertuples(index=False):
        if row.metric != "seconds":  # training time is not a number a change must keep
            curves.setdefault(row.run_id, {})[(row.step, row.split, row.metric)] = row.value
    return {run["run_id"]: {**run, "curves": curves.get(run["run_id"], {})} for run in Store(out, create=False).runs()}


def differences(ours: dict[str, dict[str, Any]], theirs: dict[str, dict[str, Any]]) -> list[str]:
    """Where two stores of the same study disagree (float.hex equality), one line each."""
    lines = [f"run {run_id}: only in one store" for run_id in sorted(set(ours) ^ set(theirs))]
    for run_id in sorted(set(ours) & set(theirs)):
        for field in ("curves", "metrics"):
            a, b = ours[run_id][field], theirs[run_id][field]
            for key in sorted(set(a) | set(b), key=str):
                if key not in a or key not in b or float(a[key]).hex() != float(b[key]).hex():
                    lines.append(f"run {run_id} {field} {key}: {a.get(key)!r} != {b.get(key)!r}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a study override passed to `workbench run` (e.g. train.steps=60)")
    parser.add_argument("--checkout", type=Path, default=HERE, help="the source tree to measure (default: this one)")
    parser.add_argument("--out", type=Path, help="the sweep's folder (default: a temporary one); it must not exist")
    parser.add_argument("--compare", type=Path, help="another store of the same study: are the numbers equal?")
    parser.add_argument("--json", help="where to write the figures (default: benchmarks/results/quickstart.json)")
    args = parser.parse_args()
    workbench = [sys.executable, "-m", "workbench"]
    with tempfile.TemporaryDirectory() as tmp:
        out = (args.out or Path(tmp) / "quickstart").resolve()
        if out.exists():
            parser.error(f"--out {out} exists; give a new folder (the sweep must start from nothing)")
        code = Path(tmp) / "code"
        code.mkdir()
        env = code_of(args.checkout, code)
        sweep = timed([*workbench, "run", str(STUDY), "--jobs", str(args.jobs), "--quiet", "--out", str(out),
                       "--reports", str(Path(tmp) / "reports"), *(f"--set={o}" for o in args.overrides)], env, code)
        report = timed([*workbench, "report", str(out), "--out", str(Path(tmp) / "report-again")], env, code)
        data = float(subprocess.run([sys.executable, "-c", DATA_PROBE, str(STUDY)], env=env, cwd=code, check=True,
                                    capture_output=True, text=True).stdout.split()[-1])
        runs = stored_runs(out)
        mismatches = differences(runs, stored_runs(args.compare)) if args.compare else None
    per_run_cpu = [r["cpu_time_s"] for r in runs.values()]
    ms_per_step = [1e3 * r["train_time_s"] / r["steps_done"] for r in runs.values() if r["steps_done"]]
    print(f"sweep ({len(runs)} runs, --jobs {args.jobs}): {sweep['wall_s']:.1f} s wall, {sweep['cpu_s']:.1f} s CPU")
    print(f"runs: {statistics.median(per_run_cpu):.1f} s CPU per run (median), "
          f"{statistics.median(ms_per_step):.2f} ms per training step (median; load-dependent)")
    print(f"report alone: {report['wall_s']:.1f} s wall, {report['cpu_s']:.1f} s CPU")
    print(f"data: {data:.3f} ms per training batch (CPU, median of 5 x {BATCHES})")
    if mismatches is not None:
        print(f"compared with {args.compare}: " + ("every curve and metric equal bit for bit" if not mismatches
                                                     else f"{len(mismatches)} differences, first: {mismatches[0]}"))
    path = write_json("quickstart", {"checkout": str(args.checkout.resolve()), "sweep": sweep, "report": report, "data_ms_per_batch": data,
                                     "per_run_cpu_s": per_run_cpu, "ms_per_step": ms_per_step,
                                     "overrides": args.overrides, "compared_with": str(args.compare or ""),
                                     "differences": mismatches}, args.json)
    print(f"written: {path}")
    if mismatches:
        sys.exit(1)


if __name__ == "__main__":
    main()
