"""The results store: one SQLite file per output folder (`results.db`).

    study   key -> value: the study's name, kind, hash, canonical run-defining JSON, YAML text
    runs    one row per run: status, swept values, config, final metrics, cost (JSON columns)
    curves  (run_id, step, split, metric) -> value: learning curves, train and eval

WAL mode and a busy timeout make it safe for several processes to write at once (a run is
recorded in one transaction: a reader never sees a run without its curves). Every table or
figure is computed from `load_results` (one flat row per run), `load_curves` and
`load_run_configs`.

One sweep writes to a folder at a time (workbench.run.folder.WriterLock). Readers (`results`, `report`) open
the store read-only and need no lock; a folder they cannot write (a received copy, a
read-only mount) is read as immutable. A damaged or crafted store, a full disk or an
unwritable folder is one WorkbenchError naming the file and what to do; what a store may hold,
and how it is opened, is workbench.run.store_schema.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workbench.errors import WorkbenchError, write_error
from workbench.results import FINAL_WEIGHTS, MAX_METRICS, OLD_FINAL_WEIGHTS, StoredRow, finite_metrics, finite_or_none, first_problem
from workbench.results import load_json, read_regular, run_stage, write_text_atomic
from workbench.run.folder import RUN_ID, check_run_id, refuse_links
from workbench.run.store_schema import SCHEMA, connect

if TYPE_CHECKING:
    import pandas as pd

DB_FILE = "results.db"
RUNS_DIR = "runs"  # out_dir/runs/<run_id>/: checkpoints, logs, final.safetensors, result.json
# Run-level columns of the flat table, in order (swept keys and metrics go in between).
LEADING = ["run_id", "index", "seed"]
# stage: "tune" for a study's tuning runs, "final" for every other run.
# train_tokens: the store's `tokens` column (real training tokens), named beside train_flops.
TRAILING = ["stage", "n_params", "steps_done", "last_step", "train_tokens", "train_flops", "tokens_per_s", "train_time_s", "eval_time_s", "wall_time_s", "cpu_time_s",
            "peak_memory_bytes", "peak_memory_instrument", "diverged_step", "resumed_from_step",
            "not_applicable", "error", "attempts", "recorded_at"]


class Store:
    """Read and write one output folder's results.db."""

    def __init__(self, out_dir: str | Path, create: bool = True):
        """create=False: read an existing store (read-only); create=True: the writer's store."""
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / DB_FILE
        self.readonly = not create
        if not create:
            if not os.path.lexists(self.path):
                raise WorkbenchError(f"{self.out_dir}: no results here (no {DB_FILE}); run a study into it first")
            return
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise WorkbenchError(f"{self.out_dir}: cannot create the output folder ({err.strerror}); "
                                 "use --out for a writable folder") from None
        for attempt in range(50):  # two processes creating one store: the loser retries
            try:
                with self.connect() as conn:
                    if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                        conn.execute("PRAGMA journal_mode = WAL")  # persistent: readers never block the writer
                    conn.executescript(SCHEMA)
                    columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
                    if "position" in columns:  # a store written before the sweep index had its name
                        conn.execute('ALTER TABLE runs RENAME COLUMN position TO "index"')
                    for column, kind in (("train_flops", "INTEGER"), ("last_step", "TEXT"), ("cpu_time_s", "REAL")):
                        if column not in columns:  # a store written before budgets (or CPU times)
                            conn.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
                return
            except WorkbenchError as err:
                if "locked" not in str(err) or attempt == 49:
                    raise
                time.sleep(0.1)

    def connect(self):
        return connect(self.path, readonly=self.readonly)

    # ---- the study ------------------------------------------------------------------------

    def study_info(self) -> dict[str, str]:
        with self.connect() as conn:
            return dict(conn.execute("SELECT key, value FROM study").fetchall())

    def study_record(self) -> dict[str, Any]:
        """study_info with its JSON values decoded (the validated study, what defines its runs,
        the providers of its variants, its --set overrides), each checked as runs() checks a row."""
        info = self.study_info()
        try:
            for key in STUDY_JSON_KEYS & info.keys():
                info[key] = column_json(info[key], key)
            return StoredStudy.model_validate(info).model_dump(exclude_unset=True)
        except ValidationError as err:
            where = first_problem(err)
        except (TypeError, ValueError) as err:
            where = str(err)
        raise WorkbenchError(f"{self.path}: its study record is damaged ({where}); move the store away and run the "
                             "study again (finished runs are recovered from their run folders' result.json)")

    def save_study(self, info: dict[str, str]) -> None:
        with self.connect() as conn:
            conn.executemany("INSERT OR REPLACE INTO study (key, value) VALUES (?, ?)", info.items())

    # ---- runs -----------------------------------------------------------------------------

    def statuses(self) -> dict[str, str]:
        with self.connect() as conn:
            return dict(conn.execute("SELECT run_id, status FROM runs").fetchall())

    def record(self, run, result) -> None:
        """Write a run's outcome (a results.RunConfig and RunResult) and curves in one transaction,
        by column name (replacing an earlier attempt); the attempt count is read inside it."""
        r = result
        with self.connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            earlier = conn.execute("SELECT attempts FROM runs WHERE run_id = ?", (run.run_id,)).fetchone()
            attempts = earlier[0] + 1 if earlier else 1
            row = {
                "run_id": run.run_id, "index": run.index, "seed": run.seed, "status": str(r.status),
                "swept": dumps(run.swept), "config": dumps(run.config), "metrics": dumps(finite_metrics(r.metrics)),
                "not_applicable": dumps(r.not_applicable), "n_params": r.n_params, "steps_done": r.steps_done,
                "last_step": r.last_step,
                "diverged_step": r.diverged_step, "error": r.error, "wall_time_s": r.wall_time_s, "cpu_time_s": r.cpu_time_s,
                "train_time_s": r.train_time_s, "eval_time_s": r.eval_time_s, "tokens": r.tokens,
                "train_flops": r.train_flops,
                "tokens_per_s": r.tokens_per_s, "peak_memory_bytes": r.peak_memory_bytes,
                "peak_memory_instrument": r.peak_memory_instrument, "resumed_from_step": r.resumed_from_step,
                "environment": dumps(r.environment), "attempts": attempts,
                "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            columns = ", ".join(f'"{name}"' for name in row)  # quoted: "index" is an SQL keyword
            conn.execute(f"INSERT OR REPLACE INTO runs ({columns}) VALUES ({', '.join('?' * len(row))})",
                         tuple(row.values()))
            conn.execute("DELETE FROM curves WHERE run_id = ?", (run.run_id,))
            conn.executemany(
                "INSERT OR REPLACE INTO curves VALUES (?, ?, ?, ?, ?)",
                [(run.run_id, int(step), split, metric, finite_or_none(value))
                 for step, split, metric, value in r.curves],
            )

    def runs(self) -> list[dict[str, Any]]:
        """Every recorded run with its JSON columns decoded, in sweep order; a row with a column
        too large or too deep, or a value of the wrong type or not finite, is refused naming it."""
        with self.connect() as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute("SELECT * FROM runs LIMIT ?", (MAX_RUNS + 1,)).fetchall()
        if len(rows) > MAX_RUNS:
            raise WorkbenchError(f"{self.path} holds over {MAX_RUNS:,} runs, more than any study the workbench runs: "
                                 "it is damaged or crafted; move it away and run the study again")
        out = []
        for row in rows:
            d = dict(row)
            check_run_id(d["run_id"])  # names a folder: `results` refuses what `report` would
            if "position" in d:  # a store written before the sweep index had its name, read as it is
                d["index"] = d.pop("position")
            d["train_tokens"] = d.pop("tokens")
            for column in ("train_flops", "last_step", "cpu_time_s"):
                d.setdefault(column, None)  # a read-only store written before budgets (or CPU times)
            try:
                for key in JSON_COLUMNS:  # NaN and infinities: stores written before wrote them for null
                    d[key] = column_json(d[key], key, non_finite_as_null=True)
                d.update(StoredRow.model_validate(d).model_dump())
            except ValidationError as err:  # JSON of the wrong shape, a number of the wrong type
                raise self.damaged_row(d, first_problem(err)) from None
            except (TypeError, ValueError) as err:  # invalid, too large or too deep JSON
                raise self.damaged_row(d, "" if "not valid JSON" in str(err) else str(err)) from None
            out.append(d)
        return sorted(out, key=lambda d: d["index"])

    def damaged_row(self, row: dict[str, Any], problem: str) -> WorkbenchError:
        where = f" ({problem})" if problem else ""
        return WorkbenchError(
            f"{self.path}: the row of run {str(row.get('run_id'))[:40]!r} is damaged{where}; move the store away and "
            "run the study again (finished runs are recovered from their run folders' result.json)")


MAX_RUNS = 100_000  # a study's runs: a sweep of thousands at most
MAX_CURVE_ROWS = 20_000_000  # a study's curve points: hundreds of runs of thousands of steps
JSON_COLUMNS = ("swept", "config", "metrics", "not_applicable", "environment")
MAX_COLUMN_CHARS = 4 * 2**20  # a run's resolved config is a few kB
MAX_COLUMN_VALUES = 100_000  # final metrics: a few per eval length
MAX_STUDY_CHARS = 32 * 2**20  # the study's YAML text (workbench.study.yaml_file.MAX_STUDY_BYTES) and names


def column_json(text: Any, key: str, non_finite_as_null: bool = False) -> Any:
    """A JSON column of the store, decoded within MAX_COLUMN_CHARS and MAX_COLUMN_VALUES."""
    if not isinstance(text, str) or len(text) > MAX_COLUMN_CHARS:
        raise ValueError(f"{key}: not JSON text of at most {MAX_COLUMN_CHARS // 2**20} MiB")
    return load_json(text, key, max_values=MAX_COLUMN_VALUES, non_finite_as_null=non_finite_as_null)


class StoredStudy(BaseModel):
    """The `study` table of a store, its JSON values decoded: every other value is text."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Annotated[str, Field(max_length=MAX_STUDY_CHARS)]]
    study: dict[str, Any] = {}
    run_defining: dict[str, Any] = {}
    providers: dict[str, str] = {}
    overrides: list[str] = []


STUDY_JSON_KEYS = frozenset(StoredStudy.model_fields)
PILOT_CPU = "pilot_cpu_s"  # a study's record: CPU seconds of its `workbench plan` pilot's runs it did not reuse


RUNS_DIR_MARK = ".results-folder-"  # RUNS_DIR/.results-folder-<digest>: a results folder whose runs live there


def stored_runs_dir(out_dir: str | Path) -> Path | None:
    """The folder `out_dir`'s store says its run folders are in (`--runs-dir`), if any."""
    if not (Path(out_dir) / DB_FILE).exists():
        return None
    root = Store(out_dir, create=False).study_info().get("runs_dir")
    return Path(root) if root else None


def mark_of(out_dir: str | Path) -> str:
    return RUNS_DIR_MARK + hashlib.blake2b(str(Path(out_dir).resolve()).encode(), digest_size=8).hexdigest()


def claim_runs_dir(out_dir: str | Path, runs_dir: Path) -> None:
    """Leave in `runs_dir` (--runs-dir, given on this command line) a mark naming `out_dir`: the
    readers of `out_dir` then read its runs there (runs_root), and only there."""
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(runs_dir / mark_of(out_dir), str(Path(out_dir).resolve()))
    except OSError as err:
        raise write_error(runs_dir, err, "write in the runs folder (--runs-dir)") from None


def runs_root(out_dir: str | Path) -> Path:
    """Where the run folders of `out_dir` live: out_dir/runs/, or the folder the study was run
    with (`--runs-dir`, e.g. shared storage for a cluster) once that folder names `out_dir` back
    (claim_runs_dir). A received store cannot choose where runs are read or written: a stored
    folder without that mark (a received or moved results folder) is refused naming it."""
    stored = stored_runs_dir(out_dir)
    if stored is None:
        return Path(out_dir) / RUNS_DIR
    try:
        claimed = read_regular(stored / mark_of(out_dir), 4096) == str(Path(out_dir).resolve()).encode()
    except (OSError, WorkbenchError):  # absent, a link, not a file
        claimed = False
    if not claimed:
        raise WorkbenchError(f"{out_dir} keeps its run folders in {stored} (--runs-dir), which does not name it back "
                             "(a received or moved folder): a results folder cannot choose by itself where runs are "
                             f"read; run its study again with --out {out_dir} --runs-dir {stored} to confirm it "
                             "(finished runs are kept)")
    return stored


def check_runs_dir(out_dir: str | Path, given: Path | None) -> None:
    """Refuse a `runs_dir` stored in `out_dir` unless this command line gave it (--runs-dir):
    a sweep trains in it and --fresh deletes from it. An unreadable store stores none."""
    try:
        stored = stored_runs_dir(out_dir)
    except WorkbenchError:
        return
    if stored is not None and (given is None or given.resolve() != stored):
        raise WorkbenchError(f"{out_dir} keeps its run folders in {stored} (--runs-dir); a results folder cannot "
                             f"choose by itself where runs are written: pass --runs-dir {stored} to use it again")


def run_dir(out_dir: str | Path, run_id: str) -> Path:
    """The folder of one run (its checkpoints, Lightning logs, final weights), once it is known
    to hold no symbolic link (a received folder's run folder must not lead elsewhere)."""
    root = runs_root(out_dir)
    refuse_links(root, check_run_id(run_id))
    return root / run_id


def run_folder_hint(folder: str | Path) -> str:
    """What to give a command that reads one finished run (export, evaluate, generate) instead of
    `folder`, which holds none: the study's finished runs when `folder` is a study's output folder
    or the runs/ folder inside one (the likely slip), else where run folders lie."""
    folder = Path(folder)
    try:
        root = runs_root(folder) if (folder / DB_FILE).is_file() else folder
        finished = sorted(p for p in root.iterdir() if RUN_ID.fullmatch(p.name) and
                          any((p / name).is_file() for name in (FINAL_WEIGHTS, OLD_FINAL_WEIGHTS)))
    except (OSError, WorkbenchError):  # not a folder, unreadable, or a store naming a runs folder it cannot
        finished = []
    if not finished:
        return "give the folder of a finished run (runs/<study>/runs/<run id>/)"
    count = f", one of {len(finished)} finished" if len(finished) > 1 else ""
    return f"it holds a study's runs: give one of them (e.g. {finished[0]}{count})"


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, allow_nan=True)


