"""Baselines: predictors that cannot solve a task, scored as a model is. A group has learned
its task only where it beats the strongest of them (`Task.baselines`); each is computed exactly,
counted on the held-out set, or by Monte Carlo from the task's generator with a fixed seed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import entropy

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
