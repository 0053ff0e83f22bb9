"""The table sections of a training study's report, each a function of the study's results:
Across scale, Setup (task, budget, seeds, what is swept, runs by status), Learned at the
training length (baselines and gates), the Leaderboard (means with intervals, differences to
the baseline, run measures), Failed runs and Environment."""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd
import yaml

from workbench.registry import get_variant
from workbench.report.document import (Code, Item, Paragraph, Section, Table, fmt, fmt_bytes, fmt_seconds,
                                       fmt_signed_interval)
from workbench.stats.intervals import difference
from workbench.stats.sequential import LOOKS
from workbench.stats.gate import MARGIN
from workbench.report.sweep_points import short_key, value_text
from workbench.results import DESCRIPTIVE_METRICS, FAILURES, Status
from workbench.recipes.train.report.computed import TrainResults
from workbench.recipes.train.runs import interval_text, metric_declaration, metric_direction, split_metric

# Run measures shown next to each leaderboard (column in the store -> heading, formatter).
MEASURES: dict[str, tuple[str, Callable[[float], str]]] = {
    "n_params": ("parameters", lambda x: fmt(int(x)) if not math.isnan(x) else "–"),
    "tokens_per_s": ("tokens/s", fmt),
    "peak_memory_bytes": ("peak memory", fmt_bytes),
    "wall_time_s": ("wall time", fmt_seconds),
}


def setup(r: TrainResults) -> Section:
    s = r.runs.study
    items: list[Item] = []
    task = get_variant("task", s.task["name"]).defining(s.task)  # where its files lay on the machine is not the study
    items.append(Paragraph(f"Task: {task.pop('name')}; " + ", ".join(
        f"{k}={setting(r, f'task.{k}', v)}" for k, v in sorted(task.items()))))
    if described := metric_descriptions(r):
        items.append(Paragraph("Metrics: " + "; ".join(described) + "."))
    items.append(Paragraph(budget_text(r)))
    if s.train.budget is not None and s.train.budget.kind != "seconds":
        items.append(steps_table(r))
    if s.tune is not None:
        items.append(Paragraph("Tuned per variant (see Tuning), replacing the values above: " + "; ".join(
            f"{k} over {', '.join(value_text(v) for v in values)}" for k, values in s.tune.values.items())))
    swept_model = {k.split(".", 1)[1] for k in r.runs.keys if k.startswith("model.")}
    fixed = {k: v for k, v in s.model.items() if k not in swept_model}
    items.append(Paragraph("Fixed model parts (everything else at its default):"))
    items.append(Code(yaml.safe_dump(fixed, sort_keys=True).strip() if fixed else "{} (all defaults)"))
    if r.runs.keys:
        items.append(Paragraph("Swept: " + "; ".join(
            f"{k} over {', '.join(value_text(v) for v in s.sweep.values(k))}" for k in r.runs.keys)))
    if s.baseline is not None:
        items.append(Paragraph("Baseline: " + ", ".join(f"{k}={value_text(v)}" for k, v in s.baseline.items())))
    items.append(status_table(r))
    items.append(Paragraph("Reproduce:"))
    items.append(Code(r.inputs.command))
    return Section("Setup", items)


def metric_descriptions(r: TrainResults) -> list[str]:
    """'bpc: bits per byte ...' for each of the task's metrics the runs recorded whose declaration
    (workbench.results.Metric.description) says what it is and how it is computed."""
    recorded = {split_metric(c)[0] for c in r.runs.metrics}
    declared = ((name, metric_declaration(name, r.runs.task_name)) for name in r.runs.task_metrics if name in recorded)
    return [f"{name}: {m.description}" for name, m in declared if m.description]


def seeds_text(r: TrainResults) -> str:
    plan = r.runs.study.seed_plan
    if plan is None:
        return f"seeds {', '.join(map(str, r.runs.study.seeds))}"
    looks = LOOKS.looks(plan.first, plan.max)
    alphas = ", ".join(fmt(a) for a in LOOKS.alphas(looks))
    ids = f" (seed ids from {plan.start})" if plan.start else ""
    return (f"adaptive seeds: {plan.first} per group{ids}, more for groups of undecided comparisons up to {plan.max} "
            f"(looks at {', '.join(map(str, looks))} seeds, each at the alpha a Pocock-type spending function "
            f"adds there: {alphas}; a look under {LOOKS.min_seeds} seeds decides nothing and spends nothing)")


