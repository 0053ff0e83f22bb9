"""Published findings side by side with our verdicts: the "Published findings" table of the
index (`reports/README.md`).

The studies folder's `findings/published.yaml` lists findings of papers, each tied to one
`expect:` entry of a study (named by its metric, better and than, as the study writes them):

    findings:
      - paper: {authors: Press et al., year: 2022, title: "Train Short, Test Long (ALiBi)"}
        claim: E6
        setup: "their setup, one line"
        result: "their number or result, one line"
        study: position-extrapolation-text
        expect: {metric: bpc_tail@256, better: alibi, than: sinusoidal}
        paper_expects: same      # `opposite` when the entry states the reverse of the paper's claim
        comparable: true         # false (with `why`) when our setup cannot test their claim
        why: ""                  # one line; required whenever the row does not read 'agrees'

Agreement is computed from the verdict in `reports/<study>/summary.json` by the kind of the
paper's claim (`agreement`); no verdict yet, or `comparable: false`, is not comparable. A row
registered after the study's first result (its `registered:` time, or the git commit that first
held the row when that is later: `registration.first_commits`) is post hoc: shown, not counted. The file
is checked against the study files (every study and `expect:` entry must exist); a row that
does not agree and has no `why` stops the index with an error naming it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workbench.errors import SpecError, WorkbenchError, unknown_name
from workbench.report.document import fmt, fmt_interval, fmt_signed_interval, level_text
from workbench.stats.outcomes import DECIDED, Outcome
from workbench.report.render import md_cell
from workbench.model.spec import spec_error_from
from workbench.report.registration import Commit, first_commits, minute, post_hoc, registered_at
from workbench.study.keys import point_labels
from workbench.study.yaml_file import LineMap, StudyError, read_yaml, suggest

FINDINGS_FILE = Path("findings") / "published.yaml"  # in the studies folder (outside its *.yaml glob)
FINDINGS_2026 = Path("findings") / "2026.yaml"  # the table's 2026 edition (issue 65), in the same format
SUMMARY_FILE = "summary.json"  # what each report writes for the index (workbench.report.index.summary)
AGREES, DISAGREES, NOT_COMPARABLE = "agrees", "does not agree", "not comparable"
POST_HOC = "post hoc: not counted"


class Paper(BaseModel):
    model_config = ConfigDict(extra="forbid")
    authors: str = Field(min_length=1, description='e.g. "Press et al."')
    year: int = Field(ge=1900, le=2100)
    title: str = Field(min_length=1, description="the paper's title, short")


class ExpectRef(BaseModel):
    """One `expect:` entry of the study, as the study writes it (a variant name, or {dotted.key: value})."""

    model_config = ConfigDict(extra="forbid")
    metric: str
    better: Any
    than: Any


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid")
    paper: Paper
    claim: str | None = Field(None, pattern=r"^E\d{1,2}$", description="the claim id in CLAIMS.md (E1, E2, ...); "
                              "null for a claim CLAIMS.md does not list (the 2026 table's: the paper's own)")
    setup: str = Field(min_length=1, description="their setup, one line")
    result: str = Field(min_length=1, description="their number or result, one line")
    study: str = Field(description="the name of our study")
    expect: ExpectRef
    paper_expects: Literal["same", "opposite"] = Field(
        "same", description="opposite: the expect: entry states the reverse of the paper's claim")
    comparable: bool = Field(True, description="false: our setup cannot test their claim (say why)")
    kind: Literal["difference", "direction", "equivalence"] = Field(
        description="what the paper claims: a difference of interest in one direction, a direction only (one is "
                    "at least as good), or an equivalence (the two are comparable); agreement follows it")
    registered: datetime = Field(description="when this row was written (UTC; the commit that introduced it): "
                                             "after its study's first result, the row is post hoc")
    post_hoc: bool | None = Field(
        None, description="for a report that records no first-result time (issued before it was recorded): "
                          "whether the row was written after that study's results, from the project's history")
    each_at_its_tuned_rate: bool = Field(
        False, description="the claim compares each arm at its own tuned learning rate, so arms that differ in "
                           "their rate as well as in the claim's factor still test it (otherwise such a row is not "
                           "comparable: the factor is confounded with the rate)")
    why: str = Field("", description="one line; required whenever the row does not read 'agrees'")


class FindingsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    findings: list[Finding] = Field(min_length=1)


MODELS: dict[str, type[BaseModel]] = {"": FindingsFile, "findings": Finding, "paper": Paper, "expect": ExpectRef}


def field_error(err: ValidationError) -> SpecError:
    """pydantic's first error as a SpecError on its dotted field. An unknown key comes first (it
    is usually a misspelt required one) and lists the valid keys."""
    unknown = [e for e in err.errors() if e["type"] == "extra_forbidden"]
    if not unknown:
        return spec_error_from(err)
    loc = unknown[0]["loc"]
    parent = next((str(p) for p in reversed(loc[:-1]) if isinstance(p, str)), "")
    valid = list(MODELS[parent].model_fields)
    return SpecError(".".join(map(str, loc)), "unknown key" + suggest(str(loc[-1]), valid), valid)


@dataclass
class Row:
    """A finding checked against the studies: the `expect:` entry it compares with."""

    finding: Finding
    field: str  # findings.<i>
    line: int | None
    metric: str
    better: dict[str, Any]  # the entry's points, as labels (what summary.json records)
    than: dict[str, Any]


def load_findings(path: Path, studies: Mapping[str, Any]) -> list[Row]:
    """Read and validate the findings file against the studies (name -> validated study);
    raises StudyError (a WorkbenchError) naming file, line and field."""
    file = str(path)
    _, data, lines = read_yaml(path)
    try:
        parsed = FindingsFile.model_validate(data)
    except ValidationError as err:
        spec = field_error(err)
        raise StudyError(file, lines.line(spec.field), spec) from None
    rows = []
    for i, finding in enumerate(parsed.findings):
        try:
            rows.append(check(finding, f"findings.{i}", studies, lines))
        except SpecError as err:
            raise StudyError(file, lines.line(err.field), err) from None
    return rows


def check(finding: Finding, field: str, studies: Mapping[str, Any], lines: LineMap) -> Row:
    if not finding.comparable and not finding.why.strip():
        raise SpecError(f"{field}.why", "missing: `comparable: false` needs one line on why")
    if finding.study not in studies:
        raise unknown_name(f"{field}.study", finding.study, studies, "study")
    study = studies[finding.study]
    entries = getattr(study, "expect", [])
    if not entries:
        raise SpecError(f"{field}.study", f"study {finding.study!r} has no expect: entries to compare with")
    ref = finding.expect
    better = point_labels(study.sweep_point(ref.better, f"{field}.expect.better"))
    than = point_labels(study.sweep_point(ref.than, f"{field}.expect.than"))
    if not any((e.metric, point_labels(e.better), point_labels(e.than)) == (ref.metric, better, than) for e in entries):
        raise SpecError(f"{field}.expect", f"study {finding.study!r} has no expect: entry "
                        f"{entry_text(ref.metric, better, than)}", [entry_text(e.metric, point_labels(e.better),
                                                                             point_labels(e.than)) for e in entries])
    return Row(finding, field, lines.line(field), ref.metric, better, than)


def entry_text(metric: str, better: Mapping[str, Any], than: Mapping[str, Any]) -> str:
    def point(p: Mapping[str, Any]) -> str:
        return ", ".join(f"{k}={v}" for k, v in p.items())

    return f"{{metric: {metric}, better: {point(better)}, than: {point(than)}}}"


# ---- the table -----------------------------------------------------------------------------------


def agreement(outcome: str | None, finding: Finding, tests_claim: bool = True) -> str:
    """Our verdict against the paper's claim, by the claim's kind (`paper_expects: opposite`
    reverses a direction):
    - difference: holds -> agrees, does not hold -> does not agree, equivalent -> does not agree
      (the interval inside the margin rules out a difference of interest);
    - direction: holds -> agrees, does not hold -> does not agree, equivalent -> not comparable
      (a difference inside the margin has no direction to check);
    - equivalence: equivalent -> agrees, holds or does not hold -> does not agree (a difference).
    Anything else (inconclusive, ceiling, identical, no verdict; a verdict where neither group
    learned, `tests_claim` false, whatever its outcome; an earlier rule's Outcome.NOT_TESTED), or
    `comparable: false` -> not comparable."""
    if not finding.comparable or outcome not in DECIDED or not tests_claim:
        return NOT_COMPARABLE
    if finding.kind == "equivalence":
        return AGREES if outcome == Outcome.EQUIVALENT else DISAGREES
    if outcome == Outcome.EQUIVALENT:
        return DISAGREES if finding.kind == "difference" else NOT_COMPARABLE
    return AGREES if (outcome == Outcome.HOLDS) == (finding.paper_expects == "same") else DISAGREES


RATE_KEYS = ("train.lr",)


def confounded(verdict: Mapping[str, Any], finding: Finding) -> str:
    """Why the verdict's two arms do not differ in the claim's factor alone, in words ('' when they
    do): they differ in more than one setting, unless the others are learning rates and the row
    says it compares each arm at its tuned rate. A summary.json without the settings (written before
    they were recorded) cannot say, and is not counted either."""
    differs = verdict.get("differs")
    if differs is None:
        return "its summary.json predates the record of which settings the arms differ in: regenerate the report"
    others = [k for k in differs if not (finding.each_at_its_tuned_rate and k in RATE_KEYS)]
    if len(others) <= 1:
        return ""
    rate = any(k in RATE_KEYS for k in differs)
    return (f"the compared arms differ in {' and '.join(others)}, not in the claim's factor alone"
            + ("; a rate tuned per arm is part of the factor only where the row says so (each at its tuned rate)"
               if rate else ""))


def row_key(row: Any) -> str:
    """What a row registers, as one string: its paper, study, `expect:` entry and kind. Its other
    fields (setup, result, why, post_hoc) may be written after the run without making it post hoc."""
    if not isinstance(row, Mapping):
        return ""
    paper = row.get("paper") if isinstance(row.get("paper"), Mapping) else {}
    return json.dumps([paper.get("authors"), paper.get("year"), row.get("study"), row.get("expect"), row.get("kind")],
                      sort_keys=True, default=str)


def row_keys(data: Any) -> list[str]:
    """The keys of every row of one version of the findings file (for registration.first_commits)."""
    rows = data.get("findings") if isinstance(data, Mapping) else None
    return [row_key(r) for r in rows] if isinstance(rows, list) else []


def finding_key(finding: Finding) -> str:
    return row_key(finding.model_dump(mode="json", include={"paper", "study", "expect", "kind"}))


def row_post_hoc(finding: Finding, summary: Mapping[str, Any] | None, commit: Commit | None = None) -> str:
    """Why the row is post hoc ('' when registered before its study's first result): from the
    report's first-result time against the row's registration (its stated time, or the commit that
    first held it in git when that is later), and from the row's own `post_hoc` (the project's
    history), which a re-issued report's later first result does not undo."""
    first = (summary or {}).get("first_result")
    if first is not None:
        late = post_hoc(registered_at(finding.registered, commit), first)
        if late:
            return f"{late}; in git since {commit.text()}" if commit is not None else late
    # `post_hoc: true` is the project's history: a row written after the results stays post hoc
    # when its study is re-issued into a fresh store (whose first result is later than the row)
    if finding.post_hoc:
        return f"registered {minute(finding.registered)}, after that study's results (from the project's history)"
    return ""


def number(value: Any) -> float:
    return math.nan if value is None else float(value)


def group_text(g: Mapping[str, Any]) -> str:
    """A group's mean with its interval; seeds that all scored the same are said so, as the
    study's report does, not shown as a missing interval."""
    if g.get("constant"):
        return f"{fmt(number(g['mean']))} (all {g.get('n')} seeds equal)"
    return fmt_interval(number(g["mean"]), number(g["lo"]), number(g["hi"]))


def verdict_text(v: Mapping[str, Any]) -> str:
    """'alibi is better than sinusoidal on bpc_tail@256: 3.33 [3.29, 3.37] vs 3.84 [3.75, 3.93];
    difference -0.512 [-0.663, -0.362] (97.5% paired); holds' (the groups in the statement's order)."""
    groups = [group_text(g) for g in v.get("groups", [])]
    levels = {number(g.get("level")) for g in v.get("groups", []) if g.get("level") is not None}
    shown = f" ({level_text(levels.pop())})" if len(levels) == 1 and groups else ""
    parts = [" vs ".join(groups) + shown] if groups else []
    d = v.get("difference") or {}
    if d.get("mean") is not None:
        text = f"difference {fmt_signed_interval(number(d['mean']), number(d.get('lo')), number(d.get('hi')))}"
        if not math.isnan(number(d.get("lo"))):  # an interval: say at which level and how
            text += f" ({level_text(number(d.get('level')))} {d.get('method', '')})"
        parts.append(text)
    outcome = v["outcome"]
    if outcome == Outcome.NOT_TESTED:
        missed = list(dict.fromkeys(g["group"] for g in v.get("learned", []) if not g.get("learned")))
        outcome += f" (did not learn: {'; '.join(missed)})" if missed else ""
    else:  # the label, with its reason where it has one ('only alibi learned')
        outcome = v.get("label", outcome)
    return f"{v['statement']}: {'; '.join(parts)}; {outcome}"


def matching_verdicts(row: Row, summary: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    want = {"metric": row.metric, "better": row.better, "than": row.than}
    return [v for v in summary.get("verdicts", [])
            if {k: (v.get("expect") or {}).get(k) for k in want} == want]


def cells(lines: Sequence[str]) -> str:
    """Several plain-text lines in one Markdown table cell, each escaped."""
    return "<br>".join(md_cell(line) for line in lines) or "–"


def table_row(row: Row, reports_dir: Path, commit: Commit | None = None) -> tuple[list[str], str | None]:
    """The row's cells, and the problem when it needs a `why` and has none. `commit`: the commit
    that first held the row in git, named in its study cell."""
    f = row.finding
    folder = reports_dir / f.study
    study = f"[{f.study}]({f.study}/report.md)" if (folder / "report.md").exists() else md_cell(f.study)
    if commit is not None:
        study += "<br>" + md_cell(f"in git since {commit.text()}")
    summary_path = folder / SUMMARY_FILE
    verdicts: list[Mapping[str, Any]] = []
    summary: Mapping[str, Any] = {}
    auto_why = ""
    if not summary_path.exists():
        auto_why = f"not run: no {summary_path.as_posix()}"
    else:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        verdicts = matching_verdicts(row, summary)
        if not verdicts:
            old = any("expect" not in v for v in summary.get("verdicts", []))
            auto_why = ("its summary.json predates this table: regenerate the report (`workbench report OUT`)"
                        if old else f"no verdict on this expect: entry in {summary_path.as_posix()}: rerun the study")
    ours = [verdict_text(v) for v in verdicts] or [f"{entry_text(row.metric, row.better, row.than)}: no verdict"]
    confounds = list(dict.fromkeys(c for c in (confounded(v, f) for v in verdicts) if c))
    agreements = list(dict.fromkeys(NOT_COMPARABLE if confounded(v, f) else agreement(v["outcome"], f,
                                                                                       v.get("tests_claim", True))
                                    for v in verdicts)) or [NOT_COMPARABLE]
    if confounds:  # not counted, whatever the file says
        auto_why = auto_why or "; ".join(confounds) + (f" (the row's own why: {f.why.strip()})" if f.why.strip() else "")
    late = row_post_hoc(f, summary if summary_path.exists() else None, commit)
    if late:  # shown, not counted
        agreements = [f"{POST_HOC} ({'; '.join(agreements)}; {late})"]
    why = auto_why or f.why.strip()  # without a verdict, that is the reason, whatever the file says
    problem = None
    if not why and agreements != [AGREES] and not late:
        problem = (f"{row.field}.why: missing: the row ({f.paper.authors} {f.paper.year} vs {f.study}) reads "
                   f"'{'; '.join(agreements)}' (verdict: {', '.join(v['outcome'] for v in verdicts)}), "
                   "so it needs one line on why")
    paper = f"{f.paper.authors} {f.paper.year}, {f.paper.title}" + (f" [{f.claim}]" if f.claim else "")
    return [md_cell(paper), cells([f.setup, f.result]), study, cells(ours), md_cell("; ".join(agreements)),
            md_cell(why) or "–"], problem


def findings_section(path: Path, studies: Mapping[str, Any], reports_dir: Path) -> list[str]:
    """The "Published findings" section's Markdown lines ([] without a findings file)."""
    if not path.exists():
        return []
    rows = load_findings(path, studies)
    commits = first_commits(path, row_keys)  # {} outside a git work tree
    built = [table_row(row, reports_dir, commits.get(finding_key(row.finding))) for row in rows]
    problems = [f"{path}:{row.line}: {problem}" if row.line else f"{path}: {problem}"
                for row, (_, problem) in zip(rows, built) if problem]
    if problems:
        raise WorkbenchError("\n".join(problems))
    header = ["paper (claim)", "their setup and number", "our study", "our number [CI at its level]",
              "agreement", "why"]
    return [
        "## Published findings",
        "",
        f"One row per finding in `{path.as_posix()}`, beside the verdict of the study's `expect:` entry that",
        "tests it: each group's mean over seeds with its t interval at the level the verdict's look read it, the",
        "difference with its (Holm-widened) interval, each level in parentheses, and the verdict. A row counts as",
        "agreeing or not only when the compared arms differ in the claim's factor alone (a learning rate tuned per",
        "arm is part of it where the row says `each_at_its_tuned_rate`). Agreement is computed from the kind of the",
        "paper's claim: a difference",
        (f"({Outcome.HOLDS} -> agrees, {Outcome.DOES_NOT_HOLD} or {Outcome.EQUIVALENT} -> does not agree), "
         f"a direction ({Outcome.HOLDS} -> agrees,"),
        (f"{Outcome.DOES_NOT_HOLD} -> does not agree, {Outcome.EQUIVALENT} -> not comparable), "
         f"an equivalence ({Outcome.EQUIVALENT} -> agrees, {Outcome.HOLDS}"),
        (f"or {Outcome.DOES_NOT_HOLD} -> does not agree); {Outcome.INCONCLUSIVE}, {Outcome.CEILING}, "
         f"{Outcome.FLOOR}, {Outcome.IDENTICAL}, a verdict where neither group learned, or not run -> not"),
        "comparable. A row registered after its study's first result is post hoc: shown, not counted. Where the",
        "file is in git, a row is registered by the first commit that holds its paper, study, entry and kind",
        "(shown under the study: \"in git since\"); a `registered:` time earlier than that commit does not count.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(cells_) + " |" for cells_, _ in built),
        "",
    ]
