"""A study's task files, relative to the study file rather than the working directory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.registry import variants


def with_task_paths(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The study data with the files its task names, in the task section and in swept
    `task.*` values, taken relative to `folder` (the study file's), not to the working
    directory (`Task.resolve_paths`)."""
    task = data.get("task")
    if not (isinstance(task, Mapping) and isinstance(task.get("name"), str) and task["name"] in variants("task")):
        return data
    cls = variants("task")[task["name"]]

    def values(key: Any, given: Any) -> Any:
        if not (isinstance(key, str) and key.startswith("task.") and isinstance(given, list)):
            return given
        field = key.removeprefix("task.")
        return [cls.resolve_paths({field: value}, folder)[field] for value in given]

    def group(keys: Any) -> Any:
        return {k: values(k, v) for k, v in keys.items()} if isinstance(keys, Mapping) else keys

    out = {**data, "task": cls.resolve_paths(dict(task), folder)}
    sweep = data.get("sweep")
    if isinstance(sweep, Mapping):
        zipped = sweep.get("zip")
        out["sweep"] = {**group(sweep), **({"zip": [group(g) for g in zipped] if isinstance(zipped, list)
                                             else group(zipped)} if "zip" in sweep else {})}
    return out