def setting(r: TrainResults, key: str, value: object) -> str:
    """A setting as Setup states it: its value, or each value it takes where it is swept (a
    comparison of folders that trained 200 and 800 steps sweeps train.steps), never the
    value of one run for all."""
    if key in r.runs.keys:
        return " or ".join(value_text(v) for v in r.runs.study.sweep.values(key)) + " (swept)"
    return value if isinstance(value, str) else value_text(value)


def budget_text(r: TrainResults) -> str:
    s, train = r.runs.study, r.runs.study.train
    optimiser = (f"lr {setting(r, 'train.lr', f'{train.lr:g}')}, {setting(r, 'train.schedule', train.schedule)} "
                 f"schedule, {setting(r, 'train.warmup_steps', train.warmup_steps)} warmup steps, "
                 f"precision {setting(r, 'train.precision', train.precision)}")
    batch = setting(r, "train.batch_size", train.batch_size)
    if train.budget is None:
        steps = setting(r, "train.steps", f"{train.resolved(s.task['train_length'])['steps']:,}")
        return f"Budget per run: {steps} steps of {batch} sequences ({optimiser}); {seeds_text(r)}."
    how = {"flops": "counted training FLOPs (useful FLOPs of the forward, x3 for a training step); each variant "
                    "trains for the steps its own cost per step buys (table below)",
           "tokens": "real training tokens; each variant trains for the steps they buy (table below)",
           "seconds": "training seconds (evaluation excluded); each run stops when they are spent"}[train.budget.kind]
    per_rung = any(key.startswith("train.budget.") for key in s.scale or {})
    return (f"Budget per run: {train.budget.text()}" + (" as train: gives it (the ladder sets each rung's own: see Across "
            "scale)" if per_rung else "") + f" of {how}; batches of {batch} sequences ({optimiser}); "
            f"{seeds_text(r)}.")


def steps_table(r: TrainResults) -> Table:
    """Per variant: the steps its budget buys at batch 0's cost, the steps its runs took, how
    their last step ended, and what they spent."""
    rows = []
    for variant in r.runs.variants.labels:
        train = r.gates.resolved_points.get(variant, {}).get("train")
        mine = r.runs.finished[r.runs.finished["variant"] == variant]

        def mean(column: str) -> str:
            return fmt(float(mine[column].mean())) if column in mine and mine[column].notna().any() else "–"

        last = mine["last_step"].dropna().value_counts() if "last_step" in mine else pd.Series(dtype=int)
        rows.append([variant, f"{train['steps']:,}" if train else "–", mean("steps_done"),
                     ", ".join(f"{kind} ({n})" for kind, n in last.items()) or "–",
                     mean("train_flops"), mean("train_tokens")])
    return Table(["variant", "steps at batch 0's cost", "steps run (mean)", "last step (runs)",
                  "train FLOPs spent (mean)", "train tokens (mean)"], rows,
                 caption="Steps each variant's budget buys, and what its finished runs spent (the last step trains "
                 "the sequences the budget still pays for: all, some (partial) or none (dropped))",
                 numeric=[False, True, True, False, True, True])


def status_table(r: TrainResults) -> Table:
    statuses = [Status.FINISHED, *FAILURES]
    statuses += sorted(set(r.runs.final_runs["status"]) - set(statuses))
    rows = []
    for variant in r.runs.variants.labels:
        mine = r.runs.final_runs[r.runs.final_runs["variant"] == variant]
        counts = [int((mine["status"] == st).sum()) for st in statuses]
        rows.append([variant, *map(str, counts), str(len(mine))])
    totals = [int((r.runs.final_runs["status"] == st).sum()) for st in statuses]
    rows.append(["total", *map(str, totals), str(len(r.runs.final_runs))])
    columns = ["variant", *statuses, "runs"]
    return Table(columns, rows, caption="Runs by status", numeric=[False] + [True] * (len(columns) - 1))