# ---- reading, for `workbench results` and the reports -------------------------------------


def load_results(out_dir: str | Path) -> pd.DataFrame:
    """One flat row per run: run_id, index (in the sweep), seed, the swept keys, status, final metrics
    (`accuracy@64`, `loss@64`, ...; NaN where not applicable or not finished), then stage
    (tune | final) and cost columns. Sorted in sweep order."""
    import pandas as pd  # here: every worker process loads this module (the kind plugins) and reads no frame

    store = Store(out_dir, create=False)
    runs = store.runs()
    swept = list(dict.fromkeys(k for r in runs for k in r["swept"]))
    metrics = sorted({k for r in runs for k in r["metrics"]}, key=metric_order)
    if len(metrics) > MAX_METRICS:
        raise WorkbenchError(f"{store.path}: its runs hold {len(metrics):,} different metrics, more than any study the "
                             f"workbench runs records ({MAX_METRICS:,}): it is damaged or crafted; move it away and run "
                             "the study again")
    rows = []
    for r in runs:
        r = {**r, "stage": run_stage(r["config"])}
        row = {key: r[key] for key in LEADING}
        row.update({key: r["swept"].get(key) for key in swept})
        row["status"] = r["status"]
        row.update({m: r["metrics"].get(m) for m in metrics})
        row.update({key: r[key] for key in TRAILING if key != "not_applicable"})
        row["not_applicable"] = "; ".join(f"@{n}: {why}" for n, why in r["not_applicable"].items()) or None
        rows.append(row)
    columns = [*LEADING, *swept, "status", *metrics, *TRAILING]
    frame = pd.DataFrame(rows, columns=columns)
    for m in metrics:
        if not frame[m].map(lambda v: isinstance(v, str)).any():  # scaling rows keep instrument labels as text
            frame[m] = pd.to_numeric(frame[m], errors="coerce")
    return frame


