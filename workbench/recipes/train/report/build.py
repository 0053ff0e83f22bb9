"""The report of a training study: verdicts, setup, leaderboards with intervals, curves,
extrapolation, cost, failures, notes and environment, from the store's flat run table.

Every table keeps every variant: one whose runs all failed is listed with "–" and its
status counts, and each failed, diverged or out-of-memory run appears with its message and
the step it reached.

The report is the list SECTIONS, in reading order: each section is a function of the study's
results (workbench.recipes.train.report.computed: the runs, their gates and verdicts) that returns a
document section (workbench.report.document), or None where it does not apply. The table
sections live in tables.py, the figure sections in figures.py; the header (verdict lines,
Learned lines, verdict figures) is put together by `train_report`.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.report import ReportSkipWarning, merged_environment, missing_variants, reproduce_command, timing_caveat
from workbench.recipes.train.report.convergence import settling, settling_section
from workbench.report.document import Paragraph, Report, Section
from workbench.report.sweep_points import short_key, value_text
from workbench.recipes.train.report.pictures import ModelPictures
from workbench.recipes.train.report.tuning_section import TuningSection
from workbench.run import store
from workbench.recipes.train.tuning import choose
from workbench.recipes.train.report import figures, tables
from workbench.recipes.train.gates import Gates
from workbench.recipes.train.report.computed import TrainResults
from workbench.stats.family import MIN_SEEDS
from workbench.stats.rule import RULE
from workbench.stats.sequential import LOOKS, seeds_for_next_look
from workbench.recipes.train.runs import TrainInputs, TrainRuns, metric_direction, metric_range
from workbench.recipes.train.verdicts import Verdicts


def tuning(r: TrainResults) -> Section | None:
    """With `tune:`, each sweep point's candidates and the values it chose."""
    study, runs = r.runs.study, r.runs
    if study.tune is None:
        return None
    return TuningSection(study, r.inputs.tuning, runs.variants, runs.palette, r.dest).build()


def budget_settling(r: TrainResults) -> Section | None:
    """Whether the budget sufficed: the verdict metrics over the last 20% of the steps."""
    curves = r.inputs.curves
    if curves is None or curves.empty:
        return None
    task = r.runs.task_name
    metrics = list(dict.fromkeys(exp.metric for exp in r.runs.study.expect if exp.target is None))
    scales = {m: (metric_direction(m, task), metric_range(m, task)) for m in metrics}
    return settling_section(settling(curves, r.runs.finished, metrics, scales))


def pictures(r: TrainResults) -> Section | None:
    """Attention and position pictures from the saved final weights, when the report draws them."""
    if r.inputs.pictures is None:
        return None
    pictured, which = pictured_variants(r.runs)
    items = r.inputs.pictures(r.runs.variants, r.runs.finished, r.dest, pictured, which)
    return Section("What the model does", items) if items else None


def pictured_variants(runs: TrainRuns) -> tuple[list[str], str]:
    """The variants a report draws pictures of, and what they are in words: those its `expect:`
    entries compare (every variant without entries), at the first rung of a scale ladder. The
    weights the pictures load are what `--with-data` ships, so a study pays in committed bytes
    only for the pictures a reader compares (the 2026 table's studies: its two arms at one width)."""
    variants, study = runs.variants, runs.study
    labels, which = variants.labels, ["with a finished run"]
    if study.expect:
        compared = {label for exp in study.expect for pair in variants.pairs(exp.better, exp.than) for label in pair}
        if compared:
            labels, which = [v for v in labels if v in compared], ["that the expect: entries compare"]
    if study.scale:
        first = value_text(study.scale[study.rung_key][0])
        labels = [v for v in labels if variants.values(v).get(study.rung_key) == first]
        which.append(f"at the ladder's first rung, {short_key(study.rung_key)}={first}")
    return labels, ", ".join(which)


def notes(r: TrainResults) -> Section | None:
    """The study's own `notes:`, one paragraph per blank-line-separated block."""
    text = r.runs.study.notes
    if not text.strip():
        return None
    return Section("Notes", [Paragraph(p.strip()) for p in text.split("\n\n") if p.strip()])


SECTIONS = (tables.across_scale, tables.setup, tuning, tables.learned, tables.leaderboards, budget_settling,
            figures.fits_section, figures.figures_section, pictures, tables.failures, notes, tables.environment)


