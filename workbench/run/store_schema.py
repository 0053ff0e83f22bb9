"""What a results store may hold, and how it is opened: a store may come from someone else
(a received results folder, a report's shipped `data/`), so it is read as data, never as a
schema that runs.

    SCHEMA           the three tables the workbench writes (study, runs, curves)
    connect(path)    a connection with defensive settings, after check_schema: no view,
                     trigger, index or table of anyone else's, no column that is computed or
                     unknown; values over MAX_VALUE_BYTES refused by SQLite itself
                     (SQLITE_LIMIT_LENGTH) and, for readers, every statement ended at
                     READ_DEADLINE_S (a progress handler)
    store_error(...) one line for what SQLite reports: a damaged or crafted file, a full or
                     failing disk, a place that cannot be written
"""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from workbench.errors import DiskError, WorkbenchError
from workbench.results import check_regular

BUSY_TIMEOUT_MS = 60_000
MAX_VALUE_BYTES = 64 * 2**20  # one value: a study's YAML text is at most 32 MiB, a run's config a few kB
READ_DEADLINE_S = 20.0  # a reader's statement; a store the workbench wrote is read in well under a second
PROGRESS_EVERY = 10_000  # SQLite virtual-machine steps between two deadline checks

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
) WITHOUT ROWID;                        -- the rows live in the key's b-tree: about half the bytes of a
                                        -- rowid table and its key index (stores written before keep theirs)
"""
TABLES = ("study", "runs", "curves")
# Columns a store written by an earlier workbench may lack, or hold under an earlier name.
OLDER_COLUMNS = {"runs": {"train_flops", "last_step", "cpu_time_s", "position"}}


@functools.cache
def schema_columns() -> dict[str, frozenset[str]]:
    """Each table's columns as SCHEMA creates them (read from an in-memory store of it)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(SCHEMA)
        return {table: frozenset(row[1] for row in conn.execute(f"PRAGMA table_xinfo({table})")) for table in TABLES}
    finally:
        conn.close()


def check_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a store whose schema is not SCHEMA's, before any of its tables is read: a view
    named like a table (an endless recursive one hangs a reader), a trigger (fired by the
    workbench's own writes), an index or table of anyone else's, a generated or unknown column.
    Reading sqlite_master and table_xinfo runs nothing of the schema."""
    for kind, name, table, sql in conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"):
        ours = (kind == "table" and name in TABLES and str(sql).upper().startswith("CREATE TABLE")) or \
            (kind == "index" and sql is None and table in TABLES and str(name).startswith(f"sqlite_autoindex_{table}_"))
        if not ours:
            article = "an" if str(kind)[:1] in "aeiou" else "a"
            raise crafted(path, f"{article} {kind} {str(name)[:40]!r}, which the workbench never creates")
    for table in TABLES:
        columns = list(conn.execute(f"PRAGMA table_xinfo({table})"))
        unknown = [c[1] for c in columns if c[1] not in schema_columns()[table] | OLDER_COLUMNS.get(table, set())]
        computed = [c[1] for c in columns if c[6]]  # hidden: a generated column, computed as it is read
        if unknown or computed:
            raise crafted(path, f"a column {table}.{str((unknown or computed)[0])[:40]!r}, which the workbench never "
                                "creates")


def crafted(path: Path, what: str) -> WorkbenchError:
    return WorkbenchError(f"{path} holds {what}: it is not a store the workbench wrote, and is not read; move it "
                          "away and run the study again (finished runs are recovered from their run folders' "
                          "result.json)")


@contextmanager
def connect(path: Path, readonly: bool = False) -> Iterator[sqlite3.Connection]:
    """A short-lived connection (never shared across processes), committed on success, to a
    store whose schema is SCHEMA's (check_schema). The store and its WAL side files must be
    regular files, checked before SQLite opens anything: SQLite follows a linked store to its
    target and creates `<target>-wal` and `-shm` beside it, and blocks forever opening a FIFO.
    Read-only connections open the file with `mode=ro`, or `immutable=1` when its folder is not
    writable (WAL readers otherwise need to create the -shm side file), and end any statement
    still running after READ_DEADLINE_S."""
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
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        if readonly:
            deadline = time.monotonic() + READ_DEADLINE_S
            conn.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_EVERY)
        conn.execute("PRAGMA trusted_schema = OFF")  # no function with side effects from schema text
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        check_schema(conn, path)
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
    tells a damaged or crafted file (move it away, or --fresh) from a failing or full disk
    (DiskError: the file may be fine, never --fresh)."""
    text = str(err)
    code = (getattr(err, "sqlite_errorcode", None) or 0) & 0xFF  # the primary result code
    if "locked" in text or "busy" in text:
        return WorkbenchError(f"{path}: still locked by another process after {BUSY_TIMEOUT_MS // 1000} s "
                              f"({text}); run again when it has finished")
    if code == sqlite3.SQLITE_FULL or "full" in text:
        return DiskError(f"{path}: the disk is full ({text}); free some space and run again "
                         "(finished runs are kept)")
    if code == sqlite3.SQLITE_IOERR or "disk I/O error" in text:
        return DiskError(f"{path}: the disk failed to read or write it ({text}); the store itself may be intact: "
                         "free some space (a full disk fails this way too) or check the disk, and run again; "
                         "do not delete the store or use --fresh for this")
    if code in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN) or "readonly" in text or "read-only" in text \
            or "unable to open" in text:
        return WorkbenchError(f"{path}: cannot write here ({text}); use --out for a writable folder "
                              "(`workbench results` and `report` read it as it is)")
    if code == sqlite3.SQLITE_TOOBIG:
        return WorkbenchError(f"{path} holds a value over {MAX_VALUE_BYTES // 2**20} MiB, more than the workbench "
                              "writes: it is damaged or crafted; move it away and run the study again")
    if code == sqlite3.SQLITE_INTERRUPT:
        return WorkbenchError(f"{path}: reading it took over {READ_DEADLINE_S:g} s, far longer than any store the "
                              "workbench writes takes: it is damaged or crafted; move it away and run the study again")
    return WorkbenchError(
        f"{path} is not a readable workbench store ({text}): move it away and run the study again "
        "(finished runs are recovered from their run folders' result.json), or run with --fresh to start over")
