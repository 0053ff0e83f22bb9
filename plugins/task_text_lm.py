"""text_lm: language modelling on a corpus (default: Python's own source code), by byte or subword.

Tokens are the tokenizer's (after the shared specials): the 256 byte values by default, a
byte-level BPE trained on the training documents (`tokenizer: bpe`, `vocab_size`), or a
HuggingFace tokenizer.json the study names (workbench.tasks.tokens). A row is a window of
`train_length` consecutive tokens, and every token after the first is predicted from the
ones before it. `loss` is nats per token; bpc is bits per byte of the original text, so
that models with different tokenizers compare: loss / ln 2 * (tokens / bytes of the scored
split), the Pile's bits per byte (Gao et al. 2020, section 4.1); with bytes the ratio is 1.
bpc_tail is bpc over the tokens past the training length only (window indices train_length
.. length-1, which no training window held): at an evaluation length past training, bpc mixes
the familiar head of the window with the new tail; bpc_tail isolates extrapolation. It is
NaN at lengths up to train_length (no such tokens).

Default corpus, present on every machine with Python and needing no download: the files
in TRAIN_FILES and VALID_FILES below, read from the running interpreter's standard library
(`sysconfig.get_paths()["stdlib"]`). The split is by file, so validation code is code the
model never saw. With `path:` the corpus is a file, a folder or glob of files, jsonl or
parquet records (`text_field`) or a saved HuggingFace dataset, split by document
(workbench.tasks.corpus; one plain file is cut by position: its last `valid_fraction` of
bytes is the validation text), after its exact or near duplicate documents are removed when
`dedupe` says so; a relative path is relative to the study file. Such a
corpus is tokenized once into shards on disk and read by memory map, so a run's memory
does not grow with the corpus (`workbench prepare`, or the first run that needs it).
Evaluation windows are `n_eval` windows spread evenly over the validation text (the same
for every seed); training windows start at random offsets.
A tuning run (a study's `tune:`) never reads the validation text: it trains on the first
1 - `valid_fraction` of the training text and is scored on the rest.

Baselines (shown beside every group in a report's Learned section): interpolated Witten-Bell
n-gram models (workbench.tasks.ngram) at the tokenizer's granularity, scored on exactly the
evaluation windows in the same units. `baselines`: the unigram (input-ignoring) and n = 2, 3, 4,
fitted on the whole training text, as context. `seen_baselines`: "2-gram (seen)", fitted on the
training text one run read, the learned gate's (`gate_baselines`).

Why a 2-gram gates: a bigram table is exactly what a transformer computes when no information
moves between positions, the zero-layer transformer of Elhage et al. (2021, "A Mathematical
Framework for Transformer Circuits"), and the stage training passes through before attention
learns to use context (Bietti et al. 2023, "Birth of a Transformer: A Memory Viewpoint"). A
model below it has learned no more than statistics of one token; beating it means the model
reads earlier tokens. The 3- and 4-gram are shown, not gated: how far past local statistics
a model gets is the study's question, not a precondition for comparing two models.

Why fitted on what the run read: language-model evaluation fits its n-gram baseline on the
neural model's own training data (Bengio et al. 2003, "A Neural Probabilistic Language Model";
the One Billion Word benchmark's Kneser-Ney 5-gram, Chelba et al. 2013), so the comparison asks
which model got more out of the same text. We follow it, the data being what one run consumed:
the first S x B windows of its seed's stream for S steps of B windows (`train_batch`; counted
from the run's recorded `train_tokens`, so early stopping and budgets are included). A few CPU
minutes read well under one pass over the split, and a table of the whole split would know text
the model never saw. Each position the windows cover counts once (`ngram.covering`), as an
n-gram is fitted on a corpus once however many epochs a network trains: a run that covered the
split gets the whole split's 2-gram. Fitted per seed (each seed's stream is its own).

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

import functools
import hashlib
import math
import os
import pathlib
import sys
import sysconfig
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, field_validator, model_serializer, model_validator

from workbench import hookimpl
from workbench.errors import SpecError, WorkbenchError, WorkbenchWarning
from workbench.results import VALIDATION
from workbench.tasks import (INPUT_IGNORING, LANGUAGE_MODEL, SPECIALS, TRAIN_STREAM, Consumed, Example, Task, TaskParams,
                             declared, rng_for)
from workbench.tasks.baselines import cached
from workbench.tasks.corpus import (
    Document,
    Source,
    document_texts,
    file_pieces,
    find_duplicates,
    has_wildcard,
    names_anything,
)
from workbench.tasks.metrics import token_nll
from workbench.tasks.model_tokenizer import model_tokenizer
from workbench.tasks.ngram import CHUNK, FIT_TOKENS, WittenBell, covering, fits
from workbench.tasks.tokens import (
    ByteTokenizer,
    HFTokenizer,
    Shards,
    Texts,
    prepare,
    prepared,
)

# Plain-file stdlib modules present in CPython 3.10 to 3.13 (~1.1 MB train, ~0.1 MB valid).
TRAIN_FILES = (
    "argparse.py", "ast.py", "calendar.py", "configparser.py", "contextlib.py", "csv.py",
    "dataclasses.py", "difflib.py", "enum.py", "fractions.py", "functools.py", "heapq.py",
    "inspect.py", "random.py", "shutil.py", "string.py", "tempfile.py", "textwrap.py",
    "threading.py", "traceback.py", "weakref.py",
)
VALID_FILES = ("copy.py", "pprint.py", "queue.py", "statistics.py", "tokenize.py")


NGRAM_ORDERS = (2, 3, 4)  # the n-gram baselines (n = 1 is the unigram, `chance`)
SEEN_BIGRAM = "2-gram (seen)"  # the 2-gram of the training text one run read: the gate's


def stdlib_root() -> pathlib.Path:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    missing = [n for n in (*TRAIN_FILES, *VALID_FILES) if not (root / n).is_file()]
    if missing:
        raise WorkbenchError(
            f"task text_lm: the default corpus needs {', '.join(missing)} under {root}; "
            "this Python lacks them, so set task.path to a text file"
        )
    return root


def read_files(root: pathlib.Path, names: tuple[str, ...]) -> np.ndarray:
    return np.frombuffer(b"\n".join((root / n).read_bytes() for n in names), dtype=np.uint8)


def stdlib_texts() -> Texts:
    """The default corpus as documents (one per file), for a tokenizer other than bytes."""
    root = stdlib_root()
    stats = [(n, os.stat(root / n).st_size) for n in (*TRAIN_FILES, *VALID_FILES)]
    return Texts(hashlib.blake2b(repr((str(root), stats)).encode(), digest_size=16).hexdigest(),
                 lambda: document_texts([Document(root / n, n) for n in TRAIN_FILES], "text"),
                 lambda: document_texts([Document(root / n, n) for n in VALID_FILES], "text"))


def source_texts(source: Source, valid_fraction: float) -> Texts:
    """A `path` corpus as the two splits' texts; the files are listed, deduplicated and split only
    when the shards are written (a prepared corpus is found from its files' sizes and times).
    The key holds `dedupe` only when it removes something, so folders written before it keep theirs."""
    split = functools.cache(lambda: source.split_and_duplicates(valid_fraction))

    def part(which: int):
        if split()[0] is None:  # one plain text file (named, or alone in its folder), cut by position
            (file,) = source.files()
            cut = int(file.stat().st_size * (1 - valid_fraction))
            return file_pieces(file, *((0, cut), (cut, None))[which])
        return document_texts(split()[0][which], source.text_field)

    def duplicates() -> dict:
        documents, found = split()
        if documents is None:
            return {"dedupe": source.dedupe, "documents": 1, "exact": 0, "near": 0}
        if found is None:  # dedupe none removes nothing; the exact copies it keeps are counted, for the message
            found = find_duplicates([*documents[0], *documents[1]], source.text_field, "none")
        return found.record()

    settings = f"{source.fingerprint()}|{valid_fraction}" + (f"|{source.dedupe}" if source.dedupe != "none" else "")
    key = hashlib.blake2b(settings.encode(), digest_size=16).hexdigest()
    return Texts(key, lambda: part(0), lambda: part(1), duplicates=duplicates)


def duplicates_said(record: dict | None) -> str:
    """What `prepare` says of the duplicate documents in meta.json's record ("" for none to speak of)."""
    if record is None:  # a folder written before dedupe
        return ""
    dedupe = record["dedupe"]
    if record["documents"] == 1:
        return "one document (a single file, cut by position: nothing to deduplicate); " if dedupe != "none" else ""
    documents, exact, near = (f"{record[k]:,}" for k in ("documents", "exact", "near"))
    if dedupe == "near":
        return f"{documents} documents, {exact} exact and {near} near duplicates removed before the split; "
    if dedupe == "exact":
        return f"{documents} documents, {exact} exact duplicates removed before the split; "
    if record["exact"]:
        return (f"{documents} documents, {exact} exact duplicate documents kept; task.dedupe: exact or near removes "
                "them; ")
    return ""


class TextParams(TaskParams):
    train_length: int = Field(128, ge=2, description="tokens per training window (the model's sequence length)")
    path: str | None = Field(None, description="the corpus: a text file, a folder or glob of files, .jsonl / .parquet "
                             "records or a saved `datasets` folder, relative to the study file; default: Python "
                             "stdlib sources (see module)")
    text_field: str = Field("text", description="jsonl / parquet / datasets: the field holding a document's text")
    if_missing: Literal["error", "default"] = Field(
        "error", description="when `path` names nothing on this machine: error, or default: train on the default "
        "corpus (Python stdlib sources, by byte) instead, with a warning; such runs keep if_missing in their task "
        "section, without path")
    tokenizer: str = Field("bytes", description="bytes, bpe (trained on the training documents) or a "
                           "tokenizer.json path (relative to the study file)")
    folder: str | None = Field(None, description="where a relative path and tokenizer.json lie (relative to the study "
                               "file): by default the study file's folder. Not part of a run's id: a study keeps its "
                               "run ids in every clone and folder it is run from, and on a machine whose corpora lie "
                               "elsewhere (give that folder here)")
    vocab_size: int = Field(4096, ge=257, le=2**20, description="bpe: the most tokens the trained vocabulary holds")
    valid_fraction: float = Field(0.1, gt=0, lt=1, description="with path: share of the documents held out (of a "
                                  "single file: its end); in tuning runs also the share of the training text (its "
                                  "end) they validate on")
    dedupe: Literal["none", "exact", "near"] = Field(
        "none", description="with path: duplicate documents removed before the split, keeping of each group the "
        "document whose name sorts first (one plain file is one document: nothing to remove). none: keep all (prepare "
        "counts the exact copies); exact: documents equal after Unicode NFC and whitespace folding are kept once; "
        "near: exact, then documents whose lower-cased word 5-grams have an estimated Jaccard similarity >= 0.8 to a "
        "kept one (MinHash with LSH, 128 permutations, fixed seed; Lee et al. 2022)")
    decode_strategy: Literal["greedy", "sample"] = Field(
        "greedy", description="how continuations for distinct_2 / repetition_4 are decoded")
    temperature: float = Field(1.0, gt=0, description="sample: divide logits by this (< 1 sharper, > 1 flatter)")
    top_p: float | None = Field(None, gt=0, le=1, description="sample: keep the smallest set of bytes reaching this "
                                "probability (nucleus); null: all")
    decode_samples: int = Field(16, ge=0, description="evaluation windows continued by the model per evaluation "
                                "(0: no generation; distinct_2 and repetition_4 are NaN)")
    decode_tokens: int = Field(32, ge=4, description="tokens the model writes after each prompt (the window's "
                               "last tokens; at most half the window)")

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: str) -> str:
        if value not in ("bytes", "bpe") and not value.endswith(".json"):
            raise ValueError(f"tokenizer must be bytes, bpe or a tokenizer.json path, got {value!r}")
        return value

    @model_validator(mode="after")
    def _dedupe_needs_path(self):
        if self.dedupe != "none" and self.path is None:
            raise SpecError("task.dedupe", f"{self.dedupe} removes duplicate documents of a corpus named by task.path; "
                                           "the default corpus (no path) has none: leave dedupe out")
        return self

    def located(self, name: str) -> str:
        """A file the section names (`path`, a tokenizer.json), where it lies on this machine."""
        return os.path.join(self.folder or "", os.path.expanduser(name))

    @model_serializer(mode="wrap")
    def _unchanged_ids(self, handler) -> dict[str, Any]:
        """Fields added after runs were stored stay out of the task section at their default,
        so the runs of every earlier study keep their ids."""
        out = handler(self)
        return {k: v for k, v in out.items() if k not in LATER_FIELDS or v != type(self).model_fields[k].default}


