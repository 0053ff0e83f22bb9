"""The index of shipped studies: `reports/README.md`, one row per study in `studies/`.

    python -m workbench.report.index [--studies studies] [--reports reports]
    workbench report-index                     (the same, from the CLI)

Each row is read from committed files only (no results store needed): the study file (its
question, and the claim ids its header comment or `expect:` names), and what `workbench
run` / `workbench report` wrote to `reports/<name>/`: `summary.json` (verdicts, run counts,
run time) and, for scaling studies, `results.csv` (refitted here to one exponent line per
variant). A study that was never run is listed as "not run". Below the table, the budget
ledger: what each study's runs (and recorded pilots) cost in CPU minutes for the verdicts they
decided, by the kind of claim they are evidence of. Below that,
the studies folder's `findings/published.yaml` (when it has one) becomes the "Published
findings" table (workbench.report.findings).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workbench.cost import fit
from workbench.errors import unknown_name
from workbench.model.spec import spec_error_from
from workbench.registry import get_variant
from workbench.report.document import Report, fmt_seconds
from workbench.report.findings import FINDINGS_2026, FINDINGS_FILE, SUMMARY_FILE, findings_section
from workbench.report.findings_by_width import findings_by_width_section
from workbench.stats.outcomes import DECIDED, VERDICT_RULE, Outcome
from workbench.report.registration import minute
from workbench.results import Status, write_text_atomic
from workbench.study import load_study
from workbench.study.yaml_file import StudyError, read_yaml
from workbench.tasks import CLAIM_KINDS, SYMBOL_TASK

CLAIM_ID = re.compile(r"\b[EP]\d{1,2}\b")


# ---- summary.json (written with every report) -------------------------------------------------


def run_span_s(runs: Sequence[dict[str, Any]]) -> float | None:
    """Seconds from the first run's start to the last run's end, from the store's records
    (`recorded_at` at each run's end, minus its wall time): the sweep's elapsed time when it
    ran in one go (a resumed sweep includes the pause)."""
    ends, starts = [], []
    for r in runs:
        if not r.get("recorded_at") or r.get("wall_time_s") is None or not math.isfinite(r["wall_time_s"]):
            continue
        end = datetime.fromisoformat(r["recorded_at"]).timestamp()
        ends.append(end)
        starts.append(end - float(r["wall_time_s"]))
    return max(ends) - min(starts) if ends else None


def run_cpu_s(runs: Sequence[dict[str, Any]]) -> float | None:
    """CPU seconds the study's runs spent (each run's processes, summed; tuning runs included),
    or None when no run recorded it (a store written before CPU times were)."""
    spent = [float(r["cpu_time_s"]) for r in runs if r.get("cpu_time_s") is not None and math.isfinite(r["cpu_time_s"])]
    return sum(spent) if spent else None


def run_time_text(span_s: float | None, cpu_s: float | None, runs: int) -> str:
    """'12.5 min wall, 21.0 min CPU, 36 runs': how long the study took and what it cost."""
    cpu = "CPU time not recorded" if cpu_s is None else f"{fmt_seconds(cpu_s)} CPU"
    return f"{fmt_seconds(span_s)} wall, {cpu}, {runs} runs"


def summary(report: Report, runs: Sequence[dict[str, Any]], pilot_cpu_s: float | None = None) -> dict[str, Any]:
    """What the index needs from one report, as plain JSON. `pilot_cpu_s`: CPU seconds of the
    study's pilot runs (`workbench plan`) that it did not reuse, which the ledger counts too."""
    statuses: dict[str, int] = {}
    for r in runs:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    span, cpu = run_span_s(runs), run_cpu_s(runs)
    return {
        "name": report.name,
        "kind": report.kind,
        "question": report.question,
        "rule": VERDICT_RULE,
        "first_result": min((r["recorded_at"] for r in runs if r.get("recorded_at")), default=None),
        "verdicts": [{"statement": v.statement, "outcome": v.outcome, "label": v.label, "detail": v.detail,
                      "note": v.note, "tests_claim": v.tests_claim,
                      "difference": json_numbers(v.difference), "learned": [json_numbers(g) for g in v.gates],
                      "groups": [json_numbers(g) for g in v.groups], "expect": v.expect, "look": v.look,
                      "post_hoc": v.post_hoc, "differs": v.differs, "qualifier": v.qualifier, "rung": v.rung}
                     for v in report.verdicts],
        "learned_criterion": report.learned,
        "notices": report.notices,
        "pictured_runs": report.pictured_runs,
        "runs": len(runs),
        "statuses": dict(sorted(statuses.items())),
        "run_span_s": None if span is None else round(span),
        "run_cpu_s": None if cpu is None else round(cpu),
        **({"pilot_cpu_s": round(pilot_cpu_s)} if pilot_cpu_s else {}),
        **({"reused_cpu_s": round(reused)} if (reused := run_cpu_s(copied_runs(runs))) else {}),
    }


