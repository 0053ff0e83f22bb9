"""Every YAML study in the README validates as written (what a new user copies first)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from workbench.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


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
