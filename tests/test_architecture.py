"""The package's import graph: no circle, and imports run down the layers.

Read from the source with ast (nothing is imported), counting imports inside functions too:
an import placed in a function still makes the importing module depend on the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"

# Lowest first. A module may import its own layer and the ones below it.
LAYERS = {
    "foundation": ["errors", "variants", "hookspecs", "registry", "results", "kinds", "stopping", "sampling",
                   "cache", "hardware"],
    "model": ["attention", "ffn", "norm", "position", "spec", "tasks", "model", "weights"],
    "cost": ["cost"],  # measure, workload, timing, flops, memory, memory_figures, budget, fit
    "study": ["study", "sweep", "tuning"],
    "run": ["run"],  # runner, executor, executor_ray, train (with batches, run_module, recording, ...), store, scaling
    "report": ["report"],
    "interface": ["cli", "scaffold", "__init__", "__main__"],
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The workbench modules `path` imports (`from workbench import x` is module workbench.x
    when x is one, else the package itself)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "workbench"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "workbench":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in known else node.module)
    return out & known


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) - {name} for name, path in found.items()}


def layer(module: str) -> int:
    parts = module.split(".")
    short = parts[1] if len(parts) > 1 else "__init__"
    for index, names in enumerate(LAYERS.values()):
        if short in names:
            return index
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: add it to LAYERS")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer():
    for name in modules():
        layer(name)


def test_no_import_circle():
    assert cycles(graph()) == []


def test_imports_run_down_the_layers():
    upward = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets if layer(b) > layer(a))
    assert upward == []


def test_the_record_layer_loads_neither_torch_nor_lightning():
    """The run record is read by the store, the runner and the report: it must stay light."""
    heavy = {"torch", "pytorch_lightning", "lightning", "matplotlib", "pandas"}
    for name in ("results", "kinds", "errors"):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not roots & heavy, f"workbench.{name} imports {roots & heavy}"


def test_the_checker_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", ["workbench.report.train_report", "workbench.report.train_runs",
                                    "workbench.run.store", "workbench.run.runner"])
def test_readers_of_the_record_do_not_import_the_training_module(module):
    assert "workbench.run.train" not in graph()[module]


def test_imports_inside_functions_say_why():
    """An import of a workbench module inside a function carries a comment saying why (the CLI
    says once, in its docstring, that each command imports what it uses)."""
    silent = []
    for name, path in modules().items():
        if name == "workbench.cli":
            continue
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                module = node.module if isinstance(node, ast.ImportFrom) else (
                    node.names[0].name if isinstance(node, ast.Import) else None)
                if module and module.split(".")[0] == "workbench":
                    line, above = lines[node.lineno - 1], lines[node.lineno - 2].strip()
                    if "#" not in line and not above.startswith("#"):
                        silent.append(f"{name}:{node.lineno}")
    assert silent == []
