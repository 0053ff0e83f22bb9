"""Adaptive seeds (`seeds: {first, max}`) through the runner: the looks and the alpha each spends,
which groups get more seeds, futility's words, identical arms, replications' seed ids, and A/A
studies that train tiny models. The error rate and power of the whole procedure, on null studies
of every shape, are tests/stats/test_null.py's."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from workbench.stats.sequential import LOOKS, WITHOUT_FUTILITY


ADAPTIVE = """\
name: adaptive
task: {name: copy, train_length: 6, n_eval: 16, alphabet_size: 6}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {steps: 2, batch_size: 4, lr: 1.0e-3, warmup_steps: 0, eval_every: 2, log_every: 1}
seeds: SEEDS
sweep:
  model.position: [none, rope, alibi]
expect:
  - {metric: loss@6, better: none, than: rope}
  - {metric: n_params, better: none, than: rope}
"""


def test_an_adaptive_study_adds_seeds_only_to_groups_of_undecided_comparisons(tmp_path):
    import torch

    from workbench.api import run_study
    from workbench.run.store import load_results
    from workbench.study import load_study
    from workbench.recipes.train.sweep import expand

    plain, adaptive = tmp_path / "plain.yaml", tmp_path / "adaptive.yaml"
    plain.write_text(ADAPTIVE.replace("SEEDS", "[0, 1]"))
    adaptive.write_text(ADAPTIVE.replace("SEEDS", "{first: 2, max: 4}"))
    # a plain list keeps the study hash it had before adaptive seeds existed; the first seeds keep their run ids
    assert load_study(plain).study.run_defining()["seeds"] == [0, 1]
    assert load_study(adaptive).study.run_defining()["seeds"] == {"first": 2, "max": 4}
    assert load_study(plain).study_hash != load_study(adaptive).study_hash
    assert [r.run_id for r in expand(load_study(plain))] == [r.run_id for r in expand(load_study(adaptive))]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = run_study(adaptive, tmp_path / "out", quiet=True)
    finally:
        torch.set_num_threads(threads)
    runs = load_results(tmp_path / "out")
    seeds = runs.groupby("model.position")["seed"].apply(sorted).to_dict()
    # loss after 2 training steps is the seed's noise, not the position scheme's (looks at 2, 3, 4), so none
    # and rope get the last look's 4; they have the same parameter count on every seed: identical, which ends at
    # the first look. (tokens/s decided at 3 seeds on a quiet machine: a timing metric made the test load-bound.)
    assert seeds == {"none": [0, 1, 2, 3], "rope": [0, 1, 2, 3], "alibi": [0, 1]}
    assert summary.total == len(runs) == 10


def test_a_replication_runs_adaptive_seeds_from_its_start_on_ids_the_earlier_study_never_ran(tmp_path):
    import torch
    from click.testing import CliRunner

    from workbench.api import run_study
    from workbench.cli import main
    from workbench.run.store import load_results
    from workbench.study import load_study
    from workbench.recipes.train.sweep import expand

    earlier, replication = tmp_path / "earlier.yaml", tmp_path / "replication.yaml"
    earlier.write_text(ADAPTIVE.replace("SEEDS", "{first: 2, max: 4}"))
    replication.write_text(ADAPTIVE.replace("SEEDS", "{first: 2, max: 4, start: 100}"))
    assert load_study(replication).study.run_defining()["seeds"] == {"first": 2, "max": 4, "start": 100}
    assert {r.config["seed"] for r in expand(load_study(replication))} == {100, 101}
    assert not {r.run_id for r in expand(load_study(earlier))} & {r.run_id for r in expand(load_study(replication))}
    result = CliRunner().invoke(main, ["validate", str(replication)])
    assert result.exit_code == 0 and "adaptive: up to 4 for groups of undecided comparisons; seed ids from 100" in result.output

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_study(replication, tmp_path / "out", quiet=True)
    finally:
        torch.set_num_threads(threads)
    seeds = load_results(tmp_path / "out").groupby("model.position")["seed"].apply(sorted).to_dict()
    # as in the study from seed 0 above: none and rope grow to the last look, alibi ends at the first
    assert seeds == {"none": [100, 101, 102, 103], "rope": [100, 101, 102, 103], "alibi": [100, 101]}


def test_adaptive_seeds_validate_and_the_schema_accepts_them(tmp_path):
    import json

    import jsonschema
    import yaml
    from click.testing import CliRunner

    from workbench.cli import main
    from workbench.study import study_json_schema

    path = tmp_path / "adaptive.yaml"
    path.write_text(ADAPTIVE.replace("SEEDS", "{first: 3, max: 20}"))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0 and "3 seeds (adaptive: up to 20 for groups of undecided comparisons)" in result.output
    schema = json.loads(json.dumps(study_json_schema()))
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**yaml.safe_load(path.read_text()), "seeds": {"first": 3}}, schema)
    path.write_text(ADAPTIVE.replace("SEEDS", "{first: 3, max: 3}"))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and "seeds.max: 3 must exceed first (3)" in result.stderr


AA = """\
name: a-a
task: {name: copy, train_length: 6, n_eval: 32, alphabet_size: 6}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {steps: 30, batch_size: 8, lr: 3.0e-3, warmup_steps: 0, eval_every: 30, log_every: 10}
seeds: {first: 2, max: 4}
sweep:
  ARM
