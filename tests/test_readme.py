"""The README says what is true: every YAML study in it validates as written (what a new user
copies first), every Python name it shows imports where it shows it, and its code layout table
names the folders of workbench/ one to one."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from workbench.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
PACKAGE = README.parent / "workbench"
NOT_PYTHON = {"workbench.status"}  # the MLflow tag a run's status is recorded under


def yaml_blocks() -> list[str]:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    return [b for b in blocks if re.search(r"^name:", b, flags=re.M)]


def test_the_readme_has_study_examples():
    assert len(yaml_blocks()) >= 2


@pytest.mark.parametrize("index", range(len(yaml_blocks())))
def test_every_readme_study_validates(tmp_path, index):
    path = tmp_path / "study.yaml"
    path.write_text(yaml_blocks()[index], encoding="utf-8")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, f"README study #{index}:\n{yaml_blocks()[index]}\n{result.output}"
    assert result.output.startswith("ok:")


def shown_python_names() -> list[str]:
    """Dotted names (`workbench.run.store.load_results`) and `from workbench... import X` lines."""
    text = README.read_text(encoding="utf-8")
    names = re.findall(r"`(workbench(?:\.\w+)+)", text)
    for module, imported in re.findall(r"^from (workbench[\w.]*) import ([\w, ]+)$", text, flags=re.M):
        names += [f"{module}.{name.strip()}" for name in imported.split(",")]
    return sorted(set(names) - NOT_PYTHON)


def resolves(dotted: str) -> bool:
    """The longest importable module prefix of `dotted` has the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_python_name_the_readme_shows_imports_where_it_shows_it():
    names = shown_python_names()
    assert "workbench.build_model" in names and "workbench.model.position.PositionScheme" in names
    assert [name for name in names if not resolves(name)] == []


def test_the_check_sees_a_moved_name():
    assert not resolves("workbench.position.PositionScheme")
    assert not resolves("workbench.model.position.NoSuchScheme")


def layout_rows() -> dict[str, str]:
    """The "Code layout" table: layer -> what its second column says."""
    section = README.read_text(encoding="utf-8").split("## Code layout", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    return {layer.strip(): text.strip() for layer, text in rows[1:]}


def test_the_code_layout_table_names_every_folder_and_module():
    rows = layout_rows()
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    by_folder = {}
    for layer, text in rows.items():
        found = sorted(set(re.findall(r"`(\w+)/`", text)) - {"workbench"})  # "in `workbench/` itself"
        assert len(found) <= 1, f"layer {layer}: more than one folder"
        if found:
            by_folder[found[0]] = text
    assert sorted(by_folder) == sorted(folders), "one row per folder of workbench/"
    for folder, text in by_folder.items():
        modules = {p.stem for p in (PACKAGE / folder).glob("*.py")} - {"__init__"}
        named = set(re.findall(r"`([a-z_0-9]+)`", text)) - {"workbench"}  # the command
        root = {p.stem for p in PACKAGE.glob("*.py")}
        assert modules <= named, f"{folder}/: the table does not name {sorted(modules - named)}"
        assert named <= modules | root, f"{folder}/: the table names {sorted(named - modules - root)}, not modules"
    named = {layer: set(re.findall(r"`([a-z_0-9]+)`", rows[layer])) for layer in ("foundation", "interface")}
    assert named["foundation"] | named["interface"] - {"workbench"} == {p.stem for p in PACKAGE.glob("*.py")}
