"""What a verdict can conclude: one type for the statistics, the ladder, the findings and the
index, so that an outcome's words, whether it decides the claim, and whether it ends an
adaptive study's comparison are written once.

An outcome is a `str` (a `StrEnum`): it compares equal to its words and is stored in
summary.json as them, so reports written before this type existed read the same.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    HOLDS = "holds"
    DOES_NOT_HOLD = "does not hold"
    EQUIVALENT = "equivalent"
    INCONCLUSIVE = "inconclusive"
    NOT_TESTED = "not tested"  # the data show that neither group learned
    CEILING = "ceiling"  # both groups at the metric's best value on every seed
    IDENTICAL = "identical"  # both groups gave the same value on every seed: the same computation
    NOT_REACHED = "not reached"  # a *_to_target comparison where a finished run never reached the target

    @property
    def decides(self) -> bool:
        """A test of the difference concluded about the claim (what error control is about)."""
        return self in (Outcome.HOLDS, Outcome.DOES_NOT_HOLD, Outcome.EQUIVALENT)

    @property
    def final(self) -> bool:
        """More seeds cannot change it: an adaptive study keeps the first look that reads it
        and adds no seeds for it. Only an inconclusive comparison goes on."""
        return self is not Outcome.INCONCLUSIVE

    @property
    def explained(self) -> bool:
        """Its label carries the reason in parentheses."""
        return self in (Outcome.INCONCLUSIVE, Outcome.NOT_TESTED, Outcome.NOT_REACHED, Outcome.IDENTICAL)


DECIDED = tuple(o for o in Outcome if o.decides)
# The verdict rule a summary.json was issued under: since this one, the learned gate qualifies a
# decided difference and never decides alone (an index marks reports issued before it).
VERDICT_RULE = "2026-12-01: every decision by a test of the difference; gates qualify"
CEILING_LABEL = "ceiling: the task does not separate them"
