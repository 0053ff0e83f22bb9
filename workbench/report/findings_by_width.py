"""A findings table read at each width: the index's section for a findings file whose studies
decide their `expect:` entry at every rung of a scale ladder (the table's 2026 edition, issue 65,
in the form x-transformers #58 asked for in 2021: one row per modification, its paper's claim, our
verdict with its interval at each width, whether the two widths agree, and what it cost).

A row's cells come from its study's summary.json, as the "Published findings" table's do
(workbench.report.findings): each verdict on the row's entry carries the rung it was decided at
(`rung`, {scale key: value}), and its agreement with the paper follows the row's `kind`. "Same at
both widths" reads yes only when every rung decided and their agreements match; a row whose
agreement differs between widths says so first, in its agreement cell."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.report.document import fmt_signed_interval, level_text
from workbench.report.findings import (
    AGREES,
    DISAGREES,
    NOT_COMPARABLE,
    POST_HOC,
    SUMMARY_FILE,
    Row,
    agreement,
    confounded,
    finding_key,
    load_findings,
    matching_verdicts,
    number,
    row_keys,
    row_post_hoc,
)
from workbench.report.registration import Commit, first_commits
from workbench.report.render import md_cell
from workbench.report.sweep_points import short_key, value_text

COLUMNS = ["modification (paper)", "their claim", "narrower width", "wider width", "same at both widths",
           "agreement", "CPU min", "why"]


def rung_text(study, rung: str) -> str:
    return f"{short_key(study.rung_key)}={rung}"


def rungs_of(study) -> list[str]:
    """The ladder's rungs as verdicts name them (value labels), narrowest first; one unnamed rung
    for a study without a ladder."""
    return [value_text(v) for v in study.scale[study.rung_key]] if study.scale else [""]


def verdict_cell(v: Mapping[str, Any]) -> str:
    """'+0.021 [-0.010, 0.052] (98.8% paired); inconclusive; 4 seeds' (the reason behind an
    outcome is in the study's report; what the gates add, '(only A learned)', is kept)."""
    d = v.get("difference") or {}
    shown = fmt_signed_interval(number(d.get("mean")), number(d.get("lo")), number(d.get("hi")))
    if d.get("level") is not None and shown != "–":
        shown += f" ({level_text(number(d['level']))} {d.get('method', '')})".replace(" )", ")")
    seeds = sorted({g.get("n") for g in v.get("groups", []) if g.get("n") is not None})
    outcome = v["outcome"] + (f" ({v['qualifier']})" if v.get("qualifier") else "")
    return "; ".join([shown, outcome, *([f"{seeds[-1]} seeds"] if seeds else [])])


def rung_agreement(v: Mapping[str, Any], row: Row) -> str:
    if confounded(v, row.finding):
        return NOT_COMPARABLE
    return agreement(v["outcome"], row.finding, v.get("tests_claim", True))


def same_at_both(agreements: Mapping[str, str], ran: Collection[str]) -> str:
    """yes when every rung decided the same way, no when decided rungs differ; not yet while a rung
    has no verdict (`ran`: the rungs that have one), undecided when one has a verdict that decides nothing."""
    decided = {a for a in agreements.values() if a in (AGREES, DISAGREES)}
    if len(agreements) < 2:
        return "one width only"
    if len(decided) > 1:
        return "no"
    if all(a in (AGREES, DISAGREES) for a in agreements.values()):
        return "yes"
    return "undecided" if set(agreements) <= set(ran) else "not yet"


def row_cells(row: Row, study, reports_dir: Path, commit: Commit | None) -> list[str]:
    f = row.finding
    folder = reports_dir / f.study
    name = f"[{f.study}]({f.study}/report.md)" if (folder / "report.md").exists() else md_cell(f.study)
    paper = md_cell(f"{f.paper.authors} {f.paper.year}, {f.paper.title}")
    summary_path = folder / SUMMARY_FILE
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.exists() else {}
    by_rung = {value_text(next(iter(v.get("rung", {}).values()), "")): v for v in matching_verdicts(row, summary)}
    rungs = rungs_of(study)
    cells, agreements = [], {}
    for rung in rungs[:2]:
        v = by_rung.get(rung)
        label = rung_text(study, rung) + ": " if rung else ""
        cells.append(md_cell(label + (verdict_cell(v) if v else "not run")))
        agreements[rung] = rung_agreement(v, row) if v else NOT_COMPARABLE
    cells += ["–"] * (2 - len(cells))
    same = same_at_both(agreements, [rung for rung in agreements if rung in by_rung])
    said = "; ".join(f"{rung_text(study, r)} {a}" if r else a for r, a in agreements.items())
    if same == "no":
        said = f"flips between widths: {said}"
    late = row_post_hoc(f, summary or None, commit)
    if late:
        said = f"{POST_HOC} ({said}; {late})"
    cpu = summary.get("run_cpu_s")
    if cpu is not None:  # as the ledger counts it: a run copied from another study counts there
        cpu += (summary.get("pilot_cpu_s") or 0) - (summary.get("reused_cpu_s") or 0)
    return [f"{name}<br>{paper}", md_cell(f.result), *cells, same, md_cell(said),
            "–" if cpu is None else f"{cpu / 60:.1f}", md_cell(f.why.strip()) or "–"]


def findings_by_width_section(path: Path, studies: Mapping[str, Any], reports_dir: Path,
                              title: str) -> tuple[list[str], Sequence[str]]:
    """The section's Markdown lines and the studies its rows name ([] and () without the file)."""
    if not path.exists():
        return [], ()
    rows = load_findings(path, studies)
    commits = first_commits(path, row_keys)  # {} outside a git work tree
    lines = [
        f"## {title}",
        "",
        f"One row per finding in `{path.as_posix()}`, each registered with its study before any run. Each width's",
        "cell is our verdict on the row's `expect:` entry at that rung of the study's ladder: the difference",
        "(better minus than) with its interval at the level its look read it, the outcome and the seeds per group",
        "(the study's report says how many more an undecided one would need). Same at both widths: yes, no, not yet",
        "(a width not run), or undecided (a width whose verdict decided nothing).",
        "Agreement follows the paper's kind of claim as in the published findings; a row whose agreement differs",
        "between widths says so first. CPU minutes are what the study trained, tuning runs and unreused pilot runs",
        "included; a run it copied from another study's folder (`--reuse`, the shared baseline arm) counts there.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
        *("| " + " | ".join(row_cells(row, studies[row.finding.study], reports_dir,
                                                 commits.get(finding_key(row.finding)))) + " |" for row in rows),
        "",
    ]
    return lines, tuple(dict.fromkeys(row.finding.study for row in rows))
