"""What a verdict can conclude: one type for the statistics, the ladder, the findings, the
templates and the index, so that an outcome's words, whether it decides the claim, whether it
ends an adaptive study's comparison, how its label reads and how its badge looks are written
once. Adding an outcome is one line here.

An outcome is a `str` (a `StrEnum`): it compares equal to its words and is stored in
summary.json as them, so reports written before this type existed read the same.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Badge(NamedTuple):
    """The colours of an outcome's badge in the HTML report (CSS colours)."""

    background: str
    text: str


class Outcome(StrEnum):
    # words, whether a test of the difference concluded about the claim (what error control is
    # about), whether its label carries the reason in parentheses, its badge (None: the neutral one)
    HOLDS = "holds", True, False, Badge("#d8f3dc", "#1b4332")
    DOES_NOT_HOLD = "does not hold", True, False, Badge("#ffd6d6", "#7a0000")
    INCONCLUSIVE = "inconclusive", False, True, Badge("#fff1c1", "#5c4400")
    # an earlier rule's outcome (before 2026-12-02: "neither group learned" ended the test); read in
    # reports issued then, never issued now (the gates qualify the tested outcome: Verdict.neither)
    NOT_TESTED = "not tested", False, True, Badge("#e4e4e4", "#333")
    EQUIVALENT = "equivalent", True, False, Badge("#dbe9ff", "#0b2e6b")
    # both groups at the metric's best value on every seed, or an equivalence whose groups both lie
    # within the margin of it (the bound alone keeps their difference inside the margin)
    CEILING = "ceiling", False, True, Badge("#ece4ff", "#33206b")
    # an equivalence whose groups both lie within the margin of the metric's worst value
    FLOOR = "floor", False, True, Badge("#ece4ff", "#33206b")
    # both groups gave the same value on every seed: the same computation
    IDENTICAL = "identical", False, True, None
    # a *_to_target comparison where a finished run never reached the target
    NOT_REACHED = "not reached", False, True, None

    def __new__(cls, words: str, decides: bool, explained: bool, badge: Badge | None) -> Outcome:
        member = str.__new__(cls, words)
        member._value_ = words
        member.decides = decides
        member.explained = explained
        member.badge = badge
        return member

    @property
    def final(self) -> bool:
        """More seeds cannot change it: an adaptive study keeps the first look that reads it
        and adds no seeds for it. Only an inconclusive comparison goes on."""
        return self is not Outcome.INCONCLUSIVE

    @property
    def css_class(self) -> str:
        """The HTML class its badge is styled by ('does-not-hold')."""
        return self.value.replace(" ", "-")

    def label(self, reason: str) -> str:
        """The outcome as a verdict reads it: with its reason where it carries one."""
        if self in (Outcome.CEILING, Outcome.FLOOR):
            return f"{self}: the task does not separate them" + (f" ({reason})" if reason else "")
        return f"{self} ({reason})" if self.explained else str(self)


DECIDED = tuple(o for o in Outcome if o.decides)
CEILING_LABEL = f"{Outcome.CEILING}: the task does not separate them"
# The verdict rule a summary.json was issued under (an index marks reports issued before it). Since
# 2026-12-01 the learned gate qualifies a decided difference and never decides alone; since
# 2026-12-02 it never ends the test either, equivalences are in Holm's family, and adaptive looks
# spend alpha Pocock-type. Since 2026-12-06 no verdict is decided on fewer than 4 seeds per group
# (seeds that learn or not), and an equivalence at the metric's best or worst value reads as a
# ceiling or floor.
VERDICT_RULE = ("2026-12-06: a verdict needs 4 seeds per group; an equivalence within the margin of the best "
                "(worst) value reads as a ceiling (floor)")
