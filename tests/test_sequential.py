"""Adaptive seeds (`seeds: {first, max}`): the looks, the alpha each spends, and a simulation
of 2,000 studies per case showing the error rate and power of the whole procedure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from workbench.report.stats import Comparison, look_alphas, seed_looks, sequential_verdicts, spent

LOOKS = seed_looks(3, 20)
STUDIES = 2000


def test_looks_double_the_seeds_up_to_the_maximum_and_spend_exactly_alpha():
    assert LOOKS == [3, 6, 12, 20] and seed_looks(2, 5) == [2, 4, 5]
    alphas = look_alphas(LOOKS)
    assert sum(alphas) == pytest.approx(0.05) and all(a >= 0 for a in alphas)
    # O'Brien-Fleming-type: almost nothing is spent early, most at the end
    assert alphas[0] < 1e-5 and alphas[-1] > 0.03
    assert spent(1.0) == pytest.approx(0.05) and spent(0.5) == pytest.approx(2 - 2 * stats.norm.cdf(1.96 / 0.5 ** 0.5), rel=1e-3)


def simulate(effect: float, rng: np.random.Generator) -> np.ndarray:
    """Per study: 1 'holds', -1 'does not hold', 0 undecided, from per-seed differences (SD 1)
    tested at each look at that look's alpha, stopping at the first decision: the procedure
    the runner and the report follow, as a reference computed for all studies at once."""
    diffs = rng.normal(effect, 1.0, (STUDIES, LOOKS[-1]))
    outcome = np.zeros(STUDIES, dtype=int)
    for n, alpha in zip(LOOKS, look_alphas(LOOKS)):
        p = stats.ttest_1samp(diffs[:, :n], 0.0, axis=1).pvalue
        decided = (outcome == 0) & (p <= alpha)
        outcome[decided] = np.sign(diffs[decided, :n].mean(1))
    return outcome, diffs


def report_outcome(diffs: np.ndarray) -> int:
    """The same study decided by the report's code (paired groups over seeds)."""
    seeds = np.arange(len(diffs))
    better, than = pd.Series(diffs, index=seeds), pd.Series(np.zeros(len(diffs)), index=seeds)
    verdict = sequential_verdicts([Comparison("accuracy@8", "A", "B", better, than, higher=True,
                                              seeds_run=len(diffs))], LOOKS)[0]
    return {"holds": 1, "does not hold": -1, "inconclusive": 0}[verdict.outcome]


@pytest.mark.parametrize("effect, check", [
    (0.0, lambda holds: holds <= 0.05 + 3 * (0.05 * 0.95 / STUDIES) ** 0.5),  # false "holds" at most 5% (+ MC error)
    (1.0, lambda holds: holds >= 0.80),  # one SD of the per-seed differences: 80% power within 20 seeds
])
def test_two_thousand_simulated_studies_keep_the_error_rate_and_reach_the_power(effect, check):
    outcome, diffs = simulate(effect, np.random.default_rng(2026))
    holds = float((outcome == 1).mean())
    assert check(holds), holds
    # the report's sequential verdicts decide these studies exactly as the reference does
    assert [report_outcome(d) for d in diffs[:60]] == outcome[:60].tolist()


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
  - {metric: accuracy@6, better: alibi, than: rope}
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
    # alibi vs rope on accuracy was decided by the gate (2 steps learn nothing: not tested): alibi keeps 2
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
