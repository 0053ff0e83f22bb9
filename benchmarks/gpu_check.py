"""The Python half of benchmarks/gpu_check.sh: what the shell script should not do in shell.

    python -m benchmarks.gpu_check info                       # this Python's torch, as JSON
    python -m benchmarks.gpu_check install --torch-before F   # pip, keeping that torch
    python -m benchmarks.gpu_check same-torch BEFORE AFTER    # exit 1, loudly, if it changed
    python -m benchmarks.gpu_check summary OUT SCRATCH ...    # OUT/check.json from the steps

Standard library only (torch is imported inside `info`, packaging inside the install's last
check), so that it runs before the project is installed and after an install that broke something.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks import Check

ROOT = Path(__file__).resolve().parent.parent
# What the shell script writes into the output folder (the device tool brings back 8 files).
FILES = {"check": "check.json", "benchmark": "gpu.json", "study": "study.json", "junit": "tests.xml"}
TEST_OUTCOME = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


# ---- torch, before and after the install ------------------------------------------------------


def torch_info() -> dict[str, Any]:
    """The torch this Python imports: versions, build, the GPU it sees."""
    info: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable}
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - a broken torch is what this records
        return info | {"error": f"{type(err).__name__}: {err}"}
    info |= dict(torch=torch.__version__, cuda=torch.version.cuda, distribution=metadata.version("torch"),
                 location=str(Path(torch.__file__).parent), cuda_available=torch.cuda.is_available())
    if info["cuda_available"]:
        info |= dict(device=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                     capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                     bf16=torch.cuda.is_bf16_supported())
    return info


def torch_replaced(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """What changed in torch between two `torch_info` records, or None when it is the same build."""
    keys = ("torch", "cuda", "location")
    if all(before.get(key) == after.get(key) for key in keys):
        return None

    def show(info):
        return info.get("error") or f"torch {info.get('torch')} (CUDA {info.get('cuda')}) in {info.get('location')}"
    return f"torch was replaced by the install: before {show(before)}, after {show(after)}"


def read_info(path: Path) -> dict[str, Any]:
    """An `info` record; one that is missing or empty (torch could not even be asked) as an error."""
    text = path.read_text() if path.is_file() else ""
    return json.loads(text) if text.strip() else {"error": f"no torch record in {path.name} (its import hung or crashed)"}


def constraint(before: dict[str, Any]) -> str:
    """A pip constraint that keeps the installed torch: its distribution's exact version (with a
    local label such as +cu130, which only the installed build carries)."""
    return f"torch=={before['distribution']}\n"


# ---- the install ---------------------------------------------------------------------------------


def dev_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The dev extra's requirements, with the project's own extras it names (`project[a,b]`) expanded."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras, name = project["optional-dependencies"], project["name"]
    out, todo = [], ["dev"]
    while todo:
        for requirement in extras[todo.pop()]:
            own = re.fullmatch(rf"{re.escape(name)}\[(.*)\]", requirement.replace(" ", ""))
            if own:
                todo += own.group(1).split(",")
            else:
                out.append(requirement)
    return out


def missing(requirements: list[str]) -> list[str]:
    """The requirements that no installed distribution satisfies."""
    from packaging.requirements import Requirement  # pip's and Lightning's dependency: always there

    def satisfied(requirement: Requirement) -> bool:
        try:
            return requirement.specifier.contains(metadata.version(requirement.name), prereleases=True)
        except metadata.PackageNotFoundError:
            return False

    return [text for text in requirements if not satisfied(Requirement(text))]


def carried(requirement: str, wheels: Path) -> bool:
    """Whether a wheel in `wheels` bears the requirement's distribution name (its version aside)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename

    name = canonicalize_name(Requirement(requirement).name)
    return any(parse_wheel_filename(wheel.name)[0] == name for wheel in wheels.glob("*.whl"))


