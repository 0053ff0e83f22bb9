"""recall: multi-query associative recall (MQAR; Arora et al. 2023, "Zoology").

One row (decoder and encoder alike):

    <bos> k1 v1 k2 v2 ... kP vP  <gap> x gap  q1 q2 ... qQ
          '---- P key-value pairs ----'        each q is a key of the row; the label at q
                                               is its value (the only scored positions)

Keys and values come from disjoint alphabets and are distinct within a row, so the answer to
a query is determined by the context and "some value of the row" scores 1 / P. As in the
Zoology generator, the answer is a label on the query position and never enters the input:
with answers teacher-forced into the row ("q1 a1 q2 a2 ..."), a model that only counts which
values were already given answers later queries by elimination (the last one for free).

A query sits at least `gap + 2` positions after its key and `gap + 1` after the value, so one
layer of sliding-window attention with window <= gap + 1 cannot answer any query, while full
attention can. A stack of L windowed layers can relay information through the gap tokens and
reaches about L * (window - 1) back: choose gap >= L * window for a clean failure.

Encoder-decoder: source = pairs, gap and queries; target = the answers in query order.
"""

import math

import numpy as np
from pydantic import Field, model_validator

from workbench import hookimpl
from workbench.tasks import IGNORE, Example, Task, TaskParams, blind_scores


class RecallParams(TaskParams):
    train_length: int = Field(4, gt=0, description="key-value pairs per row (eval_lengths: pairs at evaluation)")
    n_keys: int = Field(16, gt=0, description="key alphabet (keys in a row are distinct, so >= pairs)")
    n_values: int = Field(16, ge=2, description="value alphabet (values in a row are distinct, so >= pairs)")
    gap: int = Field(0, ge=0, description="filler tokens between the pairs and the queries (key-to-query distance knob)")
    n_queries: int | None = Field(None, gt=0, description="queries per row; default one per pair, in random order")

    @model_validator(mode="after")
    def _enough_symbols(self):
        longest = max([self.train_length, *(self.eval_lengths or [])])
        for name in ("n_keys", "n_values"):
            if getattr(self, name) < longest:
                raise ValueError(f"{name}={getattr(self, name)} cannot give {longest} distinct symbols per row")
        return self


class Recall(Task):
    """Multi-query associative recall: answer queries about earlier key-value pairs."""

    name = "recall"
    Params = RecallParams
    families = ("decoder", "encoder", "encoder_decoder")

    def __init__(self, params: RecallParams, **kw):
        super().__init__(params, **kw)
        keys = [f"k{i}" for i in range(params.n_keys)]
        values = [f"v{i}" for i in range(params.n_values)]
        self._set_vocab(["<gap>", *keys, *values])
        self.gap_id = self.token_id["<gap>"]
        self.first_key, self.first_value = self.token_id["k0"], self.token_id["v0"]

    def example(self, rng, length, training):
        p = self.params
        n_queries = min(p.n_queries or length, length)
        keys = (rng.choice(p.n_keys, size=length, replace=False) + self.first_key).tolist()
        values = (rng.choice(p.n_values, size=length, replace=False) + self.first_value).tolist()
        asked = rng.permutation(length)[:n_queries].tolist()
        pairs = [t for kv in zip(keys, values) for t in kv]
        source = pairs + [self.gap_id] * p.gap + [keys[i] for i in asked]
        return Example(tuple(source), tuple(values[i] for i in asked))

    def format_encoder(self, ex):
        """<bos> source, labelled with the answer at each query (the last len(target) tokens)."""
        n_context = len(ex.source) - len(ex.target)
        return [self.bos_id, *ex.source], [IGNORE] * (n_context + 1) + list(ex.target)

    def collate(self, examples, family):
        # A decoder reads the same labelled rows as the encoder (causally): labels sit on the
        # query positions instead of being the next input token, which would reveal answers.
        return super().collate(examples, "encoder" if family == "decoder" else family)

    def scored(self, model, batch, family):
        # Per-position labels, no shift: the base class's per-token encoder scoring; whether
        # attention is causal is the model's business (its family), not the batch's.
        return super().scored(model, batch, "encoder" if family == "decoder" else family)

    def scored_ids(self, batch, family):
        return super().scored_ids(batch, "encoder" if family == "decoder" else family)

    def chance(self, family, length):
        """Closed form for `length` pairs and Q queries per row: the answer is one of the row's
        `length` values, so a predictor that knows which values the row holds but not which
        key each belongs to scores 1 / length per query (loss ln length), and a whole row with
        1 / (length * (length - 1) * ... , Q factors). This is recall's plateau (Zoology): a
        predictor blind to the row entirely (1 / n_values) is beaten without learning any
        association, so it would not show whether a model learned the task."""
        queries = min(self.params.n_queries or length, length)
        uniform = [(1.0, np.full(length, 1.0 / length))] * queries
        certain = [(1.0, np.ones(1))] * self.always_predictable(family)
        return blind_scores(uniform + certain, 1.0 / math.perm(length, queries))


@hookimpl
def register_tasks():
    return [Recall]
