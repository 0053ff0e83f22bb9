"""text_lm: byte-level language modelling on a text file, or on Python's own source code.

Tokens are the 256 byte values (after the shared specials); a row is a window of
`train_length` consecutive bytes, and every byte after the first is predicted from the
ones before it. bpc is bits per byte (= per character for ASCII text): mean loss / ln 2.
bpc_tail is bpc over the bytes past the training length only (window indices train_length
.. length-1, which no training window held): at an evaluation length past training, bpc mixes
the familiar head of the window with the new tail; bpc_tail isolates extrapolation. It is
NaN at lengths up to train_length (no such bytes).

Default corpus, present on every machine with Python and needing no download: the files
in TRAIN_FILES and VALID_FILES below, read from the running interpreter's standard library
(`sysconfig.get_paths()["stdlib"]`). The split is by file, so validation code is code the
model never saw. With `path:` the corpus is that one file; its last `valid_fraction` of
bytes is the validation text. Evaluation windows are `n_eval` windows spread evenly over
the validation text (the same for every seed); training windows start at random offsets.
A tuning run (a study's `tune:`) never reads the validation text: it trains on the first
1 - `valid_fraction` of the training text and is scored on the rest.

Decoding metrics (claim E12: greedy decoding is stable but repetitive, sampling adds
diversity), unless `decode_samples` is 0: at every evaluation, the first `decode_samples`
evaluation windows are cut into a
prompt and a continuation of `decode_tokens` bytes (at most half the window) that the model writes with
the task's decoding strategy (greedy, or sampling with temperature / top-p, from a generator
seeded with the run's seed, through the KV cache). Prompt + continuation fill exactly one
window, so the model never runs past the length being evaluated. On the continuations:

    distinct_2    distinct byte bigrams / all bigrams, over all continuations (Li et al.
                  2016, "distinct-n"): higher = more diverse
    repetition_4  per continuation, the share of its 4-grams that repeat an earlier 4-gram of
                  the same continuation, averaged (Welleck et al. 2020, "rep-n"): higher = loops
"""

from __future__ import annotations

import math
import pathlib
import sysconfig
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from workbench import hookimpl
from workbench.errors import SpecError, WorkbenchError
from workbench.results import VALIDATION
from workbench.tasks import Example, Task, TaskParams

# Plain-file stdlib modules present in CPython 3.10 to 3.13 (~1.1 MB train, ~0.1 MB valid).
TRAIN_FILES = (
    "argparse.py", "ast.py", "calendar.py", "configparser.py", "contextlib.py", "csv.py",
    "dataclasses.py", "difflib.py", "enum.py", "fractions.py", "functools.py", "heapq.py",
    "inspect.py", "random.py", "shutil.py", "string.py", "tempfile.py", "textwrap.py",
    "threading.py", "traceback.py", "weakref.py",
)
VALID_FILES = ("copy.py", "pprint.py", "queue.py", "statistics.py", "tokenize.py")


def byte_name(b: int) -> str:
    """Readable, unique token string of a byte (for vocab listings and heatmaps)."""
    if b == 0x20:
        return "␣"
    if b == 0x0A:
        return "\\n"
    if 0x21 <= b <= 0x7E:
        return chr(b)
    return f"<0x{b:02X}>"


def read_files(root: pathlib.Path, names: tuple[str, ...]) -> np.ndarray:
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise WorkbenchError(
            f"task text_lm: the default corpus needs {', '.join(missing)} under {root}; "
            "this Python lacks them, so set task.path to a text file"
        )
    return np.frombuffer(b"\n".join((root / n).read_bytes() for n in names), dtype=np.uint8)


class TextParams(TaskParams):
    train_length: int = Field(128, ge=2, description="bytes per training window (the model's sequence length)")
    path: str | None = Field(None, description="a text file to model; default: Python stdlib sources (see module)")
    valid_fraction: float = Field(0.1, gt=0, lt=1, description="with path: share of the file (its end) held out; "
                                  "in tuning runs also the share of the training text (its end) they validate on")
    decode_strategy: Literal["greedy", "sample"] = Field(
        "greedy", description="how continuations for distinct_2 / repetition_4 are decoded")
    temperature: float = Field(1.0, gt=0, description="sample: divide logits by this (< 1 sharper, > 1 flatter)")
    top_p: float | None = Field(None, gt=0, le=1, description="sample: keep the smallest set of bytes reaching this "
                                "probability (nucleus); null: all")
    decode_samples: int = Field(16, ge=0, description="evaluation windows continued by the model per evaluation "
                                "(0: no generation; distinct_2 and repetition_4 are NaN)")
    decode_tokens: int = Field(32, ge=4, description="bytes the model writes after each prompt (the window's "
                               "last bytes; at most half the window)")


