"""`workbench plan STUDY`: the seeds and CPU minutes each `expect:` entry needs, from a pilot.

1. The pilot: the study itself at its own first `pilot` seeds (1 or 2) per group, under the name
   <name>-pilot in its own folder (runs/<name>-pilot/, beside the study's runs/<name>/). Its runs
   are the study's first runs, with the same ids: `workbench run` of the study (into
   runs/<name>/) reuses them instead of training them again (workbench.run.runner.reuse_pilot), and
   the ledger counts the CPU of those it does not reuse. A second plan resumes the pilot; a tuned
   study's pilot tunes too, as the study will (its tuning seeds lie past the pilot's, so its
   final runs are reused where it chose as the study does). A study of one seed gets a pilot
   seed it never runs beside it (within 0 .. 2^32-1, leaving room for the pilot's tuning seeds).
2. The noise, per comparison the pilot's SD of the paired per-seed differences (what the rule's
   paired test reads), with the groups' own SDs beside it. Only the variance is read from the
   pilot, never the effect: the internal pilot of Wittes & Brittain (1990, "The role of internal
   pilot studies in increasing the efficiency of clinical trials", Stat Med 9: 65-72), where
   re-estimating the variance from the study's own first observations leaves the test's error
   rate as it was, unlike a sample size fitted to an observed difference; the pilot's runs enter
   the final analysis as the study's first seeds.
   Two pilot seeds give each SD 1 degree of freedom, so the noise is pooled over the
   comparisons of one metric (planning only: it never enters a verdict; comparisons that share a
   group are not independent, so the df counted is an upper count), and the plan is shown
   twice: with the pooled SD, and with its 80% upper confidence bound, s * sqrt(df / chi2_0.2(df)),
   which Browne (1995, "On the use of a pilot sample for sample size determination", Stat Med
   14: 1933-1940) shows to keep the planned power in most pilots, where the SD itself falls short
   in about half of them. The `seeds:` line to register comes from the upper bound. One pilot
   seed measures no noise: then only the cost is planned (and `--effect-sd`, which needs none).
3. The seeds: workbench.stats.planning simulates the study's whole family through the real
   verdict rule: per entry with a margin, the seeds for Outcome.EQUIVALENT with 80% power when
   the true difference is 0; with `--effect X` (metric units) or `--effect-sd K` (noise SDs), the
   seeds for Outcome.HOLDS; with neither, the smallest effect the study's own seeds detect.
4. The cost: each group's CPU seconds per run in the pilot (the store's cpu_time_s), times the
   seeds it is expected to run (adaptive seeds stop early), plus the pilot's tuning runs, which
   the study repeats whatever its seeds, plus what the command costs beyond its runs (start-up,
   the workers' imports, recording: measured on the pilot's command; the report: the pilot's,
   built once to time it). CPU time depends on the threads a run gets, so the pilot should run
   with the study's --jobs.

`--from FOLDER` reads an earlier issue of the same study instead of a pilot (its run folder, or a
report's shipped data REPORTS/NAME/data): the noise of its seeds and its CPU seconds per run, with
nothing trained. Its variance only is read, as a pilot's. Where the re-issue runs some of the same
seeds (a study's seeds reproduce their runs), those runs are an internal pilot in Wittes &
Brittain's sense, which re-estimates the variance from the study's own first data and keeps the
error rate; their many seeds give the SD more degrees of freedom than a pilot's two.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from rich import box
from rich.table import Table
from scipy import stats as st

from workbench.errors import SpecError, WorkbenchError
from workbench.report.document import fmt
from workbench.stats.outcomes import Outcome
from workbench.report.sweep_points import Variants, value_text
from workbench.stats.planning import REPLICATIONS, Goal, Planned, SeedSearch, Simulated
from workbench.stats.power import MAX_PLANNED_SEEDS, POWER
from workbench.stats.rule import Comparison
from workbench.recipes.train.gates import Gates
from workbench.recipes.train.runs import TrainRuns
from workbench.recipes.train.study import MAX_SEED
from workbench.recipes.train.verdicts import Verdicts
from workbench.results import KEPT
from workbench.run.runner import Summary, default_out_dir
from workbench.run.store import Store, load_results, load_study_info
from workbench.study import StudyFile, load_study
from workbench.recipes.train.tuning import choose

UPPER_CONFIDENCE = 0.8  # Browne 1995's one-sided upper bound of the pilot's SD
# In the pilot's store: what its command cost beyond its runs (workbench.api.run_pilot measures it).
COMMAND_COST = ("start_up_cpu_s", "report_cpu_s")


@dataclass(frozen=True)
class Noise:
    """One metric's per-seed noise in the pilot."""

    sd: float  # SD of the paired per-seed differences, pooled over the metric's comparisons
    group_sd: float  # SD of one group's seeds, pooled over the metric's groups
    df: int  # degrees of freedom of `sd`

    def upper(self) -> Noise:
        """The UPPER_CONFIDENCE upper confidence bound of the SD (Browne 1995); the group SD
        scales with it, so the two keep their ratio (the correlation of a seed's two values)."""
        factor = math.sqrt(self.df / st.chi2.ppf(1 - UPPER_CONFIDENCE, self.df))
        return replace(self, sd=self.sd * factor, group_sd=self.group_sd * factor)