def leaderboard(r: TrainResults, metric: str) -> Table:
    higher = metric_direction(metric, r.runs.task_name)
    rows = []
    for variant in r.runs.variants.labels:
        iv = r.runs.interval(variant, metric)
        n_runs = int((r.runs.final_runs["variant"] == variant).sum())
        base = r.runs.baseline_of(variant)
        if base is None:
            diff = "–"
        elif base == variant:
            diff = "baseline"
        else:
            d = difference(r.runs.values(variant, metric), r.runs.values(base, metric), bounds=r.runs.range_of(metric))
            diff = fmt_signed_interval(d.mean, d.lo, d.hi) + (f" ({d.method})" if d.method and not
                                                              math.isnan(d.lo) else "")
            diff += "" if len(r.runs.variants.keys) == 1 or not r.runs.study.baseline else f" vs {base}"
        measures = []
        mine = r.runs.finished[r.runs.finished["variant"] == variant]
        for col, (_, formatter) in MEASURES.items():
            value = float(mine[col].mean()) if col in mine and len(mine) else math.nan
            text = formatter(value)
            if col == "peak_memory_bytes" and "peak_memory_instrument" in mine and len(mine) and text != "–":
                text += f" ({', '.join(sorted(set(mine['peak_memory_instrument'].dropna().astype(str))))})"
            measures.append(text)
        rows.append(((iv.mean if not math.isnan(iv.mean) else None),
                     [variant, interval_text(iv), f"{iv.n}/{n_runs}", diff, *measures]))
    # Best first by mean; variants without a finished run last, in sweep order.
    scored = sorted([r for r in rows if r[0] is not None], key=lambda r: -r[0] if higher else r[0])
    rows = [r for _, r in scored] + [r for m, r in rows if m is None]
    columns = ["variant", f"{metric} mean [95% CI]", "finished seeds", "Δ to baseline [95% CI]",
               *(heading for heading, _ in MEASURES.values())]
    better = "higher" if higher else "lower"
    return Table(columns, rows, caption=f"{metric} ({better} is better; sorted best first)",
                 numeric=[False] + [True] * (len(columns) - 1))


def all_metrics_table(r: TrainResults) -> Table | None:
    """Every final metric, one row per evaluation length and variant and one column per metric,
    so the table keeps a handful of columns however many lengths a study evaluates."""
    if len(r.runs.metrics) <= 1:
        return None
    names = list(dict.fromkeys(split_metric(m)[0] for m in r.runs.metrics))
    lengths = sorted({split_metric(m)[1] for m in r.runs.metrics}, key=lambda n: -1 if n is None else n)
    rows = []
    for length in lengths:
        for variant in r.runs.variants.labels:
            columns = [name if length is None else f"{name}@{length}" for name in names]
            cells = [interval_text(r.runs.interval(variant, c)) if c in r.runs.metrics else "–" for c in columns]
            rows.append(["–" if length is None else str(length), variant, *cells])
    arrows = ["" if name in DESCRIPTIVE_METRICS else " ↑" if metric_direction(name, r.runs.task_name)
              else " ↓" for name in names]
    return Table(["length", "variant", *(f"{name}{a}" for name, a in zip(names, arrows))], rows,
                 caption="Every final metric at each evaluation length: mean [95% CI] over finished seeds "
                 "(↑ higher is better, ↓ lower; no arrow: descriptive)",
                 numeric=[True, False] + [True] * len(names))


def leaderboards(r: TrainResults) -> Section:
    items: list[Item] = [Paragraph(
        "Means over finished seeds with 95% t intervals, kept inside the metric's range; Δ is the difference "
        "to the baseline with its 95% t interval, paired over seeds when both ran the same seeds, Welch's "
        "otherwise. Run measures (parameters, tokens/s, peak memory, wall time) are means "
        "over finished runs; peak memory names its instrument.")]
    if r.inputs.timing_caveat:
        items.append(Paragraph(r.inputs.timing_caveat))
    items += [leaderboard(r, m) for m in r.runs.headline]
    table = all_metrics_table(r)
    if table is not None:
        items.append(table)
    return Section("Leaderboard", items)


