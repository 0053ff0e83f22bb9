"""Benchmarks: commands that measure and print tables, never timed tests.

    python -m benchmarks.attention_scaling   cost exponents of attention variants (E1, E3, E4)
    python -m benchmarks.batched_seeds       several seeds as one batched model: time per seed against one alone
    python -m benchmarks.crn                 does train.init: paired make paired differences less noisy?
    python -m benchmarks.decode              KV-cache decode latency and bytes (E10, P9, P10)
    python -m benchmarks.gpu                 the GPU check (--device cpu --tiny: its smoke run)
    bash benchmarks/gpu_check.sh OUT         on a GPU machine: install, the GPU check, the CUDA tests, a study
    python -m benchmarks.quickstart          what `make quickstart` costs (--compare: same numbers?)
    python -m benchmarks.study               a whole study's CPU against a plain loop training its runs (--only study)

Results are written as JSON under benchmarks/results/; benchmarks/README.md records what was
measured on which machine.
"""

from __future__ import annotations

import json
import operator
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"
OPERATORS = {">=": operator.ge, "<=": operator.le, "==": operator.eq}


@dataclass(frozen=True)
class Check:
    """One acceptance threshold and its verdict: `what` measured `value`, required `op bound`."""

    what: str
    value: float
    op: str
    bound: float

    @property
    def passed(self) -> bool:
        return OPERATORS[self.op](self.value, self.bound)

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.what} = {self.value:.3f} (required {self.op} {self.bound:g})"


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, {platform.system()}, Python {platform.python_version()}"


def write_json(name: str, payload: dict[str, Any], path: str | Path | None = None) -> Path:
    out = Path(path) if path else RESULTS_DIR / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    body = {"command": " ".join([Path(sys.executable).name, "-m", f"benchmarks.{name}", *sys.argv[1:]]),
            "machine": machine(), **payload}
    body["checks"] = [dict(asdict(c), passed=c.passed) for c in payload.get("checks", [])]
    partial = out.with_name(out.name + ".partial")  # a run stopped while writing leaves the last whole file
    partial.write_text(json.dumps(body, indent=2, default=str))
    partial.replace(out)
    return out
