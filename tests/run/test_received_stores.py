"""A received store is read as data, never as a schema (issue 47): `workbench report` of a
report's shipped `data/` whose store holds a view, a trigger, another table or column, a huge
value or a runs_dir elsewhere ends at once with one line, and the report it would replace stays
whole; nothing outside the received folder is read into the rebuilt report."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import run_within_cpu

from workbench.cli import main
from workbench.api import run_study
from workbench.run.store import DB_FILE, Store, claim_runs_dir, runs_root
from workbench.run.store_schema import MAX_VALUE_BYTES

STUDY = """\
name: tiny-shipped
task: {name: copy, train_length: 6, eval_lengths: [6], n_eval: 32, alphabet_size: 6}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope}
train: {steps: 6, batch_size: 8, lr: 3.0e-3, eval_every: 3, log_every: 3}
seeds: [0]
sweep:
  model.position: [none, rope]
"""


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    """reports/tiny-shipped/ written with its data (`--with-data`), as a fresh clone has it."""
    tmp = tmp_path_factory.mktemp("shipped")
    torch.set_num_threads(1)
    (tmp / "study.yaml").write_text(STUDY)
    assert run_study(tmp / "study.yaml", tmp / "out", quiet=True).statuses == {"finished": 2}
    result = CliRunner().invoke(main, ["report", str(tmp / "out"), "--out", str(tmp / "reports"), "--with-data"])
    assert result.exit_code == 0, result.output
    return tmp / "reports"


@pytest.fixture
def received(shipped, tmp_path) -> Path:
    """A copy of the shipped reports folder; returns its tiny-shipped/data."""
    shutil.copytree(shipped, tmp_path / "reports")
    return tmp_path / "reports" / "tiny-shipped" / "data"


def report_files(report: Path) -> dict[str, bytes]:
    return {p.relative_to(report).as_posix(): p.read_bytes() for p in sorted(report.rglob("*"))
            if p.is_file() and not p.name.startswith(DB_FILE)}


def craft(data: Path, *statements: str) -> None:
    with sqlite3.connect(data / DB_FILE) as conn:
        conn.executescript(";\n".join(statements))
    conn.close()


def report_in_a_process(data: Path) -> subprocess.CompletedProcess:
    """`workbench report DATA` in a process of its own, killed if it spends more CPU than a
    generous budget (a regression would spin or fill the disk; the budget is not what the test
    measures)."""
    return run_within_cpu([sys.executable, "-m", "workbench.cli", "report", str(data)], 300, text=True)


RECURSIVE = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r)"


@pytest.mark.parametrize("statements, named", [
    (("DROP TABLE study", f"CREATE VIEW study(key, value) AS {RECURSIVE} SELECT 'k' || i, 'v' FROM r"),
     "a view 'study'"),
    (("ALTER TABLE runs RENAME TO old_runs",
      "CREATE VIEW runs AS WITH RECURSIVE r AS (SELECT * FROM old_runs UNION ALL SELECT * FROM r) SELECT * FROM r"),
     "a table 'old_runs'"),
    (("CREATE TABLE junk(x)", "INSERT INTO study VALUES ('runs_dir', '/nowhere')",
      f"CREATE TRIGGER grow AFTER DELETE ON study BEGIN INSERT INTO junk {RECURSIVE} SELECT randomblob(1000000) "
      "FROM r; END"), "a table 'junk'"),
    (("INSERT INTO study VALUES ('runs_dir', '/nowhere')",
      "CREATE TRIGGER refuse BEFORE DELETE ON study BEGIN SELECT RAISE(ABORT, 'no'); END"), "a trigger 'refuse'"),
    (("CREATE INDEX by_seed ON runs(seed)",), "an index 'by_seed'"),
    (("ALTER TABLE runs ADD COLUMN evil TEXT",), "a column runs.'evil'"),
    (("ALTER TABLE curves ADD COLUMN twice REAL AS (value * 2)",), "a column curves.'twice'"),
])
def test_a_crafted_schema_is_one_line_and_the_previous_report_stays_whole(received, statements, named):
    report = received.parent
    before = report_files(report)
    craft(received, *statements)
    result = report_in_a_process(received)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, result.stderr
    assert f"holds {named}, which the workbench never creates" in result.stderr
    assert report_files(report) == before
    assert [p.name for p in report.parent.iterdir()] == ["tiny-shipped"]  # no build folder left
    assert (received / DB_FILE).stat().st_size < 2**20  # no trigger fired


def test_a_value_over_the_limit_is_refused_before_it_is_read(received):
    craft(received, f"UPDATE runs SET error = '{'x' * 1000}' || zeroblob({MAX_VALUE_BYTES}) "
                    "WHERE \"index\" = 0")
    result = CliRunner().invoke(main, ["report", str(received)])
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert f"holds a value over {MAX_VALUE_BYTES // 2**20} MiB" in result.output


def test_an_error_text_longer_than_any_recorded_is_a_damaged_row(received):
    craft(received, f"UPDATE runs SET error = '{'x' * 100_001}' WHERE \"index\" = 0")
    result = CliRunner().invoke(main, ["results", str(received)])
    assert result.exit_code == 2 and "is damaged (error: String should have at most 100000 characters" in result.output


def test_the_rebuilt_store_holds_only_the_rows_of_the_received_one(received):
    """ship_data copies rows into a fresh store of the workbench's schema, never the file."""
    result = CliRunner().invoke(main, ["report", str(received)])
    assert result.exit_code == 0, result.output
    conn = sqlite3.connect(received / DB_FILE)
    objects = sorted(name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    conn.close()
    assert objects == ["curves", "runs", "study"] and runs == 2


def test_a_runs_dir_elsewhere_is_not_read_into_the_rebuilt_report(received, tmp_path):
    """A received store naming another folder as its runs_dir: the weights and config.json of
    that folder are neither loaded for pictures nor copied into the rebuilt data/."""
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(received / "runs", elsewhere)
    for config in elsewhere.glob("*/config.json"):
        config.write_text('{"secret": "the user\'s own file"}')
    shutil.rmtree(received / "runs")
    craft(received, f"INSERT INTO study VALUES ('runs_dir', '{elsewhere}')")
    before = report_files(received.parent)
    result = CliRunner().invoke(main, ["report", str(received)])
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert f"keeps its run folders in {elsewhere} (--runs-dir), which does not name it back" in result.output
    assert report_files(received.parent) == before
    assert not any("secret" in text.decode(errors="replace") for text in report_files(received.parent).values())


def test_a_runs_dir_that_names_the_folder_back_is_read(tmp_path):
    """What `run --runs-dir X` leaves (claim_runs_dir): X names the results folder, so its readers
    read the runs there; a copy of the results folder elsewhere is not named, and is refused."""
    out, elsewhere = tmp_path / "out", tmp_path / "shared"
    Store(out).save_study({"runs_dir": str(elsewhere.resolve())})
    claim_runs_dir(out, elsewhere)
    assert runs_root(out) == elsewhere.resolve()
    shutil.copytree(out, tmp_path / "moved")
    with pytest.raises(Exception, match="which does not name it back"):
        runs_root(tmp_path / "moved")


def test_a_run_folder_that_is_a_link_is_not_read(received, tmp_path):
    run = next((received / "runs").iterdir())
    shutil.move(run, tmp_path / "outside")
    run.symlink_to(tmp_path / "outside")
    result = CliRunner().invoke(main, ["report", str(received)])
    assert result.exit_code == 2 and f"{run.name} is a symbolic link" in result.output, result.output


def test_a_study_run_with_runs_dir_is_reported_with_its_pictures(tmp_path):
    """The legitimate case: `run --runs-dir X` (shared storage) then `report OUT` reads the
    weights in X; the sweep's own mark there is what lets it."""
    (tmp_path / "study.yaml").write_text(STUDY)
    out, shared = tmp_path / "out", tmp_path / "shared"
    run_study(tmp_path / "study.yaml", out, quiet=True, runs_dir=shared)
    assert sorted(p.name for p in shared.iterdir() if p.is_dir()) == sorted(r["run_id"] for r in Store(out, False).runs())
    result = CliRunner().invoke(main, ["report", str(out), "--out", str(tmp_path / "reports")])
    assert result.exit_code == 0, result.output
    assert any(p.name.startswith("attention_") for p in (tmp_path / "reports" / "tiny-shipped" / "figures").iterdir())


def test_a_run_id_that_names_a_path_is_one_line_from_results_as_from_report(received):
    """`results` dropped the row silently where `report` refused it."""
    craft(received, "UPDATE runs SET run_id = '../../victim/x' WHERE \"index\" = 0")
    for args in (["results", str(received)], ["report", str(received)]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
        assert "'../../victim/x' is not a run id (12 hex digits)" in result.output


# ---- values no command can hold (issue 64) ----------------------------------------------------


def many_metrics(start: int, count: int) -> str:
    """SQL that makes a run's metrics `count` made-up ones, named from `start` on."""
    names = (f"WITH RECURSIVE n(i) AS (SELECT {start} UNION ALL SELECT i + 1 FROM n WHERE i < {start + count - 1}) "
             "SELECT group_concat('\"m' || i || '@6\": 0.5', ', ') FROM n")
    return f"'{{' || ({names}) || '}}'"


@pytest.mark.parametrize("statements, message", [
    (("UPDATE curves SET value = 'hello' WHERE step = (SELECT min(step) FROM curves)",),
     "is 'hello', not a number: the store is damaged or crafted"),
    (("UPDATE curves SET value = x'00ff' WHERE step = (SELECT min(step) FROM curves)",), "not a number"),
    ((f"UPDATE runs SET metrics = '{{\"accuracy@6\": 1{'0' * 400}}}' WHERE \"index\" = 0",),
     "is damaged (metrics: an integer of 401 digits, more than the workbench writes)"),
    ((f"UPDATE runs SET metrics = {many_metrics(0, 99_000)} WHERE \"index\" = 0",),
     "is damaged (metrics: Dictionary should have at most 1000 items"),
    ((f"UPDATE runs SET metrics = {many_metrics(0, 900)} WHERE \"index\" = 0",
      f"UPDATE runs SET metrics = {many_metrics(900, 900)} WHERE \"index\" = 1"),
     "its runs hold 1,800 different metrics, more than any study the workbench runs records (1,000)"),
])
def test_a_value_no_study_records_is_one_line_from_report_and_results(received, statements, message):
    """Text in a REAL curve column and a 400-digit metric were tracebacks; 99,000 metrics per run
    (inside the store check's limits then) kept `report` busy for minutes."""
    craft(received, *statements)
    commands = [["report", str(received)], *([["results", str(received)]] if "curve" not in statements[0] else [])]
    for args in commands:
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
        assert result.output.startswith("error: ") and message in result.output, result.output
