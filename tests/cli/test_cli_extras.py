"""Rough edges of the command line: where reports go, what the quickstart installs, which
modules a command start imports, and an index that keeps the user's words."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import run_within_cpu

from workbench.cli import main
from workbench.run.folder import default_reports_dir
from workbench.report.index import build_index

ROOT = Path(__file__).resolve().parents[2]


def test_reports_go_beside_results_unless_rebuilt_from_their_shipped_data():
    # the study's own default folder too: a run must not overwrite the shipped (tracked) report in reports/
    assert default_reports_dir(Path("runs") / "positions", "positions") == Path("runs/positions/reports")
    assert default_reports_dir("/data/exp1", "exp1") == Path("/data/exp1/reports")
    assert default_reports_dir(Path("reports") / "positions" / "data", "positions") == Path("reports")
    for command in ("run", "report"):
        help_text = CliRunner().invoke(main, [command, "--help"]).output
        assert "OUT/reports/" in help_text or "OUT_DIR/reports/" in help_text


def test_a_command_start_does_not_import_sacrebleu():
    code = ("import sys; from workbench.registry import variants; from workbench.cli import main; "
            "from workbench.variants import AXES; [variants(a) for a in AXES]; "
            "print('sacrebleu' in sys.modules)")
    out = run_within_cpu([sys.executable, "-c", code], 120, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_quickstart_installs_only_what_running_needs(tmp_path):
    plan = subprocess.run(["make", "-n", "quickstart", f"VENV={tmp_path / 'v'}"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs == [f"{tmp_path / 'v'}/bin/python -m pip install -q --no-compile -c constraints-dev.txt -e ."]
    # pip skips its one-core bytecode pass; the packages are then compiled on every core, so that
    # the study's workers (which never write bytecode under PYTHONDONTWRITEBYTECODE) load .pyc files
    assert any("compileall.compile_dir" in line and "workers=0" in line for line in plan.splitlines())
    tests = subprocess.run(["make", "-n", "test", f"VENV={tmp_path / 'v'}"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    assert "-e '.[dev]'" in tests


def test_the_index_of_a_users_studies_has_no_project_prose(tmp_path):
    studies = tmp_path / "mine"
    studies.mkdir()
    text = build_index(studies, tmp_path / "reports")
    assert "tutorials" not in text and "2-core" not in text
    assert text.startswith("# Studies and their reports") and f"`workbench run {studies.as_posix()}/<name>.yaml --reports " in text
    (studies / "index-intro.md").write_text("# My lab's studies\n\nOurs.\n")
    assert build_index(studies, tmp_path / "reports").startswith("# My lab's studies\n\nOurs.\n\n| study")
    shipped = build_index(ROOT / "studies", ROOT / "reports")
    assert "tutorials the workbench started from" in shipped  # this project's words live in studies/


TINY_STUDY = """\
name: tiny
task: {name: copy, train_length: 4, n_eval: 8, alphabet_size: 4}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {steps: 2, batch_size: 4, log_every: 1}
"""


@pytest.mark.parametrize("out", [[], ["--out", "runs/tiny-trial"]])
def test_a_run_leaves_the_checkouts_shipped_report_alone(tmp_path, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY_STUDY)
    shipped = tmp_path / "reports" / "tiny" / "index.html"
    (shipped.parent / "data").mkdir(parents=True)
    shipped.write_text("the study's own report")
    result = CliRunner().invoke(main, ["run", "tiny.yaml", "--quiet", *out])
    assert result.exit_code == 0, result.output
    assert shipped.read_text() == "the study's own report"
    assert sorted(p.name for p in (tmp_path / "reports").rglob("*")) == ["data", "index.html", "tiny"]
    assert (tmp_path / (out[1] if out else "runs/tiny") / "reports" / "tiny" / "index.html").exists()


def test_run_exits_3_when_a_run_failed_unless_failures_are_allowed(tmp_path, monkeypatch):
    from workbench.run.run_module import RunModule

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY_STUDY)

    def crash(self, batch, batch_idx):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(RunModule, "training_step", crash)
    failed = CliRunner().invoke(main, ["run", "tiny.yaml", "--quiet"])
    assert failed.exit_code == 3, failed.output
    assert "1 of 1 runs did not finish" in failed.output
    assert (tmp_path / "runs" / "tiny" / "reports" / "tiny" / "index.html").exists()  # written all the same
    allowed = CliRunner().invoke(main, ["run", "tiny.yaml", "--quiet", "--allow-failures"])
    assert allowed.exit_code == 0, allowed.output


def test_a_diverged_run_is_a_result_not_a_failure(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY_STUDY.replace("steps: 2,", "steps: 20,").replace("log_every: 1}", "log_every: 1, lr: 1.0e+6}"))
    result = CliRunner().invoke(main, ["run", "tiny.yaml", "--quiet"])
    assert "1 diverged" in result.output and result.exit_code == 0, result.output


@pytest.mark.parametrize("args, hint", [
    (["run", "tiny.yaml", "train.steps=5"], "did you mean `--set train.steps=5`?"),
    (["validate", "tiny.yaml", "sweep.model.position=rope,alibi"],
     "did you mean `--set 'sweep.model.position=[rope, alibi]'`?"),
])
def test_hydra_style_arguments_get_the_workbench_form(tmp_path, monkeypatch, args, hint):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY_STUDY)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and hint in result.output


def test_setting_a_swept_key_warns_that_the_sweep_replaces_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY_STUDY + "sweep: {model.attention: [full, naive]}\n")
    swept = CliRunner().invoke(main, ["validate", "tiny.yaml", "--set", "model.attention=flul"])
    assert swept.exit_code == 0
    assert ("warning: --set model.attention=flul: model.attention is swept, so the sweep's values replace this one "
            "in every run") in swept.stderr and "--set 'sweep.model.attention=[a, b]'" in swept.stderr
    unswept = CliRunner().invoke(main, ["validate", "tiny.yaml", "--set", "train.steps=3"])
    assert unswept.exit_code == 0 and "warning" not in unswept.stderr


def test_the_scaffolds_next_step_installs_its_test_extra(tmp_path):
    result = CliRunner().invoke(main, ["new-plugin", "ffn", "squared_relu", "--dir", str(tmp_path)])
    assert result.exit_code == 0
    root = tmp_path / "workbench-squared-relu"
    assert f"pip install -e '{root}[test]' && python -m pytest {root}/tests" in result.output
    assert 'test = ["pytest' in (root / "pyproject.toml").read_text()  # what [test] brings: pytest


def test_eval_scores_a_saved_run_at_new_lengths_without_training(tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY_STUDY)
    assert CliRunner().invoke(main, ["run", "tiny.yaml", "--quiet"]).exit_code == 0
    [run_folder] = (tmp_path / "runs" / "tiny" / "runs").iterdir()
    recorded = json.loads((run_folder / "result.json").read_text())["metrics"]
    before = sorted(p.name for p in run_folder.rglob("*"))
    result = CliRunner().invoke(main, ["eval", str(run_folder), "--lengths", "4,8", "--json"])
    assert result.exit_code == 0, result.output
    scored = json.loads(result.output)["metrics"]
    assert {k: v for k, v in scored.items() if k.endswith("@4")} == pytest.approx(recorded)  # the run's own sets
    assert {"accuracy@8", "loss@8"} <= set(scored)  # a length it never saw
    assert sorted(p.name for p in run_folder.rglob("*")) == before  # nothing written
    missing = CliRunner().invoke(main, ["eval", str(tmp_path / "runs" / "tiny"), "--lengths", "4"])
    assert missing.exit_code == 2 and "no final.safetensors there" in missing.stderr
