"""Tasks, the fifth axis: the data, vocabulary and metrics a study trains and evaluates on.

    base.py       the `Task` base: seeded examples, family formatting, loss, evaluation
    metrics.py    each metric's range, and the sums an evaluation adds up (`Tally`)
    baselines.py  predictors that cannot solve a task, scored as a model is
    symbols.py    the symbol tasks' base (copy, reverse, sort) and their baselines
    ngram.py      interpolated Witten-Bell n-gram models (the language-model baselines)
    corpus.py     text corpora: files, folders, globs, jsonl / parquet / datasets; the split by document
    tokens.py     tokenizers (bytes, BPE, tokenizer.json) and token shards on disk

A task plugin imports what it needs from here (`from workbench.tasks import Task`).
"""

from workbench.tasks.base import (
    CLAIM_KINDS,
    FAMILIES,
    LANGUAGE_MODEL,
    MECHANISM,
    SYMBOL_TASK,
    IGNORE,
    TRAIN_STREAM,
    Example,
    LengthRangeParams,
    Task,
    TaskParams,
    draw_within,
    length_window,
    pad,
    real,
    rng_for,
)
from workbench.tasks.baselines import INPUT_IGNORING, ORDER_BLIND, PREFIX_AWARE, Consumed, blind_scores
from workbench.tasks.metrics import METRICS, Tally, declared
from workbench.tasks.tokens import SPECIALS
from workbench.tasks.symbols import SymbolParams, SymbolTask, symbol_names

__all__ = [
    "CLAIM_KINDS", "LANGUAGE_MODEL", "MECHANISM", "SYMBOL_TASK",
    "FAMILIES", "IGNORE", "INPUT_IGNORING", "METRICS", "ORDER_BLIND", "PREFIX_AWARE", "SPECIALS", "TRAIN_STREAM",
    "Consumed", "Example",
    "LengthRangeParams", "SymbolParams", "SymbolTask", "Tally", "Task", "TaskParams", "blind_scores", "declared",
    "draw_within", "length_window", "pad", "real", "rng_for", "symbol_names",
]
