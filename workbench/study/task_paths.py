"""A study's task files, relative to the study file rather than the working directory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.registry import variants


def with_task_paths(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The study data with the files its task names, in the task section and in swept
    `task.*` values, read relative to `folder` (the study file's), not to the working
    directory (`Task.resolve_paths`)."""
    task = data.get("task")
    if not (isinstance(task, Mapping) and isinstance(task.get("name"), str) and task["name"] in variants("task")):
        return data
    cls = variants("task")[task["name"]]
    out = {**data, "task": cls.resolve_paths(dict(task), folder)}
    added: dict[str, Any] = {}  # what resolving a swept value adds to the section (where its file lies)

    def values(key: Any, given: Any) -> Any:
        if not (isinstance(key, str) and key.startswith("task.") and isinstance(given, list)):
            return given
        field = key.removeprefix("task.")
        resolved = [cls.resolve_paths({field: value}, folder) for value in given]
        for section in resolved:
            added.update({k: v for k, v in section.items() if k != field})
        return [section[field] for section in resolved]

    def group(keys: Any) -> Any:
        return {k: values(k, v) for k, v in keys.items()} if isinstance(keys, Mapping) else keys

    sweep = data.get("sweep")
    if isinstance(sweep, Mapping):
        zipped = sweep.get("zip")
        out["sweep"] = {**group(sweep), **({"zip": [group(g) for g in zipped] if isinstance(zipped, list)
                                             else group(zipped)} if "zip" in sweep else {})}
    out["task"] = {**added, **out["task"]}
    return out