def pooled(samples: Sequence[np.ndarray]) -> tuple[float, int]:
    """(pooled SD, degrees of freedom) of samples with their own means; (NaN, 0) without any."""
    kept = [x for x in samples if len(x) >= 2]
    df = sum(len(x) - 1 for x in kept)
    return (math.sqrt(sum(np.var(x, ddof=1) * (len(x) - 1) for x in kept) / df), df) if df else (math.nan, 0)


def finite(values) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return x[np.isfinite(x)]


def metric_noise(comparisons: Sequence[Comparison]) -> dict[str, Noise]:
    """Per metric with a spread in the pilot: its Noise, pooled over its comparisons (failure
    shares aside: they are counts, compared by Fisher's test)."""
    out = {}
    for metric in dict.fromkeys(c.metric for c in comparisons):
        mine = [c for c in comparisons if c.metric == metric and not c.counts and c.seeds_run]
        diffs = [finite(pd.Series(c.better_values) - pd.Series(c.than_values)) for c in mine]  # aligned by seed
        groups = {name: finite(values) for c in mine
                  for name, values in ((c.better, c.better_values), (c.than, c.than_values))}
        (sd, df), (group_sd, _) = pooled(diffs), pooled(list(groups.values()))
        if df and sd > 0:
            out[metric] = Noise(sd, group_sd if group_sd > 0 else sd, df)
    return out


def planned_family(comparisons: Sequence[Comparison], noise: dict[str, Noise], effect: float | None,
                   effect_sd: float | None) -> tuple[list[Planned], list[str]]:
    """Each comparison as the simulation draws it, and why one without a goal has none ("")."""
    planned, why = [], []
    for c in comparisons:
        n = noise.get(c.metric)
        if not c.seeds_run:
            planned.append(Planned(c))
            why.append("neither group is a point of the study")
        elif c.counts:
            planned.append(Planned(c))
            why.append("a share of failed seeds (counts): not planned")
        elif effect_sd is not None and not c.margin:  # in noise SDs: the noise itself is not needed
            planned.append(Planned(c, n.sd, n.group_sd, effect_sd * n.sd, Goal.HOLDS) if n
                           else Planned(c, shift=effect_sd, goal=Goal.HOLDS))
            why.append("")
        elif n is None:
            planned.append(Planned(c))
            why.append("the pilot measured no noise (1 seed, or no spread)")
        elif c.margin:
            planned.append(Planned(c, n.sd, n.group_sd, 0.0, Goal.EQUIVALENT))
            why.append("")
        else:
            planned.append(Planned(c, n.sd, n.group_sd, effect or 0.0, Goal.HOLDS if effect else Goal.DETECT))
            why.append("")
    return planned, why


