"""`tune:`: validation sets apart from training and evaluation data, per-point choice in the
metric's direction, two stages through one executor, resume without retraining, messages."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from click.testing import CliRunner

from workbench.cli import main
from workbench.run.executor import InProcessExecutor
from workbench.registry import variants
from workbench.api import write_report
from workbench.api import run_study
from workbench.run.store import RUNS_DIR, Store, load_results
from workbench.study import load_study, study_json_schema
from workbench.recipes.train.sweep import expand, tuning_runs
from workbench.results import EVAL, VALIDATION
from workbench.results import RESULT_FILE
from workbench.recipes.train.tuning import choose, chosen_values

TASKS = variants("task")

STUDY = """\
name: tiny-tune
task: {name: copy, train_length: 6, n_eval: 32, alphabet_size: 6}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2}
train: {steps: 10, batch_size: 8, lr: 3.0e-3, eval_every: 5, log_every: 5}
seeds: [0]
sweep:
  model.position: [none, rope]
tune:
  train.lr: [1.0e-3, 1.0e-2]
  metric: loss
expect:
  - {metric: accuracy@6, better: rope, than: none}
"""


def write(tmp_path: Path, text: str, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- the validation split ---------------------------------------------------------------------


def test_validation_sets_avoid_the_evaluation_sets_and_training_avoids_both():
    # 3 symbols, length 3: 27 strings, so unfiltered draws would collide all the time (with
    # fewer, the held-out rows would be most of the space, which training refuses).
    params = TASKS["copy"].Params(alphabet_size=3, min_length=3, train_length=3, n_eval=3)
    tuning = TASKS["copy"](params, seed=0, split=VALIDATION)
    plain = TASKS["copy"](params, seed=0)
    evaluation = {ex.source for ex in plain.eval_examples(3)}
    validation = {ex.source for ex in tuning.eval_examples(3)}
    assert evaluation == {ex.source for ex in tuning.evaluation_set(3)}  # the same evaluation set
    assert validation and not validation & evaluation
    seen = set()
    for index in range(20):
        seen |= {tuple(row[1:4]) for row in tuning.train_batch(index, 8, "decoder")["tokens"].tolist()}
    assert seen and not seen & (validation | evaluation)
    # an ordinary run keeps its data: it does not hold out the validation sources
    plain_seen = set()
    for index in range(20):
        plain_seen |= {tuple(row[1:4]) for row in plain.train_batch(index, 8, "decoder")["tokens"].tolist()}
    assert plain_seen & validation


@pytest.mark.parametrize("name", sorted(n for n, cls in TASKS.items() if cls.hold_out))
def test_every_held_out_task_validates_apart_from_its_evaluation_sets(name):
    params = {"text_lm": {}, "translate": {"train_length": 8}, "classify": {"train_length": 24},
              "recall": {"train_length": 4}}.get(name, {"train_length": 6})
    cls = TASKS[name]
    tuning = cls(cls.Params(n_eval=16, **params), seed=0, split=VALIDATION)
    length = tuning.params.train_length
    validation, evaluation = tuning.eval_examples(length), tuning.evaluation_set(length)
    assert len(validation) == 16 and validation != evaluation
    assert not {ex.source for ex in validation} & {ex.source for ex in evaluation}
    assert {ex.source for ex in validation} <= tuning.held_out_sources()
    assert tuning.eval_batches(length, 8, cls.families[0])  # formats like evaluation data


def test_text_lm_tuning_runs_validate_on_the_training_texts_tail(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(bytes(range(32, 127)) * 40)
    cls = TASKS["text_lm"]
    params = cls.Params(path=str(corpus), train_length=16, n_eval=4, valid_fraction=0.25)
    plain, tuning = cls(params, seed=0, split=EVAL), cls(params, seed=0, split=VALIDATION)
    cut = len(tuning.train_text)
    assert cut == int(len(plain.train_text) * 0.75)
    assert (tuning.train_text.tobytes() + tuning.valid_text.tobytes()) == plain.train_text.tobytes()
    # scored on the training text's tail, never on the evaluation text; trained before the cut
    first = plain.first_token
    windows = [bytes(b - first for b in ex.target) for ex in tuning.eval_examples(16)]
    assert all(w in tuning.valid_text.tobytes() for w in windows)
    batch = tuning.train_batch(0, 64, "decoder")["tokens"] - first
    assert all(bytes(row) in tuning.train_text.tobytes() for row in batch.tolist())


# ---- choosing -----------------------------------------------------------------------------------


def recorded_rows(runs, outcomes):
    """Store-like rows for tuning runs: outcomes[(position, lr)] = (status, metric value)."""
    rows = []
    for run in runs:
        status, value = outcomes[run.swept["model.position"], run.swept["train.lr"]]
        metrics = {} if value is None else {"loss@6": value, "accuracy@6": value}
        rows.append({"swept": run.swept, "config": run.config, "status": status, "metrics": metrics})
    return rows


def test_each_point_chooses_its_own_best_value_in_the_metrics_direction(tmp_path):
    study_file = load_study(write(tmp_path, STUDY.replace("[1.0e-3, 1.0e-2]", "[1.0e-3, 3.0e-3, 1.0e-2]")))
    runs = tuning_runs(study_file)
    assert len(runs) == 2 * 3 and {r.stage for r in runs} == {"tune"}
    assert all(r.config["split"] == VALIDATION for r in runs)
    outcomes = {("none", 1e-3): ("finished", 2.0), ("none", 3e-3): ("finished", 1.5), ("none", 1e-2): ("finished", 1.7),
                ("rope", 1e-3): ("finished", 1.9), ("rope", 3e-3): ("finished", 2.5), ("rope", 1e-2): ("diverged", None)}
    none, rope = choose(study_file.study, recorded_rows(runs, outcomes))
    assert none.chosen.values == {"train.lr": 3e-3}  # lowest loss
    assert rope.chosen.values == {"train.lr": 1e-3}  # its own best, not none's
    assert not rope.candidates[2].eligible

    # higher is better for accuracy: the same numbers pick the other end
    accuracy = load_study(write(tmp_path, study_file.text.replace("metric: loss", "metric: accuracy@6"), "acc.yaml"))
    none, rope = choose(accuracy.study, recorded_rows(runs, outcomes))
    assert none.chosen.values == {"train.lr": 1e-3} and rope.chosen.values == {"train.lr": 3e-3}

    # ties go to the value listed first
    tied = {**outcomes, ("none", 1e-3): ("finished", 1.5)}
    assert choose(study_file.study, recorded_rows(runs, tied))[0].chosen.values == {"train.lr": 1e-3}


def test_a_point_waits_for_its_failed_tuning_runs_and_final_runs_follow_the_choice(tmp_path):
    study_file = load_study(write(tmp_path, STUDY))
    runs = tuning_runs(study_file)
    outcomes = {("none", 1e-3): ("finished", 2.0), ("none", 1e-2): ("failed", None),
                ("rope", 1e-3): ("finished", 1.9), ("rope", 1e-2): ("finished", 1.2)}
    tunings = choose(study_file.study, recorded_rows(runs, outcomes))
    assert tunings[0].chosen is None and not tunings[0].done  # retried before anything is chosen
    finals = expand(study_file, chosen_values(tunings, study_file.study.sweep.keys))
    assert [(r.swept, r.stage) for r in finals] == [({"model.position": "rope", "train.lr": 1e-2}, "final")]
    # a final run is an ordinary run: the untuned study at the chosen value has the same id
    untuned = load_study(write(tmp_path, STUDY.split("tune:")[0].replace("lr: 3.0e-3", "lr: 1.0e-2"), "plain.yaml"))
    assert finals[0].run_id == expand(untuned)[1].run_id and "split" not in finals[0].config
    # nothing eligible: the point is done but has no choice
    diverged = {**outcomes, ("none", 1e-2): ("diverged", None), ("none", 1e-3): ("diverged", None)}
    none = choose(study_file.study, recorded_rows(runs, diverged))[0]
    assert none.done and none.chosen is None


# ---- end to end ---------------------------------------------------------------------------------


class RecordingExecutor(InProcessExecutor):
    """In-process execution that remembers each batch of jobs it was given."""

    def __init__(self):
        super().__init__()
        self.batches: list[list[str]] = []

    def run(self, jobs):
        self.batches.append([job.run_id for job in jobs])
        return super().run(jobs)


def test_tiny_tune_study_chooses_per_point_and_resumes_without_retraining(tmp_path):
    torch.set_num_threads(1)
    path, out = write(tmp_path, STUDY), tmp_path / "out"
    executor = RecordingExecutor()
    summary = run_study(path, out, quiet=True, executor=executor)
    table = load_results(out)
    tune, final = table[table.stage == "tune"], table[table.stage == "final"]
    n = len(table)
    assert summary.statuses == {"finished": n} and summary.total == n
    assert len(final) == 2 and len(tune) >= 4  # the grid, and candidates past an edge it chose
    assert set(tune.seed) == {1} and set(final.seed) == {0}  # tuning seeds are not reported seeds
    # two stages through the one executor: the tuning runs (extended in rounds), then the final runs
    assert set().union(*map(set, executor.batches[:-1])) == set(tune.run_id)
    assert set(executor.batches[-1]) == set(final.run_id)
    for position in ("none", "rope"):
        mine = tune[tune["model.position"] == position]
        best = mine.loc[mine["loss@6"].idxmin(), "train.lr"]
        assert final.loc[final["model.position"] == position, "train.lr"].item() == best
        # the choice is bracketed by the grid, or the search hit its bound of 3 values past the grid
        lrs = sorted(mine["train.lr"])
        assert lrs[0] < best < lrs[-1] or len(lrs) == 2 + 3
    configs = {r["run_id"]: r["config"] for r in Store(out).runs()}
    assert all(configs[i]["split"] == VALIDATION for i in tune.run_id)
    assert all("split" not in configs[i] for i in final.run_id)

    results = {i: (out / RUNS_DIR / i / RESULT_FILE).stat().st_mtime_ns for i in table.run_id}
    again = run_study(path, out, quiet=True, executor=RecordingExecutor())
    assert again.skipped == n and not again.statuses and again.total == len(table) - len(tune) + 4
    assert {r["attempts"] for r in Store(out).runs()} == {1}
    assert {i: (out / RUNS_DIR / i / RESULT_FILE).stat().st_mtime_ns for i in table.run_id} == results

    index = write_report(out, tmp_path / "reports", pictures=False)
    report = (index.parent / "report.md").read_text()
    assert "## Tuning" in report and "figures/tuning.png" in report
    tuning_part = report.split("## Tuning")[1].split("## Leaderboard")[0]
    for position in ("none", "rope"):
        chosen = final.loc[final["model.position"] == position, "train.lr"].item()
        assert f"| position={position} | lr={chosen:g} |" in tuning_part
    assert "| bracketed |" in tuning_part
    # 10 steps: no candidate's validation loss beats the baselines; that qualifies the gates beside the
    # verdict, it decides nothing (one final seed per group: no interval, nothing decided)
    assert "no learning rate in the grid passed the threshold in tuning" in report
    verdict = next(line for line in report.splitlines() if line.startswith("- **"))
    assert verdict.startswith("- **inconclusive (") or verdict.startswith("- **not tested (")
    leaderboard = report.split("## Leaderboard")[1].split("## Figures")[0]
    assert "| 1/1 |" in leaderboard and "| 3/3 |" not in leaderboard  # final runs only
    csv = (index.parent / "results.csv").read_text().splitlines()
    assert "stage" in csv[0].split(",") and len(csv) == 1 + n


# ---- messages and schema ------------------------------------------------------------------------

BASE = STUDY.split("tune:")[0]

BAD = {
    "unknown tuned key": ("tune:\n  train.lrr: [1.0e-3]\n  metric: loss\n", 9,
                          ["tune.train.lrr", "no such key", "did you mean 'train.lr'"]),
    "empty list": ("tune:\n  train.lr: []\n  metric: loss\n", 9, ["tune.train.lr", "empty list"]),
    "not a list": ("tune:\n  train.lr: 0.1\n  metric: loss\n", 9, ["tune.train.lr", "list of candidate values"]),
    "unknown metric": ("tune:\n  train.lr: [1.0e-3]\n  metric: bleu\n", 10,
                       ["tune.metric", "unknown metric 'bleu'", "loss@6"]),
    "metric at a length not evaluated": ("tune:\n  train.lr: [1.0e-3]\n  metric: loss@9\n", 10,
                                         ["tune.metric", "no evaluation at length 9", "loss@6"]),
    "no metric": ("tune:\n  train.lr: [1.0e-3]\n", 8, ["tune.metric", "required"]),
    "misspelt option": ("tune:\n  train.lr: [1.0e-3]\n  metrc: loss\n", 10,
                        ["tune.metrc", "unknown key", "did you mean 'metric'"]),
    "seeds not positive": ("tune:\n  train.lr: [1.0e-3]\n  metric: loss\n  seeds: 0\n", 11,
                           ["tune.seeds", "greater than 0"]),
    "tuned and swept": ("tune:\n  model.position: [none]\n  metric: loss\n", 9, ["tune.model.position", "also swept"]),
    "nothing to tune": ("tune:\n  metric: loss\n", 8, ["tune", "name the keys to tune"]),
    "bad candidate": ("tune:\n  train.lr: [1.0e-3, -1]\n  metric: loss\n", 9,
                      ["tune.train.lr", "greater than 0", "train.lr=-1"]),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_tune_section_names_the_field_and_line(tmp_path, case):
    text, line, fragments = BAD[case]
    path = write(tmp_path, BASE + text)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and message.startswith(f"error: {path}:{line}: "), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_validate_counts_tuning_and_final_runs(tmp_path):
    result = CliRunner().invoke(main, ["validate", str(write(tmp_path, STUDY))])
    assert result.exit_code == 0, result.output
    assert "2 runs = 2 sweep points x 1 seeds (at values chosen by 4 tuning runs" in result.output


def test_schema_describes_tune(tmp_path):
    import yaml

    schema = json.loads(json.dumps(study_json_schema()))
    study = yaml.safe_load(STUDY)
    jsonschema.validate(study, schema)
    for bad in ({"train.lr": [], "metric": "loss"}, {"train.lr": [1.0]}, {"train.lr": [1.0], "metric": "loss", "seeds": 0},
                {"train.lr": [1.0], "metric": "loss", "metrc": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**study, "tune": bad}, schema)
