"""The learned-at-all gate: every task's chance levels (closed forms, checked against the
task's own generator) and a study trained for 3 steps, whose verdicts say that neither group learned, in
every file a user reads."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import installed_plugin
from workbench.registry import variants
from workbench.report.document import fmt
from workbench.api import write_report
from workbench.report.index import build_index
from workbench.api import run_study
from workbench.tasks import Task

TASKS = variants("task")


def make(name: str, seed: int = 0, **params):
    cls = TASKS[name]
    return cls(cls.Params(**params), seed=seed)


@pytest.mark.parametrize("name, family, eos", [("copy", "decoder", 1), ("copy", "encoder_decoder", 1),
                                               ("reverse", "decoder", 1), ("reverse", "encoder", 0)])
def test_copy_and_reverse_chance_is_uniform_over_the_alphabet(name, family, eos):
    a, n = 10, 12
    chance = make(name, train_length=n, alphabet_size=a).chance(family, n)
    assert chance["accuracy"] == pytest.approx((n / a + eos) / (n + eos))  # <eos> is always right
    assert chance["loss"] == pytest.approx(n * math.log(a) / (n + eos))
    assert chance["exact_match"] == pytest.approx(a ** -n)


@pytest.mark.parametrize("name", ["reverse", "sort"])
def test_symbol_accuracy_chance_leaves_out_the_eos_in_every_family(name):
    task = make(name, train_length=12, alphabet_size=10)
    encoder, decoder, both = (task.chance(f, 12) for f in ("encoder", "decoder", "encoder_decoder"))
    assert encoder["symbol_accuracy"] == pytest.approx(encoder["accuracy"])  # no <eos> in encoder labels
    assert decoder["symbol_accuracy"] == pytest.approx(both["symbol_accuracy"]) == pytest.approx(encoder["symbol_accuracy"])
    assert decoder["symbol_accuracy"] == pytest.approx((13 * decoder["accuracy"] - 1) / 12)
    if name == "reverse":
        assert decoder["symbol_accuracy"] == pytest.approx(0.1)


@pytest.mark.parametrize("family", ["decoder", "encoder_decoder", "encoder"])
def test_symbol_accuracy_scores_the_answer_symbols_only(family):
    """A model that gets every symbol wrong and every <eos> right: accuracy counts the <eos>,
    symbol_accuracy does not."""
    task = make("reverse", train_length=6, alphabet_size=10, n_eval=16)
    batch = task.eval_batches(6, 16, family)[0]
    targets, mask = task.scored_ids(batch, family)
    shifted = task.first_symbol + (targets - task.first_symbol + 1) % 10  # the next symbol: always wrong
    wrong_symbols = torch.where(targets == task.eos_id, targets, shifted)
    logits = torch.nn.functional.one_hot(wrong_symbols.clamp(min=0), len(task.vocab)).float()
    assert not ((wrong_symbols == targets) & mask & (targets != task.eos_id)).any()

    class Fixed(torch.nn.Module):  # returns the prepared logits, whatever the batch
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))

    task.scored = lambda model, b, fam: (logits, targets, mask)
    scores = task.evaluate(Fixed(), [batch], family)
    eos = int(((targets == task.eos_id) & mask).sum())
    assert scores["symbol_accuracy"] == 0.0
    assert scores["accuracy"] == pytest.approx(eos / int(mask.sum()))
    assert (eos > 0) == (family != "encoder")


def test_sort_chance_is_the_order_statistics_of_uniform_draws():
    a, n = 3, 4  # every string enumerated: the blind predictor's scores by brute force
    sorted_rows = [sorted(s) for s in itertools.product(range(a), repeat=n)]
    by_position = [Counter(row[k] for row in sorted_rows) for k in range(n)]
    accuracy = sum(max(c.values()) for c in by_position) / len(sorted_rows)
    loss = sum(-sum(v / a**n * math.log(v / a**n) for v in c.values()) for c in by_position)
    exact = max(Counter(map(tuple, sorted_rows)).values()) / a**n
    chance = make("sort", train_length=n, alphabet_size=a).chance("decoder", n)
    assert chance["accuracy"] == pytest.approx((accuracy + 1) / (n + 1))
    assert chance["loss"] == pytest.approx(loss / (n + 1))
    assert chance["exact_match"] == pytest.approx(exact)
    encoder = make("sort", train_length=n, alphabet_size=a).chance("encoder", n)
    assert encoder["accuracy"] == pytest.approx(accuracy / n)
    # At the default size the first sorted symbol is predictable without reading the input.
    assert make("sort", train_length=12, alphabet_size=10).chance("encoder", 12)["accuracy"] > 0.3


@pytest.mark.parametrize("family, eos", [("decoder", 0), ("encoder", 0), ("encoder_decoder", 1)])
def test_recall_chance_is_one_of_the_rows_values(family, eos):
    pairs = 4
    chance = make("recall", train_length=pairs, n_keys=16, n_values=16).chance(family, pairs)
    assert chance["accuracy"] == pytest.approx((1 + eos) / (pairs + eos))
    assert chance["loss"] == pytest.approx(pairs * math.log(pairs) / (pairs + eos))
    assert chance["exact_match"] == pytest.approx(1 / math.factorial(pairs))
    two = make("recall", train_length=pairs, n_queries=2).chance(family, pairs)
    assert two["exact_match"] == pytest.approx(1 / (pairs * (pairs - 1)))


@pytest.mark.parametrize("family", ["encoder", "decoder"])
def test_classify_chance_is_the_majority_class(family):
    task = make("classify", n_eval=300)
    labels = Counter(ex.target[0] for ex in task.eval_examples(48))
    chance = task.chance(family, 48)
    assert chance["accuracy"] == pytest.approx(max(labels.values()) / 300)
    shares = np.array(list(labels.values())) / 300
    assert chance["loss"] == pytest.approx(float(-(shares * np.log(shares)).sum()))


def test_text_lm_chance_is_a_unigram_model_of_the_training_text(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"ab" * 450 + b"b" * 100)  # training text: 450 a, 450 b; validation: b only
    task = make("text_lm", path=str(corpus), train_length=8, n_eval=4, decode_samples=0)
    p_b = (450 + 1) / (900 + 256)  # add-one smoothing over the 256 bytes
    chance = task.chance("decoder", 8)
    assert chance["loss"] == pytest.approx(-math.log(p_b))
    assert chance["bpc"] == pytest.approx(-math.log2(p_b))
    assert chance["perplexity"] == pytest.approx(1 / p_b)


@pytest.mark.parametrize("name", ["copy", "reverse", "sort"])
def test_closed_forms_agree_with_counting_the_generated_held_out_set(name):
    """The closed forms describe what the generator really draws: the generic estimate
    (Task.chance counts the held-out set) lands on them. (Not recall: its chance predictor
    knows the row's values, which counting answers over all rows cannot see.)"""
    task = make(name, n_eval=4000, train_length=5, alphabet_size=4)
    n = 5
    closed, counted = task.chance("decoder", n), Task.chance(task, "decoder", n)
    assert counted["accuracy"] == pytest.approx(closed["accuracy"], abs=0.02)
    assert counted["loss"] == pytest.approx(closed["loss"], abs=0.02)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_derives_baselines_inside_its_metric_ranges(name):
    shrink = {"text_lm": {"train_length": 24}, "translate": {"train_length": 8},
              "classify": {"train_length": 24}, "recall": {"train_length": 4}}
    task = make(name, **({"n_eval": 16} | shrink.get(name, {"train_length": 6})))
    for family in task.families:
        baselines = task.baselines(family, task.params.train_length)
        assert baselines["input-ignoring"] == task.chance(family, task.params.train_length)  # the counted default
        for scores in baselines.values():
            assert "loss" in scores and set(scores) <= {*task.metrics, "loss"}
            for metric, value in scores.items():
                lo, hi = task.metric(metric).range
                assert lo <= value <= hi, (family, metric, value)


STUDY = """\
name: three-steps
description: Does a position signal help a decoder copy?
task: {name: copy, train_length: 6, eval_lengths: [6, 9], n_eval: 32, alphabet_size: 6}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2, position: rope}
train: {steps: 3, batch_size: 4, lr: 1.0e-3, warmup_steps: 0, eval_every: 3, log_every: 1}
seeds: [0, 1]
sweep:
  model.position: [none, rope]
expect:
  - {metric: accuracy@9, better: rope, than: none}
  - {metric: tokens_per_s, better: none, than: rope}
"""


def test_a_study_trained_for_3_steps_says_neither_group_learned(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        studies = tmp_path / "studies"
        studies.mkdir()
        (studies / "three-steps.yaml").write_text(STUDY)
        run_study(studies / "three-steps.yaml", tmp_path / "out", quiet=True)
    finally:
        torch.set_num_threads(threads)
    reports = tmp_path / "reports"
    index = write_report(tmp_path / "out", reports, pictures=False)
    folder = index.parent

    summary = json.loads((folder / "summary.json").read_text())
    quality, cost = summary["verdicts"]
    # three steps change nothing the two schemes compute differently: the test ends as identical, and says that
    # neither group learned, so the verdict does not test the claim
    assert quality["outcome"] == "identical" and quality["tests_claim"] is False
    # names the groups that did not learn and their scores against the strongest baseline
    task = variants("task")["copy"](variants("task")["copy"].Params(train_length=6, alphabet_size=6), seed=0)
    baselines = task.baselines("decoder", 6)
    chance = baselines["order-blind"]["accuracy"]  # knowing the symbols, not their order, beats 1/6 per symbol
    assert chance > baselines["input-ignoring"]["accuracy"] == pytest.approx((6 / 6 + 1) / 7)
    # gated at the training length (6) and at the compared length (9)
    assert {(g["group"], g["metric"]) for g in quality["learned"]} == {
        (group, f"accuracy@{n}") for group in ("position=rope", "position=none") for n in (6, 9)}
    gates = {g["group"]: g for g in quality["learned"] if g["metric"] == "accuracy@6"}
    assert all(g["chance"] == pytest.approx(chance) and g["baseline"] == "order-blind" for g in gates.values())
    assert not any(g["learned"] for g in gates.values())
    assert quality["label"].startswith("identical (both groups gave the same accuracy@9 on every seed; "
                                       "neither group learned: ")
    assert "position=none: accuracy@6 " in quality["label"] and f"vs order-blind {fmt(chance)}" in quality["label"]
    assert cost["tests_claim"] and cost["learned"] == []  # cost needs no gate

    # The header states the criterion with the same numbers, and names who missed it with its score.
    assert all(gates[group]["state"] == "did not learn" for group in ("position=none", "position=rope"))
    scores = "; ".join(f"{g} ({fmt(gates[g]['score'])})" for g in ("position=none", "position=rope"))  # sweep order
    header = (f"Learned (accuracy@6 ≥ {fmt(gates['position=rope']['needed'])}, 10% of the way from order-blind {fmt(chance)} "
              f"to 1; learned when the 95% interval of the mean lies past it): 0 of 2 groups learned; "
              f"did not learn: {scores}")
    assert summary["learned_criterion"] == [header]
    # above it, that 2 seeds decide no entry (a verdict needs 4 per group)
    notice, shown = (folder / "report.md").read_text().split("\n\n")[2:4]
    assert notice.startswith("**Every group runs 2 seeds, and a verdict needs 4 per group") and shown == header
    assert summary["notices"] == [notice.strip("*")]
    assert f'<p class="learned">{header}</p>' in (folder / "index.html").read_text()
    assert "; neither group learned: position=rope: accuracy@6" in (folder / "report.md").read_text()
    html = (folder / "index.html").read_text()
    assert 'class="outcome identical">identical (both groups gave the same accuracy@9 on every seed; neither' in html
    assert "Learned at the training length" in html
    assert "; neither group learned: position=rope: accuracy@6" in build_index(studies, reports)
    # seeds that only missed the gate are counted as not learned, apart from diverged ones
    md = (folder / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| position=rope | accuracy@6"))
    assert row.rstrip().endswith("| 2/2 = 1 \\[0.158, 1\\]: 2 did not learn |")  # finished, none diverged


# ---- baselines beyond chance: predictors that read the answer's prefix or the input's symbols ----


def test_order_blind_and_sorted_prefix_baselines_match_the_audited_numbers():
    # A = 10, n = 12, decoder (the <eos> counts, always right): the audit's Monte Carlo numbers
    reverse = make("reverse", train_length=12, alphabet_size=10).baselines("decoder", 12)
    assert reverse["order-blind"]["accuracy"] == pytest.approx(0.443, abs=0.003)
    assert reverse["prefix-aware"]["accuracy"] == pytest.approx(reverse["input-ignoring"]["accuracy"], abs=0.003)
    sort = make("sort", train_length=12, alphabet_size=10).baselines("decoder", 12)
    assert sort["prefix-aware"]["accuracy"] == pytest.approx(0.579, abs=0.003)
    assert "order-blind" not in sort  # knowing the symbols solves sort: not a baseline
    assert set(make("sort", train_length=12, alphabet_size=10).baselines("encoder", 12)) == {"input-ignoring"}
    # fixed seed and cache: the same number in every report
    assert make("reverse", seed=5, train_length=12, alphabet_size=10).baselines("decoder", 12) == reverse


def bayes_accuracy(task, family_eos: int, information) -> float:
    """Exact accuracy of the best predictor that sees `information(source, answer, k)` at each
    answer position k, by enumerating every string (small alphabets and lengths only)."""
    a, n = task.params.alphabet_size, task.params.train_length
    counts: dict[tuple, Counter] = {}
    strings = [list(s) for s in itertools.product(range(a), repeat=n)]
    for s in strings:
        answer = task.transform(s)
        for k in range(n):
            counts.setdefault((k, information(s, answer, k)), Counter())[answer[k]] += 1
    right = sum(max(c.values()) for c in counts.values())
    return (right + len(strings) * family_eos) / (len(strings) * (n + family_eos))


@pytest.mark.parametrize("name, baseline, information", [
    ("sort", "prefix-aware", lambda s, answer, k: tuple(answer[:k])),
    ("reverse", "order-blind", lambda s, answer, k: (tuple(sorted(s)), tuple(answer[:k]))),
    ("copy", "order-blind", lambda s, answer, k: (tuple(sorted(s)), tuple(answer[:k]))),
])
def test_baselines_are_the_best_predictor_with_that_information(name, baseline, information):
    """Against exhaustive enumeration: the Monte Carlo baseline is the Bayes-optimal predictor
    that sees only the answer's prefix (sort) or the input's multiset and the prefix (copy, reverse)."""
    task = make(name, train_length=4, alphabet_size=3)
    exact = bayes_accuracy(task, 1, information)
    assert task.baselines("decoder", 4)[baseline]["accuracy"] == pytest.approx(exact, abs=0.004)


@pytest.mark.parametrize("n", [4, 5])
def test_difference_baselines_are_the_best_predictors_with_that_information(n):
    """Against exhaustive enumeration of every string: input-ignoring is uniform per label, and
    its whole-row chance one over the map's image (A^n rows for even n, A^(n-1) for odd n);
    side-blind is the Bayes-optimal predictor that knows its position and each symbol's
    unordered pair of neighbours (a missing one 0: an end symbol's one neighbour is known)."""
    a = 4
    task = make("difference", train_length=n, alphabet_size=a)
    rows = Counter()
    per_position: dict[tuple, Counter] = {}
    for s in itertools.product(range(a), repeat=n):
        labels = tuple(t - task.first_symbol for t in task.transform([v + task.first_symbol for v in s]))
        rows[labels] += 1
        padded = (0, *s, 0)
        for k in range(n):
            per_position.setdefault((k, tuple(sorted((padded[k], padded[k + 2])))), Counter())[labels[k]] += 1
    chance = task.chance("encoder", n)
    assert chance["accuracy"] == pytest.approx(1 / a)
    assert chance["exact_match"] == pytest.approx(max(rows.values()) / a**n)
    assert len(rows) == a ** (n - n % 2)
    side_blind = task.baselines("encoder", n)["side-blind"]
    exact = sum(max(c.values()) for c in per_position.values()) / (a**n * n)
    assert side_blind["accuracy"] == pytest.approx(exact, abs=0.004)
    assert side_blind["symbol_accuracy"] == side_blind["accuracy"]  # an encoder scores no <eos>
    assert make("difference", train_length=12, alphabet_size=10).baselines("encoder", 12)["side-blind"]["accuracy"] \
        == pytest.approx((2 + 10 * 0.6) / 12, abs=0.003)  # inside: sure when equal or 5 apart, else one of two


class HintedCopy(TASKS["copy"]):
    """A third-party task that declares one more baseline through the task interface."""

    name = "hinted_copy"

    def baselines(self, family, length):
        return {**super().baselines(family, length), "hinted": {"accuracy": 0.95, "loss": 0.1}}


def test_a_third_party_task_declares_baselines_and_the_gate_uses_the_strongest():
    from workbench.recipes.train.gates import Gates
    from workbench.recipes.train.runs import TrainRuns
    from workbench.recipes.train.verdicts import Verdicts
    from workbench.recipes.train.study import TrainStudy

    with installed_plugin("hinted_copy_plugin", register_tasks=[HintedCopy]):
        study = TrainStudy.model_validate({
            "name": "hinted", "task": {"name": "hinted_copy", "train_length": 6, "alphabet_size": 6},
            "train": {"steps": 1}, "seeds": [0, 1, 2, 3], "sweep": {"model.position": ["none", "rope"]},
            "expect": [{"metric": "accuracy@6", "better": "rope", "than": "none"}]})
        runs = pd.DataFrame([{"run_id": f"{p}{s}", "index": i, "seed": s, "model.position": p, "status": "finished",
                              "accuracy@6": acc, "loss@6": 0.5}
                             for i, (p, s, acc) in enumerate([("none", 0, 0.9), ("none", 1, 0.9), ("none", 2, 0.91),
                                                              ("none", 3, 0.905), ("rope", 0, 0.997),
                                                              ("rope", 1, 0.998), ("rope", 2, 0.999),
                                                              ("rope", 3, 0.998)])])
        train_runs = TrainRuns(study, runs)
        gates = Gates(train_runs)
        gate = gates.learned("position=rope", "accuracy")
        assert (gate.baseline, gate.chance) == ("hinted", pytest.approx(0.95))
        assert dict(gate.baselines)["order-blind"] < 0.95 and gate.learned
        assert not gates.learned("position=none", "accuracy").learned  # 0.9: above order-blind, below the hint
        (v, _), = Verdicts(train_runs, gates).decided
        assert v.label == "holds (only position=rope learned)"
