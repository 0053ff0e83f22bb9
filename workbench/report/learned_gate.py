"""The learned-at-all gate: did a group learn at all? Its mean score against the task's
baselines (predictors that cannot solve the task), by a margin towards a perfect score; a
verdict compares only groups that learned (workbench.report.stats)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from workbench.report.document import fmt

# A group learned when its score at the training length is better than chance by at least
# this share of the distance from chance to the perfect score (1 for accuracy, 0 for loss).
MARGIN = 0.1


@dataclass(frozen=True)
class Learned:
    """One group's score at one length against the task's baselines (predictors that cannot
    solve the task); the gate measures it against the strongest of them."""

    group: str
    metric: str  # e.g. accuracy@12
    score: float  # mean over finished seeds (NaN: none)
    chance: float  # the strongest baseline's score (NaN: unknown)
    needed: float  # the score the margin asks for
    higher: bool
    perfect: float = math.nan  # the metric's best possible value (1 for accuracy, 0 for loss)
    baseline: str = "chance"  # the strongest baseline's name
    baselines: tuple[tuple[str, float], ...] = ()  # every baseline's score, as the task declares them
    untested: str = ""  # why the group cannot be tested at all (e.g. no tuning candidate learned)

    @property
    def learned(self) -> bool:
        if self.untested or math.isnan(self.score) or math.isnan(self.needed):
            return False
        return self.score >= self.needed if self.higher else self.score <= self.needed

    @property
    def text(self) -> str:
        if self.untested:
            return f"{self.group}: {self.untested}"
        if math.isnan(self.chance):
            return f"{self.group}: no chance level of {self.metric}"
        if math.isnan(self.score):
            return f"{self.group}: no finished run reports {self.metric}"
        sign = "≥" if self.higher else "≤"
        return (f"{self.group}: {self.metric} {fmt(self.score)} vs {self.baseline} {fmt(self.chance)} "
                f"(learned: {sign} {fmt(self.needed)})")


def learned_gate(group: str, metric: str, score: float, chance: float | dict[str, float], perfect: float,
                 higher: bool, untested: str = "") -> Learned:
    """The margin rule: learned when `score` closes at least MARGIN of the gap from the
    strongest baseline to `perfect` (the metric's best possible value). `chance` is one
    score (the input-ignoring baseline) or every baseline's score by name."""
    baselines = chance if isinstance(chance, dict) else {"chance": chance}
    known = {name: v for name, v in baselines.items() if math.isfinite(v)}
    if known:
        name = (max if higher else min)(known, key=known.get)
        strongest = known[name]
    else:
        name, strongest = next(iter(baselines), "chance"), math.nan
    needed = strongest + MARGIN * (perfect - strongest) if math.isfinite(perfect) else math.nan
    return Learned(group, metric, score, strongest, needed, higher, perfect, name, tuple(baselines.items()), untested)


def score_text(g: Learned) -> str:
    if math.isnan(g.chance):
        return "no chance level"
    return "no finished run" if math.isnan(g.score) else fmt(g.score)


def learned_criterion(name: str, gates: Sequence[Learned]) -> str:
    """One line for a report's header: the learned rule for metric `name` (the threshold each
    group must reach at its training length) and which groups met it, e.g.
    'Learned (accuracy@12 ≥ 0.499, 10% of the way from order-blind 0.443 to 1): all 4 groups met it'."""
    known = [g for g in gates if not (math.isnan(g.chance) or math.isnan(g.needed))]
    if not known:
        return (f"Learned: no chance level of {name} is known for this task, so no group can be shown to have "
                "learned it (verdicts on it read 'not tested')")
    thresholds: dict[tuple, list[str]] = {}
    for g in known:
        thresholds.setdefault((g.metric, g.baseline, g.chance, g.needed, g.higher, g.perfect), []).append(g.group)

    def threshold(metric: str, needed: float, higher: bool) -> str:
        return f"{metric} {'≥' if higher else '≤'} {fmt(needed)}"

    if len(thresholds) == 1:
        (metric, baseline, chance, needed, higher, perfect), _ = next(iter(thresholds.items()))
        rule = (f"{threshold(metric, needed, higher)}, {MARGIN:.0%} of the way from {baseline} {fmt(chance)} "
                f"to {fmt(perfect)}")
    else:  # the baseline (or the training length) differs between groups, e.g. by family
        rule = f"{MARGIN:.0%} of the way from the strongest baseline to a perfect score: " + "; ".join(
            f"{threshold(metric, needed, higher)} for {' and '.join(groups)} ({baseline} {fmt(chance)})"
            for (metric, baseline, chance, needed, higher, _), groups in thresholds.items())
    missed = [g for g in gates if not g.learned]
    n = len(gates)
    if not missed:
        outcome = {1: "the group met it", 2: "both groups met it"}.get(n, f"all {n} groups met it")
    else:
        why = "; ".join(f"{g.group} ({score_text(g)})" for g in missed)  # labels may hold commas
        outcome = (f"no group met it ({why})" if len(missed) == n
                   else f"{n - len(missed)} of {n} groups met it; not met: {why}")
    return f"Learned ({rule}): {outcome}"
