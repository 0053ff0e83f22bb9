"""The index's 2026 table (issue 65): one row per finding of studies/findings/2026.yaml, our verdict
at each width of the study's ladder, whether both widths agree (a flip said first), and a ledger of
these studies alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.report.document import Report, VerdictLine
from workbench.report.findings import FINDINGS_2026
from workbench.report.findings_by_width import verdict_cell
from workbench.report.index import build_index, summary

STUDY = """\
name: ladder
description: Does ALiBi copy better than no position signal at both widths?
task: {name: copy, train_length: 4, eval_lengths: [4, 8]}
train: {steps: 1}
sweep: {model.position: [none, alibi]}
scale: {model.d_model: [16, 32]}
expect:
  - {metric: accuracy@8, better: alibi, than: none}
"""

ROW = """\
findings:
  - paper: {authors: Doe et al., year: 2025, title: A modern claim}
    setup: "their setup"
    result: "their claim, in their words"
    study: ladder
    expect: {metric: accuracy@8, better: alibi, than: none}
    kind: difference
    registered: "2026-01-01 00:00"
"""


def verdict(width: int, outcome: str) -> VerdictLine:
    better, than = f"position=alibi, d_model={width}", f"position=none, d_model={width}"
    groups = [{"group": g, "mean": m, "lo": m - 0.05, "hi": m + 0.05, "n": 4, "constant": False}
              for g, m in ((better, 0.9), (than, 0.5))]
    return VerdictLine(f"{better} is better than {than} on accuracy@8", outcome, outcome, "detail", groups=groups,
                       difference={"mean": 0.4, "lo": 0.3, "hi": 0.5, "level": 0.975, "method": "paired"},
                       expect={"index": 0, "metric": "accuracy@8", "better": {"model.position": "alibi"},
                               "than": {"model.position": "none"}},
                       differs=["model.position"], rung={"model.d_model": str(width)})


def index_row(tmp_path: Path, outcomes: dict[int, str] | None) -> tuple[str, str]:
    """The 2026 table's one row, and the whole index, for verdicts with these outcomes per width."""
    studies, reports = tmp_path / "studies", tmp_path / "reports"
    (studies / "findings").mkdir(parents=True)
    (studies / "ladder.yaml").write_text(STUDY)
    (studies / FINDINGS_2026).write_text(ROW)
    if outcomes is not None:
        (reports / "ladder").mkdir(parents=True)
        s = summary(Report("ladder", "train", "q?", [verdict(w, o) for w, o in outcomes.items()], []),
                    [{"status": "finished", "recorded_at": "2026-06-01T12:00:00+00:00", "cpu_s": 120.0}])
        (reports / "ladder" / "summary.json").write_text(json.dumps(s))
    index = build_index(studies, reports)
    section = index[index.index("## The 2026 table"):].split("## The 2026 table's ledger")[0]
    [row] = [line for line in section.splitlines() if line.startswith("| ladder") or line.startswith("| [ladder")]
    return row, index


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip("|").split("|")]


@pytest.mark.parametrize("outcomes, same, agreement", [
    ({16: "holds", 32: "holds"}, "yes", "d\\_model=16 agrees; d\\_model=32 agrees"),
    ({16: "holds", 32: "does not hold"}, "no", "flips between widths: d\\_model=16 agrees; d\\_model=32 does not agree"),
    ({16: "holds", 32: "inconclusive"}, "undecided", "d\\_model=16 agrees; d\\_model=32 not comparable"),
    ({16: "holds"}, "not yet", "d\\_model=16 agrees; d\\_model=32 not comparable"),
    (None, "not yet", "d\\_model=16 not comparable; d\\_model=32 not comparable"),
])
def test_each_width_has_its_verdict_and_a_flip_is_said_first(tmp_path, outcomes, same, agreement):
    row, _ = index_row(tmp_path, outcomes)
    c = cells(row)
    assert c[1] == "their claim, in their words"
    for width, cell in zip((16, 32), c[2:4]):
        assert cell.startswith(f"d\\_model={width}: ")
        assert (outcomes or {}).get(width, "not run") in cell
    assert c[4] == same and c[5] == agreement


def test_what_the_gates_add_stays_beside_the_outcome(tmp_path):
    studies_row, _ = index_row(tmp_path, {16: "holds", 32: "holds"})
    assert "; holds; 4 seeds" in cells(studies_row)[2]
    line = verdict(16, "holds")
    line.qualifier = "only position=alibi, d_model=16 learned"
    assert "holds (only position=alibi, d_model=16 learned); 4 seeds" in verdict_cell(
        {"outcome": line.outcome, "qualifier": line.qualifier, "groups": line.groups, "difference": line.difference})


def test_the_2026_ledger_counts_its_studies_alone(tmp_path):
    _, index = index_row(tmp_path, {16: "holds", 32: "holds"})
    ledger = index[index.index("## The 2026 table's ledger"):]
    assert "| ladder | " in ledger and "2 of 2" in ledger
