"""The tests mirror the code: every folder of `workbench/`, and `plugins/`, has a folder of tests
under the same name, so the test of a module is found where its module is. Test folders have no
`__init__.py` (pytest imports each file by its own name, and `conftest.py` and the test modules
that others import from stay importable), so two test files may not share a name."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
PACKAGE = ROOT / "workbench"
# Folders of tests for code outside the package's folders: the plugins, the benchmarks, and the
# interface (`workbench/cli.py` and the commands it serves, `api.py`, `notebook.py`).
OTHER_FOLDERS = {"plugins", "benchmarks", "cli"}


def files_of(folder: Path) -> list[Path]:
    return sorted(folder.glob("test_*.py"))


def package_folders() -> set[str]:
    return {path.parent.name for path in PACKAGE.glob("*/__init__.py")}


def test_every_folder_of_the_code_has_a_folder_of_tests():
    wanted = package_folders() | {"plugins"}
    assert {"model", "report", "run", "study"} <= wanted
    assert sorted(name for name in wanted if not files_of(TESTS / name)) == []


def test_every_folder_of_tests_is_named_after_code():
    folders = {path.parent.name for path in TESTS.glob("*/test_*.py")}
    assert sorted(folders - package_folders() - OTHER_FOLDERS) == []


def test_no_two_test_files_share_a_name():
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
    assert not list(TESTS.rglob("__init__.py"))
