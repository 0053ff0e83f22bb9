"""The Tuning section of a study with `tune:`: each variant's chosen value and its tuning
curve (validation metric against candidate value), as a table and, for one numeric tuned
key, a figure. Every other section of the report reads the final runs only."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from workbench.report import figures
from workbench.report.document import Figure, Item, Paragraph, Section, Table, fmt
from workbench.report.sweep_points import Variants, short_key, value_text
from workbench.results import Status
from workbench.recipes.train.tuning import EXTEND_BOUND, Candidate, PointTuning, higher_is_better, labels, numeric


def candidate_text(candidate: Candidate) -> str:
    return ", ".join(f"{short_key(k)}={v}" for k, v in labels(candidate.values).items())


def cell(candidate: Candidate) -> str:
    """Mean validation metric over the candidate's tuning runs, or why there is none."""
    if candidate.eligible:
        n = len(candidate.scores)
        return fmt(candidate.mean) + (f" ({n} seeds)" if n > 1 else "")
    if not candidate.statuses:
        return "not run"
    return "/".join(sorted(set(candidate.statuses) - {Status.FINISHED})) or "no score"


def bracket_text(tuned: PointTuning) -> str:
    """Whether the chosen value has a worse candidate on each side."""
    if tuned.chosen is None or len(tuned.candidates) < 2:
        return "–"
    if any(numeric(c.values) is None for c in tuned.candidates):
        return "– (not one numeric key: no order to extend)"
    past = len(tuned.candidates) - tuned.grid
    if tuned.stopped_at_bound:
        return f"no: still at an edge after {past} values past the grid; the bound of {EXTEND_BOUND} stopped the search"
    if tuned.edge:
        return "no: at an edge (the next `workbench run` extends the grid)"
    return "yes" + (f" (after {past} values past the grid)" if past else "")


class TuningSection:
    def __init__(self, study, tunings: Sequence[PointTuning], variants: Variants, palette, dest: Path):
        self.study, self.tunings, self.variants = study, list(tunings), variants
        self.palette, self.dest = palette, dest
        self.tune = study.tune

    def variant(self, tuned: PointTuning) -> str:
        return self.variants.label([value_text(tuned.swept.get(k)) for k in self.variants.keys])

    def table(self) -> Table:
        """A column per candidate any variant tried (the grid, and values past its edges in
        the grid's order), '–' where a variant did not try it; whether the choice is bracketed."""
        tried = [c for t in self.tunings for c in t.candidates]
        heads = list(dict.fromkeys(candidate_text(c) for c in sorted(
            tried, key=lambda c: numeric(c.values) if all(numeric(d.values) is not None for d in tried) else 0)))
        rows = []
        for tuned in self.tunings:
            if tuned.chosen is not None:
                chosen = candidate_text(tuned.chosen)
            else:
                chosen = "– (tuning not done)" if not tuned.done else "– (no candidate finished)"
            mine = {candidate_text(c): cell(c) for c in tuned.candidates}
            rows.append([self.variant(tuned), chosen, bracket_text(tuned), *(mine.get(h, "–") for h in heads)])
        better = "higher" if higher_is_better(self.study, self.tune.metric) else "lower"
        return Table(["variant", "chosen", "bracketed", *heads], rows,
                     caption=f"Validation {self.tune.metric} per candidate ({better} is better)",
                     numeric=[False, False, False] + [True] * len(heads))

    def curve(self) -> Item | None:
        """Metric against value, a line per variant, when one numeric key is tuned."""
        if len(self.tune.values) != 1:
            return None
        [(key, values)] = self.tune.values.items()
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return None
        rows = [{"variant": self.variant(t), "value": float(c.values[key]), "score": c.mean if c.eligible else math.nan,
                 "chosen": c is t.chosen} for t in self.tunings for c in t.candidates]
        path = tuning_curves(pd.DataFrame(rows), self.palette, self.dest / "figures" / "tuning.png",
                             key=key, metric=f"validation {self.tune.metric}")
        if path is None:
            return None
        return Figure(path.relative_to(self.dest).as_posix(),
                      f"Tuning curves: validation {self.tune.metric} against {key} (mean over tuning seeds; "
                      "the chosen value circled; diverged or failed candidates are left out).",
                      f"validation {self.tune.metric} against {key} per variant")

    def build(self) -> Section:
        t = self.tune
        keys = ", ".join(t.keys)
        direction = "highest" if higher_is_better(self.study, t.metric) else "lowest"
        seeds = ", ".join(map(str, self.study.tuning_seeds))
        items: list[Item] = [Paragraph(
            f"Each variant chose its own {keys} before its seeds ran, so that variants are compared at their "
            f"own best setting, not at one shared one: {t.seeds} tuning run(s) per candidate (seed {seeds}, none "
            f"of them a reported seed), "
            f"scored by {t.metric} on validation sets drawn apart from the training data and from the "
            f"evaluation sets; the {direction} mean was chosen (ties: the first listed). A candidate with a "
            "diverged or failed run is not eligible. A choice at the edge of a numeric grid is not bracketed: "
            f"the grid then extends past that edge by its own ratio, up to {EXTEND_BOUND} values. Every other table, "
            "figure and verdict uses the final runs at the chosen values only.")]
        items.append(self.table())
        curve = self.curve()
        if curve is not None:
            items.append(curve)
        return Section("Tuning", items)


@figures.styled
def tuning_curves(rows: pd.DataFrame, palette: figures.Palette, path: Path, *, key: str, metric: str) -> Path | None:
    """rows: (variant, value, score, chosen) -> score against value, a line per variant, the
    chosen value circled; a log x axis when the values span a factor of 10 or more."""
    data = rows.dropna(subset=["score"])
    if data.empty:
        return None
    fig, ax = figures.new_axes()
    for variant in [v for v in palette if v in set(data["variant"])]:
        part = data[data["variant"] == variant].sort_values("value")
        ax.plot(part["value"], part["score"], marker="o", color=palette[variant], label=variant)
        best = part[part["chosen"]]
        ax.scatter(best["value"], best["score"], s=160, facecolors="none", edgecolors=palette[variant], linewidths=2)
    values = rows["value"]
    if (values > 0).all() and values.max() >= 10 * values.min():
        ax.set_xscale("log")
    ax.set(xlabel=key + (" (log scale)" if ax.get_xscale() == "log" else ""), ylabel=metric,
           title=f"{metric} against {key}")
    ax.legend(title="variant", fontsize="small")
    return figures.save(fig, path)
