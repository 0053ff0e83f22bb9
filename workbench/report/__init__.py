"""Comparison reports: `workbench.api.write_report(out_dir)` reads a study's results store, its kind
builds the report from it, and the functions here write

    reports/<study>/index.html   one self-contained page (inline CSS, relative PNG links)
    reports/<study>/report.md    the same content for code-hosting sites
    reports/<study>/figures/*.png
    reports/<study>/results.csv  every run, one row each, variant label first
    reports/<study>/summary.json verdicts, run counts and run time (read by the index of
                                 shipped studies, workbench.report.index)

Nothing is trained or measured here: a report is a pure function of the store (and, for the
attention pictures, of the final weights runs left in their folders), so regenerating it
gives the same files byte for byte: rows are sorted, there are no timestamps, and PNGs carry
no creation date or software version.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import shlex
import shutil
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from workbench import stopping
from workbench.run import store
from workbench.run.store_schema import side_files
from workbench.run.folder import refuse_links
from workbench.results import CONFIG_FILE, FINAL, FINAL_WEIGHTS, Status, check_regular, git_commit, open_regular
from workbench.results import run_stage, short_commit
from workbench.errors import WorkbenchError, WorkbenchWarning
from workbench.kinds import study_kinds
from workbench import registry
from workbench.variants import MODEL_AXES, variant_names
from workbench.report.document import Paragraph, Report, Section, fmt_seconds
from workbench.report.index import run_cpu_s, run_span_s, run_time_text, write_summary
from workbench.report.render import render_html, render_markdown
from workbench.study import STORED, unwrap

STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a study's `name` (workbench.study), a folder name

REPORT_FILES = ("index.html", "report.md", "results.csv", "summary.json")


# Recorded per run, different for every run: read by timing_caveat, not listed as environment.
PER_RUN_ENVIRONMENT = ("load_1m",)


def merged_environment(environments: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """One entry per key; several distinct values (runs on different machines) are all listed."""
    keys = sorted({k for env in environments for k in env if k not in PER_RUN_ENVIRONMENT})
    out = {}
    for key in keys:
        values = sorted({str(env.get(key)) for env in environments if env.get(key) is not None})
        out[key] = ", ".join(values) if values else "–"
    return out


def timing_caveat(records: Sequence[Mapping[str, Any]], overlap: bool = True) -> str | None:
    """One line for every place that shows a timing, when the runs' timings come from a shared
    machine: runs that trained at the same time (--jobs N, two sweeps at once; with `overlap`),
    or a machine whose load exceeded its cores when a run ended (other work competed for them).
    None otherwise."""
    spans = [] if not overlap else [
        (end - float(r["wall_time_s"]), end) for r in records if r.get("recorded_at") and r.get("wall_time_s") is not None
        for end in [datetime.fromisoformat(r["recorded_at"]).timestamp()]]
    # the most runs training at one moment: +1 at each start, -1 at each end (a second of slack for
    # the driver's recording after a run returns)
    events = sorted([(min(start + 1.0, end), 1) for start, end in spans] + [(end, -1) for _, end in spans])
    running = concurrent = 0
    for _, change in events:
        running += change
        concurrent = max(concurrent, running)
    busy = [r for r in records if (r.get("environment") or {}).get("load_1m") is not None
            and r["environment"]["load_1m"] > (r["environment"].get("cores") or math.inf)]
    why = []
    if concurrent > 1:
        why.append(f"up to {concurrent} runs trained at the same time")
    if busy:
        why.append(f"the load exceeded the {busy[0]['environment']['cores']} cores at the end of {len(busy)} of "
                   f"{len(records)} runs")
    if not why:
        return None
    return (f"Caveat: these timings come from a shared machine ({'; '.join(why)}), so times and throughput "
            "compare only roughly.")


def reproduce_command(info: Mapping[str, Any], out_dir: Path) -> str:
    """The commands that train the study again and report it. A report rebuilt from its shipped
    data (REPORT/data) trains into runs/<name>, never into the shipped store, and names the
    rebuild beside it."""
    source = info.get("source") or f"<the study file of {info.get('name', 'this study')}>"
    profile = info.get("profile")
    overrides = info.get("overrides") or []
    sets = "".join(f" --set {shlex.quote(text)}" for text in overrides)
    shipped = out_dir.name == DATA_DIR and out_dir.parent.name == str(info.get("name"))  # REPORTS/<name>/data
    trained = Path("runs") / str(info.get("name")) if shipped else out_dir
    run = f"workbench run {source}" + (f" --profile {profile}" if profile else "") + sets + f" --out {trained}"
    rebuild = f"\nworkbench report {out_dir}  # or: this report again, from its shipped data" if shipped else ""
    return f"{run}\nworkbench report {trained}{rebuild}"


def write_files(report: Report, results: pd.DataFrame, dest: Path) -> Path:
    """index.html, report.md and results.csv into `dest` (figures are already there)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "index.html").write_text(render_html(report), encoding="utf-8")
    (dest / "report.md").write_text(render_markdown(report), encoding="utf-8")
    results.to_csv(dest / "results.csv", index=False, lineterminator="\n")
    return dest / "index.html"