expect:
  - {metric: accuracy@6, better: BETTER, than: THAN}
  - {metric: loss@6, better: BETTER, than: THAN}
  - {metric: n_params, better: BETTER, than: THAN}
"""


def run_aa(tmp_path, arm: str, a, b):
    from workbench.api import write_report
    from workbench.api import run_study
    from workbench.run.store import load_results

    path = tmp_path / "aa.yaml"
    path.write_text(AA.replace("ARM", arm).replace("BETTER", str(b)).replace("THAN", str(a)))
    run_study(path, tmp_path / "out", quiet=True)
    index = write_report(tmp_path / "out", tmp_path / "reports", pictures=False)
    summary = json.loads((index.parent / "summary.json").read_text())
    return load_results(tmp_path / "out"), summary["verdicts"]


def test_an_a_a_study_of_two_init_streams_decides_nothing(tmp_path):
    """Two arms that are the same model (same spec, same data per seed, initial weights from
    another stream): trained under adaptive seeds, no verdict decides."""
    runs, verdicts = run_aa(tmp_path, "train.init_stream: [0, 1]", 0, 1)
    per_arm = runs.groupby("train.init_stream")["seed"].apply(sorted).to_dict()
    assert set(per_arm) == {0, 1} and per_arm[0] == per_arm[1]
    first = runs[runs["seed"] == 0].set_index("train.init_stream")
    assert first.loc[0, "loss@6"] != first.loc[1, "loss@6"]  # other initial weights, so other results
    assert [v["outcome"] for v in verdicts if v["outcome"] in ("holds", "does not hold", "equivalent")] == []


def test_identical_arms_end_at_the_first_look_without_spending_seeds(tmp_path):
    """A setting that changes nothing a run computes (how often the training loss is logged)
    gives bit-identical arms: they end at the first look as such, and get no more seeds (30 steps
    learn nothing, so the gated entries also say that neither group learned)."""
    runs, verdicts = run_aa(tmp_path, "train.log_every: [10, 15]", 10, 15)
    assert sorted(runs["seed"]) == [0, 0, 1, 1]
    assert all(v["outcome"] == "identical" and "look 1 of 3" in v["label"]
               and v["label"].startswith("identical (both groups gave the same") for v in verdicts)
    assert verdicts[2]["label"].startswith("identical (both groups gave the same n_params on every seed; look 1 of 3")


def test_which_groups_get_more_seeds_is_a_function_of_the_study_and_its_runs():
    """The loop asks `seeds_wanted` after each round with the stored runs alone (no report is
    built): the groups of an undecided comparison get the next look's seeds, an ended one none."""
    import yaml

    from workbench.recipes.train.verdicts import seeds_wanted
    from workbench.recipes.train.study import TrainStudy
    from workbench.recipes.train.sweep import point_key

    study = TrainStudy.model_validate(yaml.safe_load(ADAPTIVE.replace("SEEDS", "{first: 2, max: 4}")))
    speed = {("none", 0): 1000.0, ("none", 1): 1400.0, ("rope", 0): 1100.0, ("rope", 1): 1200.0,
             ("alibi", 0): 900.0, ("alibi", 1): 950.0}
    runs = pd.DataFrame([{"run_id": f"{p}{s}", "index": i, "seed": s, "model.position": p, "status": "finished",
                          "tokens_per_s": v, "n_params": 5000} for i, ((p, s), v) in enumerate(speed.items())])
    wanted = seeds_wanted(study, runs)  # looks at 2, 3, 4 seeds
    assert wanted == {point_key({"model.position": p}, ["model.position"]): 3 for p in ("none", "rope")}
    # once the groups have the plan's maximum, nothing more is asked for
    more = pd.concat([runs, runs.assign(seed=runs["seed"] + 2, run_id=runs["run_id"] + "b")], ignore_index=True)
    assert seeds_wanted(study, more) == {}


