"""The `Task` base: the data, vocabulary and scoring of every task a study trains and evaluates on.

A task generates `Example`s (a source and a target sequence of token ids) from a seeded
random stream, and formats them for the model family that trains on them:

    decoder          tokens      [B, n]  <bos> source <sep> target <eos>, right-padded
                     padding_mask[B, n]  True for real tokens
                     loss_mask   [B, n]  True on tokens the model must predict (target and
                                         <eos>): logits at t-1 are scored against token t
    encoder_decoder  src, src_mask       source, right-padded
                     tgt, tgt_mask       <bos> target <eos>, right-padded (teacher forcing
                                         feeds tgt[:, :-1] and scores tgt[:, 1:])
    encoder          tokens, padding_mask
                     labels      [B]     class ids (sequence classification), or
                                 [B, n]  per-token target ids, -100 = not scored

Tasks with another layout (associative recall, byte-level LM) override the formatting of
one example; the loss and the teacher-forced metrics live here once, for every task.

Determinism: batch `index` of training is a pure function of (seed, index), so a resumed run
sees the same batches; held-out sets come from a separate seed stream per evaluation length,
and training never emits an example whose source is in a held-out set.

Splits: a run evaluates on the evaluation sets (split "eval"). A tuning run (a study's `tune:`
section, split "validation") evaluates instead on validation sets from a third seed stream,
whose sources avoid every evaluation set, and trains on examples in neither: the value it
picks was chosen on data disjoint from what it trained on and from what the study reports.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor

from workbench.errors import SpecError, WorkbenchError
# What a run evaluates on: the evaluation sets, or (a tuning run) the validation sets.
from workbench.results import EVAL, VALIDATION, Metric
from workbench.tasks.baselines import INPUT_IGNORING, Consumed, counted_blind_scores
from workbench.tasks.metrics import EVERY_TASK, Tally, declared, token_nll
from workbench.tasks.model_tokenizer import word_level
from workbench.tasks.tokens import SPECIALS
from workbench.variants import Params, Variant

FAMILIES = ("decoder", "encoder_decoder", "encoder")
# Training refuses a task once over half of its first 256+ draws were held out (too small a space).
HELD_SHARE_LIMIT, HELD_CHECK_DRAWS = 0.5, 256
IGNORE = -100  # label of an encoder position that is not scored (torch's cross_entropy default)

# Seed streams: training and each held-out set draw from disjoint numpy SeedSequences.
TRAIN_STREAM, EVAL_STREAM, SAMPLE_STREAM, VALID_STREAM = 0, 1, 2, 3


class TaskParams(Params):
    train_length: int = Field(gt=0, description="sequence-length knob used for training (meaning per task)")
    eval_lengths: list[int] | None = Field(
        None, description="lengths to evaluate at (extrapolation); default: train_length only"
    )
    n_eval: int = Field(512, gt=0, description="held-out examples per evaluation length")

    @model_validator(mode="after")
    def _positive_lengths(self):
        if self.eval_lengths is not None and (not self.eval_lengths or min(self.eval_lengths) <= 0):
            raise ValueError("eval_lengths must be a non-empty list of positive lengths")
        return self


class LengthRangeParams(TaskParams):
    """Parameters of tasks whose training examples range over [min_length, train_length]."""

    min_length: int = Field(1, gt=0, description="shortest training example")

    @model_validator(mode="after")
    def _range(self):
        if self.min_length > self.train_length:
            raise ValueError(f"min_length {self.min_length} exceeds train_length {self.train_length}")
        return self


@dataclass(frozen=True)
class Example:
    """One generated example before family formatting (token ids, no specials)."""

    source: tuple[int, ...]
    target: tuple[int, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


def length_window(length: int, train_length: int, min_length: int, training: bool) -> tuple[int, int]:
    """Accepted example lengths [lo, hi]: training and evaluation at or below train_length
    take [min_length, length]; evaluation past train_length takes only the new lengths
    (train_length, length], so an extrapolation score measures unseen lengths."""
    if training or length <= train_length:
        return min(min_length, length), length
    return train_length + 1, length


def draw_within(make, size, lo: int, hi: int, what: str, attempts: int = 10_000):
    """Rejection-sample `make()` until `lo <= size(result) <= hi`."""
    for _ in range(attempts):
        result = make()
        if lo <= size(result) <= hi:
            return result
    raise WorkbenchError(f"{what}: no example of length {lo}..{hi} in {attempts} draws; "
                         "adjust the lengths or the generator's size parameters")


def rng_for(*stream: int) -> np.random.Generator:
    """A numpy generator for one stream of integers (seed, purpose, index...)."""
    return np.random.default_rng(np.random.SeedSequence([int(s) for s in stream]))


def pad(rows: Sequence[Sequence[int]], value: int, left: bool = False) -> Tensor:
    """Ragged rows -> [B, max_len] long tensor."""
    width = max((len(r) for r in rows), default=0)
    filler = [value] * width
    # Padded in Python and converted once: a tensor per row costs more than the row (every
    # training step pads its batch).
    padded = [[*filler[len(r):], *r] if left else [*r, *filler[len(r):]] for r in rows]
    return torch.tensor(padded, dtype=torch.long).reshape(len(rows), width)


def real(rows: Sequence[Sequence[int]], left: bool = False) -> Tensor:
    """Padding mask for `pad(rows)`: True where a row has a real token."""
    width = max((len(r) for r in rows), default=0)
    lengths = torch.tensor([len(r) for r in rows])
    ar = torch.arange(width)[None]
    return ar >= (width - lengths)[:, None] if left else ar < lengths[:, None]


# What a study's verdicts are evidence of, by its task: a language model on text, a task of symbols, or
# a constructed mechanism (a task built so that the architecture decides the answer, e.g. the difference
# task, where a scheme that weighs both sides alike cannot pass). Verdicts of the last kind come easily
# (a one-layer model, plain differences at few seeds): the budget ledger keeps them apart.
LANGUAGE_MODEL, SYMBOL_TASK, MECHANISM = "language model on text", "symbol task", "constructed mechanism"
CLAIM_KINDS = (LANGUAGE_MODEL, SYMBOL_TASK, MECHANISM)


class Task(Variant):
    """Base of every task: seeded examples, family formatting, loss and metrics."""

    axis = "task"
    Params = TaskParams
    families: ClassVar[tuple[str, ...]] = FAMILIES
    # the scores it reports besides loss, each with its direction and range; the first is its primary one
    metrics: ClassVar[dict[str, Metric]] = declared("accuracy", "exact_match")
    sequence_labels: ClassVar[bool] = False  # encoder: one class per sequence instead of per token
    decoder_eos: ClassVar[bool] = True  # decoder: the target ends with a scored <eos>
    hold_out: ClassVar[bool] = True  # training skips examples whose source is in a held-out set
    evaluation_only: ClassVar[tuple[str, ...]] = ()
    """parameters that change how a run evaluates, never what it trains on (a decoding strategy):
    runs that differ only in them train one model (workbench.recipes.train.sweep.training_groups)"""
    # what each of its baselines knows, in a clause the report's Learned section prints
    baselines_text: ClassVar[str] = f"{INPUT_IGNORING} (knows the layout, not a token)"
    gate_baselines: ClassVar[tuple[str, ...] | None] = None
    """names of the baselines (`baselines`, `seen_baselines`) the learned gate measures against, the
    strongest of them (None: every one); the others are shown beside each group but do not gate"""
    claim_kind: ClassVar[str] = SYMBOL_TASK
    """what kind of evidence a study on the task is (CLAIM_KINDS): the index's budget ledger counts each apart"""
    location_params: ClassVar[tuple[str, ...]] = ()
    """parameters that say where the task's files lie on this machine (`resolve_paths`), never what
    a run computes: run ids and the study hash leave them out (`defining`)"""

    pad_id, bos_id, eos_id, sep_id = 0, 1, 2, 3

    def __init__(self, params: TaskParams, *, seed: int, data_dir: pathlib.Path | None = None, split: str = EVAL):
        if split not in (EVAL, VALIDATION):
            raise ValueError(f"split must be {EVAL!r} or {VALIDATION!r}, got {split!r}")
        self.params, self.seed, self.data_dir, self.split = params, int(seed), data_dir, split
        self.vocab: list[str] = list(SPECIALS)
        self._eval_cache: dict[int, list[Example]] = {}
        self._valid_cache: dict[int, list[Example]] = {}
        self._held_out: set[tuple[int, ...]] | None = None
        self._draws = self._held_draws = 0  # training draws, and those the held-out set refused

    # ---- vocabulary -------------------------------------------------------------------------

    def _set_vocab(self, words: Sequence[str]) -> None:
        self.vocab = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self.token_id = {w: i for i, w in enumerate(self.vocab)}
        if len(self.token_id) != len(self.vocab):
            raise ValueError(f"{self.name}: duplicate words in the vocabulary")

    def encode(self, words: Sequence[str]) -> tuple[int, ...]:
        return tuple(self.token_id[w] for w in words)

    def decode(self, ids: Sequence[int]) -> list[str]:
        return [self.vocab[int(i)] for i in ids]

    def text_words(self, text: str) -> list[str]:
        """Text as vocabulary words (workbench.notebook.Tokenizer): a symbol task's words are
        apart by whitespace; a task whose words are pieces of text (bytes) overrides both."""
        return text.split()

    def words_text(self, words: Sequence[str]) -> str:
        return " ".join(words)

    def model_tokenizer(self):
        """The tokenizer in model ids that `workbench generate` reads prompts with and `workbench
        export` writes: a symbol task's words apart by whitespace (model_tokenizer.word_level); a
        task of text pieces overrides it."""
        return word_level(self.vocab)

    # ---- what subclasses provide ------------------------------------------------------------

    def example(self, rng: np.random.Generator, length: int, training: bool) -> Example:
        """One example. `length` is train_length when training, an eval length otherwise."""
        raise NotImplementedError

    @classmethod
    def resolve_paths(cls, section: dict[str, Any], folder: pathlib.Path) -> dict[str, Any]:
        """The study's task section (raw, before validation) with the files it names made
        relative to `folder`, the study file's; a task that reads no files returns it as is."""
        return section

    @classmethod
    def planned(cls, params: TaskParams) -> Task:
        """The task as resolving a run needs it (its vocabulary and the shapes of its batches,
        for `validate` and the step cost of a budget), which may skip what only training needs,
        such as tokenizing a corpus; a task that generates its data is itself."""
        return cls(params, seed=0)

    def prepare(self) -> str | None:
        """Make the task's data ready on disk (e.g. tokenize a corpus) and say in one line what
        is ready; None: the task generates its data and has nothing to prepare."""
        return None

    def model_overrides(self, family: str) -> dict[str, Any]:
        """Model spec fields this task fixes, merged into the study's model spec."""
        self.check_family(family)
        return {"vocab_size": len(self.vocab)}

    @classmethod
    def defining(cls, section: dict[str, Any]) -> dict[str, Any]:
        """The task section as run ids and the study hash read it: without `location_params`."""
        return {k: v for k, v in section.items() if k not in cls.location_params}

    @classmethod
    def evaluation_params(cls) -> tuple[str, ...]:
        """`evaluation_only`, and where training never avoids the held-out sets (hold_out False)
        the evaluation lengths and set size too."""
        return (*cls.evaluation_only, *(() if cls.hold_out else ("eval_lengths", "n_eval")))

    @property
    def eval_lengths(self) -> list[int]:
        return list(self.params.eval_lengths or [self.params.train_length])

    # ---- batches ----------------------------------------------------------------------------

    def check_family(self, family: str) -> None:
        if family not in self.families:
            raise SpecError("model.family", f"task {self.name!r} does not support family {family!r}",
                            self.families)

    def train_batch(self, index: int, batch_size: int, family: str) -> dict[str, Tensor]:
        """Batch `index` of training: the same (seed, index) always gives the same batch."""
        self.check_family(family)
        rng = rng_for(self.seed, TRAIN_STREAM, index)
        return self.collate([self._train_example(rng) for _ in range(batch_size)], family)

    def _train_example(self, rng: np.random.Generator, attempts: int = 1000) -> Example:
        held = self.held_out_sources() if self.hold_out else set()
        for _ in range(attempts):
            ex = self.example(rng, self.params.train_length, training=True)
            self._draws += 1
            if ex.source not in held:
                return ex
            self._held_draws += 1
            if self._draws >= HELD_CHECK_DRAWS and self._held_draws > HELD_SHARE_LIMIT * self._draws:
                raise WorkbenchError(  # else training cycles through the few examples left
                    f"task {self.name}: {self._held_draws / self._draws:.0%} of the training examples drawn "
                    f"at train_length {self.params.train_length} are held out for evaluation, so training sees "
                    f"only the few left; the example space is too small for task.n_eval={self.params.n_eval} "
                    "(raise the lengths or the alphabet, or lower task.n_eval)")
        raise WorkbenchError(
            f"task {self.name}: {attempts} training examples in a row were in the held-out set; "
            "the example space is too small for n_eval (raise the lengths or the alphabet)"
        )

    def held_out_sources(self) -> set[tuple[int, ...]]:
        """Sources training never emits: every evaluation set's and, in a tuning run, every
        validation set's."""
        if self._held_out is None:
            sets = [self.evaluation_set, *([self.validation_set] if self.split == VALIDATION else [])]
            self._held_out = {ex.source for draw in sets for n in self.eval_lengths for ex in draw(n)}
        return self._held_out

    def eval_examples(self, length: int) -> list[Example]:
        """The held-out examples a run evaluates on at one length: the evaluation set, or in a
        tuning run the validation set."""
        return self.validation_set(length) if self.split == VALIDATION else self.evaluation_set(length)

    def evaluation_set(self, length: int) -> list[Example]:
        """The fixed evaluation set at one length (cached)."""
        if length not in self._eval_cache:
            rng = rng_for(self.seed, EVAL_STREAM, length)
            self._eval_cache[length] = [self.example(rng, length, training=False) for _ in range(self.params.n_eval)]
        return self._eval_cache[length]

    def validation_set(self, length: int, attempts: int = 1000) -> list[Example]:
        """A tuning run's fixed validation set at one length (cached): its own seed stream,
        skipping examples whose source is in an evaluation set (when the task holds out by
        example), so tuning never scores on what the study reports."""
        if length not in self._valid_cache:
            taken = {ex.source for n in self.eval_lengths for ex in self.evaluation_set(n)} if self.hold_out else set()
            rng = rng_for(self.seed, VALID_STREAM, length)
            examples, misses = [], 0  # the set so far, and refusals in a row
            while len(examples) < self.params.n_eval:
                ex = self.example(rng, length, training=False)
                if ex.source not in taken:
                    examples.append(ex)
                    misses = 0
                elif (misses := misses + 1) == attempts:
                    raise WorkbenchError(
                        f"task {self.name}: {attempts} validation examples in a row at length {length} were in an "
                        "evaluation set; the example space is too small for n_eval (raise the lengths or the alphabet)"
                    )
            self._valid_cache[length] = examples
        return self._valid_cache[length]

    def eval_batches(self, length: int, batch_size: int, family: str) -> list[dict[str, Tensor]]:
        self.check_family(family)
        examples = self.eval_examples(length)
        return [self.collate(examples[i: i + batch_size], family) for i in range(0, len(examples), batch_size)]

    def collate(self, examples: Sequence[Example], family: str) -> dict[str, Tensor]:
        """Format and pad examples for one family (layouts in the module docstring)."""
        if family == "decoder":
            rows = [self.format_decoder(ex) for ex in examples]
            tokens = [r[0] for r in rows]
            return {
                "tokens": pad(tokens, self.pad_id),
                "padding_mask": real(tokens),
                "loss_mask": pad([r[1] for r in rows], 0).bool(),
            }
        if family == "encoder_decoder":
            rows = [self.format_encoder_decoder(ex) for ex in examples]
            src, tgt = [r[0] for r in rows], [r[1] for r in rows]
            return {"src": pad(src, self.pad_id), "src_mask": real(src),
                    "tgt": pad(tgt, self.pad_id), "tgt_mask": real(tgt)}
        if family == "encoder":
            rows = [self.format_encoder(ex) for ex in examples]
            tokens = [r[0] for r in rows]
            labels = (torch.tensor([r[1] for r in rows]) if self.sequence_labels
                      else pad([r[1] for r in rows], IGNORE))
            return {"tokens": pad(tokens, self.pad_id), "padding_mask": real(tokens), "labels": labels}
        raise SpecError("model.family", f"unknown family {family!r}", FAMILIES)

    def format_decoder(self, ex: Example) -> tuple[list[int], list[bool]]:
        """<bos> source <sep> target <eos>; the loss covers target and <eos>."""
        target = [*ex.target, self.eos_id] if self.decoder_eos else list(ex.target)
        tokens = [self.bos_id, *ex.source, self.sep_id, *target]
        return tokens, [False] * (len(ex.source) + 2) + [True] * len(target)

    def decoder_prompt(self, source: Sequence[int]) -> list[int]:
        """What format_decoder puts before the target, for a decoder to answer `source` (generation)."""
        return [self.bos_id, *source, self.sep_id]

    def format_encoder_decoder(self, ex: Example) -> tuple[list[int], list[int]]:
        return list(ex.source), [self.bos_id, *ex.target, self.eos_id]

    def format_encoder(self, ex: Example) -> tuple[list[int], Any]:
        """Per-token labels (source and target aligned one to one), or one class id."""
        if self.sequence_labels:
            return list(ex.source), self.class_of(ex)
        if len(ex.source) != len(ex.target):
            raise ValueError(f"{self.name}: per-token labels need len(source) == len(target)")
        return list(ex.source), list(ex.target)

    def class_of(self, ex: Example) -> int:
        raise NotImplementedError(f"{self.name} has no sequence labels")

    # ---- loss and metrics -------------------------------------------------------------------

    @classmethod
    def metric(cls, name: str) -> Metric:
        """What the score `name` means ('accuracy@64' reads accuracy): as the task declares it in
        `metrics`; loss and attention entropy, which every task reports, as built in."""
        base = name.split("@")[0]
        found = cls.metrics.get(base) or EVERY_TASK.get(base)
        if found is None:
            raise WorkbenchError(f"task {cls.name!r} declares no metric {base!r}; it reports "
                                 f"{', '.join([*cls.metrics, 'loss'])}")
        return found

    def scored_ids(self, batch: dict[str, Tensor], family: str) -> tuple[Tensor, Tensor]:
        """The target ids [B, T] a family's logits are scored against, and the scored mask [B, T]
        (no model needed: what `scored` compares with, and what `chance` counts)."""
        if family == "decoder":
            return batch["tokens"][:, 1:], batch["loss_mask"][:, 1:]  # logits at t-1 predict token t
        if family == "encoder_decoder":
            return batch["tgt"][:, 1:], batch["tgt_mask"][:, 1:]  # teacher forcing feeds tgt[:, :-1]
        if family == "encoder":
            labels = batch["labels"]
            labels = labels[:, None] if labels.dim() == 1 else labels  # one class per sequence
            return labels, labels != IGNORE
        raise SpecError("model.family", f"unknown family {family!r}", FAMILIES)

    def scored(self, model, batch: dict[str, Tensor], family: str) -> tuple[Tensor, Tensor, Tensor]:
        """Run the model; return logits [B, T, C], targets [B, T] and the scored mask [B, T]."""
        device = next(model.parameters()).device
        b = {k: v.to(device) for k, v in batch.items()}
        targets, mask = self.scored_ids(b, family)
        if family == "decoder":
            logits = model(b["tokens"], b["padding_mask"])[:, :-1]  # predicts tokens[:, 1:]
        elif family == "encoder_decoder":
            logits = model(b["src"], b["tgt"][:, :-1], src_padding_mask=b["src_mask"],
                           tgt_padding_mask=b["tgt_mask"][:, :-1])
        elif b["labels"].dim() == 1:  # one class per sequence
            logits = model.classify(b["tokens"], b["padding_mask"])[:, None]
        else:
            logits = model(b["tokens"], b["padding_mask"])
        return logits, targets, mask

    def loss(self, model, batch: dict[str, Tensor], family: str) -> Tensor:
        """Mean cross-entropy over scored target tokens."""
        logits, targets, mask = self.scored(model, batch, family)
        # Masked mean over all positions: selecting the scored ones (logits[mask]) would make the
        # host wait for the GPU in every training step (the selection's size is data).
        nll = token_nll(logits, targets)  # [B, T]
        return (nll * mask).sum() / mask.sum()

    @torch.no_grad()
    def evaluate(self, model, batches: Sequence[dict[str, Tensor]], family: str) -> dict[str, float]:
        """Every metric in `metrics`, plus "loss" (nats per target token). Teacher-forced
        exact match equals greedy-decoding exact match: a row is exact when every target token
        (and <eos>) is the argmax given a correct prefix, which is what greedy decoding emits.
        A learned-position model evaluated past its table raises PositionLimitError."""
        was_training = model.training
        model.eval()
        try:
            tally = Tally(eos_id=self.eos_id)
            for batch in batches:
                tally.add(*self.scored(model, batch, family))
            scores = tally.scores()
            scores.update(self.extra_metrics(model, batches, family, scores))
        finally:
            model.train(was_training)
        return {name: scores[name] for name in [*self.metrics, "loss"]}

    def extra_metrics(self, model, batches, family: str, scores: dict[str, float]) -> dict[str, float]:
        """Metrics beyond loss / accuracy / exact_match (e.g. BLEU on generations)."""
        return {}

    # ---- chance level -----------------------------------------------------------------------

    def chance(self, family: str, length: int) -> dict[str, float]:
        """What a predictor that ignores the input's content scores at evaluation length `length`:
        the level below which a model has learned nothing (metric -> score, "loss" included;
        metrics without a chance level are absent).

        The predictor knows the layout (how long the row is and which position it predicts)
        but no token: at each scored position it outputs the distribution of the target there,
        so its accuracy is the share of the most frequent target per position, its loss the
        entropy of that distribution, and its exact match the probability of the most likely
        whole target. It does not read earlier target tokens either. This default counts the
        held-out set itself (a plug-in estimate: slightly optimistic for accuracy, slightly low
        for loss, so the gate errs towards "did not learn"); tasks with a closed form override it.
        """
        scores = counted_blind_scores(self.scored_targets(self.eval_examples(length), family))
        return {name: scores[name] for name in [*self.metrics, "loss"] if name in scores}

    def baselines(self, family: str, length: int) -> dict[str, dict[str, float]]:
        """Named predictors that cannot solve the task, each with its scores at evaluation
        length `length` (baseline -> metric -> score): the learned-at-all gate measures a group
        against the strongest of them on each metric. The default is the input-ignoring one
        (`chance`); a task whose answer can be partly guessed without solving it (from the
        answer's own teacher-forced prefix, or from the input's symbols without their order)
        adds those predictors here, computed exactly or by Monte Carlo from its generator."""
        return {INPUT_IGNORING: self.chance(family, length)}

    def seen_baselines(self, family: str, length: int, consumed: Consumed) -> dict[str, dict[str, float]]:
        """Baselines fitted on what one run trained on (`consumed`), shown beside `baselines`: none here."""
        return {}

    def scored_targets(self, examples: Sequence[Example], family: str) -> list[list[int]]:
        """The target ids each example is scored on in `family`, in order (specials included)."""
        targets, mask = self.scored_ids(self.collate(examples, family), family)
        return [row[m].tolist() for row, m in zip(targets, mask)]

    def always_predictable(self, family: str) -> int:
        """Scored tokens per row beyond the example's target (the <eos> where a family scores
        it): its position follows from the layout, so a blind predictor gets it right."""
        ex = self.sample_examples()[0]
        return len(self.scored_targets([ex], family)[0]) - len(ex.target)

    # ---- generation -------------------------------------------------------------------------

    def generate(self, model, batch: dict[str, Tensor], family: str, max_new_tokens: int) -> list[list[int]]:
        """Greedy continuations of each row's source, cut at <eos> (target ids only)."""
        device = next(model.parameters()).device
        if family == "encoder_decoder":
            out = model.generate(batch["src"].to(device), max_new_tokens, eos_id=self.eos_id, pad_id=self.pad_id,
                                 bos_id=self.bos_id, src_padding_mask=batch["src_mask"].to(device))[:, 1:]
        elif family == "decoder":
            # The prompt is everything before the first scored token; generation wants it left-padded.
            starts = batch["loss_mask"].int().argmax(-1).tolist()
            prompts = [row[:s] for row, s in zip(batch["tokens"].tolist(), starts)]
            prompt = pad(prompts, self.pad_id, left=True).to(device)
            out = model.generate(prompt, max_new_tokens, eos_id=self.eos_id, pad_id=self.pad_id,
                                 padding_mask=real(prompts, left=True).to(device))[:, prompt.shape[1]:]
        else:
            raise SpecError("model.family", f"generation needs a decoder; got {family!r}", ("decoder", "encoder_decoder"))
        rows = []
        for row in out.tolist():
            rows.append(row[: row.index(self.eos_id)] if self.eos_id in row else row)
        return rows

    # ---- a readable example for attention maps ----------------------------------------------

    def sample_examples(self) -> list[Example]:
        """Examples shown in attention heatmaps; tasks with canonical sentences override."""
        return [self.example(rng_for(self.seed, SAMPLE_STREAM), self.params.train_length, training=False)]

    def sample(self, family: str | None = None) -> dict[str, Any]:
        """{"examples": [{source, source_ids, target, target_ids}], "batch": the examples
        formatted for `family` (when given), "batch_tokens": token strings of each batch input}."""
        examples = self.sample_examples()
        out: dict[str, Any] = {"examples": [
            {"source": self.decode(ex.source), "source_ids": list(ex.source),
             "target": self.decode(ex.target), "target_ids": list(ex.target)} for ex in examples
        ]}
        if family is not None:
            batch = self.collate(examples, family)
            out["batch"] = batch
            out["batch_tokens"] = {
                key: [self.decode(row) for row in value.tolist()]
                for key, value in batch.items() if key in ("tokens", "src", "tgt")
            }
        return out
