"""`workbench diff SHIPPED YOURS`: how one report of a study differs from another, verdict by
verdict, read from the two folders' summary.json alone (no store, nothing trained).

For each verdict: the outcome, the difference with its interval and each group's mean in both
reports, how far the difference and the group means moved, and whether that is within the
tolerance. The default tolerance is what a change of machine moves the quickstart's accuracies by
(MACHINE_TOLERANCE, measured as docs/guide.md's "Your report against the shipped one" says): a
verdict that moved less and kept its outcome is the shipped one reproduced; a larger move, or a
changed outcome, is a real difference (other code, other settings) or a fragile verdict.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.report.findings import SUMMARY_FILE
from workbench.results import UnsafeFile, load_json, read_regular

# How far a quickstart accuracy moves between machines: the same run (same code, seed and run
# id) moved by up to 0.022 between one torch thread with AVX-512 kernels and two threads with
# ATen's and MKL's AVX2 ones (docs/guide.md gives every figure). A group mean moves at most as far
# as its runs, a difference of two means at most twice that: 0.05 covers both. In the metric's
# units: other metrics (a loss, bits per byte) need their own --tolerance.
MACHINE_TOLERANCE = 0.05


MAX_SUMMARY_BYTES = 8 * 2**20  # a shipped summary.json is under 64 kB
MAX_VERDICTS = 1000  # a study's `expect:` holds tens
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark, as some editors save JSON
# Received text is printed to a terminal: its control characters (an escape sequence, a carriage
# return) and the bidirectional overrides that reorder what is shown are left out.
CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def read_summary(folder: str | Path, which: str) -> dict[str, Any]:
    """The summary.json of a report folder (or of the folder of a file in it), or one line. It is
    received data: bounded in bytes, nesting, digits and verdicts before it is read, its verdicts
    checked for the fields diff reads, and control characters left out of its text."""
    folder = Path(folder)
    if folder.is_file():
        folder = folder.parent
    path = folder / SUMMARY_FILE
    if not path.is_file():
        raise WorkbenchError(f"{which} {folder}: no {SUMMARY_FILE} there; give a report folder (the one with "
                             "index.html), e.g. reports/quickstart")
    try:
        summary = plain_text(load_json(read_regular(path, MAX_SUMMARY_BYTES).removeprefix(BOM), SUMMARY_FILE))
        if len(summary["verdicts"]) > MAX_VERDICTS:
            raise ValueError(f"over {MAX_VERDICTS} verdicts")
        summary["verdicts"] = [well_formed(v) for v in summary["verdicts"]]
    except UnsafeFile as err:
        raise WorkbenchError(f"{which} {err}") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        why = str(err).removeprefix(f"{SUMMARY_FILE}: ") if isinstance(err, ValueError) else type(err).__name__
        raise WorkbenchError(f"{which} {path}: not a report summary ({why[:120]}); rebuild that report with "
                             "`workbench report`") from None
    return summary


def plain_text(value: Any) -> Any:
    """`value` with CONTROLS left out of every string in it, keys too."""
    if isinstance(value, str):
        return CONTROLS.sub("", value)
    if isinstance(value, dict):
        return {plain_text(k): plain_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_text(v) for v in value]
    return value


def well_formed(verdict: Any) -> dict[str, Any]:
    """A received verdict with the fields diff reads in the types it reads them (TypeError otherwise):
    a summary.json handed over from elsewhere can hold anything."""
    verdict = dict(verdict)
    if not (isinstance(verdict["statement"], str) and isinstance(verdict["outcome"], str)
            and isinstance(verdict.get("label") or "", str) and isinstance(verdict.get("difference") or {}, dict)
            and isinstance(verdict.get("groups") or [], list)
            and all(isinstance(g, dict) and isinstance(g.get("group"), str) for g in verdict.get("groups") or [])):
        raise TypeError("a verdict's fields")
    return verdict


@dataclass(frozen=True)
class Shift:
    """One verdict in both reports (None where a report lacks it) and how far its numbers moved."""

    statement: str
    shipped: dict[str, Any] | None
    yours: dict[str, Any] | None
    moved_difference: float | None  # yours minus shipped; None when neither has the number
    moved_groups: float | None  # the largest move of a group's mean
    unread: tuple[str, ...] = ()  # numbers not compared: not a number in a report, or in one report only

    def moved_within(self, tolerance: float) -> bool:
        """No number moved beyond the tolerance, and none went uncompared."""
        return not self.unread and all(m is None or abs(m) <= tolerance
                                       for m in (self.moved_difference, self.moved_groups))

    def within(self, tolerance: float) -> bool:
        """Both reports hold it, with the same outcome, and no number moved beyond the tolerance."""
        return (self.shipped is not None and self.yours is not None
                and self.shipped["outcome"] == self.yours["outcome"] and self.moved_within(tolerance))


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def number(record: dict[str, Any] | None, key: str) -> float | None:
    value = (record or {}).get(key)
    return float(value) if is_number(value) else None


def group_means(verdict: dict[str, Any]) -> dict[str, float | None]:
    return {g.get("group"): number(g, "mean") for g in verdict.get("groups") or []}


def compared_numbers(verdict: dict[str, Any]) -> dict[str, Any]:
    """What diff compares of a verdict, as the report holds it (None: absent): its difference and
    each group's mean."""
    numbers = {"the difference": (verdict.get("difference") or {}).get("mean")}
    numbers.update({f"the mean of {g['group']}": g.get("mean") for g in verdict.get("groups") or []})
    return numbers


