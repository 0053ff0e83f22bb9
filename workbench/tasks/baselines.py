"""Baselines: predictors that cannot solve a task, scored as a model is. A group has learned
its task only where it beats the strongest of them (`Task.baselines`); each is computed exactly,
counted on the held-out set, by Monte Carlo from the task's generator with a fixed seed, or
fitted on the training text a run consumed (`Consumed`).

Baselines fitted on a corpus (the text task's n-gram models: 0.3 s of CPU for the whole
split's on 1.3M tokens, 0.1 s for each seed's seen 2-gram, growing with the corpus) are computed
once per key and kept (`cached`): in this process, and as a small JSON file in the data folder
($WORKBENCH_DATA_DIR/baselines/), since a study's run, `workbench report`, `compare` and the
notebook's `load` each build the task in a process of their own, and every seed's runs of every
group share the seed's seen 2-gram. The data folder is the corpus's already (its token shards).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import ConfigDict, TypeAdapter, ValidationError
from scipy.stats import entropy

from workbench.tasks.tokens import data_dir

# The baseline every task has: a predictor that ignores the input (`Task.chance`).
INPUT_IGNORING = "input-ignoring"
PREFIX_AWARE = "prefix-aware"  # reads the teacher-forced answer prefix, not the input
ORDER_BLIND = "order-blind"  # knows which symbols the input holds, not their order
BASELINE_STRINGS = 50_000  # Monte Carlo strings per baseline, drawn from a fixed seed
BASELINE_SEED = 20_221  # so a baseline is the same number in every report


def blind_scores(positions: Sequence[tuple[float, np.ndarray]], exact_match: float) -> dict[str, float]:
    """accuracy and loss of a predictor that outputs, at each scored position, the target's
    distribution there: `positions` holds (weight, probabilities or counts) per position
    (weight: scored tokens there); `exact_match` is its chance to get a whole row right."""
    weights = np.array([w for w, _ in positions], dtype=float)
    top = np.array([p.max() / p.sum() for _, p in positions])
    entropies = np.array([entropy(p) for _, p in positions])
    return {"accuracy": float(weights @ top / weights.sum()), "exact_match": float(exact_match),
            "loss": float(weights @ entropies / weights.sum())}


def counted_blind_scores(rows: Sequence[Sequence[int]]) -> dict[str, float]:
    """`blind_scores` of the input-ignoring predictor counted on the scored target ids of a
    held-out set, one row per example: the targets' distribution at each position, and the
    share of the most frequent whole row."""
    by_position: dict[int, dict[int, int]] = {}
    for row in rows:
        for k, token in enumerate(row):
            counts = by_position.setdefault(k, {})
            counts[token] = counts.get(token, 0) + 1
    wholes: dict[tuple[int, ...], int] = {}
    for row in rows:
        wholes[tuple(row)] = wholes.get(tuple(row), 0) + 1
    positions = [(sum(c.values()), np.array(list(c.values()), dtype=float)) for c in by_position.values()]
    return blind_scores(positions, max(wholes.values()) / len(rows))


@dataclass(frozen=True)
class Consumed:
    """What one run trained on, as it recorded it (`train_tokens`): the first `tokens` real
    training tokens of its seed's stream, drawn in batches of `batch_size` sequences
    (`Task.train_batch`; a budget's last step keeps its first sequences)."""

    batch_size: int
    tokens: int


Scores = dict[str, dict[str, float]]  # baseline -> metric -> score
SCORES = TypeAdapter(Scores, config=ConfigDict(ser_json_inf_nan="constants"))  # NaN stays NaN
CACHE_VERSION = 1  # raise when a cached computation changes, so files written before are not read
KEPT_SCORES: dict[str, Scores] = {}  # this process's, by digest


def cached(key: tuple, compute: Callable[[], Scores]) -> Scores:
    """`compute()` once per `key` (a tuple of plain values that determines the result): kept in
    this process and in data_dir()/baselines/<digest>.json. A file that does not read as scores
    (cut short, edited, received from elsewhere) is computed again and replaced; a data folder
    that cannot be written only loses the reuse."""
    digest = hashlib.blake2b(repr((CACHE_VERSION, key)).encode(), digest_size=16).hexdigest()
    if digest in KEPT_SCORES:
        return KEPT_SCORES[digest]
    path = data_dir() / "baselines" / f"{digest}.json"
    try:
        scores = SCORES.validate_json(path.read_bytes())
    except (OSError, ValidationError):
        scores = compute()
        part = path.with_suffix(f".{os.getpid()}.part")  # its own name: two processes may compute one key
        try:  # written whole or not at all: a reader never sees half a file
            path.parent.mkdir(parents=True, exist_ok=True)
            part.write_bytes(SCORES.dump_json(scores))
            os.replace(part, path)
        except OSError:  # e.g. a read-only or full data folder
            with contextlib.suppress(OSError):
                part.unlink(missing_ok=True)
    KEPT_SCORES[digest] = scores
    return scores
