"""`workbench plan`: a pilot in a folder of its own, at the study's own first seeds (which a study
run after it reuses), and per comparison the seeds and CPU minutes with the `seeds:` line to
register; a study without `expect:` and bad arguments are one line each (exit 2), before anything
trains."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from workbench.cli import main
from workbench.run import executor
from workbench.run.store import Store, load_results

# Three steps at a large learning rate: the groups' seeds differ (a pilot needs a spread), in seconds.
STUDY = """\
name: tiny
task: {name: copy, train_length: 4, n_eval: 8, alphabet_size: 4}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {steps: 3, batch_size: 8, log_every: 1, lr: 0.05}
seeds: [0, 1, 2]
sweep: {model.position: [none, rope, alibi]}
expect:
  - {metric: accuracy@4, better: rope, than: none}
  - {metric: accuracy@4, better: alibi, than: none, margin: 0.05}
"""


@pytest.fixture
def study(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(STUDY)
    return tmp_path


def test_plan_trains_a_pilot_apart_from_the_study_and_prints_the_seeds_each_entry_needs(study):
    result = CliRunner().invoke(main, ["plan", "tiny.yaml", "--quiet"])
    assert result.exit_code == 0, result.output
    pilot = load_results(study / "runs" / "tiny-pilot")
    assert len(pilot) == 6 and set(pilot["seed"]) == {0, 1}  # 3 groups x the study's first 2 seeds
    assert not (study / "runs" / "tiny").exists()  # nothing in the study's own folder until the study runs
    out = result.output
    assert re.search(r"the command beyond its runs \(start-up, recording, the report\): [\d.]+ CPU s", out)
    assert "expect 2: position=alibi vs position=none on accuracy@4 (margin ±0.05)" in out
    assert re.search(r"the study as written \(seeds: \[0, 1, 2\]\): 9 runs, [\d.]+ CPU min", out)
    rows = re.findall(r"^\s+2\s+[\d.]+\s+equivalent ±0\.05\s+(\d+)\s+(\d+)%\s+(\d+)\s+[\d.]+", out, re.M)
    assert len(rows) == 2  # the noise as measured and at its upper bound
    (measured, power, spent), (upper, _, _) = rows
    assert int(measured) <= int(upper) and spent == measured and (int(measured) > 3) == (int(power) < 80)
    # no margin, no effect: what the study's 3 seeds detect: nothing, a verdict needs 4 per group
    assert re.search(r"^\s+1\s+[\d.]+\s+detects no effect\s+3\s+80%", out, re.M)
    registered = re.search(r"to register before the real runs .*, (\d+) seeds per group\):\nseeds: \[([\d, ]+)\]\n$",
                           out)
    assert registered and registered[1] == upper and registered[2] == ", ".join(map(str, range(int(upper))))

    again = CliRunner().invoke(main, ["plan", "tiny.yaml", "--quiet", "--effect", "0.2"])  # the pilot is resumed
    assert again.exit_code == 0 and "6 of 6 runs already done" in again.output, again.output
    assert re.search(r"^\s+1\s+[\d.]+\s+holds at 0\.2\s+(\d+|> 1000)\s+\d+%", again.output, re.M)

    # adaptive seeds: the same pilot (its seeds replace the study's), the plan is a max from the same first
    adaptive = CliRunner().invoke(main, ["plan", "tiny.yaml", "--quiet", "--set", "seeds={first: 2, max: 4}"])
    assert adaptive.exit_code == 0 and "6 of 6 runs already done" in adaptive.output, adaptive.output
    assert re.search(r"the study as written \(seeds: \{first: 2, max: 4\}\): 6 to 12 runs", adaptive.output)
    assert re.search(r"to register before the real runs .*\):\nseeds: \{first: 2, max: \d+\}\n$", adaptive.output)
    assert re.search(r"runs expected \(at most \d+\)", adaptive.output)


def test_a_study_run_after_its_plan_trains_only_the_seeds_the_pilot_did_not(study, monkeypatch):
    assert CliRunner().invoke(main, ["plan", "tiny.yaml", "--quiet"]).exit_code == 0
    pilot = {r["run_id"]: r for r in Store(study / "runs" / "tiny-pilot", create=False).runs()}
    trained = []
    original = executor.execute
    monkeypatch.setattr(executor, "execute", lambda job: trained.append(job.config["seed"]) or original(job))
    result = CliRunner().invoke(main, ["run", "tiny.yaml", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "6 of 9 runs trained by the study's pilot in runs/tiny-pilot" in result.output
    assert trained == [2, 2, 2]  # the seed the pilot did not run, once per group
    stored = {r["run_id"]: r for r in Store(study / "runs" / "tiny", create=False).runs()}
    assert len(stored) == 9 and set(pilot) < set(stored)
    for run_id, run in pilot.items():  # the pilot's results, its CPU, and the weights the report reads
        assert (stored[run_id]["metrics"], stored[run_id]["cpu_time_s"]) == (run["metrics"], run["cpu_time_s"])
        assert (study / "runs" / "tiny" / "runs" / run_id / "final.safetensors").is_file()
    summary = json.loads((study / "runs" / "tiny" / "reports" / "tiny" / "summary.json").read_text())
    assert "pilot_cpu_s" not in summary  # every pilot run was reused: the study's own CPU holds them

    # the same pilot under a changed study (another learning rate): none of its runs is the study's
    changed = CliRunner().invoke(main, ["run", "tiny.yaml", "--quiet", "--fresh", "--set", "train.lr=0.04"])
    assert changed.exit_code == 0 and "trained by the study's pilot" not in changed.output, changed.output
    summary = json.loads((study / "runs" / "tiny" / "reports" / "tiny" / "summary.json").read_text())
    # the ledger counts them: the study's record keeps tenths of a second, the summary whole seconds
    assert summary["pilot_cpu_s"] == round(float(f"{sum(r['cpu_time_s'] for r in pilot.values()):.1f}"))
    report = (study / "runs" / "tiny" / "reports" / "tiny" / "report.md").read_text()
    assert "The pilot's other runs, which the study did not reuse, spent" in report


def test_one_pilot_seed_plans_the_cost_only(study):
    result = CliRunner().invoke(main, ["plan", "tiny.yaml", "--quiet", "--pilot-seeds", "1", "--out", "pilot1"])
    assert result.exit_code == 0, result.output
    assert "noise: unknown (1 pilot seed): only the cost is planned" in result.output
    assert re.search(r"the study as written \(seeds: \[0, 1, 2\]\): 9 runs, [\d.]+ CPU min", result.output)
    assert "to register" not in result.output and len(load_results(study / "pilot1")) == 3


@pytest.mark.parametrize("args, message", [
    (["--effect", "0.1", "--effect-sd", "1"], "error: --effect: give --effect (in the metric's units) or --effect-sd"),
    (["--effect", "-0.1"], "error: --effect: -0.1: a true difference to plan for is a positive number"),
    (["--out", "runs/tiny"], "error: --out: runs/tiny is the study's own folder"),
    (["--pilot-seeds", "3"], "'--pilot-seeds': 3 is not in the range 1<=x<=2"),
    (["--from", "elsewhere", "--fresh"], "error: --from: --fresh names a pilot to train; with --from the plan reads"),
])
def test_bad_arguments_are_one_line_before_anything_trains(study, args, message):
    result = CliRunner().invoke(main, ["plan", "tiny.yaml", *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and not (study / "runs").exists()


def test_a_study_without_expect_entries_has_nothing_to_plan(study):
    (study / "bare.yaml").write_text(STUDY.split("expect:")[0])
    result = CliRunner().invoke(main, ["plan", "bare.yaml"])
    assert result.exit_code == 2 and not (study / "runs").exists()
    assert result.output.strip() == ("error: bare.yaml: the study has no `expect:` entries, so there are no verdicts "
                                     "to plan seeds for; `workbench validate` says what it runs")


def test_a_plan_from_an_earlier_issue_reads_its_stored_runs_and_trains_nothing(study):
    assert CliRunner().invoke(main, ["run", "tiny.yaml", "--quiet"]).exit_code == 0
    before = sorted(p.name for p in (study / "runs").iterdir())
    result = CliRunner().invoke(main, ["plan", "tiny.yaml", "--from", "runs/tiny", "--set", "seeds={first: 2, max: 6}"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (study / "runs").iterdir()) == before  # no pilot folder, nothing trained
    out = result.output
    assert re.search(r"^tiny: a plan from the runs stored in runs/tiny: 9 runs, up to 3 seeds per group, [\d.]+ CPU min "
                     r"when they ran; nothing trained$", out, re.M)
    # 2 comparisons of accuracy@4, 3 paired seeds each: 4 degrees of freedom (a 2-seed pilot gives 2)
    assert re.search(r"noise: .* accuracy@4 [\d.]+ \(4 df\); the plan reads the stored runs' noise only", out)
    assert "Noise as the stored runs measured it" in out
    assert re.search(r"the study as written \(seeds: \{first: 2, max: 6\}\): 6 to 18 runs", out)
    assert re.search(r"to register before the real runs .*\):\nseeds: \{first: 2, max: \d+\}\n$", out)


def test_a_plan_from_stored_runs_of_another_study_or_sweep_is_one_line(study):
    (study / "other.yaml").write_text(STUDY.replace("name: tiny", "name: other")
                                      .replace("[none, rope, alibi]", "[none, rope]").split("  - {metric: accuracy@4, better: alibi")[0])
    assert CliRunner().invoke(main, ["run", "other.yaml", "--quiet"]).exit_code == 0
    other = CliRunner().invoke(main, ["plan", "tiny.yaml", "--from", "runs/other"])
    assert other.exit_code == 2 and other.output.strip() == (
        "error: --from: runs/other holds the runs of study 'other', not 'tiny': a plan reads an earlier issue of the "
        "same study (its run folder, or REPORTS/NAME/data)")
    # the same study, run with one group fewer: the plan cannot price or measure the missing one
    (study / "narrow.yaml").write_text((study / "other.yaml").read_text().replace("name: other", "name: tiny"))
    assert CliRunner().invoke(main, ["run", "narrow.yaml", "--quiet", "--out", "narrow"]).exit_code == 0
    narrow = CliRunner().invoke(main, ["plan", "tiny.yaml", "--from", "narrow"])
    assert narrow.exit_code == 2 and narrow.output.strip() == (
        "error: --from: narrow has no finished run of position=alibi: a plan from stored runs needs every group of "
        "the study's sweep (without --from, a pilot trains them)")
    missing = CliRunner().invoke(main, ["plan", "tiny.yaml", "--from", "nowhere"])
    assert missing.exit_code == 2 and len(missing.output.strip().splitlines()) == 1, missing.output
    assert "Traceback" not in missing.output + narrow.output + other.output


def test_a_study_with_the_largest_seed_is_planned(study):
    """seeds [2^32-1, 0]: a pilot took seeds past the largest, and the plan failed on `seeds.0`
    with a value the user never wrote (issue 64); the pilot is the study's first seed, the largest."""
    result = CliRunner().invoke(main, ["plan", "tiny.yaml", "--quiet", "--pilot-seeds", "1",
                                       "--set", "seeds=[4294967295, 0]", "--set", "sweep={model.position: [none, rope]}",
                                       "--set", "expect=[{metric: accuracy@4, better: rope, than: none}]"])
    assert result.exit_code == 0, result.output
    assert "(seeds 4294967295, the study's first" in result.output
    assert set(load_results(study / "runs" / "tiny-pilot")["seed"]) == {4294967295}
