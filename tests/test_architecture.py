"""The package's import graph: no circle, and imports run down the layers.

Read from the source with ast (nothing is imported), counting imports inside functions too:
an import placed in a function still makes the importing module depend on the other.
"""

from __future__ import annotations

import ast
import functools
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"
PLUGINS = ROOT / "plugins"  # installs as workbench_plugins (pyproject.toml)
SOURCES = {"workbench": PACKAGE, "workbench_plugins": PLUGINS}

# Lowest first. A module may import its own layer and the ones below it. Each layer between the
# two ends is one folder: a package of workbench/, or plugins/ (the built-in variants and tasks,
# which read only the base classes below them); the foundation below and the interface above
# are modules in workbench/ itself. A study kind is a recipe at the top, over the layers it puts
# together, so following a study from its file to its report only ever goes down.
LAYERS = {
    "stats": ["stats/"],  # the verdict rule: intervals, tests, Holm, looks, futility, gates, seed planning
    "foundation": ["errors", "variants", "hookspecs", "registry", "results", "kinds", "stopping", "hardware",
                   "deadline", "importing"],
    "model": ["model/"],  # transformer, spec, position, attention, norm, ffn, cache, sampling, weights
    "tasks": ["tasks/"],  # base, metrics, baselines, symbols
    "plugins": ["plugins/"],  # position_*, attention_*, norm_*, ffn_*, task_*: leaves, imported by no module
    "cost": ["cost/"],  # measure, workload, timing, flops, memory, memory_figures, budget, fit
    "study": ["study/"],  # StudyBase and loading: keys, yaml_file, train_section, sections, schema
    "run": ["run/"],  # runner, executor, executor_ray, train (with batches, run_module, recording, ...), store
    "report": ["report/"],  # what every kind's report shares: the document, its rendering, figures, the index
    "recipes": ["recipes/"],  # train/ and scaling/: each study kind whole, from its study class to its report
    "interface": ["api", "cli", "notebook", "scaffold", "__init__", "__main__"],
}


def module_name(path: Path) -> str:
    """The import name of a source file, as installed (plugins/rope.py is workbench_plugins.rope)."""
    top = next(name for name, folder in SOURCES.items() if path.is_relative_to(folder))
    parts = (top, *path.relative_to(SOURCES[top]).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for folder in SOURCES.values() for p in sorted(folder.rglob("*.py"))}


@functools.cache
def reexports() -> dict[str, str]:
    """Name -> module for what workbench/__init__.py re-exports (`from workbench import hookimpl`
    is an import of workbench.hookspecs, the way plugins are told to write it)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    return {alias.asname or alias.name: node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}


def imports(path: Path, known: set[str]) -> set[str]:
    """The modules of ours `path` imports (`from workbench import x` is module workbench.x when
    x is one, the module x comes from when the package re-exports it, else the package)."""
    ours = set(SOURCES)
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] in ours}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ours:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                reexported = reexports().get(alias.name) if node.module == "workbench" else None
                out.add(sub if sub in known else reexported or node.module)
    return out & known


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) - {name} for name, path in found.items()}


def layer(module: str) -> int:
    parts = module.split(".")
    if parts[0] == "workbench_plugins":
        short = "plugins/"
    elif len(parts) == 1:
        short = "__init__"
    else:
        short = parts[1] + "/" if (PACKAGE / parts[1]).is_dir() else parts[1]
    for index, names in enumerate(LAYERS.values()):
        if short in names:
            return index
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: add it to LAYERS")


def folders() -> set[str]:
    """The packages inside workbench/ (folders with an __init__.py) and plugins/, as LAYERS names them."""
    return {f"{p.parent.name}/" for p in PACKAGE.glob("*/__init__.py")} | {f"{PLUGINS.name}/"}


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


def test_the_layers_are_the_folders():
    """Each layer between the foundation and the interface is one folder, and every folder is a layer."""
    named = [name for names in LAYERS.values() for name in names]
    assert len(named) == len(set(named)), "a name in two layers"
    assert {name for name in named if name.endswith("/")} == folders()
    for layer_name, names in LAYERS.items():
        if layer_name not in ("foundation", "interface"):
            assert names == [f"{layer_name}/"], f"layer {layer_name} is not its own folder: {names}"


def test_the_loose_modules_are_the_foundation_and_the_interface():
    """A module directly in workbench/ is one LAYERS names at either end; any other belongs in
    its layer's folder."""
    loose = {p.stem for p in PACKAGE.glob("*.py")}
    assert loose == {name for names in LAYERS.values() for name in names if not name.endswith("/")}


MAX_FUNCTION_LINES = 60  # longer, and a function no longer reads in one screen: split it by what its parts do


def test_no_function_is_a_long_scroll():
    """The function, not the file, is what gets a cap: a module is as long as its one job needs."""
    long = {f"{p.relative_to(ROOT)}:{node.lineno} {node.name}": n for p in modules().values()
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES}
    assert long == {}, f"over {MAX_FUNCTION_LINES} lines: {long}"


def test_every_folder_is_installed():
    """pyproject.toml lists packages one by one: a folder missing there is left out of a
    (non-editable) install, and `import workbench.<folder>` fails only for users."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    assert found - listed == set()


def test_no_import_circle():
    assert cycles(graph()) == []


def test_the_verdict_rule_imports_nothing_else_of_the_workbench():
    """workbench/stats/ is the rule's one home: it can be read and tested alone, and a change of
    the rule is a change there."""
    outside = sorted(f"{a} -> {b}" for a, targets in graph().items() if a.startswith("workbench.stats")
                     for b in targets if not b.startswith("workbench.stats"))
    assert outside == []
    assert {name for name in modules() if name.startswith("workbench.stats.")} >= {
        "workbench.stats.intervals", "workbench.stats.family", "workbench.stats.sequential", "workbench.stats.gate",
        "workbench.stats.power", "workbench.stats.planning", "workbench.stats.rule"}


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


@pytest.mark.parametrize("module", ["workbench.recipes.train.report.build", "workbench.recipes.train.runs",
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
