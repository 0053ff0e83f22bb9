"""Stores written while run ids named a task's files by where they lay.

Until 2026-12-07 a study's relative `task.path` (or tokenizer.json) entered its run ids and study
hash as the absolute path it resolved to, so the same study file, cloned elsewhere, named other
runs and was refused its own results folder. Ids now name such a file as the study writes it
(`Task.location_params` keep where it lies out of them). A store written before is re-keyed the
first time its study runs into it again, when what defines its runs differs only there: each run
keeps its results, curves and folder under the id the study now gives it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from workbench.errors import WorkbenchError
from workbench.results import CONFIG_FILE, RESULT_FILE, read_regular, write_text_atomic
from workbench.recipes.train.sweep import run_identity
from workbench.run.runner import MAX_RESULT_BYTES
from workbench.run.folder import check_run_id
from workbench.run.store import Store, dumps, run_dir
from workbench.study import StudyFile
from workbench.study.keys import canonical_json, digest


def moved_files(old: Any, new: Any, found: dict[str, str]) -> bool:
    """Whether `old` (what a store says defines its runs) equals `new` (what the study says now)
    but for files `old` names by an absolute path ending in the relative one `new` names; each
    such pair goes into `found` (old -> new)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return old.keys() == new.keys() and all(moved_files(old[k], new[k], found) for k in old)
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(moved_files(a, b, found) for a, b in zip(old, new))
    if (isinstance(old, str) and isinstance(new, str) and old != new and os.path.isabs(old)
            and not os.path.isabs(new) and old.endswith(os.sep + new)):
        found[old] = new
        return True
    return old == new


def rekey_moved_files(store: Store, study_file: StudyFile) -> str | None:
    """Re-key the store's runs when its study differs from the one it was written for only in
    naming its task files by where they lay (`moved_files`); what was done, in a line, or None
    (nothing to do, or another version of the study, which `check_study` then refuses)."""
    info = store.study_record()
    if not info or info.get("name") != study_file.study.name or info.get("hash") == study_file.study_hash:
        return None  # another study's folder is check_study's to refuse
    found: dict[str, str] = {}
    new_defining = json.loads(canonical_json(study_file.study.run_defining()))
    if not moved_files(info.get("run_defining", {}), new_defining, found) or not found:
        return None

    def relocated(config: dict[str, Any]) -> dict[str, Any]:
        task = config["task"]
        files = {k: found[v] for k, v in task.items() if isinstance(v, str) and v in found}
        folder = {task[k][: -len(v) - 1] for k, v in files.items()}
        if not files or len(folder) != 1:  # a run of the store that names the files otherwise: kept as it is
            return config
        return {**config, "task": {**task, **files, "folder": folder.pop()}}

    with store.connect() as conn:
        rows = conn.execute("SELECT run_id, config FROM runs").fetchall()
    renamed = []
    for run_id, text in rows:
        try:
            config = relocated(json.loads(text))
            new_id = digest(run_identity(config))
        except (ValueError, TypeError, KeyError, AttributeError):  # a damaged row keeps its id: the runner's checks name it
            continue
        if new_id != run_id:
            renamed.append((check_run_id(run_id), new_id, config))  # a received store's id names no path
    folders = [(run_dir(store.out_dir, run_id), run_dir(store.out_dir, new_id))  # refused if a link leads out
               for run_id, new_id, _ in renamed]
    with store.connect() as conn:  # one transaction: every run re-keyed, or none
        for run_id, new_id, config in renamed:
            conn.execute("UPDATE runs SET run_id = ?, config = ? WHERE run_id = ?", (new_id, dumps(config), run_id))
            conn.execute("UPDATE curves SET run_id = ? WHERE run_id = ?", (new_id, run_id))
        conn.executemany("INSERT OR REPLACE INTO study (key, value) VALUES (?, ?)",
                         [("hash", study_file.study_hash), ("run_defining", canonical_json(new_defining))])
    for (folder, new_folder), (_, new_id, config) in zip(folders, renamed):
        if folder.is_dir() and not new_folder.exists():
            folder.rename(new_folder)
            write_text_atomic(new_folder / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True))
            result = new_folder / RESULT_FILE
            try:  # the store holds the run: a result.json only recovers a damaged store, so one unread stays
                recovered = json.loads(read_regular(result, MAX_RESULT_BYTES))
                write_text_atomic(result, json.dumps({**recovered, "run_id": new_id}))
            except (OSError, WorkbenchError, ValueError, TypeError):
                pass
    named = ", ".join(sorted(set(found.values())))
    return (f"{store.out_dir}: {len(renamed)} run{'s' * (len(renamed) != 1)} re-keyed: run ids now name {named} as "
            "the study file writes it, not where it lay (results, curves and run folders kept)")