def fresh_folder(dest: Path) -> None:
    """Remove what an earlier report wrote here (a variant dropped since must not linger, nor
    the data of another build)."""
    for folder in (dest / "figures", dest / DATA_DIR):
        if folder.exists():
            shutil.rmtree(folder)
    for name in REPORT_FILES:
        (dest / name).unlink(missing_ok=True)


def swap_in(built: Path, dest: Path) -> None:
    """Replace the report in `dest` by the one built in `built`, by renames: a report that fails
    to build leaves the old one whole."""
    dest.mkdir(parents=True, exist_ok=True)
    fresh_folder(dest)
    for entry in built.iterdir():
        os.replace(entry, dest / entry.name)


def study_of(info: Mapping[str, Any]):
    """The validated study object stored with the results."""
    kinds = study_kinds()
    data = info.get("study")
    if not isinstance(data, Mapping):
        raise WorkbenchError("the results store holds no study description; rerun `workbench run` into it")
    kind = data.get("kind", "train")
    if not isinstance(kind, str) or kind not in kinds:
        raise WorkbenchError(f"the stored study has kind {str(kind)[:40]!r}, which this workbench does not know "
                             f"(valid: {', '.join(sorted(kinds))})")
    try:
        return kinds[kind].study.model_validate(data, context={STORED: True})
    except (ValidationError, WorkbenchError) as err:  # a SpecError from a validator, or pydantic's report
        problem = unwrap(err, fields=kinds[kind].study.model_fields) if isinstance(err, ValidationError) else err
        raise WorkbenchError(f"the results store holds a damaged study description ({str(problem)[:200]}); "
                             "move the store away and run the study again") from None