def shift(statement: str, shipped: dict[str, Any] | None, yours: dict[str, Any] | None) -> Shift:
    if shipped is None or yours is None:
        return Shift(statement, shipped, yours, None, None)
    a, b = compared_numbers(shipped), compared_numbers(yours)
    moves: dict[str, float] = {}
    unread = []
    for name in dict.fromkeys([*a, *b]):
        x, y = a.get(name), b.get(name)
        bad = [side for side, value in (("shipped", x), ("yours", y)) if value is not None and not is_number(value)]
        if bad:
            unread.append(f"{name} ({' and '.join(bad)}: not a number)")
        elif (x is None) != (y is None):
            unread.append(f"{name} (in {'yours' if x is None else 'shipped'} only)")
        elif x is not None:
            moves[name] = float(y) - float(x)
    groups = [abs(move) for name, move in moves.items() if name != "the difference"]
    return Shift(statement, shipped, yours, moves.get("the difference"), max(groups, default=None), tuple(unread))


def shifts(shipped: dict[str, Any], yours: dict[str, Any]) -> list[Shift]:
    """Verdicts matched by their statement, in the shipped report's order, then those only yours has."""
    theirs = {v["statement"]: v for v in shipped["verdicts"]}
    own = {v["statement"]: v for v in yours["verdicts"]}
    return [shift(s, theirs.get(s), own.get(s)) for s in dict.fromkeys([*theirs, *own])]


def signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.3g}"


def verdict_text(verdict: dict[str, Any] | None) -> str:
    """One line: the verdict's label, its difference with the interval, each group's mean."""
    if verdict is None:
        return "not in this report"
    d = verdict.get("difference") or {}
    parts = [verdict.get("label") or verdict["outcome"]]
    if number(d, "mean") is not None:
        parts.append(f"difference {signed(number(d, 'mean'))} [{signed(number(d, 'lo'))}, {signed(number(d, 'hi'))}]")
    means = ", ".join(f"{g} {m:.3g}" for g, m in group_means(verdict).items() if m is not None)
    return "; ".join([*parts, *([means] if means else [])])


def moved_text(s: Shift, tolerance: float) -> str:
    if s.shipped is None or s.yours is None:
        return "only one report asks this verdict"
    moved = []
    if s.moved_difference is not None:
        moved.append(f"difference {signed(s.moved_difference)}")
    if s.moved_groups is not None:
        moved.append(f"group means up to {s.moved_groups:.3g}")
    size = ", ".join(moved) or "no numbers to compare"
    same = "same outcome" if s.shipped["outcome"] == s.yours["outcome"] else (
        f"OUTCOME CHANGED ({s.shipped['outcome']} -> {s.yours['outcome']})")
    if s.unread:
        more = f" and {len(s.unread) - 3} more" if len(s.unread) > 3 else ""
        return f"{size}; could not compare {', '.join(s.unread[:3])}{more}: NOT READ, not within ±{tolerance:g}; {same}"
    return f"{size}: {'within' if s.moved_within(tolerance) else 'BEYOND'} ±{tolerance:g}; {same}"


def diff_lines(shipped_dir: str | Path, yours_dir: str | Path,
               tolerance: float = MACHINE_TOLERANCE) -> tuple[list[str], bool]:
    """The comparison as lines, and whether every verdict kept its outcome within the tolerance."""
    shipped, yours = read_summary(shipped_dir, "SHIPPED"), read_summary(yours_dir, "YOURS")
    if shipped.get("name") != yours.get("name"):
        raise WorkbenchError(f"SHIPPED is a report of study {str(shipped.get('name'))[:60]!r}, YOURS of "
                             f"{str(yours.get('name'))[:60]!r}: diff compares two reports of one study "
                             "(`workbench compare` puts the runs of several studies in one report)")
    found = shifts(shipped, yours)
    lines = [f"{shipped_dir} (shipped) against {yours_dir} (yours), study {shipped.get('name')!r}:"]
    for s in found:
        lines += [s.statement, f"  shipped: {verdict_text(s.shipped)}", f"  yours:   {verdict_text(s.yours)}",
                  f"  moved:   {moved_text(s, tolerance)}"]
    kept = sum(s.within(tolerance) for s in found)
    lines.append(summary_line(found, kept, tolerance))
    return lines, kept == len(found)


def summary_line(found: Sequence[Shift], kept: int, tolerance: float) -> str:
    if not found:
        return "neither report asks a verdict (no `expect:`)"
    if kept == len(found):
        return f"all {len(found)} verdicts kept their outcome, their numbers within ±{tolerance:g}"
    unread = sum(bool(s.unread) for s in found)
    unread_text = f" ({unread} with a number diff could not compare)" if unread else ""
    return (f"{len(found) - kept} of {len(found)} verdicts differ beyond ±{tolerance:g} or in outcome{unread_text}: "
            "more than a change of machine explains (other code or settings), or a verdict that rests on that little")
