"""`train.attention_entropy`: the normalised attention entropy recorded at the training length.

The instrument (workbench.model.transformer.attention_entropy over record_attention) must read 1 for
uniform attention and 0 for a saturated softmax, count only real rows over their visible keys,
and show the claim's mechanism (E5): unscaled dot products at large head_dim saturate. The
option must leave run ids, study hashes, training and the other metrics as they were.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import FAMILIES, TINY_PARAMS, build, choice, registered, tiny_spec, tokens
from workbench.errors import WorkbenchError
from workbench.model.transformer import (AttentionLayer, CrossAttention, SelfAttention, attention_entropy,
                                         first_token_attention, record_attention)
from workbench.api import run_study, study_verdicts
from workbench.recipes.train.gates import Gates
from workbench.recipes.train.runs import TrainRuns, metric_columns, metric_range
from workbench.recipes.train.tuning import choose
from workbench.recipes.train.verdicts import Verdicts
from workbench.run import store
from workbench.run.evaluate import evaluate_lengths, measure_attention
from workbench.recipes.train.study import TrainStudy
from workbench.study import load_study
from workbench.recipes.train.sweep import expand
from workbench.model.weights import make_task

STUDIES = Path(__file__).resolve().parents[2] / "studies"
ATTENTION = [*registered("attention"), "unscaled"]  # every plugin, and full attention with scaled: false


def attention_choice(name: str) -> dict:
    return {"name": "full", "scaled": False} if name == "unscaled" else choice("attention", name)


def entropy_of(model, family: str, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[float, int]:
    """(mean normalised entropy, rows) of one forward; x doubles as the target in encoder_decoder.
    A model without a softmax attention layer (every layer a mixer with no attention weights,
    gated_deltanet) has no attention entropy: the test is skipped (a run records NaN)."""
    if not any(isinstance(m, AttentionLayer) for m in model.modules()):
        pytest.skip("no softmax attention layer: no attention weights to record")
    with torch.no_grad(), record_attention(model) as recorded:
        if family == "encoder_decoder":
            model(x, x, src_padding_mask=mask, tgt_padding_mask=mask)
        else:
            model(x, mask)
    total, rows = attention_entropy(recorded)
    return total / rows, rows


def zero_query_key(model) -> None:
    """Every attention score 0: queries and keys come out as zero vectors."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, SelfAttention):
                m.qkv.weight[: (m.n_heads + m.n_kv_heads) * m.head_dim].zero_()
            elif isinstance(m, CrossAttention) or hasattr(m, "q"):  # a mixer's own query projection (mla)
                m.q.weight.zero_()


RIGHT_PADDED = torch.tensor([[True] * 10, [True] * 6 + [False] * 4])


