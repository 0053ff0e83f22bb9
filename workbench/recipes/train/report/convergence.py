"""Did the budget suffice? Each group's verdict metric over the last 20% of its runs' steps.

A verdict read while the curves still move decides a question about the budget, not about the
variants: a group that would overtake given more steps loses here. The check: for each
compared group and each metric an `expect:` entry reads from the evaluations, the mean over
seeds of (final value - value at the last evaluation at or before 80% of the run's steps),
against the spread of the final values over seeds (their standard deviation). A change
smaller than that spread is "flat": more steps would move the group less than another seed
does. A group whose every seed ends at the metric's best value (accuracy 1) is "at the
ceiling": more steps cannot move it, however small its spread (often 0) and its last rise. A
group without an evaluation in the first 80% of its steps cannot be checked (the study's
`train.eval_every` is too coarse) and says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from workbench.report.document import Paragraph, Section, Table, fmt
from workbench.stats.rule import perfect_on_every_seed

SHARE_BEFORE_END = 0.8  # "the last 20% of steps" (issue 23)
# How a group settled (not a verdict's outcome: workbench.stats.outcomes)
FLAT, STILL_CHANGING = "flat", "still changing"
SETTLED_AT_BEST = "at the ceiling (every seed at the best value)"


@dataclass(frozen=True)
class Settling:
    """One group's verdict metric: how much its last 20% of steps changed it, next to its spread."""

    variant: str
    metric: str
    seeds: int
    step_before: float  # mean over seeds of the step compared with the end
    change: float  # mean over seeds of final - value at step_before
    spread: float  # standard deviation of the final values over seeds (NaN for one seed)
    at_best: bool = False  # every seed's final value is the metric's best possible value

    @property
    def outcome(self) -> str:
        if self.at_best:
            return SETTLED_AT_BEST
        if self.seeds == 0:
            return "not checked (no evaluation in the first 80% of the steps)"
        if math.isnan(self.spread):
            return "not checked (one seed: no spread)"
        return FLAT if abs(self.change) <= self.spread else STILL_CHANGING


def settling(curves: pd.DataFrame, runs: pd.DataFrame, metrics: Sequence[str],
             scales: Mapping[str, tuple[bool, tuple[float, float]]] | None = None) -> list[Settling]:
    """`curves`: long rows (run_id, step, split, metric, value); `runs`: finished final runs
    with run_id and variant; `scales`: each metric's (higher is better, (lowest, highest)), which
    tells a ceiling as the verdicts' own ceiling rule does. One Settling per variant and metric
    that the curves record."""
    evals = curves[curves["split"] == "eval"] if not curves.empty else curves
    out = []
    for metric in metrics:
        mine = evals[evals["metric"] == metric]
        if mine.empty:
            continue
        for variant, group in runs.groupby("variant", sort=False):
            before, changes, finals = [], [], []
            for run_id in group["run_id"]:
                curve = mine[mine["run_id"] == run_id].dropna(subset=["value"]).sort_values("step")
                if curve.empty:
                    continue
                last = curve.iloc[-1]
                earlier = curve[curve["step"] <= SHARE_BEFORE_END * last["step"]]
                finals.append(float(last["value"]))
                if earlier.empty:
                    continue
                before.append(float(earlier.iloc[-1]["step"]))
                changes.append(float(last["value"]) - float(earlier.iloc[-1]["value"]))
            if not finals:
                continue
            spread = float(pd.Series(finals).std(ddof=1)) if len(finals) > 1 else math.nan
            at_best = metric in (scales or {}) and perfect_on_every_seed(finals, *scales[metric])
            out.append(Settling(str(variant), metric, len(changes),
                                float(pd.Series(before).mean()) if before else math.nan,
                                float(pd.Series(changes).mean()) if changes else math.nan, spread, at_best))
    return out


def settling_section(found: Sequence[Settling]) -> Section | None:
    if not found:
        return None
    moving = [s for s in found if s.outcome == STILL_CHANGING]
    summary = (f"{len(found) - len(moving)} of {len(found)} group and metric pairs are flat, at the ceiling or "
               "unchecked; still "
               "changing: " + ", ".join(f"{s.variant} on {s.metric} ({s.change:+.3g})" for s in moving)
               if moving else f"Every checked group is flat or at the ceiling on its verdict metrics ({len(found)} "
               "pairs).")
    rows = [[s.variant, s.metric, fmt(s.step_before), f"{s.change:+.3g}" if not math.isnan(s.change) else "–",
             fmt(s.spread), s.outcome] for s in found]
    return Section("Did the budget suffice?", [
        Paragraph("Each verdict metric's change over the last 20% of the steps (final value minus the last evaluation "
                  "at or before 80% of the run's steps, mean over seeds) against the spread of the final values "
                  "over seeds (standard deviation). Flat: the change is within that spread, so more steps would move "
                  "the group less than another seed does; at the ceiling: every seed ends at the metric's best value, "
                  "which more steps cannot improve. " + summary),
        Table(["variant", "metric", "compared from step (mean)", "change in the last 20%", "seed spread (SD)",
               "settled"], rows, caption="Settling of each compared group on the metrics its verdicts read",
              numeric=[False, False, True, True, True, False])])