def missing_variants(configs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """`axis name` of every variant or task the stored runs used that no installed package
    provides now (its plugin was uninstalled). A config without those names is a damaged row."""
    used = set()
    for run_id, c in configs.items():
        try:
            used |= {("task", str(c["task"]["name"]))}
            used |= {(axis, name) for axis in MODEL_AXES for name in variant_names(c["model"], axis)}
        except (KeyError, TypeError):
            raise WorkbenchError(f"the stored config of run {str(run_id)[:40]!r} names no task or variant (its "
                                 "`name`): the store is damaged; move it away and run the study again") from None
    return sorted(f"{axis} {name!r}" for axis, name in used if name not in registry.variants(axis))


class ReportSkipWarning(WorkbenchWarning):
    """A part of a report that needs code no longer installed was left out."""


def build_then_swap(final: Path, build: Callable[[Path], None]) -> None:
    """`build(folder)` writes a report into a fresh folder beside `final` (.NAME.building-PID),
    which is then swapped in by renames (swap_in): a report that fails to build, or a full disk,
    leaves the old one whole. `final` is a checked destination (report_destination)."""
    dest = final.parent / f".{final.name}.building-{os.getpid()}"
    try:
        dest.mkdir(parents=True)  # never an existing name: nothing planted there is followed
    except OSError as err:
        raise WorkbenchError(f"{final.parent}: cannot write the report here ({err.strerror}); use --out for a "
                             "writable folder") from None
    try:
        build(dest)
        with stopping.immediate(None):  # renames: never cut in half by a stop
            swap_in(dest, final)
    except OSError as err:  # a full disk, a read-only folder: the old report stays whole
        raise WorkbenchError(f"{err.filename or final}: cannot write the report ({err.strerror}); free some space or "
                             "use --out for a writable folder (the results are untouched)") from None
    finally:
        shutil.rmtree(dest, ignore_errors=True)


DATA_DIR = "data"  # in a report folder: the store it was built from, `workbench report` reads it again


def pictured_runs(report_dir: Path) -> set[str] | None:
    """The runs the report just written in `report_dir` drew its pictures from (its summary.json's
    `pictured_runs`), None where it drew none (pictures off, or a kind without them)."""
    listed = json.loads((report_dir / "summary.json").read_text(encoding="utf-8")).get("pictured_runs")
    return None if listed is None else set(listed)


def ship_data(out_dir: Path, dest: Path, own: bool = False, pictured: Collection[str] | None = None) -> None:
    """The data behind a report, compact enough to commit beside it: the results store (runs,
    curves, metrics, provenance; its rows copied into a fresh store, store.copy_store, so a
    received store's schema never travels) and the final weights the pictures load: the runs in
    `pictured` (what the report's pictures drew from: its summary.json's `pictured_runs`), or,
    where the report drew none (None), each variant's finished run with the lowest seed, not a
    tuning run; in float16 (ship_file), read as regular files inside their run folders.
    `workbench report DEST` rebuilds the report from it in a fresh clone. `own`: the report is
    rebuilt from this very data (REPORT/data), whose store the build has just read and so
    checked (store_schema.check_schema): it is kept byte for byte, as a copy of its rows
    would lay out every page anew and change a committed file although no row changed (not
    when its WAL side file holds writes the store file lacks; reading it leaves an empty one)."""
    dest.mkdir(parents=True)
    db = out_dir / store.DB_FILE
    wal = side_files(db)[0]
    if own and (not os.path.lexists(wal) or (check_regular(wal) and os.lstat(wal).st_size == 0)):
        copy_regular(db, dest / store.DB_FILE)
    else:
        store.copy_store(out_dir, dest)
    finished = [r for r in store.Store(out_dir, create=False).runs()  # tuning runs draw no picture
                if r["status"] == Status.FINISHED and run_stage(r["config"]) == FINAL]
    lowest: dict[str, dict[str, Any]] = {}
    for r in sorted(finished, key=lambda r: r["seed"]):
        if pictured is None or r["run_id"] in pictured:
            lowest.setdefault(json.dumps(r["swept"], sort_keys=True), r)
    for r in lowest.values():
        folder = store.run_dir(out_dir, r["run_id"])
        kept = dest / store.RUNS_DIR / r["run_id"]
        for name in (FINAL_WEIGHTS, CONFIG_FILE):
            if check_regular(folder / name):  # a link or FIFO planted there is refused, never followed
                kept.mkdir(parents=True, exist_ok=True)
                ship_file(folder / name, kept / name)


def ship_file(source: Path, target: Path) -> None:
    """A run folder's file into shipped data: final weights at shipped precision (float16, what
    the pictures are drawn at: workbench.model.weights); weights already at it (a rebuild from
    shipped data), a weights file that does not read as one (refused in one line where it is
    loaded) and any other file are copied byte for byte."""
    if source.name == FINAL_WEIGHTS:
        from workbench.model.weights import write_shipped_weights  # torch loads only where weights ship

        try:
            if write_shipped_weights(source, target):
                return
        except Exception:  # noqa: BLE001 - received data: whatever it holds, the copy below ships it unchanged
            target.unlink(missing_ok=True)
    copy_regular(source, target)


def copy_regular(source: Path, target: Path) -> None:
    """`source`, a regular file (never through a link), into a new file `target`."""
    with open_regular(source) as src, open(target, "xb") as dst:
        shutil.copyfileobj(src, dst)


def report_destination(reports_dir: Path, name: str) -> Path:
    """reports_dir/name, once it is known to be a real folder (or absent) inside reports_dir:
    a report replaces files and deletes figures/ there, and must not follow a link out. Build
    folders that a killed report left (.NAME.building-PID) are removed."""
    if not STUDY_NAME.fullmatch(name):
        raise WorkbenchError(f"--name: {name!r} is not a report name (letters, digits, '_', '.', '-'; "
                             "not starting with '.' or '-')")
    refuse_links(reports_dir, name)
    final = reports_dir / name
    if final.exists() and not final.is_dir():
        raise WorkbenchError(f"{final} is not a folder; move it away or use --out for another report folder")
    for stale in reports_dir.glob(f".{glob.escape(name)}.building-*"):
        pid = stale.name.rsplit("-", 1)[1]
        if not pid.isdigit() or not process_alive(int(pid)):
            stale.unlink() if stale.is_symlink() else shutil.rmtree(stale, ignore_errors=True)
    return final


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return pid != os.getpid()  # this process builds under its own pid afresh


def finish_report(out_dir: Path, report: Report, results: pd.DataFrame, dest: Path) -> None:
    """A kind's report with the run-time section every kind ends with, written into `dest`
    (index.html, report.md, results.csv, summary.json)."""
    stored = store.Store(out_dir, create=False)
    runs, pilot_cpu_s = stored.runs(), pilot_spend(stored.study_record())
    report.sections.append(run_time_section(runs, pilot_cpu_s))
    write_files(report, results, dest)
    write_summary(dest, report, runs, pilot_cpu_s)


def pilot_spend(record: Mapping[str, Any]) -> float | None:
    """CPU seconds of the study's `workbench plan` pilot runs that it did not reuse (its record,
    workbench.run.runner.record_pilot_spend); None without a pilot, or with a value that is not a
    number (a store from elsewhere is data)."""
    try:
        seconds = float(record.get(store.PILOT_CPU) or "nan")
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def run_time_section(runs: Sequence[Mapping[str, Any]], pilot_cpu_s: float | None = None) -> Section:
    """How long the study took and what it cost: the index's run-time column, explained."""
    span, cpu = run_span_s(runs), run_cpu_s(runs)
    recorded = sum(r.get("cpu_time_s") is not None for r in runs)
    reused = sum(bool((r.get("environment") or {}).get("pilot")) for r in runs)
    shared = sum(bool((r.get("environment") or {}).get("trained_with")) for r in runs)
    threads = sorted({(r.get("environment") or {}).get("threads") for r in runs} - {None})
    text = (f"{run_time_text(span, cpu, len(runs))}. Wall: from the first run's start to the last run's end (tuning "
            "runs included; a sweep resumed later includes its pause). CPU: user and system time of each run's "
            f"processes, summed over the {recorded} of {len(runs)} runs that recorded it; next to the wall time it "
            "shows how much of the machine the study used (about the number of cores when runs trained side by "
            "side, less when they waited for other work).")
    if threads:
        text += f" Each run trained on {' or '.join(map(str, threads))} torch thread{'s' * (threads != [1])}."
    if shared:
        text += (f" {shared} runs differ from others only in how they evaluate: they trained one model together, "
                 "and each records its share of that training's CPU.")
    if reused:
        text += (f" {reused} runs were trained by the study's `workbench plan` pilot and reused (their CPU is "
                 "counted here).")
    if pilot_cpu_s:
        text += (f" The pilot's other runs, which the study did not reuse, spent {fmt_seconds(pilot_cpu_s)} CPU more "
                 "(the index's ledger counts them).")
    return Section("Run time", [Paragraph(text), Paragraph(provenance_text(runs))])


def provenance_text(runs: Sequence[Mapping[str, Any]]) -> str:
    """Which source built this report and which trained its runs ("+dirty": code edited but not
    committed; workbench.results.git_commit), so a reader can tell a report rebuilt from a clean
    tree by the final code."""
    trained = Counter(short_commit((r.get("environment") or {}).get("git_commit")) for r in runs)
    listed = ", ".join(f"{commit} ({count} runs)" for commit, count in sorted(trained.items()))
    return f"Source: report built at commit {short_commit(git_commit())}; runs trained at commit {listed}."


__all__ = ["finish_report", "Report"]
