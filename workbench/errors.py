"""User-facing errors: the CLI prints their message and exits non-zero, without a traceback."""

from __future__ import annotations

import difflib
import errno
from collections.abc import Iterable


class WorkbenchError(Exception):
    """A mistake in the user's input (study file, model spec, CLI argument)."""


class WorkbenchWarning(UserWarning):
    """Something the user should know that stops nothing; the CLI prints it as one line."""


class SpecError(WorkbenchError, ValueError):
    """An invalid model spec or study field. `field` is the dotted path to it."""

    def __init__(self, field: str, problem: str, choices: Iterable[str] | None = None):
        self.field = field
        self.problem = problem
        self.choices = sorted(choices) if choices is not None else None
        super().__init__(self._message())

    def _message(self) -> str:
        text = f"{self.field}: {self.problem}" if self.field else self.problem
        if self.choices:
            text += f" (valid: {', '.join(self.choices)})"
        return text


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The registered name closest to a typo, if any is close."""
    matches = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_name(field: str, name: str, choices: Iterable[str], what: str) -> SpecError:
    choices = list(choices)
    hint = closest(name, choices)
    problem = f"unknown {what} {name!r}" + (f"; did you mean {hint!r}?" if hint else "")
    return SpecError(field, problem, choices)


class DiskError(WorkbenchError):
    """The disk failed or is full: nothing is wrong with the user's input, and what was
    computed before is intact (told apart from a mistake, whose message says what is valid)."""


DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO)  # the disk, not the place or the input


def write_error(path, err: OSError, what: str = "write it", where: str = "choose a folder this user can write"
                ) -> WorkbenchError:
    """One line for an OSError met writing `path`: a full or failing disk (DiskError: free some
    space or check the disk, the input is fine) or a place that cannot be written (read-only,
    no permission, not a folder: `where` says what to do)."""
    why = err.strerror or str(err)
    if err.errno in DISK_ERRNOS:
        advice = "free some space" if err.errno != errno.EIO else "check the disk"
        return DiskError(f"{path}: cannot {what}: the disk failed or is full ({why}); {advice} and run again "
                         "(what was there before is unchanged)")
    return WorkbenchError(f"{path}: cannot {what} there ({why}); {where}")
