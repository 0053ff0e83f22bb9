"""`workbench compare`: one report over the runs of several study folders (stores filled with
constructed results, as in test_report; nothing trains)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from test_report import save_study
from workbench.cli import main
from workbench.recipes.train.compare import comparison_inputs
from workbench.run.store import Store
from workbench.study import load_study
from workbench.recipes.train.sweep import expand
from workbench.results import RunResult

STUDY = """\
name: {name}
task: {{name: {task}, train_length: 6, n_eval: 8}}
model: {{family: decoder, d_model: 16, n_layers: 1, n_heads: 2}}
train: {{steps: {steps}, batch_size: 4}}
seeds: [0, 1]
sweep: {{model.position: {positions}}}
"""
ACCURACY = {"none": 0.2, "rope": 0.8, "alibi": 0.9}


def folder(tmp_path, name: str, positions: str, steps: int = 5, task: str = "copy"):
    (tmp_path / f"{name}.yaml").write_text(STUDY.format(name=name, positions=positions, steps=steps, task=task))
    study_file = load_study(tmp_path / f"{name}.yaml")
    out = tmp_path / name
    store = Store(out)
    save_study(store, study_file)
    for run in expand(study_file):
        acc = ACCURACY[run.swept["model.position"]] + 0.01 * run.seed + (0.05 if steps > 5 else 0)
        store.record(run, RunResult(run_id=run.run_id, status="finished", steps_done=steps, n_params=100,
                                    metrics={"accuracy@6": acc, "loss@6": 1 - acc}, wall_time_s=1.0,
                                    curves=[(steps, "train", "loss", 1 - acc)], environment={"device": "cpu"}))
    return out


def test_a_variant_added_later_joins_the_earlier_sweep(tmp_path):
    a = folder(tmp_path, "first", "[none, rope]")
    b = folder(tmp_path, "later", "[rope, alibi]")  # rope trained again: the same run ids
    result = CliRunner().invoke(main, ["compare", str(a), str(b), "--out", str(tmp_path / "reports"), "--no-pictures"])
    assert result.exit_code == 0, result.output
    report = tmp_path / "reports" / "first-vs-later"
    table = pd.read_csv(report / "results.csv")
    # rope counted once
    assert list(table["variant"]) == ["position=none"] * 2 + ["position=rope"] * 2 + ["position=alibi"] * 2
    assert table.groupby("variant")["accuracy@6"].mean().round(3).to_dict() == {
        "position=alibi": 0.905, "position=none": 0.205, "position=rope": 0.805}
    text = (report / "report.md").read_text()
    assert "Swept: model.position over none, rope, alibi" in text
    assert "workbench compare" in text


def test_settings_that_differ_between_folders_tell_variants_apart(tmp_path):
    a = folder(tmp_path, "short", "[rope]", steps=5)
    b = folder(tmp_path, "long", "[rope]", steps=10)
    study, runs, *_ = comparison_inputs([a, b], "c")
    assert study.sweep.keys == ["model.position", "train.steps"]
    assert sorted(set(zip(runs["model.position"], runs["train.steps"]))) == [("rope", 5), ("rope", 10)]


def test_setup_states_every_compared_runs_budget_and_the_header_keeps_variants_apart(tmp_path):
    a = folder(tmp_path, "short", "[none, rope]", steps=5)
    b = folder(tmp_path, "long", "[rope]", steps=10)
    result = CliRunner().invoke(main, ["compare", str(a), str(b), "--out", str(tmp_path / "r"), "--no-pictures"])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "r" / "short-vs-long" / "report.md").read_text()
    assert "Budget per run: 5 or 10 (swept) steps of 4 sequences" in text  # not the first folder's 5 for all
    assert "position=none, steps=5 \\| position=rope, steps=5); " in text  # each variant's label apart (Markdown escapes |)


def test_folders_of_different_tasks_are_refused(tmp_path):
    a = folder(tmp_path, "copying", "[rope]")
    b = folder(tmp_path, "reversing", "[rope]", task="reverse")
    result = CliRunner().invoke(main, ["compare", str(a), str(b), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "trained different tasks" in result.stderr and "(reverse)" in result.stderr


def test_compare_needs_two_folders(tmp_path):
    a = folder(tmp_path, "alone", "[rope]")
    with pytest.raises(Exception, match="at least two"):
        comparison_inputs([a], "c")


WINDOWS = """\
name: {name}
task: {{name: copy, train_length: 6, n_eval: 8}}
model: {{family: decoder, d_model: 16, n_layers: 1, n_heads: 2}}
train: {{steps: 5, batch_size: 4}}
seeds: [0, 1, 2, 3]
sweep: {{model.attention: {attention}}}
"""
# Every group above the copy task's strongest baseline (order-blind, 0.551 at length 6), so every
# comparison is decided on its interval.
SCORES = {"full": [0.95, 0.97, 0.93, 0.96], "sliding_window(window=3)": [0.62, 0.71, 0.66, 0.68],
          "sliding_window(window=2)": [0.62, 0.66, 0.61, 0.63]}


def window_folder(tmp_path, name: str, attention: str, folder: str | None = None):
    (tmp_path / f"{name}.yaml").write_text(WINDOWS.format(name=name, attention=attention))
    study_file = load_study(tmp_path / f"{name}.yaml")
    out = Path("runs") / (folder or name)  # relative: the test runs in tmp_path
    store = Store(out)
    save_study(store, study_file)
    for run in expand(study_file):
        acc = SCORES[run.swept["model.attention"]][run.seed]
        store.record(run, RunResult(run_id=run.run_id, status="finished", steps_done=5, n_params=100,
                                    metrics={"accuracy@6": acc, "loss@6": 1 - acc}, wall_time_s=1.0,
                                    curves=[(5, "train", "loss", 1 - acc)], environment={"device": "cpu"}))
    return out


def test_compare_names_its_folders_keeps_chance_levels_and_decides_expectations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = window_folder(tmp_path, "windows", "[full, {name: sliding_window, window: 3}]")
    b = window_folder(tmp_path, "windows-narrow", "[{name: sliding_window, window: 2}]")
    result = CliRunner().invoke(main, [
        "compare", str(a), str(b), "--out", str(tmp_path / "reports"), "--no-pictures", "--baseline", "full",
        "--expect", "full > sliding_window(window=3) on accuracy@6",
        "--expect", "{model.attention: sliding_window(window=2)} > full on accuracy@6"])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "reports" / "windows-vs-windows-narrow" / "report.md").read_text()
    header = text.splitlines()[2]
    assert f"{a} (study 'windows': attention=full \\| attention=sliding\\_window(window=3)); {b} (study " \
           "'windows-narrow': attention=sliding\\_window(window=2))" in header
    # chance comes from the task of each variant, parametrized ones included: every group is gated
    learned = text.splitlines()[4]
    assert learned.startswith("Learned (accuracy@6 ≥") and ("all 3 groups learned" in learned or "of 3 groups" in learned)
    assert "| attention=sliding\\_window(window=3) | 0.668 \\[" in text and "(paired)" in text  # Δ to the baseline
    verdicts = [line for line in text.splitlines() if line.startswith("- **")]
    assert verdicts[0].startswith("- **holds")
    assert "attention=full is better than attention=sliding\\_window(window=3) on accuracy@6" in verdicts[0]
    assert verdicts[1].startswith("- **does not hold")
    assert "attention=sliding\\_window(window=2) is better than attention=full" in verdicts[1]
    assert "Holm-adjusted" in verdicts[0]  # the study's rule: two comparisons, one Holm family
    assert "--expect 'full > sliding_window(window=3) on accuracy@6'" in text  # the reproduce command


def test_a_comparison_of_one_studys_folders_does_not_take_the_studys_report_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = window_folder(tmp_path, "windows", "[full]")
    b = window_folder(tmp_path, "windows", "[{name: sliding_window, window: 2}]", folder="windows-narrow")
    result = CliRunner().invoke(main, ["compare", str(a), str(b), "--no-pictures"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["windows-vs-windows-narrow"]


@pytest.mark.parametrize("option, message", [
    (["--expect", "full beats none on accuracy@6"], 'write it as "A > B on METRIC"'),
    (["--expect", "full > sliding_window(window=3) on acuracy@6"], "no run recorded the metric 'acuracy@6'; did you "
                                                                    "mean 'accuracy@6'?"),
    (["--baseline", "ful"], "--baseline: 'ful' is not a swept value of model.attention (valid: full, "),
])
def test_a_wrong_baseline_or_expectation_is_one_line(tmp_path, monkeypatch, option, message):
    monkeypatch.chdir(tmp_path)
    a = window_folder(tmp_path, "windows", "[full, {name: sliding_window, window: 3}]")
    b = window_folder(tmp_path, "windows-narrow", "[{name: sliding_window, window: 2}]")
    result = CliRunner().invoke(main, ["compare", str(a), str(b), "--out", str(tmp_path / "r"), "--no-pictures", *option])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
