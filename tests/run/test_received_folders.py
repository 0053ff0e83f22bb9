"""A received results folder cannot make the workbench write or delete outside it (issue 26):
each planted link or stored path below is refused with one line, and the victim file it
points at is left as it was. Also: one writer even when the lock file is deleted by hand."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import HANG_GUARD_S

from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.api import write_report
from workbench.run.folder import LOCK_FILE, WriterLock
from workbench.api import run_study
from workbench.run.store import DB_FILE, Store, load_results
from workbench.study import load_study
from workbench.recipes.train.sweep import expand

STUDY = """\
name: tiny-received
task: {name: copy, train_length: 6, eval_lengths: [6], n_eval: 32, alphabet_size: 6}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope}
train: {steps: 10, batch_size: 8, lr: 3.0e-3, warmup_steps: 2, eval_every: 5, log_every: 5}
seeds: [0]
sweep:
  model.position: [none, rope]
"""
VICTIM_TEXT = "the user's own file\n"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("received")
    torch.set_num_threads(1)
    (tmp / "study.yaml").write_text(STUDY)
    assert run_study(tmp / "study.yaml", tmp / "out", quiet=True).statuses == {"finished": 2}
    return tmp / "study.yaml", tmp / "out"


@pytest.fixture
def received(finished, tmp_path):
    """A copy of the finished folder, and a victim folder outside it holding one file."""
    study, out = finished
    shutil.copytree(out, tmp_path / "out", symlinks=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "file.txt").write_text(VICTIM_TEXT)
    return study, tmp_path / "out", victim


def untouched(victim: Path) -> bool:
    return [p.name for p in victim.iterdir()] == ["file.txt"] and (victim / "file.txt").read_text() == VICTIM_TEXT


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def test_a_lock_file_planted_as_a_link_is_replaced_not_followed(received):
    study, out, victim = received
    (out / LOCK_FILE).symlink_to(victim / "file.txt")
    assert run_study(study, out, quiet=True).skipped == 2
    assert untouched(victim) and not (out / LOCK_FILE).is_symlink()


def test_a_run_file_planted_as_a_link_is_refused(received, tmp_path):
    study, out, victim = received
    run = expand(load_study(study))[0]
    with sqlite3.connect(out / DB_FILE) as conn:  # that run must train again
        conn.execute("DELETE FROM runs WHERE run_id = ?", (run.run_id,))
    (out / "runs" / run.run_id / "result.json").unlink()
    config = out / "runs" / run.run_id / "config.json"
    config.unlink()
    config.symlink_to(victim / "file.txt")
    with pytest.raises(WorkbenchError, match=rf"config\.json is a symbolic link \(to {victim}/file\.txt\); the workbench "
                                             "writes only inside .* remove the link"):
        run_study(study, out, quiet=True)
    assert untouched(victim)


def test_a_reports_folder_planted_as_a_link_is_refused(received):
    study, out, victim = received
    (victim / "tiny-received" / "figures").mkdir(parents=True)
    (victim / "tiny-received" / "figures" / "keep.png").write_text("x")
    (victim / "tiny-received" / "index.html").write_text("mine")
    (out / "reports").symlink_to(victim)
    result = cli("report", str(out), "--no-pictures")  # the default destination is OUT/reports
    assert result.exit_code == 2 and "reports is a symbolic link" in result.output and "Traceback" not in result.output
    assert (victim / "tiny-received" / "figures" / "keep.png").exists()
    assert (victim / "tiny-received" / "index.html").read_text() == "mine"
    # and a report folder planted as a link inside a real reports folder
    (out / "reports").unlink()
    (out / "reports").mkdir()
    (out / "reports" / "tiny-received").symlink_to(victim / "tiny-received")
    with pytest.raises(WorkbenchError, match="tiny-received is a symbolic link"):
        write_report(out, out / "reports", pictures=False)
    assert (victim / "tiny-received" / "index.html").read_text() == "mine"


def test_a_stored_runs_dir_is_refused_unless_given_again(received):
    study, out, victim = received
    run = expand(load_study(study))[0]
    (victim / run.run_id).mkdir()
    (victim / run.run_id / "keep.txt").write_text("keep")
    Store(out).save_study({"runs_dir": str(victim)})
    for fresh in ("", "--fresh"):
        result = cli("run", str(study), "--out", str(out), "--quiet", *([fresh] if fresh else []))
        assert result.exit_code == 2 and f"keeps its run folders in {victim} (--runs-dir)" in result.output
        assert f"pass --runs-dir {victim} to use it again" in result.output
    assert (victim / run.run_id / "keep.txt").read_text() == "keep"
    assert len(load_results(out)) == 2  # --fresh deleted nothing either


def test_a_stored_run_id_that_is_a_path_is_refused(received):
    study, out, victim = received
    with sqlite3.connect(out / DB_FILE) as conn:
        conn.execute("UPDATE runs SET run_id = '../../victim' WHERE \"index\" = 0")
    with pytest.raises(WorkbenchError, match=r"'\.\./\.\./victim' is not a run id \(12 hex digits\)"):
        write_report(out, out / "reports")  # the pictures load each run's weights from its folder
    assert untouched(victim)


def test_the_hidden_attack_leaves_the_victim_untouched_through_the_cli(received):
    """Planted links and a stored runs_dir together: run, report, run --fresh."""
    study, out, victim = received
    (out / LOCK_FILE).symlink_to(victim / "file.txt")
    (out / "reports").symlink_to(victim)
    Store(out).save_study({"runs_dir": str(victim)})
    for args in (("run", str(study), "--out", str(out)), ("report", str(out)),
                 ("run", str(study), "--out", str(out), "--fresh")):
        result = cli(*args)
        assert result.exit_code == 2 and result.output.startswith("error: "), result.output
        assert len(result.output.splitlines()) == 1
    assert untouched(victim)


def test_a_deleted_lock_file_does_not_admit_a_second_writer(received):
    study, out, _ = received
    with WriterLock(out):
        (out / LOCK_FILE).unlink()  # deleted by hand while a sweep writes
        with pytest.raises(WorkbenchError, match="being written by another `workbench run`"):
            run_study(study, out, quiet=True)


# ---- round three (issue 40): the store and run files are read as regular files only ---------

def test_a_store_planted_as_a_link_is_refused_before_sqlite_writes_beside_its_target(received, tmp_path):
    """SQLite follows a linked store and creates `<target>-wal` and `-shm` beside the target:
    every reading command refuses the link first, and the folder the link points into stays
    as it was."""
    study, out, victim = received
    elsewhere = victim / "their.db"
    shutil.move(out / DB_FILE, elsewhere)  # a real workbench store, in WAL mode, outside the folder
    for side in out.glob(f"{DB_FILE}-*"):
        side.unlink()
    (out / DB_FILE).symlink_to(elsewhere)
    before = sorted(p.name for p in victim.iterdir())
    for args in (("results", str(out)), ("report", str(out), "--no-pictures"),
                 ("compare", str(out), str(out), "--no-pictures", "--out", str(tmp_path / "cmp"))):
        result = cli(*args)
        assert result.exit_code == 2 and len(result.output.splitlines()) == 1, (args, result.output)
        assert f"{DB_FILE} is a symbolic link (to {elsewhere})" in result.output, result.output
    assert sorted(p.name for p in victim.iterdir()) == before  # no their.db-wal, their.db-shm


@pytest.mark.parametrize("side", ["-wal", "-shm"])
def test_a_wal_side_file_planted_as_a_link_is_refused(received, side):
    study, out, victim = received
    (out / f"{DB_FILE}{side}").unlink(missing_ok=True)
    (out / f"{DB_FILE}{side}").symlink_to(victim / "file.txt")
    result = cli("results", str(out))
    assert result.exit_code == 2 and f"{DB_FILE}{side} is a symbolic link" in result.output
    assert untouched(victim)


def returns_within(call, seconds: float, fifo: Path):
    """call()'s value, or a test failure when it blocks past `seconds` (the FIFO is then opened
    for writing, which releases a reader blocked opening it)."""
    import os
    import threading

    outcome: list = []

    def target():
        try:
            outcome.append(("value", call()))
        except BaseException as err:  # noqa: BLE001 - handed to the test
            outcome.append(("error", err))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail(f"blocked on the FIFO {fifo}")
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def test_a_fifo_in_place_of_the_store_is_refused_at_once(received):
    import os

    study, out, victim = received
    (out / DB_FILE).unlink()
    os.mkfifo(out / DB_FILE)
    with pytest.raises(WorkbenchError, match=rf"{DB_FILE} is not a regular file \(a FIFO\)"):
        returns_within(lambda: load_results(out), 20, out / DB_FILE)
    with pytest.raises(WorkbenchError, match=rf"{DB_FILE} is not a regular file \(a FIFO\)"):
        returns_within(lambda: run_study(study, out, quiet=True), 20, out / DB_FILE)


def test_a_fifo_in_place_of_a_result_json_is_refused_and_its_run_trains_again(received):
    import os

    from workbench.run.runner import recorded_result

    study, out, victim = received
    run = expand(load_study(study))[0]
    path = out / "runs" / run.run_id / "result.json"
    path.unlink()
    os.mkfifo(path)
    warnings: list[str] = []
    assert returns_within(lambda: recorded_result(run, out, warn=warnings.append), 20, path) is None
    assert len(warnings) == 1 and "is not a regular file (a FIFO)" in warnings[0] and "training that run again" in warnings[0]


def test_a_fifo_in_place_of_a_checkpoint_fails_only_that_run_naming_it(received):
    import os

    from workbench.results import LAST_CHECKPOINT, Status
    from workbench.run.train import train_run

    study, out, victim = received
    run = expand(load_study(study))[0]
    folder = out / "runs" / run.run_id
    (folder / "checkpoints").mkdir(exist_ok=True)
    (folder / LAST_CHECKPOINT).unlink(missing_ok=True)
    os.mkfifo(folder / LAST_CHECKPOINT)
    result = returns_within(lambda: train_run(run.run_id, run.config, folder), 60, folder / LAST_CHECKPOINT)
    assert result.status == Status.FAILED and "last.ckpt is not a regular file (a FIFO)" in result.error


def test_a_fifo_in_place_of_the_final_weights_is_refused_by_the_report(received):
    import os

    from workbench.model.weights import load_final_model
    from workbench.results import FINAL_WEIGHTS

    study, out, victim = received
    folder = out / "runs" / expand(load_study(study))[0].run_id
    (folder / FINAL_WEIGHTS).unlink()
    os.mkfifo(folder / FINAL_WEIGHTS)
    with pytest.raises(WorkbenchError, match=r"final\.safetensors is not a regular file \(a FIFO\)"):
        returns_within(lambda: load_final_model(folder), HANG_GUARD_S, folder / FINAL_WEIGHTS)
    result = returns_within(lambda: cli("report", str(out)), HANG_GUARD_S, folder / FINAL_WEIGHTS)
    assert result.exit_code == 2 and "is not a regular file (a FIFO)" in result.output and "Traceback" not in result.output


# ---- tampered values (issue 40) ---------------------------------------------------------------

def test_a_pending_runs_result_json_with_values_that_are_not_finite_is_not_recorded(received, capsys):
    """NaN metrics and `"wall_time_s": Infinity` were recorded as finished, and every report
    of the folder then failed with OverflowError."""
    study, out, victim = received
    first, second = expand(load_study(study))
    with sqlite3.connect(out / DB_FILE) as conn:
        conn.execute("DELETE FROM runs WHERE run_id = ?", (second.run_id,))
    path = out / "runs" / second.run_id / "result.json"
    text = path.read_text()
    path.write_text(re.sub(r'"wall_time_s": [0-9.e+-]+', '"wall_time_s": Infinity', text))
    summary = run_study(study, out, quiet=True)
    assert "result.json is not a readable result (result.json: Infinity is not a finite number)" in capsys.readouterr().err
    assert summary.statuses == {"finished": 1}  # trained again, not recorded from the tampered file
    assert cli("report", str(out), "--no-pictures").exit_code == 0


@pytest.mark.parametrize("column, value, message", [
    ("wall_time_s", "1e999", r"wall_time_s: Input should be a finite number"),
    ("steps_done", "1", None),  # a control: the row as the workbench writes it reads back
    ("metrics", "'" + "[" * 5000 + "'", r"metrics: nested over 32 levels deep"),
    ("config", "'" + '{"a":' * 40 + "1" + "}" * 40 + "'", r"config: nested over 32 levels deep"),
    ("metrics", "'{" + ", ".join(f'"m{i}": 1' for i in range(100_001)) + "}'", r"metrics: holds over 100000 values"),
    ("recorded_at", "'yesterday'", r"recorded_at: Value error, Invalid isoformat string"),
    ("status", "'won'", r"status: Input should be 'finished'"),
])
def test_a_stored_row_with_a_value_out_of_shape_is_one_line_from_every_command(received, tmp_path, column, value,
                                                                               message):
    study, out, victim = received
    with sqlite3.connect(out / DB_FILE) as conn:
        conn.execute(f"UPDATE runs SET {column} = {value} WHERE \"index\" = 0")
    for args in (("results", str(out)), ("report", str(out), "--no-pictures"),
                 ("compare", str(out), str(out), "--no-pictures", "--out", str(tmp_path / "cmp"))):
        result = cli(*args)
        if message is None:
            assert result.exit_code == 0, (args, result.output)
            continue
        assert result.exit_code == 2 and len(result.output.splitlines()) == 1, (args, result.output)
        assert re.search(r"the row of run '[0-9a-f]{12}' is damaged \(" + message, result.output), result.output


@pytest.mark.parametrize("key, value, message", [
    ("study", '{"not json', r"its study record is damaged \(study: not valid JSON"),
    ("study", "[" * 5000, r"its study record is damaged \(study: nested over 32 levels deep"),
    ("run_defining", "{oops", r"its study record is damaged \(run_defining: not valid JSON"),
    ("study:kind", [1], r"the stored study has kind '\[1\]', which this workbench does not know"),
    ("study:name", "../../victim", r"damaged study description \(name: String should match pattern"),
    ("study:train.steps", "abc", r"damaged study description \(train.steps: "),
])
def test_a_stored_study_record_out_of_shape_is_one_line(received, tmp_path, key, value, message):
    import json

    study, out, victim = received
    with sqlite3.connect(out / DB_FILE) as conn:
        if key.startswith("study:"):
            stored = json.loads(conn.execute("SELECT value FROM study WHERE key = 'study'").fetchone()[0])
            *parents, last = key.removeprefix("study:").split(".")
            node = stored
            for part in parents:
                node = node[part]
            node[last] = value
            conn.execute("UPDATE study SET value = ? WHERE key = 'study'", (json.dumps(stored),))
        else:
            conn.execute("UPDATE study SET value = ? WHERE key = ?", (value, key))
    for args in (("report", str(out), "--no-pictures"),
                 ("compare", str(out), str(out), "--no-pictures", "--out", str(tmp_path / "cmp"))):
        result = cli(*args)
        assert result.exit_code == 2 and len(result.output.splitlines()) == 1, (args, result.output)
        assert re.search(message, result.output), (args, result.output)
    if not key.startswith("study:"):  # `run` reads the record too
        result = cli("run", str(study), "--out", str(out), "--quiet")
        assert result.exit_code == 2 and re.search(message, result.output.splitlines()[-1]), result.output


def test_a_stored_run_config_without_a_variant_name_is_one_line(received):
    import json

    study, out, victim = received
    with sqlite3.connect(out / DB_FILE) as conn:
        run_id, config = conn.execute("SELECT run_id, config FROM runs WHERE \"index\" = 0").fetchone()
        config = json.loads(config)
        del config["model"]["position"]["name"]
        conn.execute("UPDATE runs SET config = ? WHERE run_id = ?", (json.dumps(config), run_id))
    result = cli("report", str(out), "--no-pictures")
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert f"the stored config of run '{run_id}' names no task or variant" in result.output


# ---- a folder of another study (issue 64) ----------------------------------------------------

OTHER = STUDY.replace("name: tiny-received", "name: other-study").replace("steps: 10,", "steps: 4,") + """\
expect:
  - {metric: accuracy@6, better: rope, than: none}