def metric_order(name: str) -> tuple[int, str]:
    """accuracy@8, exact_match@8, loss@8, accuracy@64, ...: by eval length, then name."""
    metric, _, length = name.partition("@")
    return (int(length) if length.isdigit() else -1, metric)


def load_curves(out_dir: str | Path, run_id: str | None = None) -> pd.DataFrame:
    """Learning curves: columns run_id, step, split (train | eval), metric, value."""
    import pandas as pd

    store = Store(out_dir, create=False)
    query = "SELECT run_id, step, split, metric, value FROM curves"
    params: tuple = ()
    if run_id is not None:
        query, params = query + " WHERE run_id = ?", (run_id,)
    with store.connect() as conn:
        frame = pd.read_sql_query(query + f" ORDER BY run_id, split, metric, step LIMIT {MAX_CURVE_ROWS + 1}", conn,
                                  params=params)
    if len(frame) > MAX_CURVE_ROWS:
        raise WorkbenchError(f"{store.path} holds over {MAX_CURVE_ROWS:,} curve points, more than any study the "
                             "workbench runs records: it is damaged or crafted; move it away and run the study again")
    values = pd.to_numeric(frame["value"], errors="coerce")  # a REAL column holds any type in SQLite
    bad = values.isna() & frame["value"].notna()
    if bad.any():
        row = frame[bad].iloc[0]
        raise WorkbenchError(f"{store.path}: a curve point of run {str(row.run_id)[:40]!r} is {str(row.value)[:40]!r}, "
                             "not a number: the store is damaged or crafted; move it away and run the study again")
    # not finite: null, as recorded since (finite_or_none); a store written before may hold inf
    frame["value"] = values.astype(float).replace([math.inf, -math.inf], math.nan)
    return frame


