"""Learning curves against what a run spent: training tokens, counted FLOPs or seconds.

Every logged and evaluated step of a run records its spending (curves split "progress",
workbench.results.PROGRESS_MEASURES), so any curve can be read against it instead of steps.

`flops_to_target` (and `tokens_to_target`, `seconds_to_target`): what a run spent when its
evaluations first reached a stated score (`expect: {metric: flops_to_target, target:
{metric: bpc@64, value: 2.5}}`). Between the last evaluation short of the target and the
first that reaches it, the spending is interpolated linearly in the score; a run that
reaches the target at its first evaluation has nothing earlier to interpolate from and is
given that evaluation's spending (an upper bound). A run that never reaches it has no value:
Outcome.NOT_REACHED is its own outcome, never a large number (workbench.stats.outcomes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from workbench.results import PROGRESS, PROGRESS_MEASURES, TO_TARGET

STEP = "step"
AXES = (STEP, *PROGRESS_MEASURES)
AXIS_LABELS = {STEP: "training step", "tokens": "training tokens", "flops": "training FLOPs (counted)",
               "seconds": "training time (s)"}


def to_target(points: Sequence[tuple[float, float]], target: float, higher: bool) -> float:
    """The spending at which (spending, score) points, in training order, first reach
    `target` (module docstring); NaN when they never do."""
    before: tuple[float, float] | None = None
    for x, score in points:
        if score is None or math.isnan(score) or x is None or math.isnan(x):
            continue
        if score >= target if higher else score <= target:
            if before is None:
                return float(x)
            x0, s0 = before
            return float(x0 + (target - s0) / (score - s0) * (x - x0))
        before = (x, score)
    return math.nan


def against(curves: pd.DataFrame, axis: str) -> pd.DataFrame:
    """`curves` (run_id, step, split, metric, value) with an `x` column: the step, or the run's
    spending of `axis` at that step (rows without a recorded spending are dropped)."""
    if axis == STEP:
        return curves.assign(x=curves["step"].astype(float))
    spent = curves[(curves["split"] == PROGRESS) & (curves["metric"] == axis)][["run_id", "step", "value"]]
    return curves.merge(spent.rename(columns={"value": "x"}), on=["run_id", "step"], how="inner")


def to_target_by_run(curves: pd.DataFrame, name: str, metric: str, target: float, higher: bool) -> pd.Series:
    """Per run_id, `name` (e.g. flops_to_target) of the eval `metric` reaching `target`: NaN for
    a run whose evaluations never reach it; runs that recorded no spending are left out."""
    evals = against(curves[(curves["split"] == "eval") & (curves["metric"] == metric) | (curves["split"] == PROGRESS)],
                    TO_TARGET[name])
    evals = evals[(evals["split"] == "eval")].sort_values(["run_id", "step"])
    return evals.groupby("run_id").apply(
        lambda part: to_target(list(zip(part["x"], part["value"])), target, higher), include_groups=False)
