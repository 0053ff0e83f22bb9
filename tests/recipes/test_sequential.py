"""Adaptive seeds (`seeds: {first, max}`): the looks, the alpha each spends, and simulations of
studies fed through the runner's and the report's own functions, showing the error rate and power
of the whole procedure: gates, looks, Holm and equivalence together."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from workbench.recipes.train.sequential import EARLIER_LOOKS, LOOKS, WITHOUT_FUTILITY, obrien_fleming, pocock
from workbench.report.sweep_points import short_key


def test_looks_grow_by_half_up_to_the_maximum_and_spend_exactly_alpha():
    assert LOOKS.looks(3, 20) == [3, 4, 6, 9, 14, 20] and LOOKS.looks(2, 5) == [2, 3, 4, 5]
    assert LOOKS.looks(3, 12) == [3, 4, 6, 8, 12] and LOOKS.looks(2, 3) == [2, 3]
    alphas = LOOKS.alphas(LOOKS.looks(3, 20))
    assert sum(alphas) == pytest.approx(0.05) and all(a > 0 for a in alphas)
    # Pocock-type: the first look at 3 of 20 seeds already spends alpha ln(1 + (e - 1) 0.15) = 0.0115
    assert alphas[0] == pytest.approx(0.05 * math.log(1 + (math.e - 1) * 0.15))
    assert pocock(1.0) == pytest.approx(0.05) and pocock(0.0) == 0.0
    # the earlier rule: doubling looks, O'Brien-Fleming-type, which spent almost nothing early
    assert EARLIER_LOOKS.looks(3, 20) == [3, 6, 12, 20]
    earlier = EARLIER_LOOKS.alphas([3, 6, 12, 20])
    assert sum(earlier) == pytest.approx(0.05) and earlier[0] < 1e-5 and earlier[-1] > 0.03
    assert obrien_fleming(0.5) == pytest.approx(2 - 2 * stats.norm.cdf(1.96 / 0.5 ** 0.5), rel=1e-3)


# ---- the null through the pipeline ---------------------------------------------------------------
#
# Each simulated study is a results table like the store's (`load_results`), grown seed by seed
# through the runner's own path: the add-seeds loop (`grow_seeds`) asks `seeds_wanted(study, runs)`
# after every round, which builds the report's `TrainRuns`, `Gates` and `Verdicts.comparisons` from
# the table and applies the looks (`sequential_verdicts`) and the choice of groups that get more seeds
# (`seeds_for_next_look`). Only the training is replaced: a round "trains" a group's next seeds by
# revealing rows drawn in advance (benchmarks.decide.replay, which also replays stored studies).

SD = 0.05  # each group's per-seed spread (of accuracy)
SEED_SD = 0.03  # the part of that spread shared by both groups of a seed (the same data stream)
NOISE_SD = (SD ** 2 - SEED_SD ** 2) ** 0.5
DIFF_SD = NOISE_SD * 2 ** 0.5  # spread of the per-seed paired differences
MARGIN = 2 * DIFF_SD  # the equivalence margin: two SDs of the per-seed differences
KEY = "train.init_stream"  # the swept key that names the groups (its values change nothing here)
SIMULATED = """\
name: null-simulation
task: {name: copy, train_length: 8, eval_lengths: [8, 12], n_eval: 64, alphabet_size: 8}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {steps: 2, batch_size: 4, lr: 1.0e-3}
seeds: {first: 3, max: 20}
sweep:
  train.init_stream: GROUPS