LATER_FIELDS = ("text_field", "if_missing", "tokenizer", "vocab_size", "dedupe", "folder")
FALLBACK_DROPS = ("path", "text_field", "tokenizer", "vocab_size", "dedupe", "folder")  # what the default corpus does not use


def window_start(rng: np.random.Generator, text: np.ndarray, length: int) -> int:
    """Where a window of `length` tokens drawn from `text` starts: anywhere it fits."""
    return int(rng.integers(0, len(text) - length + 1))


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
    """A language model on a corpus (default: Python's stdlib sources, by byte)."""

    name = "text_lm"
    Params = TextParams
    families = ("decoder",)
    metrics = declared("bpc", "bpc_tail", "perplexity", "distinct_2", "repetition_4")
    hold_out = False  # the split is by document (or by position in one file), not by example
    evaluation_only = ("decode_strategy", "temperature", "top_p", "decode_samples", "decode_tokens")
    gate_baselines = (SEEN_BIGRAM,)  # why this one: the module docstring
    claim_kind = LANGUAGE_MODEL
    location_params = ("folder",)
    baselines_text = (f"interpolated Witten-Bell n-gram models at the tokenizer's granularity, scored on the same "
                      f"evaluation windows: {INPUT_IGNORING} (the unigram) and the "
                      f"{', '.join(f'{n}-gram' for n in NGRAM_ORDERS)} of the whole training text, shown as context; "
                      f"{SEEN_BIGRAM}, the 2-gram of the text each run read (per seed), which a model that reads no "
                      "earlier token can match")

    def __init__(self, params: TextParams, plan_only: bool = False, **kw):
        super().__init__(params, **kw)
        self.first_token = len(SPECIALS)  # token id of the tokenizer's id 0
        shards = None
        if params.path is None and params.tokenizer == "bytes":  # small: read whole, as always
            root = stdlib_root()
            self.train_text, self.valid_text = read_files(root, TRAIN_FILES), read_files(root, VALID_FILES)
            self.tokenizer = ByteTokenizer()
            self.corpus_key = f"stdlib:{stdlib_texts().fingerprint}"  # the files' names, sizes and times
            names, ratios = self.tokenizer.token_names(), (1.0, 1.0)
        elif (shards := self.shards(prepare_now=not plan_only)) is not None:
            self.train_text, self.valid_text = shards.tokens("train"), shards.tokens("val")
            self.tokenizer = shards.tokenizer()
            self.corpus_key = shards.folder.name
            names = [n if n not in SPECIALS else f"{n}#{i}" for i, n in enumerate(self.tokenizer.token_names())]
            ratios = (shards.tokens_per_byte("train"), shards.tokens_per_byte("val"))
        else:  # planning a run before the corpus is tokenized (`planned`)
            self.train_text, self.valid_text = (np.broadcast_to(np.uint8(0), (n,)) for n in self.split_bytes())
            if params.tokenizer == "bytes":
                self.tokenizer = ByteTokenizer()
            elif params.tokenizer == "bpe":
                self.tokenizer = None  # not trained yet: model_tokens reads its declared size
            else:
                self.tokenizer = HFTokenizer.load(pathlib.Path(params.located(params.tokenizer)))
            self.corpus_key, names, ratios = "", [], (math.nan, math.nan)
        size = self.model_tokens()
        self._set_vocab(names + [f"<unused {i}>" for i in range(len(names), size)])
        self.tokens_per_byte = ratios[1]  # of the split scored
        if self.split == VALIDATION:  # a tuning run: score on the training text's tail, never on the evaluation text
            cut = int(len(self.train_text) * (1 - self.params.valid_fraction))
            self.train_text, self.valid_text = self.train_text[:cut], self.train_text[cut:]
            self.tokens_per_byte = ratios[0]

    @classmethod
    def planned(cls, params: TextParams) -> TextLM:
        """Without tokenizing: a corpus not yet prepared is checked as far as its file sizes
        tell (task.path names files, a tokenizer.json loads, each split holds at least a
        window's length in bytes, which bounds its tokens), and its texts are zero tokens of
        those byte counts, for the shapes of batches. `workbench prepare` (or a run) tokenizes."""
        return cls(params, seed=0, plan_only=True)

    def model_tokens(self) -> int:
        """The tokenizer's ids the model has rows for, known before any tokenizing: a trained
        BPE's declared `vocab_size` (ids it did not use stay unused: a small corpus may stop
        the merges early), a named tokenizer.json's size, or the 256 bytes."""
        p = self.params
        if p.tokenizer == "bpe":
            return p.vocab_size
        return self.tokenizer.vocab_size

    def texts(self) -> Texts:
        """The corpus the task tokenizes, checked for the files it names."""
        p = self.params
        if p.tokenizer.endswith(".json") and not os.path.isfile(p.located(p.tokenizer)):
            raise SpecError("task.tokenizer", f"no such file: {p.located(p.tokenizer)}")
        if p.path is None:
            return stdlib_texts()
        path = p.located(p.path)
        if not os.path.exists(path) and not has_wildcard(path):
            raise SpecError("task.path", f"no such file or folder: {path}")
        return source_texts(Source(path, p.text_field, p.dedupe), p.valid_fraction)

    def split_bytes(self) -> tuple[int, int]:
        """Upper bounds of the two splits' text in bytes, from file sizes (workbench.tasks.corpus)."""
        p = self.params
        if p.path is None:
            root = stdlib_root()
            return tuple(sum(os.stat(root / n).st_size + 1 for n in names) for names in (TRAIN_FILES, VALID_FILES))
        return Source(p.located(p.path), p.text_field, p.dedupe).split_bytes(p.valid_fraction)

    def shards(self, progress: bool | None = None, prepare_now: bool = True) -> Shards | None:
        """The corpus tokenized on disk (tokenized first when it is not yet, with a bar on a
        terminal); without `prepare_now`, None when it is not yet."""
        p = self.params
        texts = self.texts()
        tokenizer = p.located(p.tokenizer) if p.tokenizer.endswith(".json") else p.tokenizer
        if not prepare_now:
            return prepared(texts, tokenizer, p.vocab_size)
        return prepare(texts, tokenizer, p.vocab_size, sys.stderr.isatty() if progress is None else progress)

    def prepare(self) -> str:
        shards = self.shards(progress=True) if self.params.path is not None or self.params.tokenizer != "bytes" else None
        if shards is None:
            return f"text_lm: the default corpus is read from {stdlib_root()} (nothing to prepare)"
        counts = shards.meta["splits"]
        return (f"text_lm: {duplicates_said(shards.meta.get('duplicates'))}{counts['train']['tokens']:,} training and "
                f"{counts['val']['tokens']:,} validation tokens ({shards.meta['dtype']}, vocabulary "
                f"{shards.meta['vocab_size']:,}) in {shards.folder}")

    @classmethod
    def resolve_paths(cls, section: dict[str, Any], folder: pathlib.Path) -> dict[str, Any]:
        """A relative `path` or tokenizer.json read from `folder` (the study file's): the section
        keeps them as written and says where they lie in `folder`, which run ids leave out, so a
        study keeps its run ids wherever it is cloned. The declared fallback: with `if_missing:
        default`, a `path` that names nothing here is replaced by the default corpus, by byte (a
        warning says so; the section keeps `if_missing`, so these runs have ids of their own), and
        a `path` that is here drops `if_missing` (the runs are those of the study as written, with
        the ids they have without it)."""
        out = dict(section)
        named = [out.get("path"), *([out["tokenizer"]] if str(out.get("tokenizer")).endswith(".json") else [])]
        if isinstance(out.get("folder"), str):  # given: where the corpora lie on this machine, relative to the study
            out["folder"] = os.path.join(folder, os.path.expanduser(out["folder"]))
        elif any(isinstance(v, str) and not os.path.isabs(os.path.expanduser(v)) for v in named):
            out["folder"] = str(folder)
        if out.get("if_missing") == "default" and isinstance(out.get("path"), str):
            where = os.path.join(out.get("folder") or "", os.path.expanduser(out["path"]))
            if names_anything(where):
                del out["if_missing"]
            else:
                warnings.warn(WorkbenchWarning(
                    f"task.path: nothing at {where} on this machine; as task.if_missing is 'default', the study "
                    "trains on the default corpus (Python stdlib sources, by byte) instead, and its runs record that"),
                    stacklevel=2)
                out = {k: v for k, v in out.items() if k not in FALLBACK_DROPS}
        return out

    def text_words(self, text: str) -> list[str]:
        """Text as the vocabulary's words, through the study's tokenizer (workbench.notebook)."""
        return [self.vocab[self.first_token + int(i)] for i in self.tokenizer.encode([text.encode("utf-8")])[0]]

    def words_text(self, words: Sequence[str]) -> str:
        return self.tokenizer.decode([self.token_id[w] - self.first_token for w in words])

    def model_tokenizer(self):
        """The tokenizer in the model's ids, which `workbench generate` reads prompts with and
        `workbench export` writes (workbench.tasks.model_tokenizer)."""
        return model_tokenizer(self.tokenizer)

    def _window(self, text: np.ndarray, start: int, length: int) -> Example:
        return Example((), tuple((np.asarray(text[start: start + length]).astype(np.int64) + self.first_token).tolist()))

    def _check_fits(self, text: np.ndarray, length: int, which: str) -> None:
        if len(text) < length:
            raise WorkbenchError(f"task text_lm: the {which} text has {len(text)} bytes, fewer than length {length}")

    def example(self, rng, length, training):
        text = self.train_text if training else self.valid_text
        self._check_fits(text, length, "training" if training else "validation")
        return self._window(text, window_start(rng, text, length), length)

    def consumed_starts(self, consumed: Consumed) -> np.ndarray:
        """Where the training windows one run read start: the first tokens // train_length of its
        stream, in order, batch i's drawn as `train_batch(i)` draws them."""
        length = self.params.train_length
        self._check_fits(self.train_text, length, "training")
        windows = consumed.tokens // length
        starts: list[int] = []
        for index in range(-(-windows // consumed.batch_size)):
            rng = rng_for(self.seed, TRAIN_STREAM, index)
            starts += [window_start(rng, self.train_text, length)
                       for _ in range(min(consumed.batch_size, windows - len(starts)))]
        return np.array(starts, dtype=np.int64)

    def eval_starts(self, length: int) -> np.ndarray:
        """Where the evaluation windows start: `n_eval` offsets spread evenly over the validation text."""
        self._check_fits(self.valid_text, length, "validation")
        return np.linspace(0, len(self.valid_text) - length, self.params.n_eval).astype(int)

    def eval_examples(self, length):
        if length not in self._eval_cache:
            self._eval_cache[length] = [self._window(self.valid_text, int(s), length) for s in self.eval_starts(length)]
        return self._eval_cache[length]

    def format_decoder(self, ex):
        return list(ex.target), [False] + [True] * (len(ex.target) - 1)

    def decoder_prompt(self, source):
        return list(source)  # a text is continued as it stands: no <bos>, no <sep>

    def extra_metrics(self, model, batches, family, scores):
        return {"bpc": self.bits_per_byte(scores["loss"]), "bpc_tail": self.tail_bpc(model, batches, family),
                "perplexity": math.exp(scores["loss"]), **self.decoding_metrics(model, batches)}

    def bits_per_byte(self, nats_per_token: float) -> float:
        return nats_per_token / math.log(2) * self.tokens_per_byte

    def tail_bpc(self, model, batches, family) -> float:
        """Bits per byte over the window's tokens at indices >= train_length (NaN when none)."""
        # scored() drops the first byte (it has no prediction): window index = scored index + 1.
        first = self.params.train_length - 1
        if batches[0]["tokens"].shape[1] - 1 <= first:
            return math.nan
        nats = count = 0.0
        for batch in batches:  # a second forward, only at lengths past training
            logits, targets, mask = (x[:, first:] for x in self.scored(model, batch, family))
            loss = token_nll(logits, targets)  # [B, tail]
            nats += float(loss[mask].sum())
            count += int(mask.sum())
        return self.bits_per_byte(nats / count)

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
        """A unigram model's scores: token frequencies of the training text (add-one smoothed
        over the vocabulary; counted as the n-gram models count, workbench.tasks.ngram),
        scored on the tokens the evaluation windows score. Decoding metrics have no chance level."""
        return self.baselines(family, length)[INPUT_IGNORING]

    def baselines(self, family, length):
        """The unigram (`chance`) and the n-grams of NGRAM_ORDERS of the whole training text (module docstring)."""
        self.check_family(family)
        return cached((*self.baseline_key(length), NGRAM_ORDERS), lambda: self.split_baselines(length))

    def seen_baselines(self, family, length, consumed):
        """The 2-gram of the training text one run read (module docstring)."""
        self.check_family(family)
        p = self.params  # what it read: the seed's first tokens // train_length windows, in batches of batch_size
        key = (*self.baseline_key(length), SEEN_BIGRAM, self.seed, p.train_length, consumed.batch_size,
               consumed.tokens // p.train_length)
        return cached(key, lambda: self.fit_seen(length, consumed))

    def baseline_key(self, length: int) -> tuple:
        """What every baseline at `length` depends on (each is computed once per key: `cached`): the
        corpus and tokenizer, the split, the evaluation windows (the same for every seed), the fit's sampling."""
        if not self.corpus_key:  # a planned task (`planned`): nothing tokenized to fit on
            raise WorkbenchError("task text_lm: baselines need the tokenized corpus (workbench prepare)")
        p = self.params
        return ("text_lm", self.corpus_key, self.split, p.valid_fraction, length, p.n_eval, FIT_TOKENS, CHUNK)

    def eval_windows(self, length: int) -> np.ndarray:  # [n_eval, length] of the tokenizer's ids
        return np.stack([np.asarray(self.valid_text[s: s + length]) for s in self.eval_starts(length)])

    def split_baselines(self, length: int) -> dict[str, dict[str, float]]:
        size = self.tokenizer.vocab_size  # the ids it can emit (a BPE's unused ids are not outcomes)
        windows = self.eval_windows(length)
        orders = [n for n in NGRAM_ORDERS if fits(size, n)]
        model = WittenBell(self.train_text, max(orders), size)  # the lower orders are its counts
        counts = np.zeros(size)
        counts[model.levels[0].keys.astype(np.int64)] = model.levels[0].counts
        log_p = np.log((counts + 1) / (counts.sum() + size))  # add-one over the vocabulary
        out = {INPUT_IGNORING: self.level(float(-log_p[windows[:, 1:]].mean()))}
        for n in orders:
            out[f"{n}-gram"] = self.level(float(-model.log_probs(windows, n).mean()))
        return out

    def fit_seen(self, length: int, consumed: Consumed) -> dict[str, dict[str, float]]:
        spans = covering(self.consumed_starts(consumed), self.params.train_length)
        model = WittenBell(self.train_text, 2, self.tokenizer.vocab_size, spans)
        return {SEEN_BIGRAM: self.level(float(-model.log_probs(self.eval_windows(length)).mean()))}

    def level(self, loss: float) -> dict[str, float]:
        return {"loss": loss, "bpc": self.bits_per_byte(loss), "perplexity": math.exp(loss)}


@hookimpl
def register_tasks():
    return [TextLM]
