"""A store written while run ids named a relative corpus by where it lay keeps its runs.

tests/data/stores/relative-corpus/ is what `workbench run` of the code of 2026-12-06 wrote for
tiny-text.yaml (two seeds of a byte-level model on `path: corpus.txt`), run from
/tmp/oldclone/studies/: its ids and study hash hashed /tmp/oldclone/studies/corpus.txt. Here
the study and its corpus lie elsewhere, as in another clone.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from click.testing import CliRunner

from workbench.cli import main
from workbench.recipes.train.sweep import expand
from workbench.run.store import load_curves, load_results
from workbench.study import load_study

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "stores" / "relative-corpus"
OLD_IDS = ["1402d1dd9f25", "79a6a5148191"]
WORDS = "the a model layer token attention head value key query norm residual block".split()


def received(tmp_path: Path) -> tuple[Path, Path]:
    """The study in a clone of its own and the fixture's results folder beside it."""
    studies = tmp_path / "clone" / "studies"
    studies.mkdir(parents=True)
    shutil.copy(FIXTURE / "tiny-text.yaml", studies)
    # any text: an id names the file as the study writes it, not its bytes
    (studies / "corpus.txt").write_text("\n".join(" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12))
                                                  for i in range(400)))
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(FIXTURE / "results.db", out)
    shutil.copytree(FIXTURE / "runs", out / "runs")
    return studies / "tiny-text.yaml", out


def stored_ids(out: Path) -> list[str]:
    with sqlite3.connect(out / "results.db") as conn:
        return sorted(row[0] for row in conn.execute("SELECT run_id FROM runs"))


def test_the_store_is_re_keyed_and_its_finished_runs_are_kept(tmp_path):
    study, out = received(tmp_path)
    before = load_results(out).sort_values("seed")
    curves = [len(load_curves(out, run_id)) for run_id in before["run_id"]]
    assert sorted(before["run_id"]) == OLD_IDS

    result = CliRunner().invoke(main, ["run", str(study), "--out", str(out), "--jobs", "1", "--quiet"])

    assert result.exit_code == 0, result.output
    assert "2 runs re-keyed: run ids now name corpus.txt as the study file writes it" in result.output
    assert "2 of 2 runs already done" in result.output  # nothing trained again
    expected = {run.seed: run.run_id for run in expand(load_study(study))}
    after = load_results(out).sort_values("seed")
    assert dict(zip(after["seed"], after["run_id"])) == expected
    assert list(after["bpc@32"]) == list(before["bpc@32"]) and list(after["recorded_at"]) == list(before["recorded_at"])
    assert [len(load_curves(out, run_id)) for run_id in after["run_id"]] == curves
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(expected.values())
    for run_id in expected.values():
        assert json.loads((out / "runs" / run_id / "result.json").read_text())["run_id"] == run_id
        task = json.loads((out / "runs" / run_id / "config.json").read_text())["task"]
        assert (task["path"], task["folder"]) == ("corpus.txt", "/tmp/oldclone/studies")  # where it was read

    again = CliRunner().invoke(main, ["run", str(study), "--out", str(out), "--jobs", "1", "--quiet"])
    assert again.exit_code == 0 and "re-keyed" not in again.output and "2 of 2 runs already done" in again.output


def test_a_store_of_another_version_of_the_study_is_still_refused(tmp_path):
    study, out = received(tmp_path)
    study.write_text(study.read_text().replace("steps: 4", "steps: 5"))

    result = CliRunner().invoke(main, ["run", str(study), "--out", str(out), "--jobs", "1", "--quiet"])

    assert result.exit_code != 0
    assert "holds results of a different version of study 'tiny-text'" in result.output
    assert "train.steps" in result.output and "Traceback" not in result.output
    assert stored_ids(out) == OLD_IDS and sorted(p.name for p in (out / "runs").iterdir()) == OLD_IDS


def test_a_crafted_run_id_in_a_received_store_is_one_line_and_changes_nothing(tmp_path):
    study, out = received(tmp_path)
    with sqlite3.connect(out / "results.db") as conn:
        conn.execute("UPDATE runs SET run_id = '../../outside' WHERE run_id = ?", (OLD_IDS[0],))

    result = CliRunner().invoke(main, ["run", str(study), "--out", str(out), "--jobs", "1", "--quiet"])

    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "'../../outside' is not a run id (12 hex digits)" in result.output
    assert stored_ids(out) == sorted(["../../outside", OLD_IDS[1]])
    assert sorted(p.name for p in (out / "runs").iterdir()) == OLD_IDS


def test_another_studys_folder_is_refused_not_re_keyed(tmp_path):
    study, out = received(tmp_path)
    study.write_text(study.read_text().replace("name: tiny-text", "name: other-text"))

    result = CliRunner().invoke(main, ["run", str(study), "--out", str(out), "--jobs", "1", "--quiet"])

    assert result.exit_code != 0 and "holds the results of study 'tiny-text'" in result.output
    assert stored_ids(out) == OLD_IDS