def train_report(inputs: TrainInputs, dest: Path) -> tuple[Report, pd.DataFrame]:
    """The report of one training study and its results table; figures go to `dest/figures/`."""
    r = TrainResults(inputs, dest)
    sections = [section for section in (make(r) for make in SECTIONS) if section is not None]
    lines = [r.verdicts.line(v, index) for v, index in r.verdicts.decided]
    study = r.runs.study
    report = Report(name=study.name, kind="train", question=study.description or "(no description)",
                    verdicts=lines, sections=sections, learned=r.gates.learned_lines(),
                    verdict_figures=figures.verdict_figures(r, lines), verdict_rule=RULE,
                    notices=[text for text in (short_of_the_rule(r),) if text],
                    pictured_runs=None if inputs.pictures is None else inputs.pictures.loaded)
    return report, results_table(r.runs)


def short_of_the_rule(r: TrainResults) -> str:
    """What the current rule would still run before its verdicts are read ("" when nothing): an
    adaptive study stored short of the seeds the rule asks for (interrupted, or issued under a rule
    that decided on fewer), or a list of seeds too short for any verdict."""
    study = r.runs.study
    if not study.expect:
        return ""
    if study.seed_plan is None:
        fewest = len(study.seeds)
        return (f"Every group runs {fewest} seeds, and a verdict needs {MIN_SEEDS} per group: no entry can be decided "
                f"(seeds: {{first: {fewest}, max: 12}} would add seeds where they decide)") if fewest < MIN_SEEDS else ""
    comparisons, _ = r.verdicts.comparisons()
    plan = study.seed_plan
    wanted = seeds_for_next_look(comparisons, LOOKS.looks(plan.first, plan.max), seeds=study.every_seed)
    missing = {group: n - r.runs.seeds_run.get(group, 0) for group, n in wanted.items()}
    missing = {group: k for group, k in missing.items() if k > 0}  # a group of the look that holds its seeds asks none
    if not missing:
        return ""
    groups = "; ".join(f"{group} to {wanted[group]}" for group in missing)
    runs = sum(missing.values())
    return (f"Incomplete under the current rule: it asks for {runs} more run{'s' * (runs != 1)} ({groups} seeds) "
            f"before the verdicts {'they decide' if runs != 1 else 'it decides'} are read; `workbench run` on the "
            f"study trains {'them' if runs != 1 else 'it'}, and its report reads {'them' if runs != 1 else 'it'}")


def results_table(runs: TrainRuns) -> pd.DataFrame:
    """Every run, one row each, in sweep order (tuning runs last), with its variant label first."""
    every = pd.concat([runs.final_runs, runs.tuning_runs])
    frame = every.drop(columns=["variant"])
    frame.insert(0, "variant", every["variant"])
    return frame


def report_from_store(out_dir: Path, info: dict[str, Any], study, dest: Path, pictures: bool):
    """The report of the training study stored in `out_dir` (with attention pictures from the
    saved final weights when `pictures` and every variant is installed) and its results table."""
    runs = store.load_results(out_dir)
    missing = missing_variants(store.load_run_configs(out_dir))
    if missing and pictures:
        warnings.warn(f"{', '.join(missing)} not installed: the report leaves out the attention and position "
                      "pictures (they load the trained models); everything else is from the store",
                      ReportSkipWarning, stacklevel=2)
        pictures = False
    records = store.Store(out_dir, create=False).runs()
    inputs = TrainInputs(
        study=study, runs=runs, curves=store.load_curves(out_dir),
        environment=merged_environment([r["environment"] for r in records]),
        command=reproduce_command({**info, "name": study.name}, out_dir),
        pictures=ModelPictures(lambda run_id: store.run_dir(out_dir, run_id)) if pictures else None,
        tuning=choose(study, records), timing_caveat=timing_caveat(records),
    )
    return train_report(inputs, dest)


def verdicts_from_store(out_dir: Path, study) -> list:
    """The verdict lines of the training study stored in `out_dir`, as its report states them
    (the same runs, gates and rule), with nothing drawn or written."""
    records = store.Store(out_dir, create=False).runs()
    runs = TrainRuns(study, store.load_results(out_dir), store.load_curves(out_dir), choose(study, records))
    verdicts = Verdicts(runs, Gates(runs))
    return [verdicts.line(v, index) for v, index in verdicts.decided]