def copied_runs(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs copied in from another study's folder (`workbench run --reuse`), trained there."""
    return [r for r in runs if (r.get("environment") or {}).get("reused_from")]


def issued_label(verdict: dict[str, Any], summary: dict[str, Any], study) -> str:
    """A verdict's label as the index shows it. One issued before the current rule says so (and
    when it was decided by the learned gate alone, a difference 'only A learned' or not tested,
    says that too); so does a margin the study file declares post hoc where the report records
    no first-result time (a report that records it states a post-hoc margin in the label itself)."""
    label = verdict["label"]
    index = (verdict.get("expect") or {}).get("index")
    entries = getattr(study, "expect", [])
    exp = entries[index] if index is not None and index < len(entries) else None
    if exp is not None and exp.margin and exp.post_hoc and summary.get("first_result") is None:
        when = f" {minute(exp.registered)}" if exp.registered else ""
        label += f" [post hoc margin: registered{when}, after the study's results (from the project's history)]"
    rule = summary.get("rule")
    if rule == VERDICT_RULE:
        return label
    issued = f"the rule of {rule.split(':')[0]}" if rule else "a rule before 2026-12-01"
    how = ("; the learned gate ended its test" if verdict["outcome"] == Outcome.NOT_TESTED
           else "; decided by the learned gate alone" if rule is None and verdict["outcome"] in (
               Outcome.HOLDS, Outcome.DOES_NOT_HOLD) and " learned)" in label else "")
    return f"{label} [issued under {issued}{how}; not re-issued]"


def json_numbers(record: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinities (not JSON) as null."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}


def write_summary(dest: Path, report: Report, runs: Sequence[dict[str, Any]], pilot_cpu_s: float | None = None) -> Path:
    path = dest / SUMMARY_FILE
    path.write_text(json.dumps(summary(report, runs, pilot_cpu_s), indent=2, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    return path


# ---- the index ------------------------------------------------------------------------------


def claim_ids(study_path: Path, study) -> list[str]:
    """Claim ids named in the file's leading comment block and in `expect:` entries."""
    header = []
    for line in study_path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    found = CLAIM_ID.findall("\n".join(header))
    found += [e.claim for e in getattr(study, "expect", []) if e.claim]
    # Ranges like "E1-E4" name their ends only: spell them out.
    text = "\n".join(header)
    for lo, hi in re.findall(r"\bE(\d{1,2})-E(\d{1,2})\b", text):
        found += [f"E{i}" for i in range(int(lo), int(hi) + 1)]
    return sorted(set(found), key=lambda c: (c[0], int(c[1:])))


def scaling_findings(results: pd.DataFrame) -> list[str]:
    """One line per variant: fitted exponents of time and peak memory (live tensor bytes on the
    CPU, allocated bytes on CUDA) for forward and train step, or of decode time with and
    without the cache and of cache bytes (decode)."""
    ok = results[results["status"] == Status.FINISHED]
    exps = fit.fit_exponents(ok, by=("variant", "mode", "kv_cache"),
                             metrics=("time_median_s", "peak_memory_bytes", "kv_cache_bytes"))
    # With one swept key a variant is labelled by its bare value ("4"): name the key then.
    swept = [c for c in results.columns if c.startswith("model.")]
    lines = []
    for variant in dict.fromkeys(results["variant"]):
        name = f"{swept[0].rsplit('.', 1)[-1]}={variant}" if len(swept) == 1 and str(variant)[:1].isdigit() else variant
        parts = []
        for r in exps[exps["variant"] == variant].to_dict("records"):
            what = {"time_median_s": "time", "peak_memory_bytes": "peak memory", "kv_cache_bytes": "cache bytes"}[r["metric"]]
            if r["mode"] == "decode":
                if r["metric"] == "peak_memory_bytes":
                    continue
                cached = str(r["kv_cache"]) == "True"  # a bool, numpy bool or text, as read from CSV
                if r["metric"] == "kv_cache_bytes" and not cached:
                    continue
                cache = "cached" if cached else "uncached"
                what = "cache bytes" if r["metric"] == "kv_cache_bytes" else f"{cache} decode time"
            else:
                what = f"{r['mode']} {what}"
            parts.append(f"{what} n^{r['exponent']:.2f}")
        if parts:
            lines.append(f"{name}: {', '.join(parts)}")
    return lines


def cell(lines: Sequence[str]) -> str:
    """Several lines in one Markdown table cell."""
    return "<br>".join(line.replace("|", "\\|").replace("\n", " ") for line in lines) or "–"


def read_summary(reports_dir: Path, name: str) -> dict[str, Any] | None:
    path = reports_dir / name / SUMMARY_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def study_row(study_path: Path, study, reports_dir: Path, s: dict[str, Any] | None) -> list[str]:
    folder = reports_dir / study.name
    name = f"[{study.name}]({study.name}/report.md)" if (folder / "report.md").exists() else study.name
    claims = ", ".join(claim_ids(study_path, study)) or "–"
    question = " ".join(study.description.split()) or "–"
    if s is None:
        return [name, claims, question, "not run", "–", f"`{study_path.as_posix()}`"]
    if s["verdicts"]:
        findings = [f"**{issued_label(v, s, study)}**: {v['statement']}" for v in s["verdicts"]]
        if any("learned" not in v for v in s["verdicts"]):  # a summary written before the gate existed
            findings.insert(0, "_decided before the learned-at-all gate and paired/Holm statistics: "
                               "rerun the study to re-decide_")
        elif any("baselines" not in g for v in s["verdicts"] for g in v["learned"]):  # gated on chance alone
            findings.insert(0, "_decided against chance alone, before the task's stronger baselines: "
                               "rerun the study to re-decide_")
        findings[:0] = [f"_{notice}_" for notice in s.get("notices", [])]
    elif s["kind"] == "scaling" and (folder / "results.csv").exists():
        exponents = scaling_findings(pd.read_csv(folder / "results.csv"))
        findings = ["measured (no `expect:`; verdicts in the report's Notes); fitted exponents:", *exponents]
    else:
        findings = ["descriptive (no `expect:`): see the report"]
    failed = {k: n for k, n in s["statuses"].items() if k != Status.FINISHED}
    runs = run_time_text(s["run_span_s"], s.get("run_cpu_s"), s["runs"])
    runs += " (" + ", ".join(f"{n} {k}" for k, n in failed.items()) + ")" if failed else ""
    return [name, claims, question, cell(findings), runs,
            f"`{study_path.as_posix()}`"]


# ---- the budget ledger ----------------------------------------------------------------------

PILOTS_FILE = Path("ledger") / "pilots.yaml"  # in the studies folder (outside its *.yaml glob)


class Pilot(BaseModel):
    """CPU spent on a pilot before a study's runs (`workbench plan`'s, or runs that sized it by hand),
    where the project recorded it: a pilot's runs live in a folder of their own, not shipped."""

    model_config = ConfigDict(extra="forbid")
    study: str = Field(description="the study it sized")
    cpu_min: float = Field(ge=0, allow_inf_nan=False, description="its runs' CPU minutes")
    recorded: str = Field(min_length=1, description="where the figure was written down")


class PilotsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pilots: list[Pilot] = Field(default_factory=list)


def pilot_minutes(path: Path, studies: Sequence[str]) -> dict[str, float]:
    """Study -> the pilots' CPU minutes the studies folder's `ledger/pilots.yaml` records ({} without
    one); a row naming no study of the folder is refused, naming its line."""
    if not path.exists():
        return {}
    file = str(path)
    _, data, lines = read_yaml(path)
    try:
        pilots = PilotsFile.model_validate(data).pilots
    except ValidationError as err:
        spec = spec_error_from(err)
        raise StudyError(file, lines.line(spec.field), spec) from None
    out: dict[str, float] = {}
    for i, pilot in enumerate(pilots):
        if pilot.study not in studies:
            field = f"pilots.{i}.study"
            raise StudyError(file, lines.line(field), unknown_name(field, pilot.study, studies, "study"))
        out[pilot.study] = out.get(pilot.study, 0.0) + pilot.cpu_min
    return out


@dataclass(frozen=True)
class Spend:
    """What one study's report cost and what it decided: a row of the budget ledger."""

    study: str
    cpu_s: float | None  # CPU seconds its runs and its plan's unreused pilot runs spent (summary.json); None: not recorded
    asked: int  # verdicts its `expect:` entries ask
    decided: int  # of them, outcomes that conclude about the claim (holds, does not hold, equivalent)
    current: bool = False  # issued under today's VERDICT_RULE (re-issued, or first issued, since it)
    kind: str = SYMBOL_TASK  # what kind of claim its verdicts are evidence of (its task's `claim_kind`)
    pilot_s: float = 0.0  # CPU seconds of the pilots that sized it, where recorded
    incomplete: bool = False  # its report says the current rule asks for runs it has not run

    @property
    def total_s(self) -> float | None:
        return None if self.cpu_s is None else self.cpu_s + self.pilot_s


def decides(verdict: dict[str, Any]) -> bool:
    """A verdict that concluded about its claim. One qualified "(neither group learned)" is shown
    but does not test the claim (tests_claim false), so it buys nothing."""
    return verdict["outcome"] in DECIDED and verdict.get("tests_claim", True)


def claim_kind(study) -> str:
    """The kind of claim a study's verdicts are evidence of: its task's (`Task.claim_kind`)."""
    try:
        return get_variant("task", study.task["name"]).claim_kind
    except Exception:  # noqa: BLE001 - a task no longer installed: counted as a symbol task, the default
        return SYMBOL_TASK


def study_spend(name: str, summary: dict[str, Any], kind: str = SYMBOL_TASK, pilot_min: float = 0.0) -> Spend:
    cpu = summary.get("run_cpu_s")
    if cpu is not None:  # a pilot's runs the study reused are among its own; the others cost it too
        # a run copied from another study (--reuse) counts where it was trained: a shared arm once
        cpu += (summary.get("pilot_cpu_s") or 0) - (summary.get("reused_cpu_s") or 0)
    return Spend(name, cpu, len(summary["verdicts"]), sum(map(decides, summary["verdicts"])),
                 summary.get("rule") == VERDICT_RULE, kind, pilot_min * 60, bool(summary.get("notices")))


def per_decided(cpu_s: float, decided: int) -> str:
    """CPU minutes per decided verdict, or "—" when nothing was decided (an infinite price)."""
    return f"{cpu_s / 60 / decided:.1f}" if decided else "—"


def ledger_rows(spends: Sequence[Spend]) -> list[list[str]]:
    """The ledger's rows: each kind of claim's studies, then its subtotal; the total over every
    study, and over the studies issued under the current rule."""
    counted = [s for s in spends if s.cpu_s is not None]

    def total(title: str, of: Sequence[Spend]) -> list[str]:
        runs, pilots = sum(s.cpu_s for s in of), sum(s.pilot_s for s in of)
        decided, asked = sum(s.decided for s in of), sum(s.asked for s in of)
        return [f"**{title} ({len(of)} studies)**", "", f"**{runs / 60:.1f}**", f"**{pilots / 60:.1f}**",
                f"**{decided} of {asked}**", f"**{per_decided(runs + pilots, decided)}**"]

    rows = []
    for kind in CLAIM_KINDS:
        mine = [s for s in spends if s.kind == kind]
        rows += [[s.study + " (incomplete)" * s.incomplete, kind, "not recorded" if s.cpu_s is None else f"{s.cpu_s / 60:.1f}",
                  f"{s.pilot_s / 60:.1f}" if s.pilot_s else "–", f"{s.decided} of {s.asked}",
                  "–" if s.total_s is None else per_decided(s.total_s, s.decided)] for s in mine]
        if mine:
            rows.append(total(kind, [s for s in mine if s.cpu_s is not None]))
    rows.append(total("total", counted))
    rows.append(total("issued under the current rule", [s for s in counted if s.current]))
    return rows


def ledger_section(spends: Sequence[Spend], title: str = "Budget ledger") -> list[str]:
    """The budget ledger: per study that ran, grouped by the kind of claim its verdicts are evidence
    of, its CPU minutes (its runs', and its pilots' where recorded), verdicts decided of asked and
    CPU minutes per decided verdict; each kind's subtotal, the total, and the total over the studies
    issued under the current rule. CPU time, not wall time times cores: a run that waited for a busy
    machine spent nothing meanwhile. A study that recorded no CPU time is listed and left out of
    the totals, which say so."""
    if not spends:
        return []
    header = ["study", "kind of claim", "CPU min", "pilot CPU min", "verdicts decided of asked",
              "CPU min per decided verdict"]
    lines = [
        f"## {title}",
        "",
        "What each study's verdicts cost: the CPU minutes its runs spent (user and system time of each run's "
        "processes, as the results store records it, summed over the study's runs, tuning runs included, and "
        "the runs of its `workbench plan` pilot that the study did not reuse) and "
        f"those of the pilots that sized it where they were recorded (`{PILOTS_FILE.as_posix()}` in the studies "
        f"folder), the verdicts it decided (**{Outcome.HOLDS}**, **{Outcome.DOES_NOT_HOLD}** or "
        f"**{Outcome.EQUIVALENT}**, counting one that tests its claim) of those its `expect:` entries ask, and the "
        "CPU minutes per decided verdict, pilots included (—: none decided). A run a study copied from another "
        "study's folder (`workbench run --reuse`: an arm two studies share) counts in the study that trained it, "
        "so a shared arm is paid once. A study without `expect:` spends "
        "minutes and decides nothing; the totals count both. Studies are grouped by the kind of claim their "
        "verdicts are evidence of (their task's): a language model on text, a task of symbols, or a constructed "
        "mechanism (a task built so that the architecture decides the answer, where one-layer models decide "
        "plain differences in few seeds), each with its subtotal, so that a total moved by adding cheap claims "
        "of one kind shows as such. A study marked incomplete stopped short of the seeds the current rule asks "
        "for (its report says which): its undecided verdicts may yet decide. The last row counts only the studies "
        "whose report was issued under the current rule (the rule each report prints under its Verdicts).",
        "",
        "| " + " | ".join(header) + " |",
        "|---|---|--:|--:|--:|--:|",
        *("| " + " | ".join(row) + " |" for row in ledger_rows(spends)),
    ]
    missing = [s.study for s in spends if s.cpu_s is None]
    if missing:
        lines += ["", f"Left out of the total: {', '.join(missing)} (a report written before runs recorded their "
                      "CPU time)."]
    return [*lines, ""]


INTRO_FILE = "index-intro.md"


def intro(studies_dir: Path, reports_dir: Path) -> str:
    """The text above the table: the studies folder's own `index-intro.md` when it has one
    (a project's words about its studies), else a neutral description of the table."""
    own = studies_dir / INTRO_FILE
    if own.exists():
        return own.read_text(encoding="utf-8").rstrip("\n")
    return "\n".join([
        "# Studies and their reports",
        "",
        f"One row per study in `{studies_dir.as_posix()}/`. Verdicts come from each study's `expect:` entries, each",
        "decided by a test of the difference over seeds (paired or Welch, Holm-corrected over the study's entries):",
        (f"**{Outcome.HOLDS}** when its interval lies on the expected side of 0, **{Outcome.DOES_NOT_HOLD}** on the "
         f"other side, **{Outcome.EQUIVALENT}** when"),
        (f"inside the entry's `margin:`, **{Outcome.INCONCLUSIVE}** when it contains 0; **{Outcome.CEILING}** when "
         "both groups scored the best value on every seed."),
        ("Whether each group learned (beat the task's strongest baseline) qualifies the outcome and never ends the "
         "test: **(only A learned)**, or **(neither group learned)**, which does not count as testing the claim. "
         "The exact rule is printed under each"),
        "report's Verdicts.",
        "",
        f"Regenerate a report: `workbench run {studies_dir.as_posix()}/<name>.yaml --reports {reports_dir.as_posix()}`; "
        "regenerate this table:",
        f"`workbench report-index --studies {studies_dir.as_posix()} --reports {reports_dir.as_posix()}`.",
        f"(Put your own text above the table in `{studies_dir.as_posix()}/{INTRO_FILE}`.)",
    ])


def build_index(studies_dir: Path, reports_dir: Path) -> str:
    studies = {p: load_study(p).study for p in sorted(studies_dir.glob("*.yaml"))}
    summaries = {p: read_summary(reports_dir, study.name) for p, study in studies.items()}
    rows = [study_row(p, study, reports_dir, summaries[p]) for p, study in studies.items()]
    pilots = pilot_minutes(studies_dir / PILOTS_FILE, [study.name for study in studies.values()])
    spends = [study_spend(study.name, summaries[p], claim_kind(study), pilots.get(study.name, 0.0))
              for p, study in studies.items() if summaries[p] is not None]
    by_name = {s.name: s for s in studies.values()}
    findings = findings_section(studies_dir / FINDINGS_FILE, by_name, reports_dir)
    edition, edition_studies = findings_by_width_section(studies_dir / FINDINGS_2026, by_name, reports_dir,
                                                         "The 2026 table: modifications of 2024-2026 at two widths")
    edition_spends = [s for s in spends if s.study in edition_studies]
    header = ["study (report)", "claims", "question", "verdicts", "run time", "study file"]
    lines = [
        intro(studies_dir, reports_dir),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        *ledger_section(spends),
        *findings,
        *edition,
        *(ledger_section(edition_spends, "The 2026 table's ledger") if edition_spends else []),
    ]
    return "\n".join(lines)


def write_index(studies_dir: str | Path = "studies", reports_dir: str | Path = "reports") -> Path:
    reports_dir = Path(reports_dir)
    reports_dir.mkdir(parents=True, exist_ok=True)
    path = reports_dir / "README.md"
    write_text_atomic(path, build_index(Path(studies_dir), reports_dir))  # a link planted there is replaced, not followed
    return path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workbench.report.index", description=__doc__.splitlines()[0])
    parser.add_argument("--studies", default="studies", help="folder of study YAML files")
    parser.add_argument("--reports", default="reports", help="folder of reports; README.md is written here")
    args = parser.parse_args(argv)
    print(f"index: {write_index(args.studies, args.reports)}")


if __name__ == "__main__":
    main()
