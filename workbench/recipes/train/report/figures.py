"""The figure sections of a training study's report, each a function of the study's results:
the first screen's verdict figures, learning curves, quality against evaluation length and
against cost, and for a scale ladder the Fits section (saturating power laws of the loss
against training FLOPs, workbench.cost.fit)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from workbench.report import figures
from workbench.report.document import (Figure, Item, Paragraph, Section, Table, VerdictLine, fmt, fmt_interval,
                                       level_text)
from workbench.stats.intervals import mean_ci
from workbench.report.sweep_points import Variants
from workbench.recipes.train.report.verdict_figure import verdict_groups
from workbench.cost.fit import fit_power_law, power_law_crossing
from workbench.recipes.train.compute_curves import AXIS_LABELS, against
from workbench.results import ATTENTION_ENTROPY, FAILURE_SHARE, PROGRESS
from workbench.recipes.train.report.computed import TrainResults
from workbench.recipes.train.runs import metric_direction, split_metric


def figure(r: TrainResults, path: Path | None, caption: str, alt: str) -> Figure | None:
    if path is None:
        return None
    return Figure(path.relative_to(r.dest).as_posix(), caption, alt)


def verdict_figures(r: TrainResults, lines: Sequence[VerdictLine]) -> list[Figure]:
    """The first screen's figures, one per verdict metric: each compared group's seeds as
    dots and its mean with the interval of its verdict line, with the learned-at-all gate's
    threshold and the strongest baseline where a verdict on that metric was gated on it."""
    by_metric: dict[str, list[VerdictLine]] = {}
    for line in lines:
        column = r.runs.expect_column(r.runs.study.expect[line.expect["index"]])
        if column != FAILURE_SHARE:  # a share of seeds has no per-seed values to draw
            by_metric.setdefault(column, []).append(line)
    out = []
    for metric, mine in by_metric.items():
        records = {g["group"]: g for line in mine for g in line.groups}
        groups = [(label, r.runs.values(label, metric).tolist(), *(math.nan if records[label][k] is None
                                                                  else records[label][k] for k in ("mean", "lo", "hi")))
                  for label in r.runs.variants.labels if label in records]
        gates = [g for line in mine for g in line.gates if g["metric"] == metric and not g["untested"]]
        gate = gates[0] if gates else None
        levels = {records[label].get("level") for label, *_ in groups}
        level = level_text(levels.pop()) if len(levels) == 1 and None not in levels else ""
        slug = re.sub(r"[^A-Za-z0-9]+", "_", metric).strip("_")
        path = verdict_groups(groups, r.runs.palette, r.dest / "figures" / f"verdict_{slug}.png",
                                      metric=metric, bounds=r.runs.range_of(metric),
                                      threshold=gate["needed"] if gate else None,
                                      baseline=(gate["baseline"], gate["chance"]) if gate else None,
                                      higher_is_better=metric_direction(metric, r.runs.task_name) is not False,
                                      level=level)
        lines_text = (f"; dashed: the learned-at-all threshold, dotted: the strongest baseline ({gate['baseline']})"
                      if gate else "")
        drawn = figure(r, path, f"{metric} of the compared groups: each seed a dot, the mean with its {level} t "
                                f"interval (the level its verdict read it at){lines_text}.".replace("  ", " "),
                       f"{metric} per group and seed")
        out += [drawn] if drawn else []
    return out


def figures_section(r: TrainResults) -> Section:
    fig_dir = r.dest / "figures"
    items: list[Item] = []
    curves = curve_rows(r)
    # Seeds that spent different amounts by the same step (time; FLOPs or tokens of padded batches)
    # share no x values to average over: each run is drawn on its own.
    per_seed = not curves.empty and bool(curves.groupby(["variant", "metric", "step"])["x"].nunique().max() > 1)
    if not curves.empty:
        panels = [(f"{split} {metric}", metric) for split, metric in curve_panels(r)]
        flat = [name for name, _ in panels if (curves["metric"] == name).any()
                and figures.constant(curves[curves["metric"] == name]["value"])]
        items.append(figure(r, 
            figures.learning_curves(curves, r.runs.palette, fig_dir / "learning_curves.png",
                                    panels=[name for name, _ in panels],
                                    bounds={name: r.runs.range_of(metric) for name, metric in panels},
                                    xlabel=AXIS_LABELS[r.runs.study.curves_against], per_seed=per_seed),
            f"Learning curves against {AXIS_LABELS[r.runs.study.curves_against]}: "
            + ("one line per run (its seeds had spent different amounts at the same step, so no mean or band)"
               if per_seed else figures.spread_text(curves)) + " (all runs, including those that stopped early)."
            + flat_note(flat, curves), "learning curves per variant"))
    for name in dict.fromkeys(split_metric(m)[0] for m in r.runs.metrics):
        long = by_length(r, name)
        if long is None:
            continue
        if long["value"].isna().all():  # declared by the task, measured by none of these runs (decode_samples: 0)
            items.append(Paragraph(f"{name}: not measured by these runs."))
            continue
        if figures.constant(long["value"]):
            items.append(Paragraph(f"{name}: {fmt(long['value'].dropna().iloc[0])} for every variant at every "
                                   "evaluation length, so it is not drawn."))
            continue
        items.append(figure(r, 
            figures.quality_vs_length(long, r.runs.palette, fig_dir / f"{name}_vs_length.png", metric=name,
                                      train_length=r.runs.study.task.get("train_length"),
                                      bounds=r.runs.range_of(name)),
            f"{name} against evaluation length (extrapolation beyond the dashed training length): "
            f"{figures.spread_text(long)}.", f"{name} against evaluation length"))
    headline = r.runs.headline[0] if r.runs.headline else None
    if headline is not None:
        summary = cost_summary(r, headline)
        for cost, label, slug in (("wall_time_s", "wall time per run (s)", "time"),
                                  ("peak_memory_bytes", "peak memory (bytes)", "memory")):
            if cost in summary:
                seeds = r.runs.finished[["variant", headline, cost]].rename(columns={headline: "value"}) \
                    if headline in r.runs.finished and cost in r.runs.finished else None
                caveat = r.inputs.timing_caveat if cost == "wall_time_s" else None
                caveat = f" {caveat}" if caveat else ""
                items.append(figure(r, 
                    figures.quality_vs_cost(summary, r.runs.palette, fig_dir / f"{slug}_vs_quality.png",
                                            metric=headline, cost=cost, cost_label=label,
                                            bounds=r.runs.range_of(headline), seeds=seeds),
                    f"{headline} against {label.split(' (')[0]}: each seed as a dot, the mean with its 95% CI "
                    f"over seeds.{caveat}", f"{headline} against {label}"))
    return Section("Figures", [i for i in items if i is not None])


def flat_note(flat: Sequence[str], curves: pd.DataFrame) -> str:
    """The caption's word on panels left out because every value was the same."""
    if not flat:
        return ""
    values = "; ".join(f"{name} is {fmt(curves[curves['metric'] == name]['value'].iloc[0])}" for name in flat)
    return f" Not drawn, the same at every step for every run: {values}."


