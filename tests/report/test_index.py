"""The index of shipped studies (reports/README.md), built from study files and the
summary.json / results.csv that reports leave behind; no training here."""

import json
import textwrap

import pytest
from click.testing import CliRunner

from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.report.document import Report, VerdictLine
from workbench.stats.outcomes import VERDICT_RULE
from workbench.report.index import build_index, run_cpu_s, run_span_s, scaling_findings, summary

STUDY = """\
# Claims E1-E3 (and P9): a header comment names them.
name: {name}
description: Does it hold?
task: {{name: copy, train_length: 4}}
train: {{steps: 1}}
sweep: {{model.position: [none, rope]}}
expect:
  - {{metric: accuracy@4, better: rope, than: none, claim: E6}}
"""


def write_study(folder, name, task="{name: copy, train_length: 4}", metric="accuracy@4"):
    (folder / f"{name}.yaml").write_text(textwrap.dedent(STUDY.format(name=name)).replace(
        "{name: copy, train_length: 4}", task).replace("accuracy@4", metric))


def test_summary_counts_runs_and_spans_the_sweep():
    runs = [{"status": "finished", "recorded_at": "2026-01-01T10:00:10+00:00", "wall_time_s": 10.0, "cpu_time_s": 19.0},
            {"status": "diverged", "recorded_at": "2026-01-01T10:01:00+00:00", "wall_time_s": 30.0, "cpu_time_s": 41.0}]
    assert run_span_s(runs) == 60.0  # 10:00:00 (first start) to 10:01:00 (last end)
    assert run_cpu_s(runs) == 60.0 and run_cpu_s([{"cpu_time_s": None}]) is None
    verdict = VerdictLine("rope is better than none on accuracy@4", "holds", "holds", "detail", "note")
    s = summary(Report("x", "train", "q?", [verdict], []), runs)
    assert s["statuses"] == {"diverged": 1, "finished": 1} and s["run_span_s"] == 60 and s["run_cpu_s"] == 60
    assert s["verdicts"] == [{"statement": verdict.statement, "outcome": "holds", "label": "holds", "detail": "detail",
                              "note": "note", "tests_claim": True, "difference": {}, "learned": [], "groups": [], "expect": {},
                              "look": None, "post_hoc": "", "differs": [], "qualifier": "", "rung": {}}]
    # the rule it was issued under, and its first result (what a margin or a findings row registered later is after)
    assert s["rule"] == VERDICT_RULE and s["first_result"] == "2026-01-01T10:00:10+00:00"


def test_index_rows_read_summaries_and_mark_studies_not_run(tmp_path):
    studies, reports = tmp_path / "studies", tmp_path / "reports"
    studies.mkdir()
    write_study(studies, "ran")
    write_study(studies, "pending")
    (reports / "ran").mkdir(parents=True)
    (reports / "ran" / "report.md").write_text("# ran\n")
    (reports / "ran" / "summary.json").write_text(json.dumps({
        "name": "ran", "kind": "train", "question": "Does it hold?", "runs": 4,
        "statuses": {"finished": 3, "diverged": 1}, "run_span_s": 150, "run_cpu_s": 270,
        "verdicts": [{"statement": "rope is better than none on accuracy@4", "outcome": "does not hold",
                      "label": "does not hold", "note": ""}]}))
    text = build_index(studies, reports)
    ran = next(line for line in text.splitlines() if line.startswith("| [ran]"))
    assert "(ran/report.md)" in ran and "E1, E2, E3, E6, P9" in ran
    # a summary that records no rule was issued before 2026-12-01: every verdict says so
    assert ("**does not hold [issued under a rule before 2026-12-01; not re-issued]**: rope is better than none "
            "on accuracy@4") in ran
    assert "2.5 min wall, 4.5 min CPU, 4 runs (1 diverged)" in ran
    pending = next(line for line in text.splitlines() if line.startswith("| pending"))
    assert "| not run |" in pending
    result = CliRunner().invoke(main, ["report-index", "--studies", str(studies), "--reports", str(reports)])
    assert result.exit_code == 0 and (reports / "README.md").read_text() == text
    # issued under the rule of 2026-12-01 (before the gate stopped ending tests): marked with that rule, and a verdict
    # the gate ended says so; under today's rule, plain
    for rule, outcome, shown in (
            ("2026-12-01: every decision by a test of the difference; gates qualify", "does not hold",
             "**does not hold [issued under the rule of 2026-12-01; not re-issued]**"),
            ("2026-12-01: every decision by a test of the difference; gates qualify", "not tested",
             "**not tested [issued under the rule of 2026-12-01; the learned gate ended its test; not re-issued]**"),
            (VERDICT_RULE, "does not hold", "**does not hold**")):
        summary = json.loads((reports / "ran" / "summary.json").read_text())
        summary["rule"] = rule
        summary["verdicts"][0].update(outcome=outcome, label=outcome)
        (reports / "ran" / "summary.json").write_text(json.dumps(summary))
        ran = next(line for line in build_index(studies, reports).splitlines() if line.startswith("| [ran]"))
        assert f"{shown}: rope is better than none on accuracy@4" in ran, rule