expect:
ENTRIES"""


@dataclass(frozen=True)
class Group:
    """A simulated group: its true mean score (at the training length 8 and at 12, relative to each
    length's gate threshold, in SDs), its noise scale, its chance that a run fails, and whether
    scores are counted on the 64 evaluation strings (ties) and capped at 1 (ceilings)."""

    above: float  # true mean at length 8 = threshold + above * SD
    above_12: float = 0.5
    noise: float = 1.0
    fails: float = 0.0
    counted: bool = False


@dataclass(frozen=True)
class Entry:
    better: int
    than: int
    metric: str = "accuracy@8"
    margin: float | None = None
    true_difference: float = 0.0  # better - than, in the metric's units


def simulated_study_file(groups: Sequence[Group], entries: Sequence[Entry], first: int = 3, most: int = 20):
    import yaml

    from workbench.recipes.train.study import TrainStudy

    lines = "".join(f"  - {{metric: {e.metric}, better: {e.better}, than: {e.than}"
                    + (f", margin: {e.margin}" if e.margin else "") + "}\n" for e in entries)
    text = (SIMULATED.replace("GROUPS", str(list(range(len(groups))))).replace("ENTRIES", lines)
            .replace("{first: 3, max: 20}", f"{{first: {first}, max: {most}}}"))
    return TrainStudy.model_validate(yaml.safe_load(text))


def thresholds(study) -> dict[int, float]:
    """The gate's threshold at each evaluation length, as the report computes it."""
    from workbench.recipes.train.gates import Gates
    from workbench.recipes.train.runs import TrainRuns

    runs = pd.DataFrame([{"run_id": "x", "index": 0, "seed": 0, KEY: 0, "status": "finished", "accuracy@8": 0.5,
                          "accuracy@12": 0.5}])
    gates = Gates(TrainRuns(study, runs))
    return {n: gates.gate(f"{short_key(KEY)}=0", "accuracy", n).limit.needed for n in (8, 12)}


def drawn_runs(rng: np.random.Generator, groups: Sequence[Group], limits: dict[int, float], seeds: int) -> pd.DataFrame:
    """Every run a study could train, drawn in advance: a results table of `seeds` seeds per group."""
    shared = {n: rng.normal(0.0, SEED_SD, seeds) for n in limits}  # the seed's data stream, common to all groups
    rows = []
    for g, group in enumerate(groups):
        failed = rng.random(seeds) < group.fails
        scores = {}
        for n, above in ((8, group.above), (12, group.above_12)):
            x = limits[n] + above * SD + shared[n] + rng.normal(0.0, NOISE_SD * group.noise, seeds)
            scores[n] = np.minimum(np.round(x * 64) / 64, 1.0) if group.counted else np.clip(x, 0.0, 1.0)
        for seed in range(seeds):
            rows.append({"run_id": f"{g}-{seed}", "index": g * 1000 + seed, "seed": seed, KEY: g,
                         "status": "failed" if failed[seed] else "finished",
                         **{f"accuracy@{n}": math.nan if failed[seed] else float(scores[n][seed]) for n in scores}})
    return pd.DataFrame(rows)


def simulated_study(rng: np.random.Generator, study, groups: Sequence[Group], limits: dict[int, float],
                    rule=LOOKS) -> list:
    """One adaptive study through the runner's add-seeds loop (benchmarks.decide.replay: the loop asks
    `seeds_wanted` after every round, which reads the table as the report does); the report's verdicts."""
    from benchmarks.decide import replay

    return replay(study, drawn_runs(rng, groups, limits, study.seed_plan.max), rule)[0]


def rate(outcomes: list[str], *which: str) -> float:
    return float(np.mean([o in which for o in outcomes]))


def mc_error(p: float, n: int) -> float:
    """Three Monte Carlo standard errors of a rate p over n studies."""
    return 3 * (p * (1 - p) / n) ** 0.5


NULL_STUDIES = 2000
# Twelve groups and eight `expect:` entries (Holm's family: nine hypotheses, the equivalence margins
# included), one per case the runner meets. In SDs of a group's spread past each length's threshold.
NULL_GROUPS = [Group(-1.5), Group(-1.5),  # 0, 1: equal, 1.5 SD below the threshold: neither learned, mostly
               Group(0.0), Group(0.0),  # 2, 3: equal, at the threshold: the gates undetermined
               Group(0.6), Group(0.6),  # 4, 5: equal, above it
               Group(0.6 + MARGIN / SD),  # 6: a true difference of exactly the margin over group 5
               Group(0.6, noise=3.0),  # 7: equal to group 4, three times as noisy (heteroscedastic)
               Group(4.0, counted=True), Group(4.0, counted=True),  # 8, 9: near 1, counted on 64 strings: ties, ceilings
               Group(2.0, fails=0.2), Group(2.0, fails=0.2)]  # 10, 11: a run in five fails: pairs break, Welch
NULL_ENTRIES = [Entry(0, 1), Entry(2, 3), Entry(4, 5, margin=MARGIN), Entry(6, 5, margin=MARGIN, true_difference=MARGIN),
                Entry(7, 4), Entry(8, 9), Entry(10, 11), Entry(4, 5, metric="accuracy@12")]


def false_decision(v, entry: Entry) -> bool:
    if entry.true_difference:  # a true difference at the margin: "equivalent" is false, so is the wrong direction
        return v.outcome in ("equivalent", "does not hold")
    return v.outcome in ("holds", "does not hold")


def test_two_thousand_null_studies_through_the_runners_loop_decide_at_most_at_the_stated_rate():
    """2,000 adaptive studies (looks at 3, 4, 6, 8 seeds) of the eight entries above. Per entry at
    most 2.5% false decisions in each direction and 5% in all; any false decision in a study at most
    5% (plus three Monte Carlo standard errors). One test, so that the studies are simulated once."""
    study = simulated_study_file(NULL_GROUPS, NULL_ENTRIES, most=8)
    limits = thresholds(study)
    rng = np.random.default_rng(2026)
    studies = [simulated_study(rng, study, NULL_GROUPS, limits) for _ in range(NULL_STUDIES)]
    n = len(studies)
    print(f"\n{n} null studies: false decisions per entry "
          + ", ".join(f"{k}: {np.mean([false_decision(s[k], e) for s in studies]):.2%}" for k, e in enumerate(NULL_ENTRIES))
          + f"; any in a study {np.mean([any(false_decision(v, e) for v, e in zip(s, NULL_ENTRIES)) for s in studies]):.2%}")
    for k, entry in enumerate(NULL_ENTRIES):
        outcomes = [s[k].outcome for s in studies]
        if entry.true_difference:
            assert rate(outcomes, "equivalent") <= 0.05 + mc_error(0.05, n), k
            assert rate(outcomes, "does not hold") <= 0.025 + mc_error(0.025, n), k
            continue
        assert rate(outcomes, "holds") <= 0.025 + mc_error(0.025, n), k
        assert rate(outcomes, "does not hold") <= 0.025 + mc_error(0.025, n), k
    assert rate([any(false_decision(v, e) for v, e in zip(s, NULL_ENTRIES)) for s in studies], True) <= \
        0.05 + mc_error(0.05, n)
    # the gates qualify, never decide and never end the test: "only A learned" only beside a decided
    # difference; below the threshold a verdict that shows neither group learned does not test the claim,
    # whatever its outcome; there futility stops the equal groups mostly at 4 seeds (looks 3, 4, 6, 8), before
    # their gates could show it
    assert all(v.outcome.decides for s in studies for v in s if v.only)
    below = [s[0] for s in studies]
    assert rate([v.neither != "" for v in below], True) > 0.02 and not any(v.tests_claim for v in below if v.neither)
    assert np.mean([v.seeds for v in below]) < 5.5  # 4.5 measured (seed 2026): 8 seeds without futility
    assert not any(v.outcome == "not tested" for s in studies for v in s)
    # equal groups with a margin of two SDs are found equivalent, mostly (the correct decision there)
    assert rate([s[2].outcome for s in studies], "equivalent") > 0.5
    # dropped seeds switch the paired test to Welch's; ties and ceilings still reach a verdict
    assert any(s[6].diff.method == "Welch" for s in studies) and any(s[6].diff.method == "paired" for s in studies)


def seeds_to_decide(studies) -> tuple[float, float, float]:
    """(share of studies whose first entry held, the median and the mean seeds per group it took; a
    study that did not decide counts as the maximum for the mean, as inf for the median)."""
    held = [s[0].outcome == "holds" for s in studies]
    seeds = [s[0].seeds for s in studies]
    return (float(np.mean(held)), float(np.median([n if h else math.inf for n, h in zip(seeds, held)])),
            float(np.mean(seeds)))


def test_a_true_difference_is_found_with_80_percent_power_and_plain_ones_sooner_than_before():
    """150 studies of two entries (a true difference of 1, 2 or 4 SDs of the per-seed paired
    differences, and a null), looks up to 20 seeds. Today's rule finds one SD with at least 80% power;
    the seeds it takes, today's rule beside the earlier one on the same draws, are printed (and are in
    docs/verdicts.md). A difference that every seed shows ends sooner than under the earlier rule."""
    found, null_seeds = {}, {}
    for effect in (1, 2, 4):
        groups = [Group(2.0 + effect * DIFF_SD / SD), Group(2.0), Group(2.0)]
        study = simulated_study_file(groups, [Entry(0, 1, true_difference=effect * DIFF_SD), Entry(1, 2)])
        limits = thresholds(study)
        for rule in (LOOKS, WITHOUT_FUTILITY, EARLIER_LOOKS):
            rng = np.random.default_rng(7)  # the same draws for every rule
            studies = [simulated_study(rng, study, groups, limits, rule) for _ in range(150)]
            found[effect, rule] = seeds_to_decide(studies)
            null_seeds[effect, rule] = float(np.mean([s[1].seeds for s in studies]))  # the second entry: no difference
    assert found[1, LOOKS][0] >= 0.80
    assert found[4, LOOKS][2] < found[4, EARLIER_LOOKS][2]
    # futility: a comparison with no difference stops long before the maximum, at little cost in power
    assert all(null_seeds[e, LOOKS] < 0.5 * null_seeds[e, WITHOUT_FUTILITY] for e in (1, 2, 4))
    assert found[1, LOOKS][0] >= found[1, WITHOUT_FUTILITY][0] - 0.1
    print("\n" + "; ".join(
        f"{effect} SD: power {found[effect, LOOKS][0]:.0%} (without futility {found[effect, WITHOUT_FUTILITY][0]:.0%}, "
        f"earlier rule {found[effect, EARLIER_LOOKS][0]:.0%}), median seeds {found[effect, LOOKS][1]:g} "
        f"({found[effect, WITHOUT_FUTILITY][1]:g}, {found[effect, EARLIER_LOOKS][1]:g}), mean "
        f"{found[effect, LOOKS][2]:.1f} ({found[effect, WITHOUT_FUTILITY][2]:.1f}, {found[effect, EARLIER_LOOKS][2]:.1f})"
        for effect in (1, 2, 4))
        + "; the null entry beside it: mean seeds " + ", ".join(
            f"{null_seeds[e, LOOKS]:.1f} ({null_seeds[e, WITHOUT_FUTILITY]:.1f}, {null_seeds[e, EARLIER_LOOKS]:.1f})"
            for e in (1, 2, 4)))


def test_futility_keeps_an_equivalence_within_reach_and_stops_one_out_of_it():
    """150 studies of two equivalence entries with no true difference, looks up to 20 seeds: a margin of
    two SDs of the per-seed differences (within reach: found by about 7 seeds) and one of a third of an SD
    (out of reach: over a hundred seeds would be needed for 80% power). With futility the first is found about as often,
    and the second stops long before the maximum; printed beside the rule without it, on the same draws."""
    groups = [Group(2.0), Group(2.0), Group(2.0), Group(2.0)]
    study = simulated_study_file(groups, [Entry(0, 1, margin=MARGIN), Entry(2, 3, margin=DIFF_SD / 3)])
    limits = thresholds(study)
    found = {}
    for rule in (LOOKS, WITHOUT_FUTILITY):
        rng = np.random.default_rng(11)
        studies = [simulated_study(rng, study, groups, limits, rule) for _ in range(150)]
        found[rule] = [(rate([s[k].outcome for s in studies], "equivalent"), float(np.mean([s[k].seeds for s in studies])))
                       for k in (0, 1)]
    print(f"\nwithin reach: equivalent {found[LOOKS][0][0]:.0%} ({found[WITHOUT_FUTILITY][0][0]:.0%} without futility), "
          f"mean seeds {found[LOOKS][0][1]:.1f} ({found[WITHOUT_FUTILITY][0][1]:.1f}); out of reach: equivalent "
          f"{found[LOOKS][1][0]:.0%} ({found[WITHOUT_FUTILITY][1][0]:.0%}), mean seeds {found[LOOKS][1][1]:.1f} "
          f"({found[WITHOUT_FUTILITY][1][1]:.1f})")
    assert found[LOOKS][0][0] >= found[WITHOUT_FUTILITY][0][0] - 0.05
    assert found[LOOKS][1][1] < 0.5 * found[WITHOUT_FUTILITY][1][1]


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
    """Futility: at 4 seeds a difference of 3.75 tokens/s beside a spread of the paired differences of
    about 13 would be found at 12 seeds with far under 5% power, so its groups get no more seeds; at 3
    seeds (2 df) the spread is not read yet; with a margin of 30 its equivalence could still be shown,
    so it grows, with one of 0.5 it could not; under the rule without futility it grows; a plain
    difference grows."""
    import yaml

    from workbench.recipes.train.gates import Gates
    from workbench.recipes.train.runs import TrainRuns
    from workbench.recipes.train.sequential import sequential_verdicts
    from workbench.recipes.train.study import TrainStudy
    from workbench.recipes.train.verdicts import Verdicts, seeds_wanted

    def study(entry: str):
        return TrainStudy.model_validate(yaml.safe_load(FUTILE.replace("ENTRY", entry)))

    def runs(none: list[float], rope: list[float]) -> pd.DataFrame:
        return pd.DataFrame([{"run_id": f"{p}{s}", "index": i, "seed": s, "model.position": p, "status": "finished",
                              "tokens_per_s": v} for i, (p, s, v) in enumerate(
                                  [("none", s, v) for s, v in enumerate(none)] + [("rope", s, v) for s, v in enumerate(rope)])])

    plain = study("{metric: tokens_per_s, better: none, than: rope}")
    margin = study("{metric: tokens_per_s, better: none, than: rope, margin: 30}")
    narrow = study("{metric: tokens_per_s, better: none, than: rope, margin: 0.5}")
    near = runs([1000, 1400, 900, 1300], [1010, 1390, 905, 1280])  # differences -10, +10, -5, +20
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
    assert "; no more seeds after 4: 12 seeds would find the observed difference 3.75 with" in verdict.reason