FUTILE = """\
name: futile
task: {name: copy, train_length: 6, n_eval: 16, alphabet_size: 6}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {steps: 2, batch_size: 4, lr: 1.0e-3, warmup_steps: 0, eval_every: 2, log_every: 1}
seeds: {first: 3, max: 12}
sweep:
  model.position: [none, rope]
expect:
  - ENTRY
"""


def test_a_comparison_its_seeds_cannot_decide_gets_no_more_and_the_report_says_why():
    """Futility: at 4 seeds a difference of 1.25 tokens/s beside a spread of the paired differences of
    about 13 would be found at 12 seeds with under 5% power (3% at the level of the 4-seed look, the
    first that decides: 0.0226), so its groups get no more seeds; at 3 seeds nothing is read yet; with
    a margin of 20 (not shown at 4 seeds: the interval reaches -20.6) its equivalence could still be
    shown, so it grows, with one of 0.5 it could not; under the rule without futility it grows; a
    plain difference grows."""
    import yaml

    from workbench.recipes.train.gates import Gates
    from workbench.recipes.train.runs import TrainRuns
    from workbench.stats.sequential import sequential_verdicts
    from workbench.recipes.train.study import TrainStudy
    from workbench.recipes.train.verdicts import Verdicts, seeds_wanted

    def study(entry: str):
        return TrainStudy.model_validate(yaml.safe_load(FUTILE.replace("ENTRY", entry)))

    def runs(none: list[float], rope: list[float]) -> pd.DataFrame:
        return pd.DataFrame([{"run_id": f"{p}{s}", "index": i, "seed": s, "model.position": p, "status": "finished",
                              "tokens_per_s": v} for i, (p, s, v) in enumerate(
                                  [("none", s, v) for s, v in enumerate(none)] + [("rope", s, v) for s, v in enumerate(rope)])])

    plain = study("{metric: tokens_per_s, better: none, than: rope}")
    margin = study("{metric: tokens_per_s, better: none, than: rope, margin: 20}")
    narrow = study("{metric: tokens_per_s, better: none, than: rope, margin: 0.5}")
    near = runs([1000, 1400, 900, 1300], [1010, 1390, 910, 1285])  # differences -10, +10, -10, +15
    assert seeds_wanted(plain, near) == {}
    assert set(seeds_wanted(plain, near.query("seed < 3")).values()) == {4}  # 3 seeds: not read yet
    assert set(seeds_wanted(margin, near).values()) == {6}
    assert seeds_wanted(narrow, near) == {}
    assert set(seeds_wanted(plain, near, rule=WITHOUT_FUTILITY).values()) == {6}
    apart = runs([1000, 1400, 900, 1300], [990, 1330, 905, 1240])  # differences +10, +70, -5, +60
    assert set(seeds_wanted(plain, apart).values()) == {6}
    train_runs = TrainRuns(plain, near)
    comparisons, _ = Verdicts(train_runs, Gates(train_runs)).comparisons()
    [verdict] = sequential_verdicts(comparisons, LOOKS.looks(3, 12))
    assert verdict.outcome == "inconclusive" and verdict.seeds == 4
    assert "; no more seeds after 4: 12 seeds would find the observed difference +1.25 with 3% power" in verdict.reason


def test_a_round_whose_every_run_failed_adds_no_more_seeds_and_says_so(tmp_path, capsys):
    """A failed run is an error (a lost worker, a broken plugin), not an outcome: its groups stay
    undecided, and asking more seeds of them would fail alike up to the plan's maximum."""
    import torch

    from workbench.api import run_study
    from workbench.results import RunResult, Status
    from workbench.run.executor import InProcessExecutor
    from workbench.run.store import load_results

    class LosesEveryLaterSeed(InProcessExecutor):
        def run(self, jobs):
            for job in jobs:
                if job.config["seed"] < 2:
                    yield from super().run([job])
                else:
                    yield RunResult(run_id=job.run_id, status=Status.FAILED, error="RuntimeError: worker lost")

    study = tmp_path / "adaptive.yaml"
    study.write_text(ADAPTIVE.replace("SEEDS", "{first: 2, max: 6}"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_study(study, tmp_path / "out", quiet=True, executor=LosesEveryLaterSeed())
    finally:
        torch.set_num_threads(threads)
    runs = load_results(tmp_path / "out")
    # the first look (2 seeds) left none against rope undecided: seed 2 was asked of both and failed; no look after
    assert sorted(runs.loc[runs["status"] == Status.FAILED, "seed"]) == [2, 2]
    assert runs["seed"].max() == 2
    assert "every run of this round failed (2, each line above says why): no more seeds are added" in capsys.readouterr().out
