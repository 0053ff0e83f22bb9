"""A received results folder cannot make the workbench write or delete outside it (issue 26):
each planted link or stored path below is refused with one line, and the victim file it
points at is left as it was. Also: one writer even when the lock file is deleted by hand."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.report import write_report
from workbench.run.folder import LOCK_FILE, WriterLock
from workbench.run.runner import run_study
from workbench.run.store import DB_FILE, Store, load_results
from workbench.study import load_study
from workbench.study.sweep import expand

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
