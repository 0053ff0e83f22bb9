"""`workbench diff SHIPPED YOURS`: two report folders of one study compared verdict by verdict
from their summary.json alone (synthetic summaries here; nothing trained)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from workbench.cli import main


def verdict(statement, outcome, difference, means):
    return {"statement": statement, "outcome": outcome, "label": outcome,
            "difference": {"mean": difference, "lo": difference - 0.05, "hi": difference + 0.05},
            "groups": [{"group": g, "mean": m} for g, m in means.items()]}


def report(folder, *verdicts, name="quickstart"):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"name": name, "verdicts": list(verdicts)}))
    return str(folder)


ROPE = "position=rope is better than position=none on accuracy@12"
ALIBI = "position=alibi is better than position=sinusoidal on accuracy@16"


def diff(*args):
    return CliRunner().invoke(main, ["diff", *args])


def test_a_report_within_the_tolerance_keeps_every_verdict(tmp_path):
    shipped = report(tmp_path / "shipped", verdict(ROPE, "holds", 0.574, {"rope": 0.998, "none": 0.424}))
    yours = report(tmp_path / "yours", verdict(ROPE, "holds", 0.571, {"rope": 0.997, "none": 0.426}))
    result = diff(shipped, yours)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1] == ROPE
    assert lines[2] == "  shipped: holds; difference +0.574 [+0.524, +0.624]; rope 0.998, none 0.424"
    assert lines[3] == "  yours:   holds; difference +0.571 [+0.521, +0.621]; rope 0.997, none 0.426"
    assert lines[4] == "  moved:   difference -0.003, group means up to 0.002: within ±0.05; same outcome"
    assert lines[-1] == "all 1 verdicts kept their outcome, their numbers within ±0.05"


def test_a_move_beyond_the_tolerance_a_changed_outcome_or_a_missing_verdict_exit_1(tmp_path):
    shipped = report(tmp_path / "shipped", verdict(ROPE, "holds", 0.574, {"rope": 0.998, "none": 0.424}),
                     verdict(ALIBI, "holds", 0.378, {"alibi": 0.584, "sinusoidal": 0.206}))
    yours = report(tmp_path / "yours", verdict(ROPE, "holds", 0.474, {"rope": 0.998, "none": 0.524}),
                   verdict(ALIBI, "inconclusive", 0.370, {"alibi": 0.580, "sinusoidal": 0.210}),
                   verdict("a third", "holds", 0.1, {}))
    result = diff(shipped, yours)
    assert result.exit_code == 1, result.output
    assert "  moved:   difference -0.1, group means up to 0.1: BEYOND ±0.05; same outcome" in result.output
    assert "within ±0.05; OUTCOME CHANGED (holds -> inconclusive)" in result.output
    assert "  shipped: not in this report" in result.output and "only one report asks this verdict" in result.output
    assert result.output.splitlines()[-1].startswith("3 of 3 verdicts differ beyond ±0.05 or in outcome")
    # a wider tolerance (another metric's units) takes the move, not the changed outcome
    wide = diff(shipped, yours, "--tolerance", "0.2")
    assert wide.exit_code == 1 and "2 of 3 verdicts differ beyond ±0.2" in wide.output


@pytest.mark.parametrize("make_yours, message", [
    (lambda d: None, "YOURS {d}: no summary.json there; give a report folder"),
    (lambda d: (d.mkdir(), (d / "summary.json").write_text("{not json")), "YOURS {d}/summary.json: not a report summary"),
    (lambda d: report(d, name="heads"), "SHIPPED is a report of study 'quickstart', YOURS of 'heads'"),
    *[(lambda d, verdict=verdict: (d.mkdir(), (d / "summary.json").write_text(
        json.dumps({"name": "quickstart", "verdicts": [verdict]}))), "YOURS {d}/summary.json: not a report summary")
      for verdict in ({"outcome": "holds"}, {"statement": ["x"], "outcome": "holds"},
                      {"statement": "x", "outcome": "holds", "groups": 5},
                      {"statement": "x", "outcome": "holds", "difference": "wide"})],
])
def test_bad_input_is_one_line(tmp_path, make_yours, message):
    shipped = report(tmp_path / "shipped")
    yours = tmp_path / "yours"
    make_yours(yours)
    result = diff(shipped, str(yours))
    assert result.exit_code == 2 and result.output.startswith(f"error: {message.format(d=yours)}")
    assert len(result.output.splitlines()) == 1 and "Traceback" not in result.output