def pilot_seeds(study, count: int) -> list[int]:
    """The study's own first `count` seeds: the pilot's runs are the study's first runs. A study
    that lists fewer gets seeds it never runs added, past its largest where the pilot's tuning
    seeds (which follow the pilot's largest) still fit below 2^32-1, else below its smallest."""
    own = study.every_seed[:count]
    room = MAX_SEED - (study.tune.seeds if study.tune is not None else 0)
    candidates = itertools.chain(range(max(own) + 1, room + 1), range(min(own) - 1, -1, -1))
    extra = (seed for seed in candidates if seed not in study.every_seed)
    return [*own, *itertools.islice(extra, count - len(own))]


@dataclass
class Pilot:
    """The pilot's runs, as the study's report would read them."""

    study_file: StudyFile  # the study as written (profile and --set applied)
    pilot_file: StudyFile  # the pilot: the study at the pilot seeds, under its pilot name
    out: Path
    summary: Summary
    runs: TrainRuns
    stored: bool = False  # an earlier issue's runs (`--from`), not a pilot trained for the plan
    command_cpu_s: float = 0.0  # what the study's command costs beyond its runs (start-up, report), measured

    @property
    def cpu_per_run(self) -> dict[str, float]:
        """Per group: the mean CPU seconds of its pilot runs that ended (the mean of the others'
        for a group none of whose runs recorded it)."""
        runs = self.runs.final_runs
        ended = runs[runs["status"].isin(KEPT)]
        means = ended.groupby("variant")["cpu_time_s"].mean().dropna().to_dict() if "cpu_time_s" in ended else {}
        fallback = float(np.mean(list(means.values()))) if means else math.nan
        return {group: float(means.get(group, fallback)) for group in self.runs.variants.labels}

    @property
    def tuning_cpu_s(self) -> float:
        spent = self.runs.tuning_runs.get("cpu_time_s", pd.Series(dtype=float))
        return float(spent.dropna().sum())

    @property
    def cpu_s(self) -> float:
        spent = self.runs.all_runs.get("cpu_time_s", pd.Series(dtype=float))
        return float(spent.dropna().sum())


@dataclass(frozen=True)
class PilotStudy:
    """Which study the pilot is: the study file at `path` with `overrides` (its pilot name and
    seeds added), trained into `out` (by workbench.api.run_pilot)."""

    study_file: StudyFile  # the study as written (profile and --set applied)
    path: str | Path
    profile: str | None
    out: Path
    overrides: tuple[str, ...]


def plannable(path: str | Path, profile: str | None, overrides: tuple[str, ...]) -> StudyFile:
    """The study at `path`, refused when it has nothing to plan (before anything trains or is read)."""
    study_file = load_study(path, profile, overrides)
    study = study_file.study
    if study.kind != "train":
        raise WorkbenchError(f"{path}: a {study.kind} study issues no verdicts; `workbench plan` plans the seeds of "
                             "train studies with `expect:` entries")
    if not study.expect:
        raise WorkbenchError(f"{path}: the study has no `expect:` entries, so there are no verdicts to plan seeds "
                             "for; `workbench validate` says what it runs")
    return study_file


def pilot_study(path: str | Path, seeds: int, out: str | Path | None = None, profile: str | None = None,
                overrides: tuple[str, ...] = ()) -> PilotStudy:
    """The pilot of the study at `path`; refuses a study with nothing to plan before anything trains."""
    study_file = plannable(path, profile, overrides)
    study = study_file.study
    out = Path(out) if out is not None else Path("runs") / f"{study.name}-pilot"
    if out.resolve() == default_out_dir(study_file).resolve():
        raise SpecError("--out", f"{out} is the study's own folder; the pilot's runs go elsewhere (default: "
                        f"runs/{study.name}-pilot)")
    listed = ", ".join(map(str, pilot_seeds(study, seeds)))
    return PilotStudy(study_file, path, profile, out, (*overrides, f"name={study.name}-pilot", f"seeds=[{listed}]"))


