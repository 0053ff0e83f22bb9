"""`workbench eval RUN_DIR --lengths ...`: a finished run's saved model at new evaluation lengths,
without training. The held-out sets are drawn exactly as the run drew its own (its task, its
seed), so a length the run already evaluated gives the numbers it recorded; nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from workbench.errors import WorkbenchError
from workbench.results import FINAL_WEIGHTS
from workbench.run.train import evaluate_lengths
from workbench.model.weights import load_final_model, make_task


def evaluate_saved_run(run_dir: str | Path, lengths: list[int], batch_size: int | None = None
                       ) -> tuple[dict[str, float], dict[str, str], dict[str, Any]]:
    """(metrics by `name@length`, not-applicable lengths with the reason, the run's config)."""
    try:
        model, config = load_final_model(run_dir)
    except FileNotFoundError:
        raise WorkbenchError(f"{run_dir}: no {FINAL_WEIGHTS} there; give the folder of a finished run "
                             "(runs/<study>/runs/<run id>/)") from None
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
