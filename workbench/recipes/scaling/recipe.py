"""The `scaling` study kind: cost against sequence length (workbench.recipes.scaling.measuring), one stored row
per measurement, each measured in a fresh process; report: fitted exponents and cost curves.

Measurements that hit a limit (oom, timeout) are data and kept on rerun, like finished ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.hookspecs import hookimpl
from workbench.errors import WorkbenchError
from workbench.hardware import Machine, Need, scaling_needs
from workbench.kinds import RunOptions, StudyKind
from workbench.run.runner import Summary, check_study, clear_outputs, execute_runs, sweeping
from workbench.recipes.scaling.measuring import KEEP_ON_RERUN, MeasureExecutor, measurement_line, measurement_runs
from workbench.run.store import Store
from workbench.study import StudyFile
from workbench.recipes.scaling.study import ScalingStudy


class ScalingKind(StudyKind):
    name = "scaling"
    study = ScalingStudy

    def describe(self, study_file: StudyFile) -> str:
        s = study_file.study
        return (f"ok: {study_file.path} (scaling study {s.name!r}): {len(measurement_runs(s))} measurements = "
                f"{len(s.sweep_points())} sweep points x {len(s.seeds)} seeds x modes x lengths")

    def hardware_needs(self, study_file: StudyFile, machine: Machine) -> list[Need]:
        return scaling_needs(study_file.study.scaling.device, machine)

    def dry_run(self, study_file: StudyFile) -> str:
        s = study_file.study
        return (f"{s.name}: scaling study, {len(measurement_runs(s))} measurements "
                "(no run ids: cost points are measured, not trained)\n")

    def run(self, study_file: StudyFile, out: Path, options: RunOptions) -> Summary:
        if options.executor is not None or options.runs_dir is not None:
            raise WorkbenchError("--executor/--runs-dir: a scaling study measures cost on this machine, "
                                 "one point at a time in fresh processes; run it without them")
        study: ScalingStudy = study_file.study
        machine = Machine.here()
        needs = scaling_needs(study.scaling.device, machine)
        if needs:
            raise WorkbenchError(needs[0].error(study_file.source_of(needs[0].field), machine))
        if options.fresh:
            clear_outputs(out, study.name, [])  # measurements keep no run folders
        store = Store(out)
        check_study(store, study_file)
        runs = measurement_runs(study)
        with sweeping(study.name, out, len(runs), options, line=measurement_line) as (summary, progress):
            execute_runs(runs, "measurements", store, MeasureExecutor(study.scaling), summary, progress,
                         kept=KEEP_ON_RERUN)
        return summary

    def report(self, out_dir: Path, info: dict[str, Any], study: ScalingStudy, dest: Path, pictures: bool):
        # The report layer (matplotlib, seaborn) loads only when a report is built, not with the plugins.
        from workbench.recipes.scaling.report import report_from_store

        return report_from_store(out_dir, study, info, dest)

    def verdicts(self, out_dir: Path, info: dict[str, Any], study: ScalingStudy) -> list:
        return []  # a scaling study measures; its report states no `expect:` verdicts


@hookimpl
def register_study_kinds():
    return [ScalingKind]