def read_pilot(pilot: PilotStudy, summary: Summary) -> Pilot:
    """The pilot's runs once trained, as the study's report would read them, with what its
    command cost beyond them (workbench.api.run_pilot measured it)."""
    pilot_file = load_study(pilot.path, pilot.profile, pilot.overrides)
    store = Store(pilot.out, create=False)
    tuning = choose(pilot_file.study, store.runs())
    return Pilot(pilot.study_file, pilot_file, pilot.out, summary,
                 TrainRuns(pilot_file.study, load_results(pilot.out), tuning=tuning),
                 command_cpu_s=recorded_seconds(store.study_record(), COMMAND_COST))


def recorded_seconds(record: dict, keys: Sequence[str]) -> float:
    """The sum of the seconds a store's study record holds under `keys` (text); a value that is
    missing, not a number or not finite counts 0 (a store from elsewhere is data)."""
    total = 0.0
    for key in keys:
        try:
            value = float(record.get(key) or 0)
        except ValueError:
            value = 0.0
        total += value if math.isfinite(value) and value > 0 else 0.0
    return total


def stored_pilot(path: str | Path, folder: str | Path, profile: str | None = None,
                 overrides: tuple[str, ...] = ()) -> Pilot:
    """The runs an earlier issue of the study at `path` recorded in `folder` (received data: its
    store is checked as `workbench report` checks it), read as the plan's pilot; nothing trains.
    Refused, in one line, when they are another study's or lack a group of this one's sweep."""
    study_file = plannable(path, profile, overrides)
    study, folder = study_file.study, Path(folder)
    stored = load_study_info(folder).get("name")
    if stored != study.name:
        raise SpecError("--from", f"{folder} holds the runs of study {stored!r}, not {study.name!r}: a plan reads "
                        "an earlier issue of the same study (its run folder, or REPORTS/NAME/data)")
    records = Store(folder, create=False).runs()
    runs = TrainRuns(study, load_results(folder), tuning=choose(study, records))
    swept = Variants(tuple(runs.keys), tuple(tuple(value_text(point.get(k)) for k in runs.keys)
                                             for point in study.sweep.points()))
    missing = [g for g in swept.labels if g not in set(runs.finished["variant"])]
    if missing:
        raise SpecError("--from", f"{folder} has no finished run of {', '.join(missing)}: a plan from stored runs "
                        "needs every group of the study's sweep (without --from, a pilot trains them)")
    final = runs.final_runs
    summary = Summary(folder, len(final), statuses=Counter(final["status"]), study=study.name)
    return Pilot(study_file, study_file, folder, summary, runs, stored=True)


# ---- the plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """The plan under one reading of the noise."""

    title: str
    planned: list[Planned]
    why: list[str]  # per comparison: why it has no goal ("" when it has one)
    search: SeedSearch
    smallest: dict[int, int | None]  # per comparison with a goal: the seeds it needs (None: past the most)
    written: Simulated  # the study at its own seeds
    detectable: float | None  # DETECT comparisons: the smallest effect, in noise SDs, at the study's seeds
    at_detectable: Simulated | None

    @property
    def register(self) -> int | None:
        """The seeds (or adaptive max) that give every reachable goal its power."""
        needed = [n for n in self.smallest.values() if n is not None]
        return max(needed) if needed else None


