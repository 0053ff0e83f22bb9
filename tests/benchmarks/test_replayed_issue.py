"""Re-issuing a stored adaptive study under a look rule without training (`python -m
benchmarks.decide --reissue STORE OUT`): the stored runs are revealed to the runner's own
add-seeds loop, so under the rule the store was issued with every run comes back, and under
today's futility only the runs it asks for."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from benchmarks.decide import replayed_issue
from workbench.recipes.train.gates import Gates
from workbench.recipes.train.runs import TrainRuns
from workbench.stats.sequential import LOOKS, WITHOUT_FUTILITY, sequential_verdicts
from workbench.recipes.train.sweep import expand, point_key
from workbench.recipes.train.verdicts import Verdicts
from workbench.report import study_of
from workbench.results import RunResult
from workbench.run.store import Store, load_results
from workbench.study import load_study
from workbench.study.keys import canonical_json, label

STUDY = """\
name: replayed
task: {name: copy, train_length: 6, n_eval: 16, alphabet_size: 6}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {steps: 2, batch_size: 4, lr: 1.0e-3, warmup_steps: 0, eval_every: 2, log_every: 1}
seeds: {first: 3, max: 8}
sweep:
  model.position: [none, rope, alibi]
expect:
  - {metric: tokens_per_s, better: none, than: rope}
  - {metric: tokens_per_s, better: alibi, than: rope}
