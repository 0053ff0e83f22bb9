"""The "Published findings" table of the index: the findings file validated against the study
files, agreement computed from each study's summary.json verdicts, and the shipped file checked
against the shipped studies (not against reports/, which are regenerated separately)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.report.document import Report, VerdictLine
from workbench.report.findings import FINDINGS_2026, FINDINGS_FILE, agreement, load_findings
from workbench.report.index import build_index, summary
from workbench.study import load_study

STUDIES = Path(__file__).resolve().parents[2] / "studies"

STUDY = """\
name: positions
description: Which position scheme copies best?
task: {name: copy, train_length: 4, eval_lengths: [4, 8]}
train: {steps: 1}
sweep: {model.position: [none, rope, alibi]}
expect:
  - {metric: accuracy@8, better: alibi, than: none}
  - {metric: accuracy@8, better: rope, than: none}
  - {metric: accuracy@4, better: rope, than: alibi}
"""

PAPER = "paper: {authors: Doe et al., year: 2024, title: A <b>bold</b> claim}"


def finding(expect: str, extra: str = "") -> str:
    return textwrap.indent(textwrap.dedent(f"""\
        - {PAPER}
          claim: E6
          setup: "their setup"
          result: "their number"
          study: positions
          expect: {expect}
        """) + textwrap.indent(textwrap.dedent(extra).rstrip("\n") + "\n" if extra else "", "  ") + DEFAULTS(extra), "  ")


def DEFAULTS(extra: str) -> str:  # noqa: N802 - the fields every row needs, unless the test sets them
    kind = "" if "kind:" in extra else "  kind: difference\n"
    registered = "" if "registered:" in extra else '  registered: "2026-01-01 00:00"\n'
    return kind + registered


def verdict(better: str, than: str, metric: str, outcome: str, means=(0.9, 0.5)) -> VerdictLine:
    groups = [{"group": g, "mean": m, "lo": m - 0.05, "hi": m + 0.05, "n": 3, "constant": False}
              for g, m in ((better, means[0]), (than, means[1]))]
    diff = means[0] - means[1]
    return VerdictLine(f"{better} is better than {than} on {metric}", outcome, outcome, "detail",
                       groups=groups, difference={"mean": diff, "lo": diff - 0.1, "hi": diff + 0.1, "level": 0.975,
                                                  "method": "paired", "p": 0.01, "p_holm": 0.02},
                       expect={"index": 0, "metric": metric, "better": {"model.position": better},
                               "than": {"model.position": than}})


@pytest.fixture
def folders(tmp_path):
    studies, reports = tmp_path / "studies", tmp_path / "reports"
    studies.mkdir()
    (studies / "positions.yaml").write_text(STUDY)
    (reports / "positions").mkdir(parents=True)
    (reports / "positions" / "report.md").write_text("# positions\n")
    verdicts = [verdict("alibi", "none", "accuracy@8", "holds"),
                verdict("rope", "none", "accuracy@8", "does not hold", means=(0.3, 0.5)),
                verdict("rope", "alibi", "accuracy@4", "inconclusive")]
    s = summary(Report("positions", "train", "q?", verdicts, []),
                [{"status": "finished", "recorded_at": FIRST_RESULT}])
    (reports / "positions" / "summary.json").write_text(json.dumps(s))
    return studies, reports


FIRST_RESULT = "2026-06-01T12:00:00+00:00"


def write_findings(studies: Path, *rows: str) -> Path:
    path = studies / FINDINGS_FILE
    path.parent.mkdir(exist_ok=True)
    path.write_text("findings:\n" + "".join(rows))
    return path


def findings_rows(text: str) -> list[list[str]]:
    table = text[text.index("## Published findings"):].splitlines()
    return [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in table if line.startswith("| Doe")]


def test_agreement_follows_the_verdict_and_the_papers_direction():
    same, = load_findings_from_text("")
    opposite, = load_findings_from_text("paper_expects: opposite\nwhy: reversed")
    unfit, = load_findings_from_text("comparable: false\nwhy: other setup")
    assert [agreement(o, same) for o in ("holds", "does not hold", "inconclusive", "not tested", None)] == [
        "agrees", "does not agree", "not comparable", "not comparable", "not comparable"]
    assert [agreement(o, opposite) for o in ("holds", "does not hold", "inconclusive")] == [
        "does not agree", "agrees", "not comparable"]
    # a difference ruled out by the entry's margin contradicts a paper that states one, either way round
    assert agreement("equivalent", same) == agreement("equivalent", opposite) == "does not agree"
    assert agreement("ceiling: the task does not separate them", same) == "not comparable"
    assert agreement("holds", unfit) == "not comparable"
    # the claim's kind decides what an equivalence says: a direction has none to check inside the
    # margin; an equivalence claim agrees with it and disagrees with a decided difference
    direction, = load_findings_from_text("kind: direction")
    equivalence, = load_findings_from_text("kind: equivalence\nwhy: x")
    assert agreement("equivalent", direction) == "not comparable" and agreement("holds", direction) == "agrees"
    assert [agreement(o, equivalence) for o in ("equivalent", "holds", "does not hold", "inconclusive")] == [
        "agrees", "does not agree", "does not agree", "not comparable"]


def test_a_row_registered_after_its_studys_first_result_is_shown_but_not_counted(folders):
    studies, reports = folders
    write_findings(
        studies,
        finding("{metric: accuracy@8, better: alibi, than: none}", 'registered: "2026-06-02 09:00"\n'),
        finding("{metric: accuracy@8, better: alibi, than: none}", 'registered: "2026-05-30 09:00"\n'),
    )
    late, early = findings_rows(build_index(studies, reports))
    assert late[4] == ("post hoc: not counted (agrees; registered 2026-06-02 09:00 UTC, after the study's first "
                       "result (2026-06-01 12:00 UTC))")
    assert early[4] == "agrees"
    # a report that records no first-result time: the row's own post_hoc, from the project's history
    s = json.loads((reports / "positions" / "summary.json").read_text())
    del s["first_result"]
    (reports / "positions" / "summary.json").write_text(json.dumps(s))
    write_findings(studies, finding("{metric: accuracy@8, better: alibi, than: none}", "post_hoc: true\n"))
    row, = findings_rows(build_index(studies, reports))
    assert row[4].startswith("post hoc: not counted (agrees; registered 2026-01-01 00:00 UTC, after that study's "
                             "results")
    # a row written after its study's results stays post hoc when the study is re-issued into a
    # fresh store, whose first result is later than the row's registration
    s["first_result"] = "2026-06-01T12:00:00+00:00"
    (reports / "positions" / "summary.json").write_text(json.dumps(s))
    row, = findings_rows(build_index(studies, reports))
    assert row[4].startswith("post hoc: not counted (agrees; registered 2026-01-01 00:00 UTC, after that study's "
                             "results")


def commit(repo: Path, when: str, message: str) -> str:
    """Commit everything in `repo` at `when` (UTC, ISO) as author and committer; its hash."""
    env = {**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when, "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    subprocess.run(["git", "add", "-A"], cwd=repo, env=env, check=True, capture_output=True)
    subprocess.run(["git", "commit", "-q", "-m", message], cwd=repo, env=env, check=True, capture_output=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_in_git_a_row_counts_when_its_commit_precedes_the_first_recorded_result(folders):
    """The provenance check against history: the study's first result is its store's earliest
    `recorded_at` (FIRST_RESULT, 2026-06-01 12:00); a row first committed before it is counted,
    one first committed after it is post hoc, whatever its own `registered:` says."""
    studies, reports = folders
    repo = studies.parent
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, capture_output=True)
    early = finding("{metric: accuracy@8, better: alibi, than: none}", 'registered: "2026-05-30 09:00"\n')
    write_findings(studies, early)
    before = commit(repo, "2026-05-30T09:00:00+00:00", "register the row, before the run")
    # A later commit edits the row's why (not what it registers) and adds a row that states an
    # earlier time than the commit that wrote it, after the study's first result.
    backdated = finding("{metric: accuracy@8, better: rope, than: none}",
                        'registered: "2026-05-30 09:00"\nwhy: written after the run\n')
    edited = finding("{metric: accuracy@8, better: alibi, than: none}",
                     'registered: "2026-05-30 09:00"\nwhy: edited after the run\n')
    write_findings(studies, edited, backdated)
    after = commit(repo, "2026-06-02T09:00:00+00:00", "a row after the run")
    counted, late = findings_rows(build_index(studies, reports))
    assert counted[2] == f"[positions](positions/report.md)<br>in git since 2026-05-30 09:00 UTC ({before[:7]})"
    assert counted[4] == "agrees"
    assert late[2].endswith(f"in git since 2026-06-02 09:00 UTC ({after[:7]})")
    assert late[4] == ("post hoc: not counted (does not agree; registered 2026-06-02 09:00 UTC, after the study's "
                       f"first result (2026-06-01 12:00 UTC); in git since 2026-06-02 09:00 UTC ({after[:7]}))")
    # without the history (an exported tree), only the stated times are there: both count
    shutil.rmtree(repo / ".git")
    assert [row[4] for row in findings_rows(build_index(studies, reports))] == ["agrees", "does not agree"]


def load_findings_from_text(extra: str):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "positions.yaml").write_text(STUDY)
        path = write_findings(Path(folder), finding("{metric: accuracy@8, better: alibi, than: none}", extra))
        study = load_study(Path(folder) / "positions.yaml").study
        return [row.finding for row in load_findings(path, {study.name: study})]


def test_table_renders_numbers_links_and_computed_agreement(folders):
    studies, reports = folders
    write_findings(
        studies,
        finding("{metric: accuracy@8, better: alibi, than: none}"),  # holds -> agrees
        finding("{metric: accuracy@8, better: {model.position: rope}, than: none}",  # does not hold, reversed
                "paper_expects: opposite\n"),
        finding("{metric: accuracy@4, better: rope, than: alibi}", "why: three seeds are too few <here>\n"),
        finding("{metric: accuracy@8, better: alibi, than: none}", "comparable: false\nwhy: not their setup\n"),
    )
    text = build_index(studies, reports)
    agrees, opposite, inconclusive, unfit = findings_rows(text)
    assert agrees[0] == "Doe et al. 2024, A &lt;b&gt;bold&lt;/b&gt; claim \\[E6\\]"  # escaped, no HTML
    assert agrees[1] == "their setup<br>their number"
    assert agrees[2] == "[positions](positions/report.md)"
    assert agrees[3] == ("alibi is better than none on accuracy@8: 0.9 \\[0.85, 0.95\\] vs 0.5 \\[0.45, 0.55\\]; "
                         "difference +0.4 \\[0.3, 0.5\\] (97.5% paired); holds")
    assert agrees[4:] == ["agrees", "–"]
    assert opposite[3].endswith("does not hold") and opposite[4:] == ["agrees", "–"]
    assert inconclusive[4:] == ["not comparable", "three seeds are too few &lt;here&gt;"]
    assert unfit[3].endswith("holds") and unfit[4:] == ["not comparable", "not their setup"]


def test_a_row_agrees_only_where_the_arms_differ_in_the_claims_factor_alone(folders):
    """swiglu-replication's case: SwiGLU at 1e-3 against GELU at 3e-3 "holds", but the arms differ in the
    FFN and the rate, so the row does not count as agreeing unless it says it compares each at its tuned
    rate; arms that differ in two swept settings never count."""
    studies, reports = folders
    summary_path = reports / "positions" / "summary.json"
    s = json.loads(summary_path.read_text())
    s["verdicts"][0]["differs"] = ["model.position", "train.lr"]
    summary_path.write_text(json.dumps(s))
    write_findings(studies, finding("{metric: accuracy@8, better: alibi, than: none}"),
                   finding("{metric: accuracy@8, better: alibi, than: none}", "each_at_its_tuned_rate: true\n"))
    confounded, tuned = findings_rows(build_index(studies, reports))
    assert confounded[4:] == ["not comparable", "the compared arms differ in model.position and train.lr, not in the "
                              "claim's factor alone; a rate tuned per arm is part of the factor only where the row says "
                              "so (each at its tuned rate)"]
    assert tuned[4:] == ["agrees", "–"]
    s["verdicts"][0]["differs"] = ["model.position", "model.d_model"]  # two swept settings: a rate does not excuse it
    summary_path.write_text(json.dumps(s))
    assert all(row[4] == "not comparable" for row in findings_rows(build_index(studies, reports)))
    del s["verdicts"][0]["differs"]  # a summary.json from before the record: not counted, and says why
    summary_path.write_text(json.dumps(s))
    assert "regenerate the report" in findings_rows(build_index(studies, reports))[0][5]


def test_a_row_that_does_not_agree_without_why_is_an_error_naming_it(folders):
    studies, reports = folders
    path = write_findings(studies, finding("{metric: accuracy@8, better: alibi, than: none}"),
                          finding("{metric: accuracy@8, better: rope, than: none}"))  # does not hold, no why
    with pytest.raises(WorkbenchError) as err:
        build_index(studies, reports)
    message = str(err.value)
    assert message.startswith(f"{path}:10: findings.1.why: missing: the row (Doe et al. 2024 vs positions) reads "
                              "'does not agree' (verdict: does not hold)")
    result = CliRunner().invoke(main, ["report-index", "--studies", str(studies), "--reports", str(reports)])
    assert result.exit_code != 0 and "findings.1.why: missing" in result.output + (result.stderr or "")
    assert not isinstance(result.exception, AssertionError) and "Traceback" not in result.output


def test_a_study_not_run_reads_not_comparable_without_a_why(folders):
    studies, reports = folders
    (reports / "positions" / "summary.json").unlink()
    write_findings(studies, finding("{metric: accuracy@8, better: alibi, than: none}"))
    [row] = findings_rows(build_index(studies, reports))
    assert row[4] == "not comparable" and row[5].startswith("not run: no ")


@pytest.mark.parametrize("edit, field, hint", [
    (("study: positions", "study: positoins"), "findings.0.study", "did you mean 'positions'?"),
    (("claim: E6", "claim: X6"), "findings.0.claim", "pattern"),
    (("setup:", "setpu:"), "findings.0.setpu", "did you mean 'setup'?"),
    (("better: alibi", "better: learned"), "findings.0.expect.better", "is not a swept value"),
    (("accuracy@8", "accuracy@16"), "findings.0.expect", "has no expect: entry"),
])
def test_bad_findings_name_the_field(folders, edit, field, hint):
    studies, reports = folders
    path = write_findings(studies, finding("{metric: accuracy@8, better: alibi, than: none}").replace(*edit))
    with pytest.raises(WorkbenchError) as err:
        build_index(studies, reports)
    assert str(err.value).startswith(f"{path}:") and f": {field}: " in str(err.value) and hint in str(err.value)


def test_comparable_false_needs_a_why(folders):
    studies, reports = folders
    write_findings(studies, finding("{metric: accuracy@8, better: alibi, than: none}", "comparable: false\n"))
    with pytest.raises(WorkbenchError, match=r"findings\.0\.why: missing: `comparable: false`"):
        build_index(studies, reports)


def test_shipped_findings_validate_against_the_shipped_studies():
    """Every study and expect: entry the shipped file names exists (reports are not consulted)."""
    studies = {s.name: s for s in (load_study(p).study for p in sorted(STUDIES.glob("*.yaml")))}
    rows = load_findings(STUDIES / FINDINGS_FILE, studies)
    assert len(rows) >= 5  # issue 13: at least five published findings side by side


def test_the_2026_findings_validate_against_the_shipped_studies():
    """The 2026 table's rows (issue 65): at least eight findings, each naming an `expect:` entry of
    its study, none tied to a claim of CLAIMS.md."""
    studies = {s.name: s for s in (load_study(p).study for p in sorted(STUDIES.glob("*.yaml")))}
    rows = load_findings(STUDIES / FINDINGS_2026, studies)
    assert len(rows) >= 8 and len({row.finding.study for row in rows}) == len(rows)
    assert all(row.finding.claim is None for row in rows)


def test_the_documented_example_validates(tmp_path):
    guide = (STUDIES.parent / "docs" / "guide.md").read_text(encoding="utf-8")  # the user guide's example
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", guide, flags=re.S) if "findings:" in b]
    path = tmp_path / "published.yaml"
    path.write_text(textwrap.dedent(block), encoding="utf-8")
    studies = {s.name: s for s in (load_study(p).study for p in sorted(STUDIES.glob("*.yaml")))}
    [row] = load_findings(path, studies)
    assert row.finding.study == "position-extrapolation-text"


def test_groups_whose_seeds_all_scored_the_same_say_so():
    """A ceiling group has no interval because its seeds agree, not because it has one seed."""
    from workbench.report.findings import verdict_text

    verdict = {"statement": "4 is better than 1 on accuracy@4", "outcome": "inconclusive",
               "label": "inconclusive (every seed gave the same difference)",
               "groups": [{"group": "4", "mean": 1.0, "lo": 1.0, "hi": 1.0, "n": 3, "constant": True},
                          {"group": "1", "mean": 0.9, "lo": 0.8, "hi": 1.0, "n": 3, "constant": False}],
               "difference": {"mean": 0.0, "lo": None, "hi": None, "level": 0.95, "method": "paired"}}
    text = verdict_text(verdict)
    assert "1 (all 3 seeds equal) vs 0.9 [0.8, 1]" in text
    assert "1 seed" not in text and "95%" not in text


LADDER = """\
name: ladder
description: Does an FFN help at every width?
task: {name: copy, train_length: 4}
train: {steps: 1}
sweep: {model.ffn: [none, gelu]}
scale: {model.d_model: [16, 32]}
expect:
  - {metric: accuracy@4, better: gelu, than: none}
"""


def test_a_finding_names_a_ladder_study_entry_as_the_study_writes_it(tmp_path):
    """The ladder's size key is a rung, not a compared key: `better: gelu` names the entry, as in the study."""
    (tmp_path / "ladder.yaml").write_text(LADDER)
    study = load_study(tmp_path / "ladder.yaml").study
    path = tmp_path / FINDINGS_FILE
    path.parent.mkdir()
    path.write_text("findings:\n" + finding("{metric: accuracy@4, better: gelu, than: none}").replace(
        "study: positions", "study: ladder"))
    row, = load_findings(path, {"ladder": study})
    assert (row.better, row.than) == ({"model.ffn": "gelu"}, {"model.ffn": "none"})
