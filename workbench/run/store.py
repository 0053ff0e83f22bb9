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
read-only mount) is read as immutable. A damaged store, a full disk or an unwritable folder
is one WorkbenchError naming the file and what to do.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workbench.errors import WorkbenchError
from workbench.results import StoredRow, check_regular, finite_metrics, finite_or_none, first_problem, load_json, run_stage
from workbench.run.folder import check_run_id

if TYPE_CHECKING:
    import pandas as pd

DB_FILE = "results.db"
RUNS_DIR = "runs"  # out_dir/runs/<run_id>/: checkpoints, logs, final.safetensors, result.json
BUSY_TIMEOUT_MS = 60_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS study (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    "index" INTEGER NOT NULL,           -- order in the sweep (`position` in stores written before)
    seed INTEGER NOT NULL,
    status TEXT NOT NULL,               -- a results.Status: finished | diverged | oom | failed | timeout
    swept TEXT NOT NULL,                -- JSON {dotted.key: value label}
    config TEXT NOT NULL,               -- JSON: the fully resolved run config
    metrics TEXT NOT NULL,              -- JSON {metric@length: value}, final
    not_applicable TEXT NOT NULL,       -- JSON {eval length: reason}
    n_params INTEGER,
    steps_done INTEGER,
    last_step TEXT,                     -- under a FLOP or token budget: whole | partial | dropped
    diverged_step INTEGER,
    error TEXT,
    wall_time_s REAL,
    cpu_time_s REAL,                    -- CPU time of the run's processes (NULL: not recorded)
    train_time_s REAL,
    eval_time_s REAL,
    tokens INTEGER,
    train_flops INTEGER,                -- counted training FLOPs spent (NULL in stores written before)
    tokens_per_s REAL,
    peak_memory_bytes INTEGER,
    peak_memory_instrument TEXT,
    resumed_from_step INTEGER,
    environment TEXT NOT NULL,          -- JSON: versions, device, commit
    attempts INTEGER NOT NULL DEFAULT 1,
    recorded_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS curves (
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    split TEXT NOT NULL,                -- train | eval | progress (tokens, flops, seconds spent)
    metric TEXT NOT NULL,               -- loss, lr, accuracy@64, ...
    value REAL,
    PRIMARY KEY (run_id, step, split, metric)
);
"""

# Run-level columns of the flat table, in order (swept keys and metrics go in between).
LEADING = ["run_id", "index", "seed"]
# stage: "tune" for a study's tuning runs, "final" for every other run.
# train_tokens: the store's `tokens` column (real training tokens), named beside train_flops.
TRAILING = ["stage", "n_params", "steps_done", "last_step", "train_tokens", "train_flops", "tokens_per_s", "train_time_s", "eval_time_s", "wall_time_s", "cpu_time_s",
            "peak_memory_bytes", "peak_memory_instrument", "diverged_step", "resumed_from_step",
            "not_applicable", "error", "attempts", "recorded_at"]


@contextmanager
def connect(path: Path, readonly: bool = False) -> Iterator[sqlite3.Connection]:
    """A short-lived connection (never shared across processes), committed on success.
    The store and its WAL side files must be regular files, checked before SQLite opens
    anything: SQLite follows a linked store to its target and creates `<target>-wal` and
    `-shm` beside it, and blocks forever opening a FIFO. Read-only connections open the file
    with `mode=ro`, or `immutable=1` when its folder is not writable (WAL readers otherwise
    need to create the -shm side file)."""
    for name in (path, *side_files(path)):
        check_regular(name)
    try:
        if readonly:
            mode = "mode=ro" if os.access(path.parent, os.W_OK) else "immutable=1"
            conn = sqlite3.connect(f"{path.absolute().as_uri()}?{mode}", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
        else:
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as err:
        raise store_error(path, err) from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        yield conn
        conn.commit()
    except sqlite3.Error as err:
        with suppress(sqlite3.Error):
            conn.rollback()
        raise store_error(path, err) from None
    except BaseException:
        with suppress(sqlite3.Error):
            conn.rollback()
        raise
    finally:
        conn.close()


def side_files(path: Path) -> tuple[Path, Path]:
    """The WAL files SQLite keeps beside a store in WAL mode."""
    return path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")


def store_error(path: Path, err: sqlite3.Error) -> WorkbenchError:
    """One line naming the store file and what to do, for what SQLite reports: its result code
    tells a damaged file (move it away, or --fresh) from a failing or full disk (the file may be
    fine: never --fresh)."""
    text = str(err)
    code = (getattr(err, "sqlite_errorcode", None) or 0) & 0xFF  # the primary result code
    if "locked" in text or "busy" in text:
        return WorkbenchError(f"{path}: still locked by another process after {BUSY_TIMEOUT_MS // 1000} s "
                              f"({text}); run again when it has finished")
    if code == sqlite3.SQLITE_FULL or "full" in text:
        return WorkbenchError(f"{path}: the disk is full ({text}); free some space and run again "
                              "(finished runs are kept)")
    if code == sqlite3.SQLITE_IOERR or "disk I/O error" in text:
        return WorkbenchError(f"{path}: the disk failed to read or write it ({text}); the store itself may be intact: "
                              "free some space (a full disk fails this way too) or check the disk, and run again; "
                              "do not delete the store or use --fresh for this")
    if code in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN) or "readonly" in text or "read-only" in text \
            or "unable to open" in text:
        return WorkbenchError(f"{path}: cannot write here ({text}); use --out for a writable folder "
                              "(`workbench results` and `report` read it as it is)")
    return WorkbenchError(
        f"{path} is not a readable workbench store ({text}): move it away and run the study again "
        "(finished runs are recovered from their run folders' result.json), or run with --fresh to start over")


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
            rows = conn.execute("SELECT * FROM runs").fetchall()
        out = []
        for row in rows:
            d = dict(row)
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


def runs_root(out_dir: str | Path) -> Path:
    """Where the run folders of `out_dir` live: out_dir/runs/, or the folder the study was run
    with (`--runs-dir`, e.g. shared storage for a cluster). A sweep uses a stored folder only
    when given it again (check_runs_dir): a received store cannot choose where runs are written."""
    if (Path(out_dir) / DB_FILE).exists():
        root = Store(out_dir, create=False).study_info().get("runs_dir")
        if root:
            return Path(root)
    return Path(out_dir) / RUNS_DIR


def check_runs_dir(out_dir: str | Path, given: Path | None) -> None:
    """Refuse a `runs_dir` stored in `out_dir` unless this command line gave it (--runs-dir):
    a sweep trains in it and --fresh deletes from it. An unreadable store stores none."""
    try:
        stored = runs_root(out_dir)
    except WorkbenchError:
        return
    if stored != Path(out_dir) / RUNS_DIR and (given is None or given.resolve() != stored):
        raise WorkbenchError(f"{out_dir} keeps its run folders in {stored} (--runs-dir); a results folder cannot "
                             f"choose by itself where runs are written: pass --runs-dir {stored} to use it again")


def run_dir(out_dir: str | Path, run_id: str) -> Path:
    """The folder of one run (its checkpoints, Lightning logs, final weights)."""
    return runs_root(out_dir) / check_run_id(run_id)


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, allow_nan=True)


# ---- reading, for `workbench results` and the reports -------------------------------------


def load_results(out_dir: str | Path) -> pd.DataFrame:
    """One flat row per run: run_id, index (in the sweep), seed, the swept keys, status, final metrics
    (`accuracy@64`, `loss@64`, ...; NaN where not applicable or not finished), then stage
    (tune | final) and cost columns. Sorted in sweep order."""
    import pandas as pd  # here: every worker process loads this module (the kind plugins) and reads no frame

    runs = Store(out_dir, create=False).runs()
    swept = list(dict.fromkeys(k for r in runs for k in r["swept"]))
    metrics = sorted({k for r in runs for k in r["metrics"]}, key=metric_order)
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
        return pd.read_sql_query(query + " ORDER BY run_id, split, metric, step", conn, params=params)


def load_run_configs(out_dir: str | Path) -> dict[str, dict[str, Any]]:
    """run_id -> the fully resolved config it trained with."""
    return {r["run_id"]: r["config"] for r in Store(out_dir, create=False).runs()}


def load_study_info(out_dir: str | Path) -> dict[str, Any]:
    """The stored study (Store.study_record): `study` (the validated study as JSON: name,
    description, notes, baseline, expect, ...), `yaml` (its text), `hash`, `source` (file path)."""
    return Store(out_dir, create=False).study_record()