def curve_panels(r: TrainResults) -> list[tuple[str, str]]:
    """(split, metric) of the learning-curve panels: the training loss, and the evaluation
    loss and headline metric at the training length (or the first evaluation length), and
    the attention entropy when the runs recorded it."""
    lengths = r.runs.study.task.get("eval_lengths") or [r.runs.study.task["train_length"]]
    length = r.runs.study.task["train_length"] if r.runs.study.task["train_length"] in lengths else lengths[0]
    panels = [("train", "loss"), ("eval", f"loss@{length}"), ("eval", f"{r.runs.primary}@{length}")]
    entropy = f"{ATTENTION_ENTROPY}@{r.runs.study.task['train_length']}"  # recorded at the training length only
    curves = r.inputs.curves
    if curves is not None and not curves.empty and (curves["metric"] == entropy).any():
        panels.append(("eval", entropy))
    return panels


def curve_rows(r: TrainResults) -> pd.DataFrame:
    """Long rows (variant, seed, step, metric, value, x) of the curve panels, every run; x is
    the step or what the run had spent by then (the study's `curves_against`)."""
    curves = r.inputs.curves
    columns = ["variant", "seed", "step", "metric", "value"]
    if curves is None or curves.empty:
        return pd.DataFrame(columns=[*columns, "x"])
    parts = []
    for split, metric in curve_panels(r):
        part = curves[(curves["split"] == split) & (curves["metric"] == metric)].copy()
        part["metric"] = f"{split} {metric}"
        parts.append(part)
    joined = pd.concat(parts).merge(r.runs.final_runs[["run_id", "variant", "seed"]], on="run_id", how="inner")
    joined = against(pd.concat([joined, curves[curves["split"] == PROGRESS]]), r.runs.study.curves_against)
    joined = joined.dropna(subset=["value", "variant"])
    return joined.sort_values(["metric", "variant", "seed", "step"])[[*columns, "x"]].reset_index(drop=True)


def by_length(r: TrainResults, name: str) -> pd.DataFrame | None:
    cols = [m for m in r.runs.metrics if split_metric(m)[0] == name and split_metric(m)[1] is not None]
    if len(cols) < 2:
        return None
    long = r.runs.finished.melt(id_vars=["variant", "seed"], value_vars=cols, var_name="metric", value_name="value")
    long["length"] = long["metric"].map(lambda m: split_metric(m)[1])
    return long.dropna(subset=["value"])