def test_scaling_findings_fit_exponents_per_variant():
    import pandas as pd

    rows = [{"variant": v, "status": "finished", "mode": "train_step", "kv_cache": None, "length": n,
             "time_median_s": 1e-6 * n ** p, "peak_memory_bytes": 4.0 * n ** p}
            for v, p in (("full", 2), ("sliding", 1)) for n in (64, 128, 256, 512)]
    lines = scaling_findings(pd.DataFrame(rows))
    assert lines == ["full: train_step time n^2.00, train_step peak memory n^2.00",
                     "sliding: train_step time n^1.00, train_step peak memory n^1.00"]


def test_scaling_findings_of_decode_rows_read_back_from_csv(tmp_path):
    import pandas as pd

    rows = [{"variant": 4, "model.n_kv_heads": 4, "status": "finished", "mode": "decode", "kv_cache": cache, "length": n,
             "time_median_s": 1e-3 * n ** (0.5 if cache else 1.0), "kv_cache_bytes": 8.0 * n if cache else None}
            for cache in (True, False) for n in (64, 128, 256)]
    pd.DataFrame(rows).to_csv(tmp_path / "results.csv", index=False)
    [line] = scaling_findings(pd.read_csv(tmp_path / "results.csv"))
    assert "cached decode time n^0.50" in line and "uncached decode time n^1.00" in line
    assert "cache bytes n^1.00" in line and line.startswith("n_kv_heads=4: ")


def test_a_summary_gated_on_chance_alone_is_marked_for_a_rerun(tmp_path):
    studies, reports = tmp_path / "studies", tmp_path / "reports"
    studies.mkdir()
    write_study(studies, "ran")
    (reports / "ran").mkdir(parents=True)
    verdict = {"statement": "rope is better than none on accuracy@4", "outcome": "holds", "label": "holds", "note": ""}
    old_gate = {"group": "rope", "metric": "accuracy@4", "chance": 0.17, "learned": True}
    for gate, marked in ((old_gate, True), ({**old_gate, "baselines": [["order-blind", 0.44]]}, False)):
        (reports / "ran" / "summary.json").write_text(json.dumps({
            "name": "ran", "kind": "train", "question": "?", "runs": 2, "statuses": {"finished": 2}, "run_span_s": 1,
            "verdicts": [{**verdict, "learned": [gate]}]}))
        row = next(line for line in build_index(studies, reports).splitlines() if line.startswith("| ran"))
        assert ("decided against chance alone, before the task's stronger baselines" in row) == marked


