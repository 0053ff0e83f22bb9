"""recall: multi-query associative recall (MQAR; Arora et al. 2023, "Zoology").

Decoder layout (one row):

    <bos> k1 v1 k2 v2 ... kP vP  <gap> x gap  q1 a1 q2 a2 ... qQ aQ
          '---- P key-value pairs ----'        each q is a key from the context,
                                               a its value (the only scored tokens)

Keys are distinct within a row; values are drawn with replacement. A query sits at least
`gap + 2` positions after its key and reads the value `gap + 1` or more positions back, so
one layer of sliding-window attention with window <= gap + 1 cannot answer any query, while
full attention can. A stack of L windowed layers can relay information through the gap
tokens and reaches about L * (window - 1) back: choose gap >= L * window for a clean failure.

Encoder layout: the same row with each answer replaced by <mask>, labelled with its value.
Encoder-decoder: source = pairs, gap and queries; target = the answers in query order.
"""

from pydantic import Field, model_validator

from workbench import hookimpl
from workbench.tasks import IGNORE, Example, Task, TaskParams


class RecallParams(TaskParams):
    train_length: int = Field(8, gt=0, description="key-value pairs per row (eval_lengths: pairs at evaluation)")
    n_keys: int = Field(64, gt=0, description="key alphabet (keys in a row are distinct, so >= pairs)")
    n_values: int = Field(64, ge=2, description="value alphabet; chance accuracy is 1 / n_values")
    gap: int = Field(0, ge=0, description="filler tokens between the pairs and the queries (key-to-query distance knob)")
    n_queries: int | None = Field(None, gt=0, description="queries per row; default one per pair, in random order")

    @model_validator(mode="after")
    def _enough_keys(self):
        longest = max([self.train_length, *(self.eval_lengths or [])])
        if self.n_keys < longest:
            raise ValueError(f"n_keys={self.n_keys} cannot give {longest} distinct keys per row")
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
        self._set_vocab(["<gap>", "<mask>", *keys, *values])
        self.gap_id, self.mask_id = self.token_id["<gap>"], self.token_id["<mask>"]
        self.first_key, self.first_value = self.token_id["k0"], self.token_id["v0"]

    def example(self, rng, length, training):
        p = self.params
        n_queries = min(p.n_queries or length, length)
        keys = (rng.choice(p.n_keys, size=length, replace=False) + self.first_key).tolist()
        values = (rng.integers(0, p.n_values, size=length) + self.first_value).tolist()
        asked = rng.permutation(length)[:n_queries].tolist()
        pairs = [t for kv in zip(keys, values) for t in kv]
        source = pairs + [self.gap_id] * p.gap + [keys[i] for i in asked]
        return Example(tuple(source), tuple(values[i] for i in asked))

    def _split(self, ex: Example) -> tuple[list[int], list[int]]:
        n_queries = len(ex.target)
        return list(ex.source[:-n_queries]), list(ex.source[-n_queries:])

    def format_decoder(self, ex):
        context, queries = self._split(ex)
        tokens = [self.bos_id, *context]
        for q, a in zip(queries, ex.target):
            tokens += [q, a]
        return tokens, [False] * (len(context) + 1) + [False, True] * len(queries)

    def format_encoder(self, ex):
        context, queries = self._split(ex)
        tokens, labels = [self.bos_id, *context], [IGNORE] * (len(context) + 1)
        for q, a in zip(queries, ex.target):
            tokens += [q, self.mask_id]
            labels += [IGNORE, a]
        return tokens, labels


@hookimpl
def register_tasks():
    return [Recall]
