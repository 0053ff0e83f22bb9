"""Tasks: determinism, data correctness against independent references, metrics, families."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from torch import nn

from workbench.model.transformer import build_model
from workbench.model.position import PositionLimitError
from workbench.registry import variants
from workbench.tasks import IGNORE, Tally

TASKS = variants("task")
TINY = {"d_model": 16, "n_layers": 1, "n_heads": 2}


def make(name: str, seed: int = 0, **params):
    cls = TASKS[name]
    return cls(cls.Params(**params), seed=seed)


def small(name: str, **params):
    """Short sequences keep the per-family checks fast."""
    shrink = {"text_lm": {"train_length": 24}, "translate": {"train_length": 8},
              "classify": {"train_length": 24}, "recall": {"train_length": 4}}
    return make(name, **({"n_eval": 8} | shrink.get(name, {"train_length": 6}) | params))


def test_builtin_tasks_registered():
    assert {"copy", "reverse", "sort", "difference", "recall", "translate", "text_lm", "classify"} <= set(TASKS)
    for cls in TASKS.values():
        assert "train_length" in cls.Params.model_fields and cls.metrics and cls.families


# ---- determinism ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TASKS))
def test_batches_are_pure_functions_of_seed_and_index(name):
    family = TASKS[name].families[0]
    a, b, other_seed = small(name), small(name), small(name, seed=1)
    first = a.train_batch(3, 4, family)
    for key, value in b.train_batch(3, 4, family).items():
        assert torch.equal(first[key], value), key
    assert not torch.equal(a.train_batch(4, 4, family)[next(iter(first))], first[next(iter(first))])
    assert not torch.equal(other_seed.train_batch(3, 4, family)[next(iter(first))], first[next(iter(first))])
    ea, eb = a.eval_batches(a.params.train_length, 4, family), b.eval_batches(b.params.train_length, 4, family)
    assert len(ea) == 2 and all(torch.equal(x[k], y[k]) for x, y in zip(ea, eb) for k in x)


def test_training_never_emits_a_held_out_source():
    # 2 symbols and length 3: only 8 strings, half of them held out.
    task = make("copy", alphabet_size=2, min_length=3, train_length=3, n_eval=4)
    held = {tuple(ex.source) for ex in task.eval_examples(3)}
    seen = set()
    for index in range(20):
        tokens = task.train_batch(index, 8, "decoder")["tokens"]
        seen |= {tuple(row[1:4]) for row in tokens.tolist()}
    assert seen and not seen & held


# ---- data against independent references ------------------------------------------------------


def listops_reference(tokens: list[str]) -> int:
    """Stack evaluator of a ListOps token string (written apart from the generator)."""
    ops = {"[MAX": max, "[MIN": min, "[SM": lambda xs: sum(xs) % 10,
           "[MED": lambda xs: math.floor(statistics.median(xs))}
    stack: list = []
    for tok in tokens:
        if tok == "]":
            args = []
            while not isinstance(stack[-1], str):
                args.append(stack.pop())
            stack.append(ops[stack.pop()](args[::-1]))
        else:
            stack.append(tok if tok.startswith("[") else int(tok))
    assert len(stack) == 1
    return stack[0]


def test_listops_labels_match_reference_evaluator():
    task = make("classify", n_eval=300, max_depth=4, train_length=64)
    batch = task.eval_batches(64, 300, "encoder")[0]
    labels = batch["labels"].tolist()
    for row, mask, label in zip(batch["tokens"].tolist(), batch["padding_mask"].tolist(), labels):
        assert listops_reference(task.decode([t for t, m in zip(row, mask) if m])) == label
    assert len(set(labels)) == 10


def test_recall_answers_are_recoverable_from_context():
    gap, pairs = 5, 6
    task = make("recall", train_length=pairs, gap=gap, n_keys=8, n_values=6)
    batch = task.train_batch(0, 16, "decoder")
    for row, labels in zip(batch["tokens"].tolist(), batch["labels"].tolist()):
        words = task.decode(row)
        keys, values = words[1: 1 + 2 * pairs: 2], words[2: 2 + 2 * pairs: 2]
        assert len(set(keys)) == pairs and all(k.startswith("k") for k in keys)
        assert len(set(values)) == pairs and all(v.startswith("v") for v in values)
        assert words[1 + 2 * pairs: 1 + 2 * pairs + gap] == ["<gap>"] * gap
        value_of = dict(zip(keys, values))
        queries = [t for t, label in enumerate(labels) if label != IGNORE]
        assert queries == list(range(1 + 2 * pairs + gap, len(row)))  # one label per query, nothing else
        for t in queries:
            assert task.vocab[labels[t]] == value_of[words[t]]
            assert t - (1 + 2 * keys.index(words[t])) >= gap + 2  # query is far from its key
        # The answers never enter the input after the pairs: no answering by elimination.
        assert not set(words[1 + 2 * pairs:]) & set(values)


def test_recall_decoder_and_encoder_read_the_same_labelled_rows():
    task = make("recall", train_length=4, n_eval=8)
    decoder, encoder = task.train_batch(0, 2, "decoder"), task.train_batch(0, 2, "encoder")
    assert decoder.keys() == encoder.keys() and all(torch.equal(decoder[k], encoder[k]) for k in decoder)
    assert int((decoder["labels"] != IGNORE).sum()) == 8


def test_sort_and_reverse_targets():
    for name, fn in [("sort", sorted), ("reverse", lambda s: s[::-1])]:
        task = make(name, train_length=7)
        for ex in task.eval_examples(7)[:20]:
            assert list(ex.target) == list(fn(list(ex.source))) and len(ex.source) == 7


def test_difference_labels_each_symbol_with_its_right_neighbour_minus_its_left():
    task = make("difference", train_length=7, alphabet_size=5)
    first = task.first_symbol
    for ex in task.eval_examples(7)[:20] + task.eval_examples(4)[:5]:
        values = [t - first for t in ex.source] + [0]  # index -1 and n: the missing neighbours, 0
        expected = [(values[i + 1] - values[i - 1]) % 5 + first for i in range(len(ex.source))]
        assert list(ex.target) == expected
    batch = task.train_batch(0, 4, "encoder")  # one label per symbol, every symbol scored
    assert torch.equal(batch["labels"] != IGNORE, batch["padding_mask"])


def test_text_lm_splits_by_file():
    task = make("text_lm")
    valid = task.valid_text.tobytes()
    train = task.train_text.tobytes()
    probe = valid[len(valid) // 2: len(valid) // 2 + 300]
    assert len(train) > 500_000 and probe not in train


def test_text_lm_path(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_bytes(bytes(range(32, 127)) * 20)
    task = make("text_lm", path=str(text), train_length=16, valid_fraction=0.25)
    assert (len(task.train_text), len(task.valid_text)) == (1425, 475)  # 1900 bytes, last quarter held out
    batch = task.train_batch(0, 2, "decoder")
    assert batch["tokens"].shape == (2, 16) and batch["loss_mask"][:, 0].sum() == 0


# ---- metrics on hand-made models --------------------------------------------------------------


class Oracle(nn.Module):
    """A 'decoder' whose logits at t put all mass on tokens[t + shift] (shift 1 = perfect)."""

    def __init__(self, vocab: int, shift: int):
        super().__init__()
        self.vocab, self.shift = vocab, shift
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, tokens, padding_mask=None):
        target = torch.roll(tokens, -self.shift, dims=1)
        return 50.0 * nn.functional.one_hot(target, self.vocab).float()


def test_metrics_of_perfect_and_off_by_one_models():
    task = make("copy", train_length=5, n_eval=32)
    batches = task.eval_batches(5, 8, "decoder")
    perfect = task.evaluate(Oracle(len(task.vocab), 1), batches, "decoder")
    assert perfect["accuracy"] == 1.0 and perfect["exact_match"] == 1.0 and perfect["loss"] < 1e-6
    # Off by one: predicting the current token is right exactly where target[t] == token[t-1].
    lagged = task.evaluate(Oracle(len(task.vocab), 0), batches, "decoder")
    hits = total = 0
    for b in batches:
        mask = b["loss_mask"][:, 1:]
        hits += int(((b["tokens"][:, 1:] == b["tokens"][:, :-1]) & mask).sum())
        total += int(mask.sum())
    assert lagged["accuracy"] == pytest.approx(hits / total) and lagged["exact_match"] == 0.0


def test_tally_counts():
    logits = torch.tensor([[[5.0, 0], [0, 5.0], [5.0, 0]]])  # predicts 0, 1, 0
    t = Tally()
    t.add(logits, torch.tensor([[0, 1, 1]]), torch.tensor([[True, True, True]]))
    assert t.scores()["accuracy"] == pytest.approx(2 / 3) and t.scores()["exact_match"] == 0
    t2 = Tally()
    t2.add(logits, torch.tensor([[0, 1, 1]]), torch.tensor([[True, True, False]]))
    assert t2.scores()["accuracy"] == 1 and t2.scores()["exact_match"] == 1
    empty = Tally()
    empty.add(logits, torch.tensor([[0, 1, 1]]), torch.zeros(1, 3, dtype=torch.bool))
    assert all(math.isnan(v) for v in empty.scores().values())


def test_bleu_perfect_empty_and_partial():
    from workbench_plugins.task_translate import corpus_bleu

    ref = [["the", "cat", "did", "not", "catch", "the", "car"]]
    assert corpus_bleu(ref, ref) == pytest.approx(100.0)
    assert corpus_bleu([[]], ref) == 0.0
    assert 0 < corpus_bleu([ref[0][:-1] + ["dog"]], ref) < 100


def test_uniform_model_bpc_is_log2_vocab():
    task = make("text_lm", train_length=16, n_eval=4, decode_samples=0)  # the stand-in cannot generate

    class Uniform(Oracle):
        def forward(self, tokens, padding_mask=None):
            return torch.zeros(*tokens.shape, self.vocab)

    scores = task.evaluate(Uniform(len(task.vocab), 0), task.eval_batches(16, 4, "decoder"), "decoder")
    assert scores["bpc"] == pytest.approx(math.log2(len(task.vocab)))
    assert scores["perplexity"] == pytest.approx(len(task.vocab), rel=1e-5)


def test_bpc_tail_scores_only_bytes_past_the_training_length():
    """A stand-in that is uniform on the first `train_length` bytes of a window and gives the
    true next byte probability 1/2 (rest uniform) on the bytes after: bpc_tail is exactly
    1 bit, bpc the length-weighted mix, and at the training length bpc_tail is NaN."""
    L, n = 16, 40
    task = make("text_lm", train_length=L, eval_lengths=[L, n], n_eval=4, decode_samples=0)
    V = len(task.vocab)

    class KnowsTheTail(Oracle):
        def forward(self, tokens, padding_mask=None):
            logits = torch.zeros(*tokens.shape, self.vocab)
            nxt = torch.roll(tokens, -1, dims=1)[:, L - 1:]  # logits at t predict byte t + 1 >= L
            logits[:, L - 1:] = math.log(V - 1) * nn.functional.one_hot(nxt, self.vocab).float()
            return logits

    model = KnowsTheTail(V, 1)
    long = task.evaluate(model, task.eval_batches(n, 4, "decoder"), "decoder")
    assert long["bpc_tail"] == pytest.approx(1.0, rel=1e-5)
    head, tail = L - 1, n - L  # predicted bytes at indices 1 .. L-1, and L .. n-1
    assert long["bpc"] == pytest.approx((head * math.log2(V) + tail * 1.0) / (head + tail), rel=1e-5)
    assert math.isnan(task.evaluate(model, task.eval_batches(L, 4, "decoder"), "decoder")["bpc_tail"])


# ---- every task with every family it declares -------------------------------------------------


@pytest.mark.parametrize("name,family", [(n, f) for n, c in sorted(TASKS.items()) for f in c.families])
def test_task_trains_and_evaluates_with_each_family(name, family):
    task = small(name)
    torch.manual_seed(0)
    model = build_model({"family": family, **TINY} | task.model_overrides(family))
    loss = task.loss(model, task.train_batch(0, 4, family), family)
    loss.backward()
    assert torch.isfinite(loss) and any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    scores = task.evaluate(model, task.eval_batches(task.params.train_length, 8, family), family)
    assert set(scores) == {*task.metrics, "loss"}
    past_training_only = {"bpc_tail"}  # NaN at the training length by definition (tested above)
    assert all(math.isfinite(v) for k, v in scores.items() if k not in past_training_only)
    assert model.training  # evaluate restores the mode


def test_unsupported_family_is_a_spec_error():
    from workbench.errors import SpecError

    with pytest.raises(SpecError, match="model.family"):
        make("text_lm").train_batch(0, 2, "encoder")


def test_learned_positions_past_the_table_raise():
    task = make("copy", train_length=4, eval_lengths=[4, 12], n_eval=4)
    model = build_model({"family": "decoder", **TINY, "position": {"name": "learned", "max_len": 12}}
                        | task.model_overrides("decoder"))
    task.evaluate(model, task.eval_batches(4, 4, "decoder"), "decoder")  # 11 tokens fit
    with pytest.raises(PositionLimitError):
        task.evaluate(model, task.eval_batches(12, 4, "decoder"), "decoder")


def test_eval_past_train_length_uses_only_new_lengths():
    task = make("translate", train_length=10, eval_lengths=[10, 20], n_eval=30)
    assert all(len(ex.source) <= 10 for ex in task.eval_examples(10))
    assert all(10 < len(ex.source) <= 20 for ex in task.eval_examples(20))