def copy_store(out_dir: str | Path, dest_dir: Path) -> None:
    """The store of `out_dir` rebuilt at `dest_dir`: its rows (every run row validated as runs()
    validates it) inserted into a fresh store of SCHEMA, never a copy of its file, so nothing of
    a received store's schema travels; without `runs_dir` (the copy's runs travel beside it)."""
    source = Store(out_dir, create=False)
    source.runs()
    target = Store(dest_dir)
    with source.connect() as src, target.connect() as dst:
        study = [(k, v) for k, v in src.execute("SELECT key, value FROM study") if k != "runs_dir"]
        dst.executemany("INSERT INTO study (key, value) VALUES (?, ?)", study)
        cursor = src.execute("SELECT * FROM runs")
        columns = ", ".join('"index"' if c[0] == "position" else f'"{c[0]}"' for c in cursor.description)
        dst.executemany(f"INSERT INTO runs ({columns}) VALUES ({', '.join('?' * len(cursor.description))})", cursor)
        dst.executemany("INSERT INTO curves VALUES (?, ?, ?, ?, ?)",
                        src.execute("SELECT run_id, step, split, metric, value FROM curves"))


def load_run_configs(out_dir: str | Path) -> dict[str, dict[str, Any]]:
    """run_id -> the fully resolved config it trained with."""
    return {r["run_id"]: r["config"] for r in Store(out_dir, create=False).runs()}


def load_study_info(out_dir: str | Path) -> dict[str, Any]:
    """The stored study (Store.study_record): `study` (the validated study as JSON: name,
    description, notes, baseline, expect, ...), `yaml` (its text), `hash`, `source` (file path)."""
    return Store(out_dir, create=False).study_record()
