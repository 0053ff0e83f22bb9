"""Adaptive seeds (`seeds: {first, max}`): the looks, the alpha each spends, and simulations of
studies fed through the runner's and the report's own functions, showing the error rate and power
of the whole procedure: gates, looks, Holm and equivalence together."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from workbench.report.learned_gate import make_gate
from workbench.report.sequential import (grow_seeds, look_alphas, seed_looks, seeds_for_next_look, sequential_verdicts,
                                         spent)
from workbench.report.stats import Comparison

LOOKS = seed_looks(3, 20)
STUDIES = 2000


def test_looks_double_the_seeds_up_to_the_maximum_and_spend_exactly_alpha():
    assert LOOKS == [3, 6, 12, 20] and seed_looks(2, 5) == [2, 4, 5]
    alphas = look_alphas(LOOKS)
    assert sum(alphas) == pytest.approx(0.05) and all(a >= 0 for a in alphas)
    # O'Brien-Fleming-type: almost nothing is spent early, most at the end
    assert alphas[0] < 1e-5 and alphas[-1] > 0.03
    assert spent(1.0) == pytest.approx(0.05) and spent(0.5) == pytest.approx(2 - 2 * stats.norm.cdf(1.96 / 0.5 ** 0.5), rel=1e-3)


# ---- the null through the pipeline ---------------------------------------------------------------
#
# Each simulated study is fed through the functions the runner and the report call: the gates
# (workbench.report.learned_gate), the verdicts with Holm and equivalence (stats.verdicts), the looks
# (sequential.sequential_verdicts), the choice of groups that get more seeds (seeds_for_next_look) and
# the add-seeds loop itself (grow_seeds), which here draws synthetic per-seed scores instead of training.

THRESHOLD, SD = 0.5845, 0.05  # the audit's gate threshold (copy, length 8); each group's per-seed spread
SEED_SD = 0.03  # the part of that spread shared by both groups of a seed (the same data stream)
NOISE_SD = (SD ** 2 - SEED_SD ** 2) ** 0.5
DIFF_SD = NOISE_SD * 2 ** 0.5  # spread of the per-seed paired differences
MARGIN = DIFF_SD  # the equivalence margin: one SD of the per-seed differences
BASELINES = {"order-blind": (THRESHOLD - 0.1) / 0.9}  # 10% of the way to 1 from here is THRESHOLD


def simulated_study(rng: np.random.Generator, groups: dict[str, float],
                    pairs: list[tuple[str, str, float | None]]) -> list:
    """One adaptive study (looks at 3, 6, 12, 20 seeds): `groups` maps a group to its true mean
    score, `pairs` are its `expect:` entries (better, than, margin). Returns the report's verdicts."""
    seed_effect = rng.normal(0.0, SEED_SD, LOOKS[-1])
    scores = {g: pd.Series(mean + seed_effect + rng.normal(0.0, NOISE_SD, LOOKS[-1])) for g, mean in groups.items()}
    revealed = dict.fromkeys(groups, LOOKS[0])

    def comparisons() -> list[Comparison]:
        seen = {g: scores[g].iloc[:revealed[g]] for g in groups}
        gates = {g: make_gate(g, "accuracy@8", seen[g], BASELINES, 1.0, True, (0.0, 1.0)) for g in groups}
        return [Comparison("accuracy@8", a, b, seen[a], seen[b], higher=True, bounds=(0.0, 1.0),
                           gates=(gates[a], gates[b]), margin=margin, seeds_run=min(revealed[a], revealed[b]))
                for a, b, margin in pairs]

    def wanted() -> dict[str, int]:
        c = comparisons()
        return seeds_for_next_look(c, sequential_verdicts(c, LOOKS, plan=False), LOOKS)

    def run(counts: dict[str, int], grown: dict[str, int]) -> None:
        revealed.update(counts)

    grow_seeds(wanted, run, LOOKS[0])
    return sequential_verdicts(comparisons(), LOOKS, plan=False)


def rate(outcomes: list[str], *which: str) -> float:
    return float(np.mean([o in which for o in outcomes]))


def mc_error(p: float, n: int) -> float:
    """Three Monte Carlo standard errors of a rate p over n studies."""
    return 3 * (p * (1 - p) / n) ** 0.5


NULL_STUDIES = 2000