def test_the_budget_ledger_prices_each_decided_verdict_in_cpu_minutes(tmp_path):
    """Three studies built from runs as the store records them (cpu_time_s per run): one decides
    2 of 3 (a verdict where neither group learned does not test its claim), one asks nothing,
    one decides nothing; a fourth report predates CPU times and is left out of the total."""
    studies, reports = tmp_path / "studies", tmp_path / "reports"
    studies.mkdir()

    def ran(name, outcomes, cpu_per_run, task="{name: copy, train_length: 4}"):
        write_study(studies, name, task, "bpc@16" if "text_lm" in task else "accuracy@4")
        runs = [{"status": "finished", "recorded_at": "2026-01-01T10:00:00+00:00", "wall_time_s": 60.0,
                 "cpu_time_s": cpu} for cpu in cpu_per_run]
        verdicts = [VerdictLine("rope is better than none on accuracy@4", outcome, outcome, "", "", tests_claim=tests)
                    for outcome, tests in outcomes]
        (reports / name).mkdir(parents=True)
        (reports / name / "summary.json").write_text(json.dumps(summary(Report(name, "train", "?", verdicts, []), runs)))

    ran("decides", [("holds", True), ("equivalent", True), ("holds", False)], [300.0, 300.0])  # 10 min
    ran("describes", [], [120.0])  # 2 min
    ran("undecided", [("inconclusive", True), ("does not hold", False)], [240.0, 240.0, 240.0])  # 12 min
    ran("old", [("holds", True)], [None])
    ran("text", [("holds", True)], [180.0], task="{name: text_lm, train_length: 16}")  # 3 min
    ran("mechanism", [("holds", True), ("holds", True)], [60.0], task="{name: difference, train_length: 4}")  # 1 min
    # "undecided" was issued under an earlier rule: it counts in the table's total, not in the current rule's
    earlier = json.loads((reports / "undecided" / "summary.json").read_text())
    (reports / "undecided" / "summary.json").write_text(json.dumps({**earlier, "rule": "2026-12-01: an earlier rule"}))
    # a pilot of 1 CPU min recorded for "text": its minutes count with the study's
    (studies / "ledger").mkdir()
    (studies / "ledger" / "pilots.yaml").write_text(
        'pilots:\n  - {study: text, cpu_min: 1.0, recorded: "its header"}\n')
    ledger = build_index(studies, reports).split("## Budget ledger")[1].split("\n## ")[0]
    rows = [line for line in ledger.splitlines() if line.startswith("| ")]
    assert rows[1:] == ["| text | language model on text | 3.0 | 1.0 | 1 of 1 | 4.0 |",
                        "| **language model on text (1 studies)** |  | **3.0** | **1.0** | **1 of 1** | **4.0** |",
                        "| decides | symbol task | 10.0 | – | 2 of 3 | 5.0 |",
                        "| describes | symbol task | 2.0 | – | 0 of 0 | — |",
                        "| old | symbol task | not recorded | – | 1 of 1 | – |",
                        "| undecided | symbol task | 12.0 | – | 0 of 2 | — |",
                        "| **symbol task (3 studies)** |  | **24.0** | **0.0** | **2 of 5** | **12.0** |",
                        "| mechanism | constructed mechanism | 1.0 | – | 2 of 2 | 0.5 |",
                        "| **constructed mechanism (1 studies)** |  | **1.0** | **0.0** | **2 of 2** | **0.5** |",
                        "| **total (5 studies)** | | **28.0** | **1.0** | **5 of 8** | **5.8** |".replace("| |", "|  |"),
                        "| **issued under the current rule (4 studies)** |  | **16.0** | **1.0** | **5 of 6** | **3.4** |"]
    # a pilot of a study the folder does not have is refused, naming its line
    (studies / "ledger" / "pilots.yaml").write_text('pilots:\n  - {study: txet, cpu_min: 1.0, recorded: "x"}\n')
    with pytest.raises(WorkbenchError, match=r"pilots.yaml:2.*pilots.0.study.*'txet'.*did you mean 'text'"):
        build_index(studies, reports)
    assert "Left out of the total: old" in ledger