def plan_scenario(title: str, comparisons: Sequence[Comparison], noise: dict[str, Noise], effect: float | None,
                  effect_sd: float | None, study, groups: Sequence[str], replications: int) -> Scenario | None:
    """The plan under one reading of the noise; None when no comparison has a goal to plan."""
    planned, why = planned_family(comparisons, noise, effect, effect_sd)
    if not any(p.goal for p in planned):
        return None
    first = study.seed_plan.first if study.seed_plan is not None else None
    search = SeedSearch(planned, first, groups, replications)
    written_seeds = study.seed_plan.max if study.seed_plan is not None else len(study.seeds)
    detectable, at_detectable = (search.detectable(written_seeds) if any(p.goal is Goal.DETECT for p in planned)
                                 else (None, None))
    return Scenario(title, planned, why, search, search.smallest(), search.at(written_seeds), detectable,
                    at_detectable)


def seeds_line(study, seeds: int) -> str:
    """The `seeds:` line of the study file for `seeds` per group (adaptive: its max, keeping first)."""
    if study.seed_plan is not None:
        start = f", start: {study.seed_plan.start}" if study.seed_plan.start else ""
        return f"seeds: {{first: {study.seed_plan.first}, max: {seeds}{start}}}"
    return f"seeds: [{', '.join(map(str, range(seeds)))}]"


def cpu_min(s: Simulated, cpu: dict[str, float], groups: Sequence[str], tuning_s: float = 0.0) -> float:
    return (sum(s.group_seeds[g] * cpu[g] for g in groups) + tuning_s) / 60


def runs_text(s: Simulated, groups: Sequence[str], adaptive: bool) -> str:
    most = s.seeds * len(groups)
    if not adaptive:
        return f"{most} runs"
    return f"{fmt(sum(s.group_seeds[g] for g in groups))} runs expected (at most {most})"


