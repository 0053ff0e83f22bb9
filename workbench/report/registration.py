"""Pre-registration: a `margin:` or a Published-findings row written after its study's first
result is *post hoc*. The report states it beside the verdict; the index marks it; a post-hoc
findings row is shown but not counted as agreeing or disagreeing. A findings row's time is
checked against git history where there is one: the commit that first held the row in its
registered form (`first_commits`) is the evidence, a stated time earlier than it is not."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml


def utc(moment: datetime | str) -> datetime:
    """A time as an aware UTC datetime (naive times, as study files write them, are UTC)."""
    value = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def minute(moment: datetime | str) -> str:
    return utc(moment).strftime("%Y-%m-%d %H:%M UTC")


def post_hoc(registered: datetime | str | None, first_result: datetime | str | None) -> str:
    """'registered 2026-12-01 09:30 UTC, after the study's first result (2026-11-30 15:02 UTC)',
    or '' when registered before it or when either time is unknown."""
    if registered is None or first_result is None or utc(registered) <= utc(first_result):
        return ""
    return f"registered {minute(registered)}, after the study's first result ({minute(first_result)})"


# ---- what git says -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Commit:
    """The commit that first held something (a findings row in its registered form), and its time."""

    sha: str
    time: datetime  # the committer's time, UTC

    def text(self) -> str:
        return f"{minute(self.time)} ({self.sha[:7]})"


def first_commits(path: Path, keys: Callable[[Any], Iterable[Hashable]]) -> dict[Hashable, Commit]:
    """For a file git tracks: each key of its contents (`keys` maps the parsed YAML of one version
    to its keys) -> the oldest commit whose version of the file holds it. {} where git or the
    history is missing (an exported tree, an untracked file, a shallow clone, whose oldest commit would
    seem to register all it holds): the stated `registered` times are then all there is."""
    try:
        root = git(path.parent, "rev-parse", "--show-toplevel").strip()
        if git(root, "rev-parse", "--is-shallow-repository").strip() == "true":
            return {}  # its oldest commit would seem to register every row it holds
        rel = path.resolve().relative_to(Path(root).resolve()).as_posix()
        log = git(root, "log", "--reverse", "--format=%H %ct", "--", rel).split()
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    found: dict[Hashable, Commit] = {}
    for sha, stamp in zip(log[::2], log[1::2]):
        try:
            data = yaml.safe_load(git(root, "show", f"{sha}:{rel}"))
        except (OSError, subprocess.SubprocessError, yaml.YAMLError):
            continue  # a version that did not parse registered nothing
        for key in keys(data):
            found.setdefault(key, Commit(sha, datetime.fromtimestamp(int(stamp), timezone.utc)))
    return found


def git(cwd: str | Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


def registered_at(stated: datetime | str, commit: Commit | None) -> datetime:
    """When a row was registered: its stated time, or the time of the commit that first held it
    when that is later (a stated time can be written earlier than the commit; git's cannot)."""
    return utc(stated) if commit is None else max(utc(stated), commit.time)
