"""Verdicts across a scale ladder (a study's `scale:`): each `expect:` entry is decided at every
rung, and one line says what the rungs show together:

    holds at 3 of 3 rungs              every rung decided, the same way
    holds at 2 of 3 rungs (decided only at 64 and 128)
    decided only at 128 (holds)        one rung decided
    flips between 64 and 128           two neighbouring decided rungs disagree
    decided at no rung                 no rung decided by a test (inconclusive, ceiling, identical, not tested, not reached)

Rungs are in the ladder's order (smallest first as written); "neighbouring" skips undecided
rungs, so a flip names the two decided rungs it lies between.
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.stats.outcomes import DECIDED


def joined(names: Sequence[str]) -> str:
    """'128', '64 and 128', '32, 64 and 128'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def cross_scale_line(rungs: Sequence[tuple[str, str]]) -> str:
    """One line for an entry's outcomes at each rung: (rung name, outcome) in ladder order."""
    decided = [(rung, outcome) for rung, outcome in rungs if outcome in DECIDED]
    if not decided:
        return "decided at no rung"
    flips = [f"between {a} and {b}" for (a, oa), (b, ob) in zip(decided, decided[1:]) if oa != ob]
    if flips:
        return "flips " + ", and ".join(flips)
    outcome = decided[0][1]
    if len(decided) == 1 and len(rungs) > 1:
        return f"decided only at {decided[0][0]} ({outcome})"
    line = f"{outcome} at {len(decided)} of {len(rungs)} rungs"
    if len(decided) < len(rungs):
        line += f" (decided only at {joined([rung for rung, _ in decided])})"
    return line