"""


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file but the store's (SQLite rewrites its side files on opening; its rows are compared)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(DB_FILE)}


@pytest.mark.parametrize("command", [["run", "{study}", "--out", "{out}", "--quiet"],
                                     ["run", "{study}", "--out", "{out}", "--quiet", "--fresh"],
                                     ["plan", "{study}", "--out", "{out}", "--quiet"],
                                     ["plan", "{study}", "--out", "{out}", "--quiet", "--fresh"]])
def test_a_folder_of_another_study_is_refused_and_fresh_deletes_none_of_its_runs(received, tmp_path, command):
    """`run --fresh` and `plan --out` (whose pilot is study 'other-study-pilot') into a folder
    holding tiny-received's runs: one line that says what the folder holds and suggests another
    --out, never --fresh; every file there is as it was."""
    _, out, _ = received
    other = tmp_path / "other.yaml"
    other.write_text(OTHER)
    before, rows = files_of(out), load_results(out)
    result = cli(*[part.format(study=other, out=out) for part in command])
    name = "other-study-pilot" if command[0] == "plan" else "other-study"
    assert result.exit_code == 2, result.output
    assert result.output == (f"error: {out} holds the results of study 'tiny-received' (2 runs recorded), not of "
                             f"{name!r}; use --out for another folder (nothing there was changed)\n")
    assert files_of(out) == before and load_results(out).equals(rows)


def test_fresh_deletes_only_the_runs_of_the_study_it_runs(received):
    """--fresh on the same study (a changed version) removes its own runs and store; a run folder
    no store names (another study's, its store moved away) is kept."""
    study, out, _ = received
    stray = out / "runs" / "0123456789ab"
    stray.mkdir()
    (stray / "result.json").write_text("{}")
    changed = study.parent / "changed.yaml"
    changed.write_text(STUDY.replace("steps: 10,", "steps: 6,"))
    old_ids = set(load_results(out)["run_id"])
    summary = run_study(changed, out, quiet=True, fresh=True)
    assert summary.statuses == {"finished": 2}
    kept = {p.name for p in (out / "runs").iterdir()}
    assert kept == {*load_results(out)["run_id"], "0123456789ab"} and not kept & old_ids
    assert (stray / "result.json").read_text() == "{}"


# ---- a report while the study's run writes (issue 64) ----------------------------------------


def test_a_report_of_a_study_still_running_says_so_or_reports_the_runs_that_ended(received, tmp_path):
    """As `workbench run` leaves its folder while it trains: the lock held by a live process, the
    study recorded, no run or one run ended. No run: one line (was KeyError 'model.position');
    one run: the report of that run, and a warning that says the rest is still running."""
    _, out, _ = received
    first = load_results(out)["run_id"][0]
    with sqlite3.connect(out / DB_FILE) as conn:
        rows = conn.execute("SELECT * FROM runs WHERE run_id = ?", (first,)).fetchall()
        conn.execute("DELETE FROM runs")
    conn.close()
    with WriterLock(out):
        result = cli("report", str(out), "--no-pictures")
        assert result.exit_code == 2, result.output
        assert result.output == (f"error: {out}: no run of study 'tiny-received' is recorded yet (its `workbench run` "
                                 f"(pid {os.getpid()}) is still writing {out}); report it once a run has ended\n")
        with sqlite3.connect(out / DB_FILE) as conn:
            conn.executemany(f"INSERT INTO runs VALUES ({', '.join('?' * len(rows[0]))})", rows)
        conn.close()
        result = cli("report", str(out), "--no-pictures")
        assert result.exit_code == 0, result.output
        assert (f"warning: study 'tiny-received': its `workbench run` (pid {os.getpid()}) is still writing {out}: this "
                "report holds the 1 run recorded so far") in result.output
    assert (out / "reports" / "tiny-received" / "index.html").exists()
    result = cli("report", str(out), "--no-pictures")  # the sweep ended (the lock released): no warning
    assert result.exit_code == 0 and "warning" not in result.output, result.output
