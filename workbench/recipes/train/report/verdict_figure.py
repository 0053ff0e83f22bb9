"""The first screen's figure of a training report: one verdict metric, each compared group's
seeds as dots beside its mean and interval, with the learned-at-all threshold and the strongest
baseline as lines (drawn with the report's style, workbench.report.figures)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from workbench.report.document import fmt
from workbench.report import figures
from workbench.report.figures import UNBOUNDED, Bounds, Palette, styled
from workbench.study.keys import split_top


@styled
def verdict_groups(groups: Sequence[tuple[str, Sequence[float], float, float, float]], palette: Palette, path: Path, *,
                   metric: str, bounds: Bounds = UNBOUNDED, threshold: float | None = None,
                   baseline: tuple[str, float] | None = None, higher_is_better: bool = True,
                   level: str = "95%") -> Path | None:
    """The first screen's figure of one verdict metric: groups (label, per-seed values, mean,
    lo, hi) side by side, each seed a dot, the mean with its interval (clipped to `bounds`);
    `threshold` (the learned-at-all gate's) dashed and the strongest `baseline` (name, score)
    dotted across every group; the threshold's legend reads its side from the metric's declared
    direction (`higher_is_better`: ≥, else ≤, as for bpc); `level`: the intervals' level, as the title
    says. The legend sits right of the axes, so that no seed's dot hides behind it. Small (it shares
    the screen with the verdict table)."""
    if not groups:
        return None
    lines = [split_top(label, ",") for label, *_ in groups]  # one swept key a line
    labels = ["\n".join(group) for group in lines]
    per_group = max(1.1, 0.075 * max(len(line) for group in lines for line in group))  # inches: its longest line
    legend = threshold is not None or baseline is not None
    fig, ax = figures.new_axes(width=max(3.6, per_group * len(groups) + 1.8) + (1.9 if legend else 0.0),
                               height=2.9 + 0.15 * (max(map(len, lines)) - 1))
    low, high = bounds
    for i, (label, values, mean, lo, hi) in enumerate(groups):
        offsets = np.linspace(-0.12, 0.12, len(values)) if len(values) > 1 else np.zeros(len(values))
        ax.scatter(i - 0.18 + offsets, values, s=16, alpha=0.6, color=palette[label], linewidths=0, zorder=2)
        below = mean - max(lo, low) if not math.isnan(lo) else 0.0
        above = min(hi, high) - mean if not math.isnan(hi) else 0.0
        ax.errorbar([i + 0.12], [mean], yerr=[[below], [above]], fmt="o", capsize=4, markersize=6,
                    color=palette[label], zorder=3)
    if threshold is not None:
        ax.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"learned: {'≥' if higher_is_better else '≤'} {fmt(threshold)}")
    if baseline is not None:
        ax.axhline(baseline[1], color="black", linestyle=":", linewidth=1, label=f"{baseline[0]} {fmt(baseline[1])}")
    ax.set_xticks(range(len(groups)), labels)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set(ylabel=metric, title=f"{metric}: dots seeds, bars mean and {level} CI".replace("  ", " "))
    if legend:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    return figures.save(fig, path)

