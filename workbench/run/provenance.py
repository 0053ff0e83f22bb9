"""Which source a run was trained by and a report was built by: the git commit of the workbench
tree, recorded with every run (its environment) and stated in every report (its Run time)."""

from __future__ import annotations

import subprocess
from pathlib import Path

SHORT = 12  # hex digits of a commit a report prints


def git_commit() -> str | None:
    """The commit of the workbench source tree, when it is a git checkout ("+dirty" if edited)."""
    root = Path(__file__).resolve().parent.parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if commit.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def short_commit(commit: str | None) -> str:
    """A commit as a report prints it: 12 hex digits, "+dirty" kept; "not recorded" for None."""
    if not commit:
        return "not recorded"
    head, _, dirty = commit.partition("+")
    return head[:SHORT] + (f"+{dirty}" if dirty else "")
