"""Study kinds: what the `kind:` of a study file selects, found through one registry.

A kind is a StudyKind subclass that knows its study class (the pydantic model validating
the file) and the four things the CLI does with a study:

    describe   `workbench validate`: what the study expands to, in one line (what the
               machine lacks, `hardware_needs`, is not checked there but listed after it)
    dry_run    `workbench run --dry-run`: every run with its settings; nothing runs
    run        `workbench run`: execute the pending runs into an output folder (the runner
               holds the folder's writer lock around it)
    report     `workbench report`: the report document and the results table from the store
    verdicts   (optional) the notebook API's verdicts without the report's figures and HTML

Kinds register like variants: a plugin module returns its classes from the
`register_study_kinds` hook and is declared as an entry point in the `workbench` group. The
built-ins are the recipes workbench/recipes/train/ and workbench/recipes/scaling/, declared the
same way.
"""

from __future__ import annotations

import functools
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from workbench.errors import unknown_name
from workbench.registry import first_line, hook_results

BUILTIN_KINDS = "workbench.recipes."  # the recipes folder, where the built-in kinds live


@dataclass(frozen=True)
class RunOptions:
    """How `workbench run` executes a study (none of it changes what the runs compute)."""

    jobs: int = 1  # runs at once, in local processes
    fresh: bool = False  # clear what the folder holds first
    quiet: bool = False  # plain lines instead of the live progress display
    console: Any = None  # a rich Console for the progress display (tests capture it)
    executor: Any = None  # a workbench.run.executor.Executor (default: local processes)
    runs_dir: Path | None = None  # where run folders go (default: OUT/runs)
    reuse: tuple[Path, ...] = ()  # other studies' output folders: a finished run of the same id there is not trained again


class StudyKind(ABC):
    """One kind of study; subclasses set `name` and `study` and implement the four steps."""

    name: ClassVar[str]
    study: ClassVar[type]  # the StudyBase subclass that validates a study file of this kind

    @abstractmethod
    def describe(self, study_file) -> str:
        """`workbench validate`'s line; raises a StudyError for a run that cannot be built."""

    def hardware_needs(self, study_file, machine) -> list:
        """The `workbench.hardware.Need`s of the study's settings that `machine` lacks (none by
        default). `validate` lists them as notes; `run` refuses them itself, before anything runs."""
        return []

    @abstractmethod
    def dry_run(self, study_file) -> str:
        """Every run (or measurement) of the study with its settings, as text."""

    @abstractmethod
    def run(self, study_file, out: Path, options: RunOptions):
        """Execute the pending runs into `out`, record each outcome; returns a runner.Summary."""

    @abstractmethod
    def report(self, out_dir: Path, info: dict[str, Any], study, dest: Path, pictures: bool):
        """(report.document.Report, results DataFrame) for the study stored in `out_dir`;
        figures are written under `dest`."""

    def verdicts(self, out_dir: Path, info: dict[str, Any], study) -> list:
        """Each `expect:` entry's verdict (report.document.VerdictLine), as `report` decides them,
        for the notebook API. This default builds the report (pictures aside) in a scratch folder
        and says so on stderr; a kind that can decide its verdicts without figures overrides it."""
        import sys
        import tempfile

        print(f"{study.name}: building the report (no attention pictures) in a scratch folder to read its "
              "verdicts", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="workbench-verdicts-") as scratch:
            report, _ = self.report(out_dir, info, study, Path(scratch), False)
        return list(report.verdicts)


@functools.cache
def study_kinds() -> dict[str, StudyKind]:
    """Every registered study kind by name (built-ins first, so an installed kind of the same
    name overrides a built-in, with a warning)."""
    classes = hook_results("register_study_kinds", kind_problem)
    classes.sort(key=lambda cls: not cls.__module__.startswith(BUILTIN_KINDS))
    found: dict[str, StudyKind] = {}
    for cls in classes:
        if cls.name in found and type(found[cls.name]) is not cls:
            warnings.warn(f"study kind {cls.name!r} from {cls.__module__} overrides {type(found[cls.name]).__module__}",
                          stacklevel=2)
        found[cls.name] = cls()
    return dict(sorted(found.items()))


def kind_problem(item: Any) -> str | None:
    """What is wrong with an item a plugin registers as a study kind (None: nothing)."""
    if not isinstance(item, type) or not issubclass(item, StudyKind):
        return "which is not a StudyKind class"
    if not isinstance(getattr(item, "name", None), str) or not item.name:
        return "a class without a `name`"
    try:
        item()  # a kind holds no state: making one here tells a class that cannot be made (a step left abstract)
    except Exception as err:  # noqa: BLE001 - someone else's class
        return f"which cannot be made ({first_line(err)})"
    return None


def get_kind(name: str, field: str = "kind") -> StudyKind:
    """The study kind registered under `name`; a SpecError naming the field and the choices otherwise."""
    kinds = study_kinds()
    if name not in kinds:
        raise unknown_name(field, name, kinds, "study kind")
    return kinds[name]
