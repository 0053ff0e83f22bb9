"""The text task's gate baseline: a 2-gram fitted on the training text the run read, found from
the tokens it recorded, and fitted once per seed for the whole study."""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import run_within_cpu

from workbench.recipes.train.gates import Gates
from workbench.recipes.train.runs import TrainRuns
from workbench.api import write_report
from workbench.api import run_study
from workbench.run.store import load_results
from workbench.recipes.train.study import TrainStudy
from workbench.tasks import METRICS, Consumed
from workbench.tasks.ngram import WittenBell, covering
from workbench_plugins.task_text_lm import SEEN_BIGRAM, TextLM, TextParams

WORDS = "the cat sat on a mat while one dog ran far away from every red car".split()


@pytest.fixture
def corpus(tmp_path):
    """About 27,000 bytes of words with local structure: 16-byte windows cover it only after many steps."""
    rng = np.random.default_rng(1)
    path = tmp_path / "prose.txt"
    path.write_text("\n".join(" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 12)) + "." for _ in range(500)))
    return path


def text(corpus, seed=0, **params) -> TextLM:
    return TextLM(TextParams(**{"path": str(corpus), "train_length": 16, "n_eval": 16, "decode_samples": 0,
                                **params}), seed=seed)


def test_the_windows_a_run_read_are_the_ones_its_batches_hold(corpus):
    task = text(corpus, seed=5)
    consumed = Consumed(batch_size=4, tokens=(3 * 4 + 2) * 16)  # 3 whole steps and a budget's 2 sequences
    starts = task.consumed_starts(consumed)
    batches = torch.cat([task.train_batch(i, 4, "decoder")["tokens"] for i in range(4)])[:14]
    windows = np.stack([np.asarray(task.train_text[s: s + 16]).astype(np.int64) + task.first_token for s in starts])
    assert len(starts) == 14 and np.array_equal(windows, batches.numpy())
    assert not np.array_equal(text(corpus, seed=6).consumed_starts(consumed), starts)  # each seed its own stream


def test_the_seen_bigram_knows_only_what_the_run_read(corpus):
    task = text(corpus)
    whole = task.baselines("decoder", 16)
    assert SEEN_BIGRAM not in whole and TextLM.gate_baselines == (SEEN_BIGRAM,)
    split = len(task.train_text)
    few, all_of_it = Consumed(4, 20 * 4 * 16), Consumed(4, 50_000 * 4 * 16)
    assert covering(task.consumed_starts(few), 16).stops.max() > split / 2  # spread over the split, not its head
    seen_few = task.seen_baselines("decoder", 16, few)[SEEN_BIGRAM]
    seen_all = task.seen_baselines("decoder", 16, all_of_it)[SEEN_BIGRAM]
    spans = covering(task.consumed_starts(all_of_it), 16)
    assert (spans.stops - spans.starts).sum() == split  # 138 passes: every position read, the ends too
    # a run that read every position gets the whole split's 2-gram (its repeats count once)
    assert seen_all["bpc"] == pytest.approx(whole["2-gram"]["bpc"])
    # one that read a fraction gets a weaker table: more bits to beat
    assert seen_few["bpc"] > whole["2-gram"]["bpc"] + 0.05


def study_file(corpus, **train) -> dict:
    return {
        "name": "seen", "task": {"name": "text_lm", "path": str(corpus), "train_length": 16, "n_eval": 16,
                                 "decode_samples": 0},
        "model": {"family": "decoder", "d_model": 16, "n_layers": 1, "n_heads": 2},
        "train": {"batch_size": 4, **train}, "seeds": [0, 1], "sweep": {"model.position": ["none", "rope"]},
        "expect": [{"metric": "bpc@16", "better": "rope", "than": "none"}]}


def study(corpus, **train) -> TrainStudy:
    return TrainStudy.model_validate(study_file(corpus, **train))


def test_each_group_is_gated_on_the_text_its_own_runs_read_fitted_once_per_seed(corpus, monkeypatch):
    fits, original = [], TextLM.fit_seen

    def counted(self, length, consumed):
        fits.append((self.seed, consumed.tokens))
        return original(self, length, consumed)
    monkeypatch.setattr(TextLM, "fit_seen", counted)
    tokens = {"none": 30 * 4 * 16, "rope": 60 * 4 * 16}  # e.g. a FLOP budget buys more steps of a cheaper model
    runs = pd.DataFrame([{"run_id": f"{p}{s}", "index": i, "seed": s, "model.position": p, "status": "finished",
                          "bpc@16": 3.0, "loss@16": 2.0, "train_tokens": tokens[p]}
                         for i, (p, s) in enumerate([("none", 0), ("none", 1), ("rope", 0), ("rope", 1)])])
    gates = Gates(TrainRuns(study(corpus, steps=60), runs))
    none, rope = gates.learned("position=none", "bpc"), gates.learned("position=rope", "bpc")
    for gate, group in ((none, "none"), (rope, "rope")):
        levels = [text(corpus, seed).seen_baselines("decoder", 16, Consumed(4, tokens[group]))[SEEN_BIGRAM]["bpc"]
                  for seed in (0, 1)]
        assert gate.baseline == SEEN_BIGRAM and gate.chance == pytest.approx(np.mean(levels))
        assert {"input-ignoring", "2-gram", "3-gram", "4-gram", SEEN_BIGRAM} == set(dict(gate.baselines))
    assert none.chance > rope.chance > dict(rope.baselines)["2-gram"]  # read less: an easier bar
    assert sorted(fits) == sorted((seed, t) for seed in (0, 1) for t in tokens.values())  # per seed and count
    Gates(TrainRuns(study(corpus, steps=60), runs)).learned("position=rope", "bpc")  # a report built again
    assert len(fits) == 4  # read back, not fitted again
    unrecorded = Gates(TrainRuns(study(corpus, steps=60), runs.drop(columns="train_tokens")))
    assert unrecorded.learned("position=rope", "bpc").text == "position=rope: no chance level of bpc@16"


def test_a_budgeted_study_is_gated_on_the_tokens_its_runs_recorded(corpus, tmp_path, monkeypatch):
    import workbench.recipes.train.report.figures as train_figures

    drawn, draw = [], train_figures.verdict_groups
    monkeypatch.setattr(train_figures, "verdict_groups", lambda *a, **kw: drawn.append(kw) or draw(*a, **kw))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # 3 steps of 4 windows of 16 tokens, then the 2 sequences the last 24 tokens pay for (rounded)
        (tmp_path / "seen.yaml").write_text(json.dumps(study_file(corpus, budget={"tokens": 3 * 64 + 24})))
        run_study(tmp_path / "seen.yaml", tmp_path / "out", quiet=True)
    finally:
        torch.set_num_threads(threads)
    folder = write_report(tmp_path / "out", tmp_path / "reports", pictures=False).parent
    summary = json.loads((folder / "summary.json").read_text())
    assert set(load_results(tmp_path / "out")["train_tokens"]) == {14 * 16}
    # the report says what bpc is, from its declaration, and describes the n-gram baselines and which gates
    md = (folder / "report.md").read_text().replace("\\", "")
    assert f"Metrics: bpc: {METRICS['bpc'].description}" in md and "bits per byte" in METRICS["bpc"].description
    baselines = next(p for p in md.split("\n\n") if p.startswith("Baselines:"))
    assert TextLM.baselines_text in baselines and "prefix-aware" not in baselines and "order-blind" not in baselines
    assert f"The learned gate reads {SEEN_BIGRAM} only" in baselines
    # the verdict figure's threshold legend takes bpc's declared direction: lower is better
    assert [(kw["metric"], kw["higher_is_better"]) for kw in drawn] == [("bpc@16", False)]
    (verdict,) = summary["verdicts"]
    seen = np.mean([text(corpus, seed).seen_baselines("decoder", 16, Consumed(4, 14 * 16))[SEEN_BIGRAM]["bpc"]
                    for seed in (0, 1)])
    assert {g["baseline"] for g in verdict["learned"]} == {SEEN_BIGRAM}
    assert all(g["chance"] == pytest.approx(seen) for g in verdict["learned"])


# A study's next run in a process of its own, with every n-gram fit made to fail: it may only
# read the fits the first run left in the data folder.
NEXT_RUN = """
import json, sys
import workbench_plugins.task_text_lm as text_lm
from workbench.tasks import Consumed

def fitted_again(*args, **kwargs):
    raise AssertionError("an n-gram model was fitted again")

text_lm.WittenBell = fitted_again
task = text_lm.TextLM(text_lm.TextParams(path=sys.argv[1], train_length=16, n_eval=16, decode_samples=0), seed=0)
print(json.dumps([task.baselines("decoder", 16), task.seen_baselines("decoder", 16, Consumed(4, 20 * 64))]))
"""


def test_the_next_run_of_a_study_reuses_the_n_gram_fits_and_gets_the_same_numbers(corpus, monkeypatch):
    """Fitted once per corpus, tokenizer and window, whichever process asks first; another
    window is a fit of its own."""
    fits, original = [], WittenBell.__init__

    def counted(self, *args, **kwargs):
        fits.append(args[1])  # the order
        original(self, *args, **kwargs)
    monkeypatch.setattr(WittenBell, "__init__", counted)
    task = text(corpus)
    first = [task.baselines("decoder", 16), task.seen_baselines("decoder", 16, Consumed(4, 20 * 64))]
    assert len(fits) == 2  # the whole split's n-grams (one model, its lower orders inside) and the seen 2-gram
    # The token shards and the fits are in the data folder the session fixture set ($WORKBENCH_DATA_DIR).
    done = run_within_cpu([sys.executable, "-c", NEXT_RUN, str(corpus)], 120, text=True, check=True)
    assert json.loads(done.stdout) == first  # the same floats, read back exactly
    text(corpus).baselines("decoder", 24)
    assert len(fits) == 3


def test_a_seed_that_diverged_and_one_that_did_not_learn_are_counted_apart(corpus):
    rows = [("none", 0, "diverged", np.nan), ("none", 1, "finished", 9.0), ("rope", 0, "finished", 9.5),
            ("rope", 1, "finished", 9.0)]
    runs = pd.DataFrame([{"run_id": f"{p}{s}", "index": i, "seed": s, "model.position": p, "status": status,
                          "bpc@16": bpc, "loss@16": bpc, "train_tokens": 30 * 64}
                         for i, (p, s, status, bpc) in enumerate(rows)])
    gates = Gates(TrainRuns(study(corpus, steps=30), runs))
    outcomes = gates.seed_outcomes("position=none")
    assert outcomes.to_dict("index") == {0: {"diverged": 1.0, "missed": 0.0}, 1: {"diverged": 0.0, "missed": 1.0}}
    assert gates.failure_text("position=none") == "2/2 = 1 [0.158, 1]: 1 diverged, 1 did not learn"
    assert gates.failure_text("position=rope") == "2/2 = 1 [0.158, 1]: 2 did not learn"  # none failed to run
