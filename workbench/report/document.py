"""What a report says, independent of its format: sections of paragraphs, tables, figures and
code. `render.py` turns one `Report` into HTML and into Markdown, so both always agree.

All text here is plain (unescaped): the HTML template escapes it, the Markdown writer
escapes what Markdown would misread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from workbench.stats.numbers import fmt, level_text  # the rule's number formatting is every report's
from workbench.stats.outcomes import Outcome


@dataclass
class Paragraph:
    text: str
    kind: Literal["paragraph"] = "paragraph"


@dataclass
class Code:
    """A shell command or a YAML/JSON block, shown verbatim."""

    text: str
    kind: Literal["code"] = "code"


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]]
    caption: str = ""
    # Which columns hold numbers (right-aligned); the first column is a row label.
    numeric: list[bool] | None = None
    kind: Literal["table"] = "table"

    def __post_init__(self) -> None:
        if self.numeric is None:
            self.numeric = [False] * len(self.columns)


@dataclass
class Figure:
    """A PNG written next to the report; `path` is relative to the report folder."""

    path: str
    caption: str
    alt: str
    legend: list[str] = field(default_factory=list)  # e.g. token ids the figure shows as #i
    kind: Literal["figure"] = "figure"


Item = Paragraph | Code | Table | Figure


@dataclass
class Section:
    title: str
    items: list[Item] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.title.lower()).strip("-")


@dataclass
class VerdictLine:
    """One `expect:` entry's outcome, formatted for the top of the report."""

    statement: str  # "alibi is better than sinusoidal on accuracy@128"
    outcome: Outcome
    label: str  # outcome with its reason where it has one (Outcome.label), and what the gates add
    detail: str  # the two intervals, the difference and the learned-at-all check
    note: str = ""
    gates: list[dict] = field(default_factory=list)  # each group's score at the training length vs chance
    difference: dict = field(default_factory=dict)  # mean, lo, hi, level, method, p_holm
    groups: list[dict] = field(default_factory=list)  # the two groups' means with their intervals
    expect: dict = field(default_factory=dict)  # the `expect:` entry decided: index, metric, better, than
    look: dict | None = None  # adaptive seeds: the look it was read at (look, of, seeds); None: fixed seeds
    post_hoc: str = ""  # its margin was registered after the study's first result (workbench.report.registration)
    tests_claim: bool = True  # False when neither group learned: shown, not counted as testing the claim
    differs: list[str] = field(default_factory=list)  # the settings the two compared groups differ in (tuned ones too)
    qualifier: str = ""  # what the gates and the claim's predicted level add to the outcome (Verdict.qualifier)
    rung: dict = field(default_factory=dict)  # scale ladder: {key: value} of the rung it was decided at; {} without one

    # ---- the first screen's verdict table reads these -------------------------------------

    @property
    def reason(self) -> str:
        """What the label adds to the outcome ("only rope learned"), or ""."""
        rest = self.label.removeprefix(self.outcome).removeprefix(":").strip()  # "ceiling: the task ..."
        return rest[1:-1] if rest.startswith("(") and rest.endswith(")") else rest

    @property
    def difference_text(self) -> str:
        """'+0.572 [0.549, 0.595]', the difference of the group means with its interval."""
        d = {k: math.nan if v is None else v for k, v in self.difference.items()}
        if math.isnan(d.get("mean", math.nan)):
            return "–"
        return fmt_signed_interval(d["mean"], d.get("lo", math.nan), d.get("hi", math.nan))

    @property
    def interval_kind(self) -> str:
        """'95% paired': the difference's interval, as the table's second line names it."""
        level, method = self.difference.get("level"), self.difference.get("method")
        if level is None or self.difference_text == "–":
            return ""
        return level_text(level) + (f" {method}" if method else "")

    @property
    def seeds_text(self) -> str:
        """Each compared group's seeds, in the statement's order ('3 vs 3')."""
        return " vs ".join(str(g["n"]) for g in self.groups) or "–"


@dataclass
class Report:
    name: str
    kind: str
    question: str
    verdicts: list[VerdictLine]
    sections: list[Section]
    learned: list[str] = field(default_factory=list)  # the header's lines: what "learned" means, who met it
    verdict_figures: list[Figure] = field(default_factory=list)  # the first screen's, one per verdict metric
    verdict_rule: str = ""  # how the kind decides its verdicts, printed under them
    notices: list[str] = field(default_factory=list)  # above everything: e.g. runs the rule asks for that were not run
    pictured_runs: list[str] | None = None  # runs whose final weights its pictures loaded (what --with-data ships); None: a kind without pictures


# ---- number formatting (one place, so tables, captions and figures agree) ---------------------


def fmt_interval(mean: float, lo: float, hi: float) -> str:
    """'0.912 [0.899, 0.925]'; a single seed has no interval: '0.912 (1 seed)'."""
    if math.isnan(mean):
        return "–"
    if math.isnan(lo):
        return f"{fmt(mean)} (no CI: 1 seed)"
    return f"{fmt(mean)} [{fmt(lo)}, {fmt(hi)}]"


def fmt_signed_interval(mean: float, lo: float, hi: float) -> str:
    if math.isnan(mean):
        return "–"
    sign = "+" if mean > 0 else ""
    if math.isnan(lo):
        return f"{sign}{fmt(mean)} (no CI)"
    return f"{sign}{fmt(mean)} [{fmt(lo)}, {fmt(hi)}]"


def fmt_bytes(n: float | None) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "–"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def fmt_seconds(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "–"
    if s >= 120:
        return f"{s / 60:.3g} min"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"