def ngrams(seq: Sequence[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(seq[i: i + n]) for i in range(len(seq) - n + 1)]


def distinct_n(seqs: Sequence[Sequence[int]], n: int) -> float:
    """Distinct n-grams / all n-grams, pooled over `seqs` (NaN when none has n tokens)."""
    grams = [g for s in seqs for g in ngrams(s, n)]
    return len(set(grams)) / len(grams) if grams else math.nan


def repetition_n(seqs: Sequence[Sequence[int]], n: int) -> float:
    """Mean over `seqs` of the share of n-grams that repeat an earlier n-gram of the same
    sequence (1 - distinct / all, per sequence); sequences shorter than n are skipped."""
    shares = [1 - len(set(g)) / len(g) for g in (ngrams(s, n) for s in seqs) if g]
    return float(np.mean(shares)) if shares else math.nan


class TextLM(Task):
    """Byte-level language model on a text file (default: Python's stdlib sources)."""

    name = "text_lm"
    Params = TextParams
    families = ("decoder",)
    metrics = {"bpc": False, "bpc_tail": False, "perplexity": False, "distinct_2": True, "repetition_4": False}
    hold_out = False  # the split is by file (or by position in the file), not by example

    def __init__(self, params: TextParams, **kw):
        super().__init__(params, **kw)
        self._set_vocab([byte_name(b) for b in range(256)])
        self.first_byte = self.token_id[byte_name(0)]
        self.train_text, self.valid_text = self._load()
        if self.split == VALIDATION:  # a tuning run: score on the training text's tail, never on the evaluation text
            cut = int(len(self.train_text) * (1 - self.params.valid_fraction))
            self.train_text, self.valid_text = self.train_text[:cut], self.train_text[cut:]

    def text_words(self, text: str) -> list[str]:
        return [byte_name(b) for b in text.encode("utf-8")]  # the vocabulary's bytes, not its ids

    def words_text(self, words: Sequence[str]) -> str:
        return bytes(self.token_id[w] - self.first_byte for w in words).decode("utf-8", errors="replace")

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        if self.params.path is None:
            root = pathlib.Path(sysconfig.get_paths()["stdlib"])
            return read_files(root, TRAIN_FILES), read_files(root, VALID_FILES)
        path = pathlib.Path(self.params.path).expanduser()
        if not path.is_file():
            raise SpecError("task.path", f"no such file: {path}")
        data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        cut = int(len(data) * (1 - self.params.valid_fraction))
        return data[:cut], data[cut:]

    def _window(self, text: np.ndarray, start: int, length: int) -> Example:
        return Example((), tuple((text[start: start + length].astype(np.int64) + self.first_byte).tolist()))

    def _check_fits(self, text: np.ndarray, length: int, which: str) -> None:
        if len(text) < length:
            raise WorkbenchError(f"task text_lm: the {which} text has {len(text)} bytes, fewer than length {length}")

    def example(self, rng, length, training):
        text = self.train_text if training else self.valid_text
        self._check_fits(text, length, "training" if training else "validation")
        return self._window(text, int(rng.integers(0, len(text) - length + 1)), length)

    def eval_examples(self, length):
        if length not in self._eval_cache:
            self._check_fits(self.valid_text, length, "validation")
            starts = np.linspace(0, len(self.valid_text) - length, self.params.n_eval).astype(int)
            self._eval_cache[length] = [self._window(self.valid_text, int(s), length) for s in starts]
        return self._eval_cache[length]

    def format_decoder(self, ex):
        return list(ex.target), [False] + [True] * (len(ex.target) - 1)

    def decoder_prompt(self, source):
        return list(source)  # a text is continued as it stands: no <bos>, no <sep>

    def extra_metrics(self, model, batches, family, scores):
        return {"bpc": scores["loss"] / math.log(2), "bpc_tail": self.tail_bpc(model, batches, family),
                "perplexity": math.exp(scores["loss"]), **self.decoding_metrics(model, batches)}

    def tail_bpc(self, model, batches, family) -> float:
        """Bits per byte over the window's bytes at indices >= train_length (NaN when none)."""
        # scored() drops the first byte (it has no prediction): window index = scored index + 1.
        first = self.params.train_length - 1
        if batches[0]["tokens"].shape[1] - 1 <= first:
            return math.nan
        nats = count = 0.0
        for batch in batches:  # a second forward, only at lengths past training
            logits, targets, mask = (x[:, first:] for x in self.scored(model, batch, family))
            loss = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")  # [B, tail]
            nats += float(loss[mask].sum())
            count += int(mask.sum())
        return nats / count / math.log(2)

    def continuations(self, model, batches) -> list[list[int]]:
        """The model's continuations of the first `decode_samples` evaluation windows (their
        last `decode_tokens` bytes, at most half the window, replaced by what the model writes)."""
        p = self.params
        windows = torch.cat([b["tokens"] for b in batches])[: p.decode_samples]  # [S, length], no padding
        new = min(p.decode_tokens, windows.shape[1] // 2)
        prompt = windows[:, : windows.shape[1] - new]
        device = next(model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(self.seed)
        out = model.generate(prompt.to(device), new, strategy=p.decode_strategy,
                             temperature=p.temperature, top_p=p.top_p, use_cache=True, generator=generator)
        return out[:, prompt.shape[1]:].tolist()

    def decoding_metrics(self, model, batches) -> dict[str, float]:
        if self.params.decode_samples == 0:  # generation off (e.g. a scoring-only model)
            return {"distinct_2": math.nan, "repetition_4": math.nan}
        written = self.continuations(model, batches)
        return {"distinct_2": distinct_n(written, 2), "repetition_4": repetition_n(written, 4)}

    def chance(self, family, length):
        """A unigram model's scores: byte frequencies of the training text (add-one smoothed
        over the 256 bytes), scored on the bytes the evaluation windows score. Decoding
        metrics have no chance level."""
        counts = np.bincount(self.train_text, minlength=256) + 1.0
        log_p = np.log(counts / counts.sum())
        scored = [np.asarray(row) - self.first_byte for row in self.scored_targets(self.eval_examples(length), family)]
        loss = float(-log_p[np.concatenate(scored)].mean())
        return {"loss": loss, "bpc": loss / math.log(2), "perplexity": math.exp(loss)}


@hookimpl
def register_tasks():
    return [TextLM]