def cost_summary(r: TrainResults, metric: str) -> pd.DataFrame:
    rows = []
    for variant in r.runs.variants.labels:
        mine = r.runs.finished[r.runs.finished["variant"] == variant]
        iv = mean_ci(mine[metric]) if metric in mine else mean_ci([])
        row = {"variant": variant, "mean": iv.mean, "ci_lo": iv.lo, "ci_hi": iv.hi}
        for cost in ("wall_time_s", "peak_memory_bytes"):
            if cost in mine:
                row[cost] = float(mine[cost].mean()) if len(mine) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def fit_metric(r: TrainResults) -> str:
    """The loss the ladder's fits read: the first expect: entry's metric when it is a loss,
    else the evaluation loss at the training length."""
    losses = [r.runs.expect_column(e) for e in r.runs.study.expect
              if split_metric(r.runs.expect_column(e))[0] in ("loss", "bpc", "perplexity")]
    return losses[0] if losses else f"loss@{r.runs.study.task['train_length']}"


def fits_section(r: TrainResults) -> Section | None:
    """Per variant (the swept keys without the ladder's), L = E + A (C/C0)^-alpha through its
    finished runs' final loss against their counted training FLOPs, every rung and seed
    (workbench.cost.fit), and where two variants' fitted curves cross."""
    if not r.runs.study.scale or "train_flops" not in r.runs.finished:
        return None
    metric = fit_metric(r)
    base_keys = [k for k in r.runs.keys if k not in r.runs.study.scale]
    runs = r.runs.finished.assign(base=Variants.of(base_keys, r.runs.finished).label_runs(r.runs.finished)
                                if base_keys else "all runs")
    fits, rows, notes, points = {}, [], [], []
    for base, part in runs.groupby("base", sort=False):
        data = pd.DataFrame({"compute": pd.to_numeric(part["train_flops"], errors="coerce"),
                             "loss": pd.to_numeric(part.get(metric), errors="coerce"), "seed": part["seed"]})
        try:
            fit = fit_power_law(data)
        except (ValueError, RuntimeError) as err:
            notes.append(f"{base}: no fit ({err})")
            continue
        fits[base] = fit
        points.append(data.assign(variant=base))
        ci = {k: fmt_interval(getattr(fit.law, k), *fit.intervals[k]) if not math.isnan(fit.intervals[k][0])
              else f"{fmt(getattr(fit.law, k))} (one seed: no interval)" for k in ("E", "A", "alpha")}
        rows.append([base, ci["E"], ci["A"], ci["alpha"], fmt(fit.law.C0), str(fit.n_points), str(fit.n_seeds)])
    if not fits:
        return Section("Fits", [Paragraph("; ".join(notes) or "No finished runs to fit.")])
    items: list[Item] = [Paragraph(
        f"{metric} against counted training FLOPs C, per variant over every rung and seed: L = E + A (C/C0)^-α "
        "(scipy curve_fit, E, A ≥ 0), with 95% intervals from 1,000 bootstrap draws of whole seeds. C0 is the "
        "smallest compute fitted."),
        Table(["variant", "E [95% CI]", "A [95% CI]", "α [95% CI]", "C0 (FLOPs)", "runs", "seeds"], rows,
              caption=f"Saturating power laws of {metric} against training FLOPs",
              numeric=[False, True, True, True, True, True, True])]
    names = list(fits)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            lo = max(fits[a].compute_range[0], fits[b].compute_range[0])
            hi = min(fits[a].compute_range[1], fits[b].compute_range[1])
            where = power_law_crossing(fits[a].law, fits[b].law, lo, hi) if lo < hi else None
            if where is None:
                ahead = a if fits[a].law.loss(hi) < fits[b].law.loss(hi) else b
                items.append(Paragraph(f"{a} and {b}: the fitted curves do not cross within the measured range "
                                       f"({fmt(lo)} to {fmt(hi)} FLOPs); {ahead} is lower throughout."))
            else:
                items.append(Paragraph(f"{a} and {b}: the fitted curves cross at {fmt(where)} FLOPs (measured range "
                                       f"{fmt(lo)} to {fmt(hi)})."))
    items += [Paragraph(n) for n in notes]
    palette = figures.variant_palette(list(fits))
    items.append(figure(r, 
        figures.loss_vs_compute(pd.concat(points), {b: f.law.loss for b, f in fits.items()}, palette,
                                r.dest / "figures" / "loss_vs_compute.png", metric=metric),
        f"{metric} of every finished run against its counted training FLOPs (dots), with each variant's fitted "
        "saturating power law (lines).", f"{metric} against training compute with fitted laws"))
    return Section("Fits", [i for i in items if i is not None])