def pip(*args: str) -> int:
    command = [sys.executable, "-m", "pip", "install", "--no-input", *args]
    print("$", " ".join(command), flush=True)
    return subprocess.call(command, cwd=ROOT)


def install(before: dict[str, Any], wheels: Path | None, record: Path) -> int:
    """`pip install -e '.[dev]'` under a constraint that keeps `before`'s torch. With `wheels`
    (a machine without a package index) only from that folder, and when a dev requirement is
    neither installed nor there (Ray, wandb and MLflow are too large to carry), the project and
    every wheel there instead; the dev requirements left out are recorded."""
    if "error" in before:
        print(f"no torch to keep: {before['error']}", flush=True)
        return 1
    absent = [r for r in missing(dev_requirements()) if not carried(r, wheels)] if wheels else []
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="torch-constraint-") as file:
        file.write(constraint(before))
        file.flush()
        common = ["-c", file.name, *(["--no-index", "--find-links", str(wheels)] if wheels else [])]
        if absent:
            mode = f"project and the wheels in {wheels}"
            print(f"the dev extras need {', '.join(absent)}, neither installed nor in {wheels}: installing the "
                  "project and the wheels there", flush=True)
            rc = pip(*common, "-e", ".", *map(str, sorted(wheels.glob("*.whl"))))
        else:
            mode, rc = "project with its dev extras", pip(*common, "-e", ".[dev]")
    left_out = missing(dev_requirements())
    record.write_text(json.dumps(dict(mode=mode, rc=rc, wheels=str(wheels) if wheels else None,
                                      constraint=constraint(before).strip(), dev_missing=left_out), indent=2))
    print(f"install: {mode}, pip exit status {rc}; dev requirements not installed: {left_out or 'none'}", flush=True)
    return rc


# ---- reading the steps' outputs ----------------------------------------------------------------------