def scenario_table(sc: Scenario, comparisons: Sequence[Comparison], study, cpu: dict[str, float]) -> Table:
    """One row per comparison (numbered as `legend` lists them): its noise, what it is planned
    for, the seeds that needs (adaptive: the max), its power at the study's own seeds, the seeds
    it spends there on average (fewer than the max when looks end it) and their CPU minutes (both
    its groups)."""
    plan = study.seed_plan
    written = plan.max if plan is not None else len(study.seeds)
    table = Table(title=sc.title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("#", justify="right", no_wrap=True)
    now = f"power at {written}" if plan is None else f"power at {plan.first}..{plan.max}"
    for column in ("noise SD", "planned for", "max seeds" if plan else "seeds", now, "mean seeds", "CPU min"):
        # Numbers never break; on a narrow screen the words of "planned for" wrap instead.
        table.add_column(column, justify="left" if column == "planned for" else "right", overflow="fold",
                         no_wrap=column != "planned for",
                         min_width=len(Outcome.EQUIVALENT) + 1 if column == "planned for" else None)
    for k, (c, p) in enumerate(zip(comparisons, sc.planned)):
        row = [str(k + 1), fmt(p.sd) if p.goal else "–"]
        pair = cpu.get(c.better, math.nan) + cpu.get(c.than, math.nan)
        if p.goal is None:
            table.add_row(*row, sc.why[k], "–", "–", "–", "–")
        elif p.goal is Goal.DETECT:
            s = sc.at_detectable
            found = math.inf if sc.detectable is None else sc.detectable * p.sd
            past = found >= c.bounds[1] - c.bounds[0]  # no difference that large fits in the metric's range
            what = "detects no effect" if found == math.inf else f"detects {fmt(found)}" + " (> range)" * past
            table.add_row(*row, what, str(written), f"{POWER:.0%}", fmt(s.spent[k]), fmt(s.spent[k] * pair / 60))
        else:
            what = (f"{Outcome.EQUIVALENT} ±{fmt(c.margin)}" if p.goal is Goal.EQUIVALENT
                    else f"{Outcome.HOLDS} at {fmt(p.shift)}")
            power = f"{sc.written.power[k]:.0%}"
            n = sc.smallest[k]
            if n is None:
                table.add_row(*row, what, f"> {MAX_PLANNED_SEEDS}", power, "–", "–")
            else:
                s = sc.search.at(n)
                table.add_row(*row, what, str(n), power, fmt(s.spent[k]), fmt(s.spent[k] * pair / 60))
    return table


def legend(comparisons: Sequence[Comparison], origins: Sequence[int]) -> list[str]:
    """The comparisons the tables number, each with the `expect:` entry it decides."""
    return [f"Holm's family: {len(comparisons)} comparisons"] + [
        f"  {k + 1:>2}  expect {origins[k] + 1}: {c.better} vs {c.than} on {c.metric}"
        + (f" (margin ±{fmt(c.margin)})" if c.margin else "") for k, c in enumerate(comparisons)]


def pilot_lines(found: Pilot, noise: dict[str, Noise], effect_sd: float | None) -> list[str]:
    """What the pilot (or the stored runs read as one) ran, cost and measured."""
    cpu, name, runs = found.cpu_per_run, found.study_file.study.name, len(found.runs.all_runs)
    tuning = f" (and {fmt(found.tuning_cpu_s / 60)} CPU min of tuning runs in all)" if found.tuning_cpu_s else ""
    if found.stored:
        most = max(found.runs.seeds_run.values())
        source, spreadless = "the stored", "1 seed per group" if most == 1 else "no spread in the stored runs"
        head = (f"{name}: a plan from the runs stored in {found.out}: {runs} runs, up to {most} seeds per group, "
                f"{fmt(found.cpu_s / 60)} CPU min when they ran; nothing trained")
        unfinished = "the plan reads those that did"
    else:
        seeds = found.pilot_file.study.seeds
        source, spreadless = "the pilot", "1 pilot seed" if len(seeds) == 1 else "no spread in the pilot"
        head = (f"{name}: a plan from a pilot of {len(seeds)} seed{'s' * (len(seeds) > 1)} per group: {runs} runs in "
                f"{found.out} (seeds {', '.join(map(str, seeds))}, the study's first: `workbench run` into "
                f"{found.out.name.removesuffix('-pilot')}/ beside it reuses them), {fmt(found.cpu_s / 60)} CPU min")
        unfinished = "the plan reads those that did (the same command retries them)"
    lines = [head, f"CPU seconds per run{tuning}:", *(f"  {fmt(cpu[g]):>6}  {g}" for g in found.runs.variants.labels)]
    if found.command_cpu_s:
        lines.append(f"the command beyond its runs (start-up, recording, the report): {fmt(found.command_cpu_s)} CPU s, "
                     "in every CPU figure below")
    if found.summary.incomplete:
        lines.append(f"note: {found.summary.incomplete} {source.removeprefix('the ')} runs did not finish; {unfinished}")
    if noise:
        lines.append("noise: the SD of the paired per-seed differences, pooled over the comparisons of each metric: "
                     + ", ".join(f"{m} {fmt(n.sd)} ({n.df} df)" for m, n in noise.items())
                     + f"; the plan reads {source} runs' noise only, never their differences")
    else:
        lines.append(f"noise: unknown ({spreadless}): only the cost is planned" + (", and --effect-sd" if effect_sd else ""))
    return lines


def written_line(study, cpu: dict[str, float], tuning_s: float) -> str:
    """The study's runs and CPU minutes at its own seeds (adaptive: from the first look to the last)."""
    per_seed = sum(cpu.values())  # one seed of every group

    def cost(seeds: int) -> str:
        return fmt((seeds * per_seed + tuning_s) / 60)

    plan = study.seed_plan
    if plan is None:
        n = len(study.seeds)
        return f"the study as written ({seeds_line(study, n)}): {n * len(cpu)} runs, {cost(n)} CPU min"
    return (f"the study as written ({seeds_line(study, plan.max)}): {plan.first * len(cpu)} to {plan.max * len(cpu)} "
            f"runs, {cost(plan.first)} to {cost(plan.max)} CPU min")


def scenario_lines(sc: Scenario, comparisons: Sequence[Comparison], study, cpu: dict[str, float],
                   tuning_s: float) -> list[str | Table]:
    """A reading's table, what the study as written is expected to spend (adaptive), and the plan's cost."""
    adaptive, groups = study.seed_plan is not None, list(cpu)
    lines: list[str | Table] = [scenario_table(sc, comparisons, study, cpu)]
    if adaptive:
        lines.append(f"  the study as written: {runs_text(sc.written, groups, True)}, "
                     f"{fmt(cpu_min(sc.written, cpu, groups, tuning_s))} CPU min")
    if sc.register is not None:
        s = sc.search.at(sc.register)
        planned = f"max {sc.register}" if adaptive else f"{sc.register} seeds per group"
        lines.append(f"  planned ({planned}): {runs_text(s, groups, adaptive)}, "
                     f"{fmt(cpu_min(s, cpu, groups, tuning_s))} CPU min")
    return lines


def register_lines(final: Scenario, study, upper: bool) -> list[str]:
    """The `seeds:` line to put in the study file (from the last reading of the noise), or why none."""
    beyond = [str(k + 1) for k, n in final.smallest.items() if n is None]
    if final.register is not None:
        short = f"; comparisons {', '.join(beyond)} need more than {MAX_PLANNED_SEEDS}" if beyond else ""
        return [f"to register before the real runs (from the {'upper bound of the ' * upper}noise, "
                f"{'at most ' * (study.seed_plan is not None)}{final.register} seeds per group{short}):",
                seeds_line(study, final.register)]
    if beyond:
        return [f"no seed count up to {MAX_PLANNED_SEEDS} gives the planned comparisons {POWER:.0%} power: "
                "nothing to register"]
    return ["no entry has a margin, and no --effect was given: nothing to register; each row says the smallest "
            "effect the study's seeds detect"]


def check_effect(effect: float | None, effect_sd: float | None) -> None:
    """--effect and --effect-sd, checked before the pilot trains."""
    if effect is not None and effect_sd is not None:
        raise SpecError("--effect", "give --effect (in the metric's units) or --effect-sd (in noise SDs), not both")
    for name, value in (("--effect", effect), ("--effect-sd", effect_sd)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise SpecError(name, f"{value}: a true difference to plan for is a positive number")


def plan_lines(found: Pilot, effect: float | None = None, effect_sd: float | None = None,
               replications: int = REPLICATIONS) -> list[str | Table]:
    """The plan from a trained pilot: the lines and tables `workbench plan` prints."""
    study = found.study_file.study
    comparisons, origins = Verdicts(found.runs, Gates(found.runs)).comparisons()
    cpu, tuning_s = found.cpu_per_run, found.tuning_cpu_s + found.command_cpu_s  # costs the study pays whatever its seeds
    noise = metric_noise(comparisons)
    lines = [*pilot_lines(found, noise, effect_sd), *legend(comparisons, origins),
             written_line(study, cpu, tuning_s)]
    readings = [(f"Noise as {'the stored runs' if found.stored else 'the pilot'} measured it", noise)]
    if noise:
        readings.append((f"Noise at its {UPPER_CONFIDENCE:.0%} upper confidence bound (Browne 1995)",
                         {m: n.upper() for m, n in noise.items()}))
    scenarios = [sc for title, reading in readings
                 if (sc := plan_scenario(title, comparisons, reading, effect, effect_sd, study, list(cpu),
                                         replications))]
    if not scenarios:
        return lines
    for sc in scenarios:
        lines += scenario_lines(sc, comparisons, study, cpu, tuning_s)
    lines.append(f"power: {replications} simulated studies per seed count, decided by the verdict rule with Holm "
                 f"over the {len(comparisons)} comparisons (±{math.sqrt(POWER * (1 - POWER) / replications):.0%} "
                 "at 80%); comparisons planned for nothing are drawn at a difference of 0")
    return lines + register_lines(scenarios[-1], study, upper=len(scenarios) > 1)
