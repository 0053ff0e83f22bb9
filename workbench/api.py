"""The one entry to a study, from the command line (workbench.cli) and from Python
(workbench.notebook): run it, write its report, run a plan's pilot.

    run_study     load the study file, hand it to its kind (workbench.kinds), which runs it
    write_report  read the study back from its store, let its kind build the report, swap it in
    study_verdicts  its `expect:` verdicts as the report would decide them, no report built
    run_pilot     `workbench plan`'s pilot: the train recipe names it, run_study runs it

Everything a kind does lies below this module, in its recipe (workbench/recipes/) and the layers
that recipe puts together; nothing there calls back up here.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from workbench.errors import WorkbenchError, WorkbenchWarning
from workbench.hardware import cpu_seconds
from workbench.importing import loading
from workbench.kinds import RunOptions, get_kind
from workbench.run.executor import Executor
from workbench.run.folder import WriterLock, refuse_links, running_writer
from workbench.run.runner import STORE_FILES, Summary, default_out_dir, reuse_folders
from workbench.run.store import DB_FILE, RUNS_DIR, Store, check_runs_dir, load_study_info
from workbench.study import load_study


def run_study(path: str | Path, out_dir: str | Path | None = None, jobs: int = 1, fresh: bool = False,
              profile: str | None = None, quiet: bool = False, console: Console | None = None,
              executor: Executor | None = None, runs_dir: str | Path | None = None,
              overrides: tuple[str, ...] = (), reuse: Sequence[str | Path] = ()) -> Summary:
    """Run every pending run of a study into `out_dir` (default runs/<study name>/), through
    its kind (workbench.kinds), under the folder's writer lock.

    `executor` defaults to local processes (`jobs` at once); `runs_dir` puts the run folders
    (checkpoints, final weights) elsewhere, e.g. on storage shared by a cluster's nodes,
    while the results store stays in `out_dir`. `reuse`: other studies' output folders, whose
    finished runs of the same run id (the same resolved settings) are copied in, not trained again."""
    study_file = load_study(path, profile, overrides)
    out = Path(out_dir) if out_dir is not None else default_out_dir(study_file)
    options = RunOptions(jobs=jobs, fresh=fresh, quiet=quiet, console=console, executor=executor,
                         runs_dir=Path(runs_dir) if runs_dir is not None else None,
                         reuse=tuple(reuse_folders(reuse, out)))
    with WriterLock(out):
        check_runs_dir(out, options.runs_dir)  # before --fresh deletes from it
        refuse_links(out, *STORE_FILES, RUNS_DIR)
        return get_kind(study_file.study.kind).run(study_file, out, options)


def write_report(out_dir: str | Path, reports_dir: str | Path = "reports", *, pictures: bool = True,
                 with_data: bool = False) -> Path:
    """Write the report of the study stored in `out_dir`; returns the path of index.html.

    `pictures=False` skips the attention heatmaps (which load each variant's final weights).
    `with_data`: the report folder also receives `data/`, the data it was built from (ship_data)."""
    with loading("workbench.report"):
        # The report layer (pandas, seaborn) loads only when a report is written: `workbench run`
        # starts its workers without waiting for it.
        from workbench.report import DATA_DIR, build_then_swap, pictured_runs, report_destination, ship_data, study_of

    out_dir = Path(out_dir)
    info = load_study_info(out_dir)
    study = study_of(info)
    check_recorded(out_dir, study.name)
    final = report_destination(Path(reports_dir), study.name)
    own = out_dir.resolve() == (final / DATA_DIR).resolve()  # rebuilt from its own data: keep it

    def build(dest: Path) -> None:
        build_report(out_dir, info, study, dest, pictures)
        if with_data or own:
            ship_data(out_dir, dest / DATA_DIR, own=own, pictured=pictured_runs(dest))

    build_then_swap(final, build)
    return final / "index.html"


def study_verdicts(out_dir: str | Path) -> list:
    """Each `expect:` entry's verdict (report.document.VerdictLine) for the study stored in
    `out_dir`, decided by its kind as its report would, without building the report."""
    from workbench.report import study_of  # as in write_report: the report layer loads when asked

    out_dir = Path(out_dir)
    info = load_study_info(out_dir)
    study = study_of(info)
    check_recorded(out_dir, study.name)
    return get_kind(study.kind).verdicts(out_dir, info, study)


def check_recorded(out_dir: Path, name: str) -> None:
    """A study whose sweep is still running is reported from the runs it recorded so far, and
    says so (one warning); one that has recorded none yet is one line."""
    recorded, writer = len(Store(out_dir, create=False).statuses()), running_writer(out_dir)
    running = f"its `workbench run` (pid {writer}) is still writing {out_dir}" if writer else None
    if not recorded:
        why = running or "a sweep records each run as it ends"
        raise WorkbenchError(f"{out_dir}: no run of study {name!r} is recorded yet ({why}); report it once a run has ended")
    if running:
        warnings.warn(f"study {name!r}: {running}: this report holds the {recorded} run{'s' * (recorded != 1)} "
                      "recorded so far", WorkbenchWarning, stacklevel=3)


def build_report(out_dir: Path, info: dict[str, Any], study, dest: Path, pictures: bool) -> None:
    """The kind's report of the stored study, with the run-time section every kind ends with,
    written into `dest` (index.html, report.md, results.csv, summary.json)."""
    # as in write_report: the report layer loads with the first report
    from workbench.report import finish_report

    report, results = get_kind(study.kind).report(out_dir, info, study, dest, pictures)
    finish_report(out_dir, report, results, dest)


def run_pilot(path: str | Path, seeds: int, out: str | Path | None = None, profile: str | None = None,
              overrides: tuple[str, ...] = (), jobs: int = 1, fresh: bool = False, quiet: bool = False,
              cpu_from: float | None = None):
    """Train (or resume) the pilot of `workbench plan` for the study at `path`
    (workbench.recipes.train.plan: which study the pilot is, and what is read back from it).

    When it trains runs, what its command costs beyond them is recorded in the pilot's store for
    the plan's CPU figures: the CPU seconds since `cpu_from` (this process's and its children's
    count: the CLI passes 0, the process's start; default, this call) less those runs' own, and
    the CPU seconds of the pilot's report, built once into a folder that is then deleted."""
    import tempfile

    # the plan's statistics (scipy, pandas) load only for `workbench plan`
    from workbench.recipes.train.plan import COMMAND_COST, pilot_study, read_pilot

    start = cpu_seconds() if cpu_from is None else cpu_from
    pilot = pilot_study(path, seeds, out, profile, tuple(overrides))
    before = set(Store(pilot.out, create=False).statuses()) if (pilot.out / DB_FILE).exists() and not fresh else set()
    summary = run_study(path, pilot.out, jobs=jobs, fresh=fresh, profile=profile, quiet=quiet,
                        overrides=pilot.overrides)
    trained = [r for r in Store(pilot.out, create=False).runs() if r["run_id"] not in before]
    if trained:
        start_up = cpu_seconds() - start - sum(r.get("cpu_time_s") or 0.0 for r in trained)
        report_start = cpu_seconds()
        with tempfile.TemporaryDirectory() as folder:
            write_report(pilot.out, folder)
        with WriterLock(pilot.out):
            Store(pilot.out).save_study(dict(zip(COMMAND_COST, (f"{start_up:.1f}", f"{cpu_seconds() - report_start:.1f}"))))
    return read_pilot(pilot, summary)