def pytest_counts(junit: Path, log: Path) -> dict[str, Any]:
    """pytest's counts (passed, failed, errors, skipped) from its junit XML; when pytest was
    stopped before writing it, from the outcome words of the verbose log (tests that finished)."""
    if junit.is_file():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        tests, failed, errors, skipped = (int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped"))
        problems = []
        for case in suite.iter("testcase"):
            problem = next((p for p in (case.find("failure"), case.find("error")) if p is not None), None)
            if problem is not None:
                message = (problem.get("message") or "").splitlines()
                problems.append(f"{case.get('classname')}::{case.get('name')}: {message[0][:300] if message else ''}")
        return dict(source=junit.name, seconds=float(suite.get("time", 0)), passed=tests - failed - errors - skipped,
                    failed=failed, errors=errors, skipped=skipped, problems=problems)
    if not log.is_file():
        return dict(source=None)
    words = [m.group(1) for line in log.read_text(errors="replace").splitlines() if "::" in line
             for m in [TEST_OUTCOME.search(line)] if m]
    return dict(source=f"{log.name} (no junit XML: pytest was stopped before it wrote one)",
                passed=words.count("PASSED") + words.count("XPASS"), failed=words.count("FAILED"),
                errors=words.count("ERROR"), skipped=words.count("SKIPPED") + words.count("XFAIL"), problems=[])


def benchmark_summary(path: Path) -> dict[str, Any]:
    """Which sections of `python -m benchmarks.gpu` finished, failed or were never reached, its
    checks, the quickstart's tokens/s per position scheme and the batched seeds' speed-ups."""
    if not path.is_file():
        return dict(source=None)
    result = json.loads(path.read_text())
    asked = result.get("sections", [])
    sections = {name: result[name] for name in asked if name in result}
    out = dict(source=path.name, device=result.get("device"), tiny=result.get("tiny"),
               finished=[name for name, section in sections.items() if "error" not in section],
               failed={name: section["error"] for name, section in sections.items() if "error" in section},
               not_reached=[name for name in asked if name not in result],
               seconds={name: round(section.get("section_s", 0), 1) for name, section in sections.items()},
               checks=[Check(c["what"], c["value"], c["op"], c["bound"]).line() for c in result.get("checks", [])])
    batched = sections.get("batched_seeds", {}).get("rows", {})
    if batched:  # per model size and batch layout: K -> time per seed alone / time per seed batched
        out["batched_seeds_speed_up"] = {name: row["speed_up"] for name, row in batched.items()}
    runs = sections.get("train_quickstart", {}).get("runs", [])
    if runs:
        out["quickstart_tokens_per_s"] = {", ".join(f"{v}" for v in run["swept"].values()) or run["run_id"]:
                                          run["tokens_per_s"] for run in runs}
    return out


def study_summary(path: Path) -> dict[str, Any]:
    """The study step's runs (`workbench results --format json`): status, speed, memory instrument."""
    if not path.is_file():
        return dict(source=None)
    rows = json.loads(path.read_text() or "[]")
    keep = ("run_id", "status", "tokens_per_s", "peak_memory_bytes", "peak_memory_instrument", "wall_time_s", "error")
    return dict(source=path.name, statuses={s: sum(r["status"] == s for r in rows) for s in {r["status"] for r in rows}},
                runs=[{key: row.get(key) for key in keep} for row in rows])


def readable(read: Callable[..., dict[str, Any]], path: Path, *more: Path) -> dict[str, Any]:
    """`read(path, *more)`, or what made the file unreadable (a step stopped while writing it):
    check.json is written whatever the steps left."""
    try:
        return read(path, *more)
    except Exception as err:  # noqa: BLE001 - any damage to one output must not cost the record
        return dict(source=path.name, error=f"unreadable: {type(err).__name__}: {err}")


def read_steps(path: Path) -> dict[str, dict[str, Any]]:
    """The shell script's step records: name, status, exit status, seconds, budget, log, note (tab-separated)."""
    steps = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, status, rc, seconds, budget, log, note = line.split("\t")
        steps[name] = dict(status=status, rc=int(rc) if rc else None, seconds=float(seconds),
                           budget_s=int(budget) if budget else None, log=log or None, note=note or None)
    return steps


def git_commit() -> tuple[str | None, bool | None]:
    """HEAD and whether tracked files differ from it; (None, None) outside a git checkout."""

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode:
            return None, None
        return head.stdout.strip(), bool(git("status", "--porcelain", "--untracked-files=no").stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        return None, None


def nvidia_smi() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def summary(out: Path, scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    before = read_info(scratch / "torch-before.json")
    after = read_info(scratch / "torch-after.json") if (scratch / "torch-after.json").exists() else None
    steps = read_steps(scratch / "steps.tsv")
    replaced = torch_replaced(before, after) if after is not None else None
    if replaced and "install" in steps:
        steps["install"] |= dict(status="failed", note=replaced)
    commit, dirty = git_commit()
    ran = [step for step in steps.values() if step["status"] != "skipped"]
    record = dict(
        command=args.argv, started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(args.started)),
        seconds=round(time.time() - args.started, 1), total_budget_s=args.total, device_asked=args.device, tiny=args.tiny,
        device=before.get("device") or ("cpu" if "torch" in before else None), torch=before.get("torch"),
        cuda=before.get("cuda"), python=before.get("python"), nvidia_smi=nvidia_smi(),
        commit=args.commit or commit, commit_source="--commit" if args.commit else ("git" if commit else None),
        uncommitted_changes=dirty, machine=f"{platform.machine()}, {platform.system()}",
        torch_before_install=before, torch_after_install=after, torch_replaced=replaced,
        install=json.loads((scratch / "install.json").read_text()) if (scratch / "install.json").is_file() else None,
        steps=steps,
        tests=readable(pytest_counts, out / FILES["junit"], out / "tests.log"),
        benchmark=readable(benchmark_summary, out / FILES["benchmark"]),
        study=readable(study_summary, out / FILES["study"]),
        passed=bool(ran) and all(step["status"] == "passed" for step in ran),
    )
    (out / FILES["check"]).write_text(json.dumps(record, indent=2, default=str))
    return record


def print_summary(record: dict[str, Any]) -> None:
    """The few lines to read first (the device tool shows the end of the output)."""
    print(f"\n== gpu_check: {record['device']}, torch {record['torch']}, CUDA {record['cuda']}, "
          f"commit {record['commit']}{' (uncommitted changes)' if record['uncommitted_changes'] else ''}")
    for name, step in record["steps"].items():
        budget = f" of {step['budget_s']} s" if step["budget_s"] is not None else ""
        print(f"  {name:<10} {step['status']:<8} {step['seconds']:6.1f} s{budget}"
              + (f"  rc {step['rc']}" if step["rc"] else "") + (f"  ({step['note']})" if step["note"] else ""))
    tests, bench = record["tests"], record["benchmark"]
    for name, part in (("tests", tests), ("benchmark", bench), ("study", record["study"])):
        if "error" in part:
            print(f"  {name}: {part['source']} {part['error']}")
    if tests.get("source") and "error" not in tests:
        print(f"  tests: {', '.join(f'{tests[k]} {k}' for k in ('passed', 'failed', 'errors', 'skipped'))}  [{tests['source']}]")
        for line in tests["problems"][:20]:
            print(f"    {line}")
    if bench.get("source") and "error" not in bench:
        print(f"  benchmark sections finished: {', '.join(bench['finished']) or 'none'}"
              + (f"; failed: {', '.join(bench['failed'])}" if bench["failed"] else "")
              + (f"; not reached: {', '.join(bench['not_reached'])}" if bench["not_reached"] else ""))
        for line in bench["checks"]:
            print(f"    {line}")
    if record["study"].get("source") and "error" not in record["study"]:
        print(f"  study runs: {record['study']['statuses']}")
    print(f"  all steps passed: {record['passed']}")


# ---- the command ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="this Python's torch and GPU, as JSON on stdout")
    install_parser = commands.add_parser("install", help="pip install -e '.[dev]' keeping the installed torch")
    install_parser.add_argument("--torch-before", type=Path, required=True, help="`info` JSON of the torch to keep")
    install_parser.add_argument("--wheels", type=Path, default=None, help="install only from this folder of wheels")
    install_parser.add_argument("--record", type=Path, required=True, help="where to write what was installed (JSON)")
    same = commands.add_parser("same-torch", help="exit 1 with a message when two `info` records differ")
    same.add_argument("before", type=Path)
    same.add_argument("after", type=Path)
    summary_parser = commands.add_parser("summary", help="write OUT/check.json and print its digest")
    summary_parser.add_argument("out", type=Path)
    summary_parser.add_argument("scratch", type=Path)
    summary_parser.add_argument("--argv", default="", help="the shell script's command line")
    summary_parser.add_argument("--started", type=float, required=True, help="the script's start (Unix seconds)")
    summary_parser.add_argument("--total", type=int, required=True, help="the script's time budget (s)")
    summary_parser.add_argument("--device", required=True)
    summary_parser.add_argument("--tiny", action="store_true")
    summary_parser.add_argument("--commit", default=None, help="the commit checked, when this is no git checkout")
    args = parser.parse_args(argv)
    if args.command == "info":
        print(json.dumps(torch_info(), indent=2))
    elif args.command == "install":
        if args.wheels and not args.wheels.is_dir():
            parser.error(f"--wheels: {args.wheels} is not a folder (benchmarks/gpu_wheels.sh makes one)")
        return install(json.loads(args.torch_before.read_text()), args.wheels, args.record)
    elif args.command == "same-torch":
        change = torch_replaced(*map(read_info, (args.before, args.after)))
        if change:
            print(f"\n!!!! {change}. Every GPU figure after this would not be of the machine's own torch: "
                  "the check stops here.\n", file=sys.stderr)
            return 1
        print("torch unchanged by the install")
    else:
        print_summary(summary(args.out, args.scratch, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