def failures(r: TrainResults) -> Section:
    failed = r.runs.final_runs[r.runs.final_runs["status"] != Status.FINISHED]
    if failed.empty:
        return Section("Failed runs", [Paragraph("Every run finished.")])
    rows = []
    for row in failed.to_dict("records"):
        step = row.get("diverged_step")
        if step is None or pd.isna(step):
            step = row.get("steps_done")
        rows.append([row["variant"], str(row["seed"]), str(row["status"]),
                     "–" if step is None or pd.isna(step) else f"{int(step):,}",
                     str(row.get("error") or "").strip() or "–"])
    return Section("Failed runs", [
        Paragraph("Runs that failed, diverged or ran out of memory are kept here and counted in the tables; "
                  "their metrics do not enter the means. Step: where the run stopped (for a diverged run, "
                  "the step whose loss was not finite)."),
        Table(["variant", "seed", "status", "step", "message"], rows, numeric=[False, True, False, True, False])])


def environment(r: TrainResults) -> Section:
    env = r.inputs.environment
    rows = [[k, str(env[k])] for k in sorted(env)]
    return Section("Environment", [Table(["", "value"], rows)])


def gate_scope(r: TrainResults) -> str:
    """On which seeds and at which level the Learned section reads each group's gate."""
    if r.runs.study.seed_plan is None:
        return "Over all finished seeds, at 95%"
    return "On the seeds of the last look each group's seeds reached, at that look's level"


def learned(r: TrainResults) -> Section | None:
    """Per variant, its score at the training length beside every baseline of the task, the
    threshold, whether it learned, and its share of seeds that diverged or did not learn."""
    if not r.gates.per_metric or not r.runs.variants.labels:
        return None
    items: list[Item] = [Paragraph(
        "Baselines: predictors that cannot solve the task, each derived from the task's own generator "
        f"(`Task.baselines`, exactly or by Monte Carlo with a fixed seed, or fitted on its text): "
        f"{r.gates.baselines_text}. The threshold is the "
        f"strongest gating baseline moved {MARGIN:.0%} of the way to a "
        f"perfect score. {gate_scope(r)}, a group learned when the interval of its mean lies past "
        "the threshold, did not learn when it lies short of it, and is undetermined otherwise (a verdict reads "
        "its gates at its own look and level). The last column: the share of seeds that diverged or finished "
        "but did not learn (their own score missed the threshold), with an exact (Clopper-Pearson) 95% "
        "interval, then each kind counted apart.")]
    for name, gates in r.gates.per_metric.items():
        names = list(dict.fromkeys(b for g in gates for b, _ in g.baselines))
        rows = []
        for variant, g in zip(r.runs.variants.labels, gates):
            scores = dict(g.baselines)
            rows.append([variant, g.metric, interval_text(r.runs.interval(variant, g.metric)),
                         *(fmt(scores.get(b, math.nan)) for b in names), fmt(g.needed),
                         f"{g.state} ({g.untested})" if g.untested else str(g.state),
                         r.gates.failure_text(variant)])
        better = "≥" if metric_direction(name, r.runs.task_name) else "≤"
        items.append(Table(["variant", "at the training length", f"{name} mean [95% CI]", *names,
                            f"learned: {better}", "learned", "diverged or did not learn [95% CI]"], rows,
                           caption=f"{name}: score at the training length against the task's baselines",
                           numeric=[False, False, True, *([True] * len(names)), True, False, True]))
    return Section("Learned at the training length", items)


def across_scale(r: TrainResults) -> Section | None:
    """For a scale ladder: each `expect:` entry's outcome at every rung, and whether it holds across."""
    study = r.runs.study
    if not study.scale:
        return None
    rungs = [value_text(v) for v in study.scale[study.rung_key]]
    matching = "; ".join(f"{k}: {', '.join(value_text(x) for x in values)}" for k, values in study.scale.items())
    rows = []
    for row in r.verdicts.across_scale(r.verdicts.decided):
        rows.append([row["statement"] + (f" ({row['context']})" if row["context"] else ""),
                     *(row["labels"].get(rung, "–") for rung in rungs), row["line"]])
    return Section("Across scale", [
        Paragraph(f"Scale ladder: {matching} (one value per rung). Every expect: entry is decided at each rung "
                  "by the rule under Verdicts (Holm's correction covers every rung's comparison together); the "
                  "last column says whether the verdict holds across the rungs."),
        Table(["expectation", *(f"{short_key(study.rung_key)} = {rung}" for rung in rungs), "across scale"], rows,
              caption="Each expect: entry at every rung of the ladder")])
