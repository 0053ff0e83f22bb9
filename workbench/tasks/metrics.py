"""What a task's evaluation scores: each built-in metric's declaration (its direction and range,
workbench.results.Metric), and the sums a teacher-forced evaluation adds up (`Task.evaluate`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from workbench.results import ATTENTION_ENTROPY, FIRST_TOKEN_ATTENTION, Metric

SHARE = (0.0, 1.0)
# Every built-in metric: the scores `Task` computes for every task (loss included), those the
# shipped tasks add, and the descriptive attention entropy. A task declares its own from these
# (`declared`) or with a Metric of its own; a report on a task no longer installed reads these.
METRICS: dict[str, Metric] = {
    "accuracy": Metric(higher_is_better=True, range=SHARE),
    "exact_match": Metric(higher_is_better=True, range=SHARE),
    "loss": Metric(higher_is_better=False, range=(0.0, math.inf)),  # nats per target token
    "bleu": Metric(higher_is_better=True, range=(0.0, 100.0)),
    "bpc": Metric(higher_is_better=False, range=(0.0, math.inf), description=(
        "bits per byte of the original text (lower is better): the mean loss in nats per token / ln 2 x the "
        "scored split's tokens per byte, so models with different tokenizers compare (the Pile's bits per "
        "byte, Gao et al. 2020); with the byte tokenizer the ratio is 1")),
    # declared without a range: its intervals and gate are unbounded
    "bpc_tail": Metric(higher_is_better=False, description=(
        "bpc over the window's tokens past the training length only, which no training window held "
        "(extrapolation; not measured at lengths up to the training length)")),
    "perplexity": Metric(higher_is_better=False, range=(1.0, math.inf), description=(
        "exp(loss), loss being the mean nats per token: per token, so it compares models of one tokenizer only")),
    "distinct_2": Metric(higher_is_better=True, range=SHARE, description=(
        "on the model's own continuations of evaluation prompts: distinct bigrams / all bigrams, over all "
        "continuations (Li et al. 2016, distinct-n; higher is more diverse; not measured with decode_samples: 0)")),
    "repetition_4": Metric(higher_is_better=False, range=SHARE, description=(
        "on the same continuations: the share of a continuation's 4-grams that repeat an earlier one, averaged "
        "(Welleck et al. 2020, rep-n; higher loops more; not measured with decode_samples: 0)")),
    "symbol_accuracy": Metric(higher_is_better=True, range=SHARE),
    ATTENTION_ENTROPY: Metric(higher_is_better=None, range=SHARE),
    FIRST_TOKEN_ATTENTION: Metric(higher_is_better=None, range=SHARE, description=(
        "the mean attention weight on the first key, over every layer, head and query that sees it and one "
        "more key (the attention sink); recorded with train.attention_entropy")),
}


def declared(*names: str) -> dict[str, Metric]:
    """The built-in declarations of `names`, in that order (a task's first metric is its primary one)."""
    return {name: METRICS[name] for name in names}


EVERY_TASK = declared("loss", ATTENTION_ENTROPY, FIRST_TOKEN_ATTENTION)  # what every task reports, or records when asked


def token_nll(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy in nats per token, [B, T], from logits [B, T, C] (targets < 0 score 0's
    class; callers mask them). Computed over the [B*T, C] rows: the class dimension stays the
    contiguous one, where a transposed [B, C, T] input made log-softmax stride across memory
    (5x slower forward + backward at a 2,048-token vocabulary on the CPU, 2x at bytes)."""
    rows = F.cross_entropy(logits.float().flatten(0, 1), targets.clamp(min=0).flatten(), reduction="none")
    return rows.view(targets.shape)


@dataclass
class Tally:
    """Sums over an evaluation set, so metrics weight every token / row equally. The sums stay
    on the model's device until `scores` (one wait for a GPU per evaluation, not one per sum
    and batch)."""

    eos_id: int | None = None  # symbol_accuracy leaves out targets equal to it
    _nll: list[Tensor] = field(default_factory=list)  # per batch: summed NLL (nats) over target tokens
    _counts: list[Tensor] = field(default_factory=list)  # per batch: COUNTS, in that order

    # target tokens; of them right under teacher forcing; targets other than <eos>; of them
    # right; rows with a target; of them rows whose every target token is right
    COUNTS = ("tokens", "correct", "symbols", "symbols_correct", "rows", "exact")

    def add(self, logits: Tensor, targets: Tensor, mask: Tensor) -> None:
        nll = token_nll(logits, targets)
        right = (logits.argmax(-1) == targets) | ~mask
        symbols = mask & (targets != self.eos_id) if self.eos_id is not None else mask
        scored_rows = mask.any(-1)
        self._nll.append((nll * mask).sum())
        self._counts.append(torch.stack([mask.sum(), (right & mask).sum(), symbols.sum(), (right & symbols).sum(),
                                         scored_rows.sum(), (right.all(-1) & scored_rows).sum()]))

    def scores(self) -> dict[str, float]:
        nll = sum(float(x) for x in torch.stack(self._nll).cpu()) if self._nll else 0.0
        counts = dict(zip(self.COUNTS, torch.stack(self._counts).sum(0).tolist() if self._counts else [0] * 6))
        ratio = lambda a, b: a / b if b else math.nan  # noqa: E731
        return {
            "loss": ratio(nll, counts["tokens"]),
            "accuracy": ratio(counts["correct"], counts["tokens"]),
            "exact_match": ratio(counts["exact"], counts["rows"]),
            "symbol_accuracy": ratio(counts["symbols_correct"], counts["symbols"]),
        }
