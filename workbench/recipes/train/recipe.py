"""The `train` study kind: train every run of a sweep with Lightning, report the comparison.

    validate  expand every run (and tuning run); list the hardware each training setting needs
    run       tuning runs first when the study has `tune:`, then the final runs, through the
              executor (workbench.run.runner.execute_runs); finished and diverged runs are kept
    report    workbench.recipes.train.report.build from the store, with attention pictures from
              the saved final weights
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchWarning
from workbench.hookspecs import hookimpl
from workbench.run.executor import make_executor
from workbench.hardware import Machine, Need, train_needs
from workbench.kinds import RunOptions, StudyKind
from workbench.results import KEPT, RunConfig, Status, flatten
from workbench.run.runner import (
    Summary,
    SweepProgress,
    check_providers,
    check_study,
    clear_outputs,
    execute_runs,
    pilot_folder,
    record_pilot_spend,
    sweeping,
)
from workbench.run.store import Store, claim_runs_dir, load_results
from workbench.run.tracking import prepare_trackers, tracker_run
from workbench.recipes.train.relocated import rekey_moved_files
from workbench.recipes.train.study import TrainStudy
from workbench.stats.family import MIN_SEEDS
from workbench.study import StudyFile
from workbench.study.keys import canonical_json
from workbench.recipes.train.sweep import TrainPlan, batched_trainings, sweep_points
from workbench.recipes.train.tuning import PointTuning, choose, chosen_values, extensions, labels


class TrainKind(StudyKind):
    name = "train"
    study = TrainStudy

    def describe(self, study_file: StudyFile) -> str:
        s = study_file.study
        plan = TrainPlan(study_file)  # with `tune:`, the final runs exist once each point has chosen
        tuning = plan.tuning
        from workbench.run.environment import check_packages  # Lightning loads only for train.callbacks

        for train in train_sections(plan.known):
            check_packages(train)
        steps = sorted({r.config["train"]["steps"] for r in plan.known})
        n_final = len(sweep_points(s)) * len(s.seeds)
        tuned = (f" (at values chosen by {len(tuning)} tuning runs = {len(sweep_points(s))} sweep points x "
                 f"{len(s.tune.points())} candidates x {s.tune.seeds} seeds)" if tuning else "")
        seeds = (f"{len(s.seeds)} seeds (adaptive: up to {s.seed_plan.max} for groups of undecided comparisons"
                 f"{f'; seed ids from {s.seed_plan.start}' if s.seed_plan.start else ''})"
                 if s.seed_plan is not None else f"{len(s.seeds)} seeds")
        budget = s.train.budget
        steps_text = f"{', '.join(map(str, steps))} steps per run"
        if budget is not None:
            per_rung = ", the ladder's per rung" if s.scale else ""
            steps_text = (f"a budget of {budget.text()} per run{per_rung}" if budget.kind == "seconds"
                          else f"{steps_text} at batch 0's cost (a budget of {budget.text()}{per_rung})")
        most = s.seed_plan.max if s.seed_plan is not None else len(s.seeds)
        short = (f"\nnote: at most {most} seeds per group: a verdict needs {MIN_SEEDS}, so no `expect:` entry can be "
                 f"decided (seeds that each learn or not line up by chance on fewer); give seeds: {{first: "
                 f"{min(most, 3)}, max: 12}} or {MIN_SEEDS} seeds" if s.expect and most < MIN_SEEDS else "")
        return (f"ok: {study_file.path} ({s.kind} study {s.name!r}): {n_final} runs = {len(sweep_points(s))} sweep "
                f"points x {seeds}{tuned}; task {s.task['name']}; {steps_text}{short}")

    def hardware_needs(self, study_file: StudyFile, machine: Machine) -> list[Need]:
        needs = [need for train in train_sections(TrainPlan(study_file).known) for need in train_needs(train, machine)]
        return list(dict.fromkeys(needs))

    def dry_run(self, study_file: StudyFile) -> str:
        """Every run id with its resolved settings: those shared by all runs once, then per run
        the ones that differ (flattened dotted keys, as `--set` and sweeps name them)."""
        s = study_file.study
        runs = TrainPlan(study_file).finals or []  # with `tune:`, known once tuning has chosen
        settings = [flatten(r.config) for r in runs]
        keys = list(dict.fromkeys(k for row in settings for k in row))
        varying = [k for k in keys if len({json.dumps(row.get(k), sort_keys=True, default=str) for row in settings}) > 1]
        common = [k for k in keys if k not in varying]
        lines = [f"{s.name}: {len(runs)} runs (study hash {study_file.study_hash}); nothing is trained with --dry-run",
                 "settings of every run:"]
        lines += [f"  {k} = {json.dumps(settings[0].get(k), default=str)}" for k in common]
        for run, row in zip(runs, settings):  # a parameter only another variant has is not this run's: left out
            differing = " ".join(f"{k}={json.dumps(row[k], default=str)}" for k in varying if k in row)
            lines.append(f"{run.run_id}  {differing}".rstrip())
        return "\n".join(lines) + "\n"

    def run(self, study_file: StudyFile, out: Path, options: RunOptions) -> Summary:
        study = study_file.study
        plan = TrainPlan(study_file)  # the study expanded once; each stage below adds to it
        # what --fresh clears: every run the study could have (with `tune:`, each point at each candidate)
        cleared = [run.run_id for run in [*plan.tuning, *plan.candidate_finals()]] if options.fresh else []
        executor = options.executor or make_executor(options.jobs)
        # Checked against where the runs train (a Ray cluster, not its driver), before the folder
        # is touched (--fresh clears it); so are the GPUs each run gets.
        check_devices(study_file, plan.known, executor.machine())
        placement = executor.place(train_sections(plan.known))
        if options.runs_dir is not None:  # before --fresh deletes there: the runs folder names this one back
            claim_runs_dir(out, options.runs_dir)
        if options.fresh:
            clear_outputs(out, study.name, cleared)
        store = Store(out)
        if moved := rekey_moved_files(store, study_file):  # a folder written when ids named where files lay
            warnings.warn(WorkbenchWarning(moved), stacklevel=2)
        check_study(store, study_file)
        check_providers(store, plan.known)
        if options.runs_dir is not None:
            store.save_study({"runs_dir": str(options.runs_dir.resolve())})

        names = {run.run_id: run.describe for run in plan.known}
        prepare_trackers(plan.known, study.name, out)  # shared stores, before any worker
        pilot = pilot_folder(out, study.name)  # `workbench plan`'s runs of the study's first seeds

        def tracker(run: RunConfig):
            return tracker_run(run, study.name, out)

        def execute(runs: list[RunConfig], what: str = "runs") -> None:
            execute_runs(runs, what, store, executor, summary, progress, tracker=tracker, trainings=batched_trainings,
                         pilot=pilot, reuse=options.reuse)

        with sweeping(study.name, out, plan.total, options) as (summary, progress):
            if executor.on_start is None:  # a live row per running run
                executor.on_start = lambda job: progress.started(job, names[job.run_id])
            if placement:
                progress.print(placement)
            if plan.finals is None:
                names.update({run.run_id: run.describe for run in tune(plan, store, summary, progress, names, execute)})
            execute(plan.finals)
            if study.seed_plan is not None:
                add_seeds(plan, store, summary, progress, names, execute)
        if pilot is not None:
            record_pilot_spend(store, pilot)
        return summary

    def report(self, out_dir: Path, info: dict[str, Any], study: TrainStudy, dest: Path, pictures: bool):
        # The report layer (matplotlib, seaborn) loads only when a report is built, not with the kinds.
        from workbench.recipes.train.report.build import report_from_store

        return report_from_store(out_dir, info, study, dest, pictures)

    def verdicts(self, out_dir: Path, info: dict[str, Any], study: TrainStudy) -> list:
        # the report's verdict lines, decided from the store without a figure or a page
        from workbench.recipes.train.report.build import verdicts_from_store  # as in report: the report layer loads when asked

        return verdicts_from_store(out_dir, study)


def tune(plan: TrainPlan, store: Store, summary: Summary, progress: SweepProgress, names: dict[str, str],
         execute: Callable[[list[RunConfig], str], None]) -> list[RunConfig]:
    """Run the tuning runs; while a point's choice sits at the edge of its grid, run the next
    candidate past that edge (workbench.recipes.train.tuning.extensions) and choose again.
    Says each point's choice and returns the final runs at the chosen values (the plan's finals)."""
    study = plan.study
    known, runs = set(), plan.tuning
    while True:
        execute(runs, "tuning runs")
        known |= {run.run_id for run in runs}
        tunings = choose(study, store.runs())
        runs = [run for run in plan.extended_tuning(extensions(study, tunings)) if run.run_id not in known]
        if not runs:
            for tuned in tunings:
                report_choice(tuned, study, summary, progress)
            return plan.choose(chosen_values(tunings, study.sweep.keys))
        statuses = store.statuses()
        pending = [run for run in runs if statuses.get(run.run_id) not in KEPT]
        progress.print(f"extend   {len(runs)} tuning runs past a grid edge (until the choice is bracketed)")
        names.update({run.run_id: run.describe for run in runs})
        summary.total += len(pending)
        progress.grow(len(pending))


def add_seeds(plan: TrainPlan, store: Store, summary: Summary, progress: SweepProgress, names: dict[str, str],
              execute: Callable[[list[RunConfig]], None]) -> None:
    """Adaptive seeds: after each round, give the groups of comparisons still undecided the
    seeds of the next look, until every comparison has ended or its groups reached the plan's
    maximum (workbench.stats.sequential: the loop and the rule the report reads back)."""
    # The verdicts' statistics (scipy, pandas) load only for an adaptive study.
    from workbench.recipes.train.verdicts import seeds_wanted
    from workbench.stats.sequential import grow_seeds  # the loop that asks seeds_wanted after each round

    study = plan.study
    all_failed = False  # every run of the last round failed: the loop stops growing

    def wanted() -> dict[str, int]:
        if all_failed:
            return {}
        return seeds_wanted(study, load_results(store.out_dir), choose(study, store.runs()))

    def run(counts: dict[str, int], grown: dict[str, int]) -> None:
        nonlocal all_failed
        statuses = store.statuses()
        pending = [run for run in plan.seed_round(counts) if statuses.get(run.run_id) not in KEPT]
        progress.print(f"seeds    {len(grown)} groups in undecided comparisons get more seeds "
                       f"(up to {max(grown.values())} each)")
        names.update({run.run_id: run.describe for run in pending})
        summary.total += len(pending)
        progress.grow(len(pending))
        execute(pending)
        statuses = store.statuses()
        if pending and all(statuses.get(run.run_id) == Status.FAILED for run in pending):
            # a failure is an error, not an outcome: the groups stay undecided, and more seeds would fail alike
            all_failed = True
            progress.print(f"seeds    every run of this round failed ({len(pending)}, each line above says why): no "
                           "more seeds are added, which would fail alike; run the study again once the cause is "
                           "fixed (the failed runs are retried, finished ones kept)")

    grow_seeds(wanted, run, len(study.seeds))


def train_sections(runs: list[RunConfig]) -> list[dict[str, Any]]:
    """The distinct `train:` sections of the runs."""
    return list({canonical_json(r.config["train"]): r.config["train"] for r in runs}.values())


def check_devices(study_file: StudyFile, runs: list[RunConfig], machine: Machine) -> None:
    """Every training setting can run on `machine`, this one or a cluster's (precision,
    accelerator, devices, nodes, logger)."""
    # Lightning loads only for train.callbacks: a sweep's driver process does not train.
    from workbench.run.environment import check_device

    for train in train_sections(runs):
        check_device(train, study_file.source_of, machine)


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


@hookimpl
def register_study_kinds():
    return [TrainKind]
