"""`workbench run --reuse FOLDER`: a run another study finished with the same run id (the same
resolved settings: a shared baseline arm) is copied in, not trained again, and is the same run."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from workbench.api import run_study, write_report
from workbench.report.index import study_spend
from workbench.cli import main
from workbench.run.store import Store

STUDY = """\
name: {name}
task: {{name: copy, train_length: 6, n_eval: 16, alphabet_size: 6}}
model: {{family: decoder, d_model: 16, n_layers: 1, n_heads: 2}}
train: {{steps: 4, batch_size: 4, log_every: 2, eval_every: 4}}
seeds: [0, 1]
sweep: {{model.position: [none, {other}]}}
"""


def write(tmp_path, name: str, other: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(STUDY.format(name=name, other=other))
    return path


def test_a_shared_arm_is_copied_in_and_equals_its_training(tmp_path):
    first = run_study(write(tmp_path, "one", "rope"), tmp_path / "one", quiet=True)
    assert first.statuses == {"finished": 4}
    for result in (tmp_path / "one" / "runs").glob("*/result.json"):  # a value nothing measured is stored as null
        data = json.loads(result.read_text())
        data["curves"].append([4, "eval", "bpc_tail@6", None])
        result.write_text(json.dumps(data))
    second = run_study(write(tmp_path, "two", "alibi"), tmp_path / "two", quiet=True, reuse=[tmp_path / "one"])
    assert second.statuses == {"finished": 2} and second.skipped == 2  # alibi trained, none copied
    one = {r["run_id"]: r for r in Store(tmp_path / "one", create=False).runs()}
    two = {r["run_id"]: r for r in Store(tmp_path / "two", create=False).runs()}
    shared = sorted(one.keys() & two.keys())
    assert len(shared) == 2 and len(two) == 4
    for run_id in shared:
        assert two[run_id]["metrics"] == one[run_id]["metrics"]
        assert two[run_id]["environment"]["reused_from"] == str(tmp_path / "one")
        assert (tmp_path / "two" / "runs" / run_id / "final.safetensors").is_file()  # the report's pictures read it
    assert all("reused_from" not in two[r]["environment"] for r in two.keys() - one.keys())
    # the ledger counts a copied run where it was trained
    write_report(tmp_path / "two", tmp_path / "reports", pictures=False)
    summary = json.loads((tmp_path / "reports" / "two" / "summary.json").read_text())
    copied_cpu = sum(two[r]["cpu_time_s"] for r in shared)
    assert summary["reused_cpu_s"] == round(copied_cpu) and summary["run_cpu_s"] == round(sum(r["cpu_time_s"] for r in two.values()))
    assert study_spend("two", summary).cpu_s == summary["run_cpu_s"] - summary["reused_cpu_s"]


def test_a_run_of_the_same_id_recorded_with_other_settings_is_trained_again(tmp_path):
    """train.attention_entropy leaves the run id as it is but adds a measure: a run recorded
    without it is not what this study asks for."""
    run_study(write(tmp_path, "one", "rope"), tmp_path / "one", quiet=True)
    measured = write(tmp_path, "two", "alibi")
    measured.write_text(measured.read_text().replace("log_every: 2,", "log_every: 2, attention_entropy: true,"))
    second = run_study(measured, tmp_path / "two", quiet=True, reuse=[tmp_path / "one"])
    assert second.statuses == {"finished": 4} and second.skipped == 0
    assert all("attention_entropy@6" in r["metrics"] for r in Store(tmp_path / "two", create=False).runs())


@pytest.mark.parametrize("folder, said", [("missing", "holds no results store"), ("own", "this study's own folder")])
def test_a_reuse_folder_that_is_no_other_study_is_one_line(tmp_path, folder, said):
    study = write(tmp_path, "two", "alibi")
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "results.db").write_bytes(b"")
    target = tmp_path / ("nothing-here" if folder == "missing" else "two")
    result = CliRunner().invoke(main, ["run", str(study), "--out", str(tmp_path / "two"), "--reuse", str(target)])
    assert result.exit_code != 0 and said in result.output and "Traceback" not in result.output