"""
# tokens/s per seed (no gate): none and rope the same but for noise; alibi far ahead on every seed
SPEED = {"none": [1000, 1400, 900, 1300, 1100, 1200, 950, 1250],
         "rope": [1010, 1390, 905, 1280, 1105, 1190, 960, 1240],
         "alibi": [2000, 2400, 1900, 2300, 2100, 2200, 1950, 2250]}


@pytest.fixture
def stored(tmp_path) -> Path:
    """The study as the rule without futility issues it: none and rope, undecided, grown to 8 seeds;
    alibi, far ahead on every seed, decided at the first look that decides (4 seeds)."""
    (tmp_path / "study.yaml").write_text(STUDY)
    study_file = load_study(tmp_path / "study.yaml")
    study = study_file.study
    store = Store(tmp_path / "issued")
    store.save_study({"name": study.name, "kind": study.kind, "hash": study_file.study_hash,
                      "run_defining": canonical_json(study.run_defining()),
                      "study": json.dumps(study.model_dump(mode="json"), default=str),
                      "yaml": study_file.text, "source": str(study_file.path), "profile": ""})
    grown = {"none": 8, "rope": 8, "alibi": 4}
    keys = list(study.sweep.keys)
    for run in expand(study_file, seeds={point_key({keys[0]: label(p)}, keys): n for p, n in grown.items()}):
        speed = SPEED[run.swept["model.position"]][run.seed]
        store.record(run, RunResult(run_id=run.run_id, status="finished", steps_done=2, metrics={}, curves=[
            (2, "train", "loss", 1.0)], n_params=5000, wall_time_s=10.0, cpu_time_s=15.0, tokens=1200,
            tokens_per_s=float(speed), environment={"device": "cpu"}))
    return tmp_path / "issued"


def verdicts_of(store: Path):
    study = study_of(Store(store, create=False).study_record())
    runs = TrainRuns(study, load_results(store))
    comparisons, _ = Verdicts(runs, Gates(runs)).comparisons()
    return sequential_verdicts(comparisons, LOOKS.looks(study.seed_plan.first, study.seed_plan.max))


def test_a_replay_keeps_the_runs_its_own_rule_trained_and_drops_only_what_futility_no_longer_asks(stored, tmp_path):
    everything = set(load_results(stored)["run_id"])
    kept, dropped, short = replayed_issue(stored, tmp_path / "same", WITHOUT_FUTILITY)
    assert set(kept) == everything and not dropped and not short  # the loop asked for exactly the runs it holds

    kept, dropped, _ = replayed_issue(stored, tmp_path / "today", LOOKS)
    runs = load_results(stored).set_index("run_id")
    assert sorted(runs.loc[dropped, "seed"]) == [6, 6, 7, 7]  # none and rope stop at 6 (looks 3, 4, 6, 8)
    with sqlite3.connect(tmp_path / "today" / "results.db") as conn:
        assert {r for (r,) in conn.execute("SELECT run_id FROM runs")} == set(kept)
        assert not {r for (r,) in conn.execute("SELECT DISTINCT run_id FROM curves")} & set(dropped)
    before, after = verdicts_of(stored), verdicts_of(tmp_path / "today")
    assert (before[1].outcome, before[1].seeds) == (after[1].outcome, after[1].seeds) == ("holds", 4)
    assert (before[0].outcome, before[0].seeds) == ("inconclusive", 8)
    assert (after[0].outcome, after[0].seeds) == ("inconclusive", 6) and "no more seeds after 6" in after[0].reason


def test_a_replay_refuses_a_folder_that_exists_and_a_rule_that_asks_for_runs_never_stored(stored, tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(SystemExit, match="exists: give a new folder"):
        replayed_issue(stored, tmp_path / "taken")
    today = tmp_path / "today"
    replayed_issue(stored, today)
    with pytest.raises(SystemExit, match="the rule asks for 8 seeds of .*; the store holds 6"):
        replayed_issue(today, tmp_path / "again", WITHOUT_FUTILITY)
    # --partial keeps what the store holds of a group the rule wants more of, and says so
    kept, dropped, short = replayed_issue(today, tmp_path / "partial", WITHOUT_FUTILITY, partial=True)
    assert not dropped and sorted(short.values()) == [(8, 6), (8, 6)]


def test_a_received_store_gets_one_line_and_nothing_written(stored, tmp_path):
    """A store is data: a run folder holding a link (a weights file that points elsewhere), a
    planted trigger and a damaged study record are each refused in one line, before anything is
    written."""
    from benchmarks.decide import main
    from workbench.run.store import run_dir

    def refused(out: Path) -> str:
        with pytest.raises(SystemExit) as stop:
            main(["--reissue", str(stored), str(out)])
        assert not out.exists()
        return str(stop.value)

    folder = run_dir(stored, load_results(stored).query("seed == 0")["run_id"].iloc[0])
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (tmp_path / "outside.txt").write_text("not the study's")
    (folder / "final.safetensors").symlink_to(tmp_path / "outside.txt")
    message = refused(tmp_path / "linked")
    assert message.startswith("error: ") and "\n" not in message and "is a symbolic link" in message
    (folder / "final.safetensors").unlink()
    replayed_issue(stored, tmp_path / "copy")  # without the link, the folder is copied with the run
    assert (run_dir(tmp_path / "copy", folder.name) / "config.json").is_file()

    with sqlite3.connect(stored / "results.db") as conn:  # a trigger the replay's deletions would fire
        conn.execute("CREATE TRIGGER planted AFTER DELETE ON runs BEGIN DELETE FROM study; END")
    message = refused(tmp_path / "triggered")
    assert message.startswith("error: ") and "\n" not in message and "trigger 'planted'" in message
    with sqlite3.connect(stored / "results.db") as conn:
        conn.execute("DROP TRIGGER planted")

    with sqlite3.connect(stored / "results.db") as conn:
        conn.execute("UPDATE study SET value = 'not json' WHERE key = 'study'")
    message = refused(tmp_path / "damaged")
    assert message.startswith("error: ") and "\n" not in message and "damaged" in message


def test_a_replay_issues_under_the_study_file_as_it_now_reads_when_its_runs_are_the_stores(stored, tmp_path):
    """`--study FILE`: an entry's words may change after its runs (here a note), and the re-issue records
    the file as `workbench run` would; a file that defines other runs (more steps) is refused in one line."""
    from benchmarks.decide import main

    noted = tmp_path / "noted.yaml"
    noted.write_text(STUDY.replace("{metric: tokens_per_s, better: alibi, than: rope}",
                                   "{metric: tokens_per_s, better: alibi, than: rope, note: written later}"))
    replayed_issue(stored, tmp_path / "noted", study_path=noted)
    record = Store(tmp_path / "noted", create=False).study_record()
    assert "written later" in record["yaml"] and study_of(record).expect[1].note == "written later"
    longer = tmp_path / "longer.yaml"
    longer.write_text(STUDY.replace("steps: 2,", "steps: 3,"))
    with pytest.raises(SystemExit) as stop:
        main(["--reissue", str(stored), str(tmp_path / "longer"), "--study", str(longer)])
    assert "defines other runs than the study stored" in str(stop.value) and not (tmp_path / "longer").exists()


def test_a_report_of_a_store_short_of_the_rule_names_only_the_groups_that_lack_seeds(stored):
    """The line above an incomplete report's verdicts: the runs the current rule asks for before
    its verdicts are read, each group that lacks seeds with the count it needs, no other group."""
    from types import SimpleNamespace

    from workbench.recipes.train.report.build import short_of_the_rule

    study = study_of(Store(stored, create=False).study_record())
    everything = load_results(stored)

    def line(seeds: dict[str, int]) -> str:
        runs = TrainRuns(study, everything[everything["seed"] < everything["model.position"].map(seeds)])
        return short_of_the_rule(SimpleNamespace(runs=runs, verdicts=Verdicts(runs, Gates(runs))))

    assert line({"none": 3, "rope": 3, "alibi": 3}).startswith(
        "Incomplete under the current rule: it asks for 3 more runs (position=none to 4; position=rope to 4; "
        "position=alibi to 4 seeds) before the verdicts they decide are read")
    # alibi holds its 4 seeds: it is not named
    assert line({"none": 3, "rope": 3, "alibi": 4}).startswith(
        "Incomplete under the current rule: it asks for 2 more runs (position=none to 4; position=rope to 4 seeds)")
    assert line({"none": 3, "rope": 4, "alibi": 4}).startswith(
        "Incomplete under the current rule: it asks for 1 more run (position=none to 4 seeds) before the verdicts it "
        "decides are read; `workbench run` on the study trains it")
    assert line({"none": 8, "rope": 8, "alibi": 4}) == ""  # as issued: nothing asked