def test_two_thousand_null_studies_through_the_pipeline_decide_at_most_at_the_stated_rate():
    """2,000 studies of four `expect:` entries each (Holm's m = 4): three pairs of equal groups whose
    common mean lies 1 SD below, at, and 0.6 SD above the gate's threshold (the last with an
    equivalence margin), and one pair whose true difference equals its margin (so "equivalent"
    is false there). One test, so that the studies are simulated once."""
    rng = np.random.default_rng(2026)
    groups = {"below-a": THRESHOLD - SD, "below-b": THRESHOLD - SD, "at-a": THRESHOLD, "at-b": THRESHOLD,
              "above-a": THRESHOLD + 0.6 * SD, "above-b": THRESHOLD + 0.6 * SD,
              "edge-a": THRESHOLD + 2 * SD + MARGIN, "edge-b": THRESHOLD + 2 * SD}
    pairs = [("below-a", "below-b", None), ("at-a", "at-b", None), ("above-a", "above-b", MARGIN),
             ("edge-a", "edge-b", MARGIN)]
    studies = [simulated_study(rng, groups, pairs) for _ in range(NULL_STUDIES)]
    n = len(studies)
    for k, where in enumerate(("below", "at", "above")):
        outcomes = [study[k].outcome for study in studies]
        # the README's rates: at most 2.5% false "holds" and 2.5% false "does not hold", 5% in total
        assert rate(outcomes, "holds") <= 0.025 + mc_error(0.025, n), where
        assert rate(outcomes, "does not hold") <= 0.025 + mc_error(0.025, n), where
        assert rate(outcomes, "holds", "does not hold") <= 0.05 + mc_error(0.05, n), where
    # the gate never decides: "only A learned" comes only with a decided difference
    assert all(v.outcome.decides for study in studies for v in study if v.only)
    # below the threshold the data show that neither learned, mostly: "not tested", never a claim
    assert rate([study[0].outcome for study in studies], "not tested") > 0.5
    # equal groups with a margin of one SD are found equivalent, mostly (the correct decision there)
    assert rate([study[2].outcome for study in studies], "equivalent") > 0.5
    # a true difference at the margin: "equivalent" is false there, and so is "does not hold"
    edge = [study[3].outcome for study in studies]
    assert rate(edge, "equivalent") <= 0.05 + mc_error(0.05, n)
    assert rate(edge, "does not hold") <= 0.025 + mc_error(0.025, n)

    # family-wise: any false decision among the study's four entries, over all looks
    def false(study) -> bool:
        return (any(v.outcome in ("holds", "does not hold") for v in study[:3])
                or study[3].outcome in ("equivalent", "does not hold"))
    assert rate([false(study) for study in studies], True) <= 0.05 + mc_error(0.05, n)


def test_one_sd_of_the_per_seed_differences_is_found_within_20_seeds_with_80_percent_power():
    rng = np.random.default_rng(7)
    groups = {"a": THRESHOLD + 2 * SD + DIFF_SD, "b": THRESHOLD + 2 * SD, "c": THRESHOLD + 2 * SD}
    studies = [simulated_study(rng, groups, [("a", "b", None), ("b", "c", None)]) for _ in range(500)]
    assert rate([s[0].outcome for s in studies], "holds") >= 0.80
    # and both learned: a decided difference between groups that learned reads plainly "holds"
    assert all(s[0].label == "holds" for s in studies if s[0].outcome == "holds" and s[0].seeds >= 6)


ADAPTIVE = """\
name: adaptive
task: {name: copy, train_length: 6, n_eval: 16, alphabet_size: 6}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {steps: 2, batch_size: 4, lr: 1.0e-3, warmup_steps: 0, eval_every: 2, log_every: 1}
seeds: SEEDS
sweep:
  model.position: [none, rope, alibi]
expect:
  - {metric: tokens_per_s, better: none, than: rope}
  - {metric: n_params, better: none, than: rope}
"""


def test_an_adaptive_study_adds_seeds_only_to_groups_of_undecided_comparisons(tmp_path):
    import torch

    from workbench.run.runner import run_study
    from workbench.run.store import load_results
    from workbench.study import load_study
    from workbench.study.sweep import expand

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
    # tokens/s after 2 seeds: the first look spends almost no alpha, so none and rope get the next look's 4;
    # none and rope have the same parameter count on every seed: identical, which ends at the first look
    assert seeds == {"none": [0, 1, 2, 3], "rope": [0, 1, 2, 3], "alibi": [0, 1]}
    assert summary.total == len(runs) == 10


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
    from workbench.report import write_report
    from workbench.run.runner import run_study
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
    learn nothing, so the gated entries say that first, and that both arms scored alike)."""
    runs, verdicts = run_aa(tmp_path, "train.log_every: [10, 15]", 10, 15)
    assert sorted(runs["seed"]) == [0, 0, 1, 1]
    assert all("look 1 of 2" in v["label"] and ("identical (both groups gave the same" in v["label"]
               or "both gave the same value on every seed" in v["label"]) for v in verdicts)
    assert [v["outcome"] for v in verdicts if v["outcome"] not in ("identical", "not tested")] == []
    assert verdicts[2]["label"].startswith("identical (both groups gave the same n_params on every seed; look 1 of 2")


def test_which_groups_get_more_seeds_is_a_function_of_the_study_and_its_runs():
    """The loop asks `seeds_wanted` after each round with the stored runs alone (no report is
    built): the groups of an undecided comparison get the next look's seeds, an ended one none."""
    import yaml

    from workbench.recipes.train.verdicts import seeds_wanted
    from workbench.study import TrainStudy
    from workbench.study.sweep import point_key

    study = TrainStudy.model_validate(yaml.safe_load(ADAPTIVE.replace("SEEDS", "{first: 2, max: 4}")))
    speed = {("none", 0): 1000.0, ("none", 1): 1400.0, ("rope", 0): 1100.0, ("rope", 1): 1200.0,
             ("alibi", 0): 900.0, ("alibi", 1): 950.0}
    runs = pd.DataFrame([{"run_id": f"{p}{s}", "index": i, "seed": s, "model.position": p, "status": "finished",
                          "tokens_per_s": v, "n_params": 5000} for i, ((p, s), v) in enumerate(speed.items())])
    wanted = seeds_wanted(study, runs)
    assert wanted == {point_key({"model.position": p}, ["model.position"]): 4 for p in ("none", "rope")}
    # once the groups have the plan's maximum, nothing more is asked for
    more = pd.concat([runs, runs.assign(seed=runs["seed"] + 2, run_id=runs["run_id"] + "b")], ignore_index=True)
    assert seeds_wanted(study, more) == {}
