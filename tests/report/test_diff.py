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


# ---- received summaries (issue 64) -----------------------------------------------------------


def raw_report(folder, text: bytes | str):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(folder)


def one_line_error(result, message):
    assert result.exit_code == 2 and result.output.startswith(f"error: {message}"), result.output
    assert len(result.output.splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.parametrize("mean", ["0.9", True, [0.9], {"value": 0.9}, None])
def test_a_number_diff_cannot_read_is_said_and_never_within(tmp_path, mean):
    """A difference that is not a number (text, a boolean, a list) or that only one report has
    (null) is named, and the verdict is not counted as reproduced (it was 'within ±0.05')."""
    shipped = report(tmp_path / "shipped", verdict(ROPE, "holds", 0.574, {"rope": 0.998, "none": 0.424}))
    mine = verdict(ROPE, "holds", 0.574, {"rope": 0.998, "none": 0.424})
    mine["difference"]["mean"] = mean
    result = diff(shipped, report(tmp_path / "yours", mine))
    assert result.exit_code == 1, result.output
    moved = result.output.splitlines()[4]
    why = "in shipped only" if mean is None else "yours: not a number"
    assert moved == (f"  moved:   group means up to 0; could not compare the difference ({why}): NOT READ, not "
                     "within ±0.05; same outcome")
    assert result.output.splitlines()[-1].startswith("1 of 1 verdicts differ beyond ±0.05 or in outcome (1 with a "
                                                     "number diff could not compare)")


def test_a_group_mean_that_is_not_a_number_is_said(tmp_path):
    shipped = report(tmp_path / "shipped", verdict(ROPE, "holds", 0.574, {"rope": 0.998, "none": 0.424}))
    yours = report(tmp_path / "yours", verdict(ROPE, "holds", 0.574, {"rope": "0.998", "none": 0.424}))
    result = diff(shipped, yours)
    assert result.exit_code == 1
    assert "could not compare the mean of rope (yours: not a number): NOT READ" in result.output


@pytest.mark.parametrize("text, message", [
    ('{"name": "quickstart", "verdicts": [' + "[" * 5000 + "]" * 5000 + "]}", "nested over 32 levels deep"),
    ('{"name": "quickstart", "verdicts": [{"statement": "x", "outcome": "holds", "difference": {"mean": 1'
     + "0" * 400 + "}}]}", "an integer of 401 digits, more than the workbench writes"),
    ('{"name": "quickstart", "verdicts": [{"statement": "x", "outcome": "holds", "difference": {"mean": 1e400}}]}',
     "1e400 is not a finite number"),
    ('{"name": "quickstart", "verdicts": [' + ",".join(['{"statement": "x", "outcome": "holds"}'] * 1001) + "]}",
     "over 1000 verdicts"),
])
def test_deep_huge_or_endless_summaries_are_one_line(tmp_path, text, message):
    shipped = report(tmp_path / "shipped")
    yours = raw_report(tmp_path / "yours", text)
    one_line_error(diff(shipped, yours), f"YOURS {yours}/summary.json: not a report summary ({message})")


def test_a_summary_over_the_size_bound_is_refused_before_it_is_parsed(tmp_path):
    shipped = report(tmp_path / "shipped")
    yours = tmp_path / "yours"
    yours.mkdir()
    with open(yours / "summary.json", "wb") as f:  # sparse: 9 MiB of nothing, never valid JSON
        f.truncate(9 * 2**20)
    one_line_error(diff(shipped, str(yours)), f"YOURS {yours}/summary.json is over 8 MiB")


def test_control_characters_of_received_text_never_reach_the_terminal(tmp_path):
    statement = ROPE + "\x1b]0;owned\x07\x1b[2J\r\u202e"
    name = "quick\x1b[1mstart"
    shipped = report(tmp_path / "shipped", verdict(statement, "holds", 0.574, {"rope\x1b[31m": 0.998}), name=name)
    yours = report(tmp_path / "yours", verdict(statement, "holds", 0.571, {"rope\x1b[31m": 0.997}), name=name)
    result = diff(shipped, yours)
    assert result.exit_code == 0, result.output
    assert not any(c in result.output for c in "\x1b\x07\r\u202e")
    assert result.output.splitlines()[0].endswith("study 'quick[1mstart':")
    assert result.output.splitlines()[1] == ROPE + "]0;owned[2J"
    assert "rope[31m 0.998" in result.output


def test_a_summary_saved_with_a_byte_order_mark_is_read(tmp_path):
    body = json.dumps({"name": "quickstart", "verdicts": [verdict(ROPE, "holds", 0.574, {"rope": 0.998})]})
    shipped = raw_report(tmp_path / "shipped", b"\xef\xbb\xbf" + body.encode())
    yours = report(tmp_path / "yours", verdict(ROPE, "holds", 0.571, {"rope": 0.997}))
    result = diff(shipped, yours)
    assert result.exit_code == 0 and result.output.splitlines()[-1].startswith("all 1 verdicts kept"), result.output


@pytest.mark.parametrize("tolerance", ["nan", "inf"])
def test_a_tolerance_that_is_not_finite_is_refused(tmp_path, tolerance):
    shipped = report(tmp_path / "shipped")
    one_line_error(diff(shipped, shipped, "--tolerance", tolerance), f"--tolerance: {float(tolerance)}: a distance")
