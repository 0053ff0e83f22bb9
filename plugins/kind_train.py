"""The `train` study kind: train every run of a sweep with Lightning, report the comparison.

    validate  expand every run (and tuning run); list the hardware each training setting needs
    run       tuning runs first when the study has `tune:`, then the final runs, through the
              executor (workbench.run.runner.execute_runs); finished and diverged runs are kept
    report    workbench.report.train_report from the store, with attention pictures from
              the saved final weights
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from workbench import hookimpl
from workbench.run.executor import make_executor
from workbench.hardware import Machine, Need, train_needs
from workbench.kinds import RunOptions, StudyKind
from workbench.results import RunConfig, Status, flatten
from workbench.run.runner import (
    Summary,
    SweepProgress,
    check_providers,
    check_study,
    clear_outputs,
    execute_runs,
    sweeping,
)
from workbench.run.store import Store
from workbench.study import StudyFile, TrainStudy
from workbench.study.keys import canonical_json
from workbench.sweep import expand, point_key, sweep_points, tuning_runs
from workbench.tuning import PointTuning, choose, chosen_values, labels


class TrainKind(StudyKind):
    name = "train"
    study = TrainStudy

    def describe(self, study_file: StudyFile) -> str:
        s = study_file.study
        runs = expand(study_file)
        tuning = tuning_runs(study_file)  # with `tune:`, the final runs exist once each point has chosen
        from workbench.run.train import check_logger  # Lightning loads with a train study, not the plugins

        for train in train_sections([*runs, *tuning]):
            check_logger(train)
        steps = sorted({r.config["train"]["steps"] for r in [*runs, *tuning]})
        n_final = len(sweep_points(s)) * len(s.seeds)
        tuned = (f" (at values chosen by {len(tuning)} tuning runs = {len(sweep_points(s))} sweep points x "
                 f"{len(s.tune.points())} candidates x {s.tune.seeds} seeds)" if tuning else "")
        budget = s.train.budget
        steps_text = f"{', '.join(map(str, steps))} steps per run"
        if budget is not None:
            per_rung = ", the ladder's per rung" if s.scale else ""
            steps_text = (f"a budget of {budget.text()} per run{per_rung}" if budget.kind == "seconds"
                          else f"{steps_text} at batch 0's cost (a budget of {budget.text()}{per_rung})")
        return (f"ok: {study_file.path} ({s.kind} study {s.name!r}): {n_final} runs = {len(sweep_points(s))} sweep "
                f"points x {len(s.seeds)} seeds{tuned}; task {s.task['name']}; {steps_text}")

    def hardware_needs(self, study_file: StudyFile, machine: Machine) -> list[Need]:
        runs = [*expand(study_file), *tuning_runs(study_file)]
        needs = [need for train in train_sections(runs) for need in train_needs(train, machine)]
        return list(dict.fromkeys(needs))

    def dry_run(self, study_file: StudyFile) -> str:
        """Every run id with its resolved settings: those shared by all runs once, then per run
        the ones that differ (flattened dotted keys, as `--set` and sweeps name them)."""
        s = study_file.study
        runs = expand(study_file)
        settings = [flatten(r.config) for r in runs]
        keys = list(dict.fromkeys(k for row in settings for k in row))
        varying = [k for k in keys if len({json.dumps(row.get(k), sort_keys=True, default=str) for row in settings}) > 1]
        common = [k for k in keys if k not in varying]
        lines = [f"{s.name}: {len(runs)} runs (study hash {study_file.study_hash}); nothing is trained with --dry-run",
                 "settings of every run:"]
        lines += [f"  {k} = {json.dumps(settings[0].get(k), default=str)}" for k in common]
        for run, row in zip(runs, settings):
            differing = " ".join(f"{k}={json.dumps(row.get(k), default=str)}" for k in varying)
            lines.append(f"{run.run_id}  {differing}".rstrip())
        return "\n".join(lines) + "\n"

    def run(self, study_file: StudyFile, out: Path, options: RunOptions) -> Summary:
        study = study_file.study
        tuning = tuning_runs(study_file)  # none without `tune:`
        finals = expand(study_file) if study.tune is None else None  # with `tune:`, known once tuning is done
        check_devices(study_file, [*tuning, *(finals or [])])  # before the folder is touched (--fresh clears it)
        if options.fresh:
            clear_outputs(out, [run.run_id for run in [*tuning, *(finals or candidate_final_runs(study_file))]])
        store = Store(out)
        check_study(store, study_file)
        check_providers(store, [*tuning, *(finals or [])])
        if options.runs_dir is not None:
            store.save_study({"runs_dir": str(options.runs_dir.resolve())})

        total = len(tuning) + len(study.sweep.points()) * len(study.seeds)
        executor = options.executor or make_executor(options.jobs)
        names = {run.run_id: run.describe for run in [*tuning, *(finals or [])]}
        with sweeping(study.name, out, total, options) as (summary, progress):
            if executor.on_start is None:  # a live row per running run
                executor.on_start = lambda job: progress.started(job, names[job.run_id])
            if finals is None:
                execute_runs(tuning, "tuning runs", store, executor, summary, progress)
                tunings = choose(study, store.runs())
                for tuned in tunings:
                    report_choice(tuned, study, summary, progress)
                finals = expand(study_file, chosen_values(tunings, study.sweep.keys))
                names.update({run.run_id: run.describe for run in finals})
            execute_runs(finals, "runs", store, executor, summary, progress)
        return summary

    def report(self, out_dir: Path, info: dict[str, Any], study: TrainStudy, dest: Path, pictures: bool):
        # The report layer (matplotlib, seaborn) loads only when a report is built, not with the plugins.
        from workbench.run import store
        from workbench.report import ReportSkipWarning, merged_environment, missing_variants, reproduce_command
        from workbench.report.pictures import ModelPictures
        from workbench.report.train_report import TrainInputs, TrainReport

        runs = store.load_results(out_dir)
        missing = missing_variants(store.load_run_configs(out_dir))
        if missing and pictures:
            warnings.warn(f"{', '.join(missing)} not installed: the report leaves out the attention and position "
                          "pictures (they load the trained models); everything else is from the store",
                          ReportSkipWarning, stacklevel=2)
            pictures = False
        records = Store(out_dir, create=False).runs()
        inputs = TrainInputs(
            study=study, runs=runs, curves=store.load_curves(out_dir),
            environment=merged_environment([r["environment"] for r in records]),
            command=reproduce_command({**info, "name": study.name}, out_dir),
            pictures=ModelPictures(lambda run_id: store.run_dir(out_dir, run_id)) if pictures else None,
            tuning=choose(study, records),
        )
        builder = TrainReport(inputs, dest)
        return builder.build(), builder.results_csv()


def train_sections(runs: list[RunConfig]) -> list[dict[str, Any]]:
    """The distinct `train:` sections of the runs."""
    return list({canonical_json(r.config["train"]): r.config["train"] for r in runs}.values())


def check_devices(study_file: StudyFile, runs: list[RunConfig]) -> None:
    """Every training setting can run on this machine (precision, accelerator, logger)."""
    # Lightning loads only when a train study is validated or run, not with the plugins.
    from workbench.run.train import check_device

    for train in train_sections(runs):
        check_device(train, study_file.source_of)


def report_choice(tuned: PointTuning, study: TrainStudy, summary: Summary, progress: SweepProgress) -> None:
    """One line per sweep point: its chosen values, or why its seeds cannot run yet (they
    count as "untuned" in the summary)."""
    where = " ".join(f"{k}={v}" for k, v in tuned.swept.items()) or "the study"
    metric = study.tune.metric
    curve = ", ".join(f"{' '.join(f'{v}' for v in labels(c.values).values())}: "
                      + (f"{c.mean:.4g}" if c.eligible else "/".join(sorted(set(c.statuses))) or "not run")
                      for c in tuned.candidates)
    if tuned.chosen is not None:
        chosen = " ".join(f"{k}={v}" for k, v in labels(tuned.chosen.values).items())
        progress.print(f"tuned    {where}: {chosen} (validation {metric}: {curve})")
        return
    summary.statuses[Status.UNTUNED] += len(study.seeds)
    progress.advance(len(study.seeds))
    if not tuned.done:
        progress.print(f"untuned  {where}: a tuning run did not finish (failed or out of memory); run the study "
                       f"again to retry it; its {len(study.seeds)} runs wait for the choice")
    else:
        progress.print(f"untuned  {where}: no candidate finished with a finite {metric} ({curve}); "
                       f"its {len(study.seeds)} runs are not run")


def candidate_final_runs(study_file: StudyFile) -> list[RunConfig]:
    """Every final run a study with `tune:` could have: each point at each candidate."""
    study = study_file.study
    points = [point_key(labels(p), study.sweep.keys) for p in study.sweep.points()]
    return [run for values in study.tune.points() for run in expand(study_file, dict.fromkeys(points, values))]


@hookimpl
def register_study_kinds():
    return [TrainKind]
