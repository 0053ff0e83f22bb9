"""The SQLite store: concurrent writer processes, one row per run, curves without duplicates."""

from __future__ import annotations

import multiprocessing
from types import SimpleNamespace
from conftest import HANG_GUARD_S

from workbench.run import store_schema
from workbench.run.store import Store, load_curves, load_results, load_run_configs

WRITERS, RUNS_EACH = 3, 15


def fake(writer: int, i: int, status: str = "finished"):
    # a run id has 12 hex digits: `results` refuses a row whose id could name a path
    run = SimpleNamespace(run_id=f"{writer:06x}{i:06x}", index=writer * 100 + i, seed=i,
                          swept={"model.position": f"p{writer}"}, config={"seed": i, "writer": writer})
    result = SimpleNamespace(
        status=status, metrics={"accuracy@8": i / 100, "loss@8": 1.0, "accuracy@16": 0.5}, not_applicable={},
        n_params=10, steps_done=5, diverged_step=None, error=None, wall_time_s=1.0, cpu_time_s=0.9, train_time_s=0.5, eval_time_s=0.1, tokens=100, train_flops=None, last_step=None,
        tokens_per_s=200.0, peak_memory_bytes=1, peak_memory_instrument="process_peak_rss", resumed_from_step=None,
        environment={}, curves=[(s, "train", "loss", 1.0 / s) for s in range(1, 6)] + [(5, "eval", "loss@8", float("nan"))],
    )
    return run, result


def write_many(out_dir: str, writer: int) -> None:
    store = Store(out_dir)
    for i in range(RUNS_EACH):
        store.record(*fake(writer, i))


def test_concurrent_writer_processes_lose_nothing(tmp_path):
    Store(tmp_path)
    ctx = multiprocessing.get_context("fork")  # fast start; each writer opens its own connections
    procs = [ctx.Process(target=write_many, args=(str(tmp_path), w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=HANG_GUARD_S)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    table = load_results(tmp_path)
    assert len(table) == WRITERS * RUNS_EACH and table.run_id.is_unique
    curves = load_curves(tmp_path)
    assert len(curves) == WRITERS * RUNS_EACH * 6
    assert curves.value.isna().sum() == WRITERS * RUNS_EACH  # NaN stored as NULL, not dropped


def test_rewriting_a_run_replaces_it_and_counts_attempts(tmp_path):
    store = Store(tmp_path)
    store.record(*fake(0, 1, status="failed"))
    store.record(*fake(0, 1))
    (row,) = store.runs()
    assert row["status"] == "finished" and row["attempts"] == 2
    assert len(load_curves(tmp_path, "000000000001")) == 6
    assert load_run_configs(tmp_path) == {"000000000001": {"seed": 1, "writer": 0}}


def test_flat_table_orders_metrics_by_length_then_name(tmp_path):
    Store(tmp_path).record(*fake(0, 2))
    columns = list(load_results(tmp_path).columns)
    assert columns[:5] == ["run_id", "index", "seed", "model.position", "status"]
    assert columns[5:8] == ["accuracy@8", "loss@8", "accuracy@16"]


def test_a_store_written_before_the_index_column_was_named_reads_and_resumes(tmp_path):
    """Stores written before the sweep index was called `index` have it as `position`."""
    import sqlite3

    store = Store(tmp_path)
    for i in (2, 0, 1):
        store.record(*fake(0, i))
    with sqlite3.connect(tmp_path / "results.db") as conn:
        conn.execute('ALTER TABLE runs RENAME COLUMN "index" TO position')
    assert list(load_results(tmp_path)["index"]) == [0, 1, 2]  # read as it is
    Store(tmp_path).record(*fake(0, 3))  # a writer renames the column and goes on
    table = load_results(tmp_path)
    assert list(table.columns[:3]) == ["run_id", "index", "seed"] and list(table["index"]) == [0, 1, 2, 3]


def test_a_store_written_before_curves_lost_their_rowid_reads_and_copies_at_half_the_bytes(tmp_path):
    """Stores written before 2026-12-05 keep their curves in a rowid table with a key index; they
    are read and written as before, and copy_store (what a report's shipped data is made with)
    puts the same rows into a WITHOUT ROWID table of about half the bytes."""
    import sqlite3

    from workbench.run.store import copy_store

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    with sqlite3.connect(old / "results.db") as conn:  # SCHEMA as it was, curves with a rowid
        conn.executescript(store_schema.SCHEMA.replace(") WITHOUT ROWID;", ");"))
    store = Store(old)
    for i in range(40):
        run, result = fake(0, i)
        result.curves = [(s, split, m, s / 7) for s in range(1, 101) for split, m in (("train", "loss"), ("eval", "loss@8"))]
        store.record(run, result)
    copy_store(old, new)
    with sqlite3.connect(new / "results.db") as conn:
        assert "WITHOUT ROWID" in conn.execute("SELECT sql FROM sqlite_master WHERE name = 'curves'").fetchone()[0]
    assert load_curves(new).equals(load_curves(old)) and len(load_curves(new)) == 40 * 200
    assert (new / "results.db").stat().st_size < 0.7 * (old / "results.db").stat().st_size


# ---- issue 40: a failing disk is not a damaged store ------------------------------------------

SAFE_ADVICE = "do not delete the store or use --fresh for this"


def assert_disk_advice(err: Exception) -> None:
    message = str(err)
    assert "the disk failed to read or write it (disk I/O error)" in message and SAFE_ADVICE in message, message
    assert "move it away" not in message and "to start over" not in message


def test_a_disk_io_error_is_told_apart_from_a_damaged_store(tmp_path, monkeypatch):
    """Injected: the error SQLite gave a reader on a full tmpfs (SQLITE_IOERR_SHMSIZE), raised by
    a monkeypatched sqlite3.connect."""
    import sqlite3

    import pytest

    from workbench.errors import WorkbenchError

    Store(tmp_path).record(*fake(0, 0))

    def failing_disk(*args, **kwargs):
        err = sqlite3.OperationalError("disk I/O error")
        err.sqlite_errorcode, err.sqlite_errorname = 4874, "SQLITE_IOERR_SHMSIZE"
        raise err

    monkeypatch.setattr(sqlite3, "connect", failing_disk)
    with pytest.raises(WorkbenchError) as info:
        load_results(tmp_path)
    assert_disk_advice(info.value)
    monkeypatch.undo()
    assert len(load_results(tmp_path)) == 1  # the store was fine all along


def test_a_full_tmpfs_is_a_disk_error_and_the_store_reads_once_space_is_freed(tmp_path):
    """A real full disk: a 1 MiB tmpfs, where the reader cannot create the store's -shm file.
    Needs the right to mount (root in a container that allows it); skipped elsewhere."""
    import subprocess

    import pytest

    from workbench.errors import WorkbenchError

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        Store(disk / "out").record(*fake(0, 0))
        for side in (disk / "out").glob("results.db-*"):
            side.unlink()
        with open(disk / "fill", "wb") as fill:  # until the disk is full
            with pytest.raises(OSError):
                while True:
                    fill.write(b"\0" * 65536)
                    fill.flush()
        with pytest.raises(WorkbenchError) as info:
            load_results(disk / "out")
        assert_disk_advice(info.value)
        (disk / "fill").unlink()
        assert len(load_results(disk / "out")) == 1
    finally:
        subprocess.run(["umount", str(disk)], check=False)