def test_a_weights_hook_sees_every_call_until_its_handle_is_removed():
    """What record_attention stands on: a layer hands each forward's weights and visible pairs
    to its hooks, the model's output stays that of the fast path (to float tolerance), and once
    the handle is removed the layer keeps nothing and calls nothing."""
    model = build(tiny_spec("decoder", n_layers=1))
    attn = next(m for m in model.modules() if isinstance(m, SelfAttention))
    x, calls = tokens(2, 7), []
    with torch.no_grad():
        fast = model(x)
        handle = attn.register_weights_hook(lambda weights, visible: calls.append((weights, visible)))
        hooked = [model(x), model(x)]
        handle.remove()
        model(x)
    assert len(calls) == 2 and not attn.weights_hooks
    weights, visible = calls[0]
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    assert weights.shape == (2, attn.n_heads, 7, 7) and torch.equal(visible.expand_as(weights), causal.expand_as(weights))
    assert not bool(weights[..., ~causal].any())
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, attn.n_heads, 7))
    torch.testing.assert_close(hooked[0], fast, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", FAMILIES)
def test_uniform_attention_reads_one(family, attention):
    """Zero scores: each row is uniform over its visible keys, whatever the pattern (window,
    sparse blocks, causal) and padding; normalising by any other key count would read < 1."""
    model = build(tiny_spec(family, attention=attention_choice(attention), n_kv_heads=2, n_layers=2))
    zero_query_key(model)
    value, rows = entropy_of(model, family, tokens(2, 10), RIGHT_PADDED)
    assert rows > 0
    assert value == pytest.approx(1.0, abs=1e-5)


def test_only_real_rows_that_see_two_keys_count():
    """Decoder, full causal attention: a real query i sees i + 1 keys; padding queries count not."""
    model = build(tiny_spec("decoder", n_layers=2))
    _, rows = entropy_of(model, "decoder", tokens(2, 10), RIGHT_PADDED)
    heads, layers = 4, 2
    assert rows == ((10 - 1) + (6 - 1)) * heads * layers


def saturated_decoder(scale: float):
    """One layer, one head of 16 dims: q = k = scale * (normed token), so each query's own key
    outscores every other by about scale^2 * 16."""
    model = build(tiny_spec("decoder", n_heads=1, n_layers=1, attention={"name": "full", "scaled": False}))
    with torch.no_grad():
        attn = next(m for m in model.modules() if isinstance(m, SelfAttention))
        attn.qkv.weight[:32] = scale * torch.cat([torch.eye(16), torch.eye(16)])
    return model


def test_huge_scores_on_one_key_read_near_zero():
    distinct = torch.randperm(30, generator=torch.Generator().manual_seed(0))[None, :12] + 2
    value, _ = entropy_of(saturated_decoder(30.0), "decoder", distinct)
    assert value < 1e-3
    moderate, _ = entropy_of(saturated_decoder(0.3), "decoder", distinct)
    assert moderate > 0.5  # the same pattern with small scores is far from saturated


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", FAMILIES)
def test_it_lies_between_zero_and_one(family, attention):
    model = build(tiny_spec(family, attention=attention_choice(attention), n_kv_heads=2, n_layers=2), seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(20)  # far from the near-uniform attention at init
    value, _ = entropy_of(model, family, tokens(2, 10), RIGHT_PADDED)
    assert 0.0 <= value <= 1.0


def test_unscaled_dot_products_saturate_at_large_head_dim():
    """E5's mechanism at init: at head_dim 256 with init std 0.05 the unscaled scores are
    16x the scaled ones, and the softmax is much closer to one-hot."""
    x = tokens(4, 32, seed=1)
    values = {}
    for scaled in (True, False):
        model = build(dict(tiny_spec("decoder", n_heads=1, attention={"name": "full", "scaled": scaled}),
                           d_model=256))
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    torch.nn.init.normal_(p, std=0.05, generator=torch.Generator().manual_seed(0))
        values[scaled], _ = entropy_of(model, "decoder", x)
    assert values[True] > 0.8  # measured 0.88
    assert values[False] < 0.2  # measured 0.09: most rows put nearly all weight on one key


# ---- in a run's evaluation ----------------------------------------------------------------


def copy_task(**params):
    config = {"task": {"name": "copy", "train_length": 6, "eval_lengths": [6, 9], "n_eval": 16, "alphabet_size": 8,
                       "min_length": 1, **params}, "seed": 0}
    return make_task(config)


@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
def test_recorded_at_the_training_length_only_and_only_when_asked(family):
    task = copy_task()
    model = build(tiny_spec(family, vocab_size=len(task.vocab), position="rope"))
    off, _ = evaluate_lengths(task, model, family, 8, {})
    on, _ = evaluate_lengths(task, model, family, 8, {}, entropy=True)
    assert not any(k.startswith(("attention_entropy", "first_token_attention")) for k in off)
    assert [k for k in on if k.startswith("attention_entropy")] == ["attention_entropy@6"]
    assert 0.0 < on.pop("attention_entropy@6") <= 1.0
    assert 0.0 < on.pop("first_token_attention@6") < 1.0
    assert on == off  # the other metrics are computed exactly as without it


def test_measured_at_the_training_length_when_it_is_not_an_eval_length():
    task = copy_task(eval_lengths=[9])
    model = build(tiny_spec("decoder", vocab_size=len(task.vocab)))
    metrics, _ = evaluate_lengths(task, model, "decoder", 8, {}, entropy=True)
    assert sorted(metrics) == ["accuracy@9", "attention_entropy@6", "exact_match@9", "first_token_attention@6", "loss@9",
                               "symbol_accuracy@9"]


def test_batches_cut_into_pieces_give_the_same_mean(monkeypatch):
    """The row-weighted mean does not depend on how the entropy pass splits a batch."""
    task = copy_task()
    model = build(tiny_spec("decoder", vocab_size=len(task.vocab)))
    batches = task.eval_batches(6, 16, "decoder")
    whole = measure_attention(task, model, "decoder", batches)
    monkeypatch.setattr("workbench.run.evaluate.ENTROPY_WEIGHTS_PER_FORWARD", 1)  # one sequence at a time
    assert measure_attention(task, model, "decoder", batches) == pytest.approx(whole, rel=1e-9)


# ---- the first token's share (the attention sink) ------------------------------------------


def first_token_share(model, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[float, int]:
    with torch.no_grad(), record_attention(model) as recorded:
        model(x, mask)
    total, rows = first_token_attention(recorded)
    return total / rows, rows


def test_uniform_causal_attention_puts_one_over_the_keys_seen_on_the_first():
    """Query i of a causal decoder sees i + 1 keys: uniform attention gives the first 1 / (i + 1);
    the first query (one key) and padding queries are left out."""
    model = build(tiny_spec("decoder", n_layers=2))
    zero_query_key(model)
    value, rows = first_token_share(model, tokens(2, 10), RIGHT_PADDED)
    shares = [1 / (i + 1) for i in range(1, 10)] + [1 / (i + 1) for i in range(1, 6)]
    assert rows == len(shares) * 4 * 2  # heads, layers
    assert value == pytest.approx(sum(shares) / len(shares), rel=1e-6)


def test_attention_on_each_own_key_leaves_the_first_nearly_nothing():
    distinct = torch.randperm(30, generator=torch.Generator().manual_seed(0))[None, :12] + 2
    value, _ = first_token_share(saturated_decoder(30.0), distinct)
    assert value < 1e-3


STUDY = """\
name: entropy
task: {name: copy, train_length: 4, n_eval: 8, alphabet_size: 4}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {steps: 4, batch_size: 4, log_every: 1, eval_every: 2ENTROPY}
"""


def test_training_is_the_same_with_it_on(tmp_path):
    from workbench.run.train import train_run

    results = {}
    for on in (False, True):
        path = tmp_path / f"{on}.yaml"
        path.write_text(STUDY.replace("ENTROPY", ", attention_entropy: true" if on else ""))
        run = expand(load_study(path))[0]
        results[on] = train_run(run.run_id, run.config, tmp_path / f"run-{on}")
        assert results[on].status == "finished", results[on].error
    train_curve = {on: [c for c in r.curves if c[1] == "train"] for on, r in results.items()}
    assert train_curve[True] == train_curve[False]
    entropy = {k: v for k, v in results[True].metrics.items() if k.startswith(("attention_entropy", "first_token"))}
    assert sorted(entropy) == ["attention_entropy@4", "first_token_attention@4"]
    assert {k: v for k, v in results[True].metrics.items() if k not in entropy} == results[False].metrics
    steps = [c[0] for c in results[True].curves if c[2] == "attention_entropy@4"]
    assert steps == [2, 4]  # in the learning curves at every evaluation


# ---- run ids, study hashes, validation and the report ---------------------------------------

PINNED = """\
name: t
task: {name: copy, train_length: 8, n_eval: 16, alphabet_size: 8}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope, attention: {name: full}}
train: {steps: 20, batch_size: 8}
seeds: [0, 1]
sweep: {model.attention.scaled: [true, false]}
"""
# Computed before train.attention_entropy existed: a study that does not set it keeps these.
PINNED_HASH = "5dc0853a16fe"
PINNED_RUNS = ["a4274eebcda4", "b5879d0bde39", "bf71c166d9e2", "71a26a78549d"]


def test_studies_without_it_keep_their_hash_and_run_ids(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(PINNED)
    study = load_study(path)
    assert study.study_hash == PINNED_HASH
    assert [r.run_id for r in expand(study)] == PINNED_RUNS
    path.write_text(PINNED.replace("batch_size: 8}", "batch_size: 8, attention_entropy: false}"))
    assert load_study(path).study_hash == PINNED_HASH
    assert [r.run_id for r in expand(load_study(path))] == PINNED_RUNS
    path.write_text(PINNED.replace("batch_size: 8}", "batch_size: 8, attention_entropy: true}"))
    assert load_study(path).study_hash != PINNED_HASH
    assert not set(PINNED_RUNS) & {r.run_id for r in expand(load_study(path))}


@pytest.mark.parametrize("path", sorted(STUDIES.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_studies_hash_without_it_unless_they_set_it(path):
    study = load_study(path)
    if not isinstance(study.study, TrainStudy) or study.study.train.attention_entropy:
        pytest.skip("not a training study, or it records the entropy")
    assert "attention_entropy" not in study.study.run_defining()["train"]


def test_expect_on_it_is_refused_with_the_reason(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(PINNED + "expect: [{metric: attention_entropy@8, better: true, than: false}]\n")
    with pytest.raises(WorkbenchError, match="attention_entropy is descriptive"):
        load_study(path)


def test_the_report_lists_it_with_its_range():
    runs = pd.DataFrame(columns=["attention_entropy@8", "loss@8", "accuracy@8", "tokens_per_s"])
    assert metric_columns(runs, ["accuracy"]) == ["accuracy@8", "loss@8", "attention_entropy@8"]
    assert metric_range("attention_entropy@8", "copy") == (0.0, 1.0)
    assert not math.isinf(metric_range("attention_entropy@8", "no-such-task")[1])


def test_an_expect_entry_tests_a_descriptive_measure_in_the_direction_it_states(tmp_path):
    """Qiu et al. 2025's second claim: gated attention puts less weight on the first token. A
    descriptive measure is tested only with a stated direction, only when the runs record it,
    and the verdict says which way ('is lower than')."""
    study = PINNED.replace("seeds: [0, 1]", "seeds: [0, 1, 2, 3]").replace(
        "batch_size: 8}", "batch_size: 8, attention_entropy: true}") + (
        "expect: [{metric: first_token_attention@8, better: false, than: true, direction: lower}]\n")
    path = tmp_path / "t.yaml"
    for text, problem in [(study.replace(", direction: lower", ""), "tests it only with a stated `direction"),
                          (study.replace(", attention_entropy: true", ""), "recorded only with train.attention_entropy"),
                          (study.replace("first_token_attention@8", "accuracy@8"), "has a better direction of its own")]:
        path.write_text(text)
        with pytest.raises(WorkbenchError, match=problem.replace("(", r"\(")):
            load_study(path)
    path.write_text(study)
    run_study(path, tmp_path / "out", quiet=True)
    [verdict] = study_verdicts(tmp_path / "out")
    assert " is lower than " in verdict.statement and verdict.statement.endswith("on first_token_attention@8")
    assert 0 < verdict.groups[0]["mean"] < 1 and verdict.groups[0]["n"] == 4
    # `direction: lower` is the comparison's direction: a lower `better` is what holds
    loaded = load_study(path).study
    runs = TrainRuns(loaded, store.load_results(tmp_path / "out"), store.load_curves(tmp_path / "out"),
                     choose(loaded, store.Store(tmp_path / "out", create=False).runs()))
    [comparison], _ = Verdicts(runs, Gates(runs)).comparisons()
    assert comparison.higher is False and comparison.relation == "lower"
