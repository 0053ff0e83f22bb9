"""A model on its task's held-out sets at every evaluation length: during training
(`evaluate_lengths`, called by workbench.run.recording) and after it.

`workbench eval RUN_DIR --lengths ...`: a finished run's saved model at new evaluation lengths,
without training. The held-out sets are drawn exactly as the run drew its own (its task, its
seed), so a length the run already evaluated gives the numbers it recorded; nothing is written."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from workbench.errors import WorkbenchError
from workbench.model.transformer import attention_entropy, first_token_attention, record_attention
from workbench.model.position import PositionLimitError
from workbench.results import ATTENTION_ENTROPY, FINAL_WEIGHTS, FIRST_TOKEN_ATTENTION
from workbench.model.weights import load_final_model, make_task
from workbench.run.store import run_folder_hint


def evaluate_saved_run(run_dir: str | Path, lengths: list[int], batch_size: int | None = None
                       ) -> tuple[dict[str, float], dict[str, str], dict[str, Any]]:
    """(metrics by `name@length`, not-applicable lengths with the reason, the run's config)."""
    try:
        model, config = load_final_model(run_dir)
    except FileNotFoundError:
        raise WorkbenchError(f"{run_dir}: no {FINAL_WEIGHTS} there; {run_folder_hint(run_dir)}") from None
    if not lengths or min(lengths) <= 0:
        raise WorkbenchError(f"--lengths: give positive lengths, e.g. --lengths 16,32,64 (got {lengths})")
    try:
        task = make_task({**config, "task": {**config["task"], "eval_lengths": lengths}})
    except (ValidationError, ValueError) as err:
        raise WorkbenchError(f"--lengths {','.join(map(str, lengths))}: the task {config['task']['name']!r} "
                             f"refuses them ({str(err).splitlines()[-1].strip()})") from None
    with torch.no_grad():
        metrics, not_applicable = evaluate_lengths(task, model, config["model"]["family"],
                                                   batch_size or config["train"]["eval_batch_size"], {})
    return metrics, not_applicable, config


def evaluate_lengths(task, model, family: str, batch_size: int, cache: dict[int, list],
                     context=None, entropy: bool = False) -> tuple[dict[str, float], dict[str, str]]:
    """Every metric at every eval length (`accuracy@64`); a length the position scheme cannot
    represent is recorded as not applicable, with the reason. With `entropy`, also the attention
    measures `attention_entropy@<train_length>` and `first_token_attention@<train_length>` (see
    `measure_attention`), on the evaluation set
    at train_length; when eval_lengths leave that length out, the set drawn there is not held
    out from training (a descriptive measure of the attention, not a score)."""
    metrics: dict[str, float] = {}
    not_applicable: dict[str, str] = {}
    context = context or contextlib.nullcontext
    for length in task.eval_lengths:
        try:
            with context():
                scores = task.evaluate(model, eval_batches(task, length, batch_size, family, cache), family)
        except PositionLimitError as err:
            not_applicable[str(length)] = f"not applicable: {err}"
            continue
        metrics.update({f"{name}@{length}": float(value) for name, value in scores.items()})
    if entropy:
        length = task.params.train_length
        with context():
            measured = measure_attention(task, model, family, eval_batches(task, length, batch_size, family, cache))
        metrics.update({f"{name}@{length}": value for name, value in measured.items()})
    return metrics, not_applicable


def eval_batches(task, length: int, batch_size: int, family: str, cache: dict[int, list]) -> list:
    """The held-out batches at one length, made once per run."""
    if length not in cache:
        cache[length] = task.eval_batches(length, batch_size, family)
    return cache[length]


# Attention weights held at once by the entropy pass: [rows, h, nq, nk] per attention layer.
ENTROPY_WEIGHTS_PER_FORWARD = 2**24


@torch.no_grad()
def measure_attention(task, model, family: str, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Over every row of the held-out batches: the mean normalised attention entropy
    (workbench.model.transformer.attention_entropy; 1 = uniform over the visible keys, 0 = a
    saturated softmax) and the mean weight on the first key (first_token_attention: the attention
    sink); NaN when no row sees two keys. A separate teacher-forced pass through the explicit-weights path, so
    the other metrics are computed exactly as without it; batches are cut into pieces small
    enough that the recorded weights stay under ENTROPY_WEIGHTS_PER_FORWARD per layer."""
    spec = model.spec
    was_training = model.training
    model.eval()
    sums = {ATTENTION_ENTROPY: [0.0, 0], FIRST_TOKEN_ATTENTION: [0.0, 0]}
    measures = {ATTENTION_ENTROPY: attention_entropy, FIRST_TOKEN_ATTENTION: first_token_attention}
    try:
        for batch in batches:
            widest = max(v.shape[-1] for v in batch.values() if v.dim() == 2)
            step = max(1, ENTROPY_WEIGHTS_PER_FORWARD // (spec.n_heads * widest * widest))
            size = next(iter(batch.values())).shape[0]
            for start in range(0, size, step):
                piece = {k: v[start: start + step] for k, v in batch.items()}
                with record_attention(model) as recorded:
                    task.scored(model, piece, family)
                for name, measure in measures.items():
                    piece_total, piece_rows = measure(recorded)
                    sums[name][0] += piece_total
                    sums[name][1] += piece_rows
    finally:
        model.train(was_training)
    return {name: total / rows if rows else math.nan for name, (total, rows) in sums.items()}
