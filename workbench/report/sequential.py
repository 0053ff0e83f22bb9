"""Adaptive seeds (`seeds: {first, max}`): repeated looks with alpha spending.

Looks are at `first` seeds per group, then twice as many each round, ending at `max`. Each look
applies the verdict rule (workbench.report.stats.verdicts) at the alpha an O'Brien-Fleming-type
spending function adds there, gates and group intervals included; a comparison keeps the first
look that ends it (`Outcome.final`). The looks' alphas sum to the study's alpha, so by the union
bound the chance of any false decision over all looks is at most that alpha.

The runner's add-seeds loop and the report call the same functions: `seeds_for_next_look` says
which groups get more seeds, `grow_seeds` is the loop itself (the runner passes a function that
trains the runs; tests/report/test_sequential.py passes one that draws synthetic scores), and
`sequential_verdicts` is what the report prints.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import pandas as pd
from scipy import stats as st

from workbench.report.document import fmt
from workbench.report.intervals import ALPHA
from workbench.report.stats import CONTAINS_ZERO, Comparison, Verdict, plan_text, verdicts


def seed_looks(first: int, most: int) -> list[int]:
    """Seeds per group at each look of an adaptive study: `first`, then twice as many each
    round, ending at `most`; e.g. 3, 6, 12, 20. Few looks keep the alpha each one gets large."""
    looks = [first]
    while looks[-1] < most:
        looks.append(min(most, 2 * looks[-1]))
    return looks


def spent(fraction: float, alpha: float = ALPHA) -> float:
    """Alpha spent by information fraction t: the O'Brien-Fleming-type spending function of
    Lan & DeMets (1983), 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))."""
    return 0.0 if fraction <= 0 else float(2 - 2 * st.norm.cdf(st.norm.ppf(1 - alpha / 2) / math.sqrt(fraction)))


def look_alphas(looks: Sequence[int], alpha: float = ALPHA) -> list[float]:
    """The alpha each look tests at: what the spending function adds since the previous look.
    They sum to alpha, so by the union bound the chance of any false decision over all looks
    stays at most alpha, whatever the correlation between looks."""
    return list(_look_alphas(tuple(looks), alpha))


@functools.lru_cache(maxsize=64)
def _look_alphas(looks: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    fractions = [n / looks[-1] for n in looks]
    return tuple(spent(t, alpha) - spent(prev, alpha) for prev, t in zip([0.0, *fractions], fractions))


def sequential_verdicts(comparisons: Sequence[Comparison], looks: Sequence[int], plan: bool = True) -> list[Verdict]:
    """Verdicts of an adaptive study: at each look (its first n seeds, for the comparisons
    whose groups ran them) RULE runs at that look's spent alpha; a comparison keeps the first
    look that ends it, otherwise its last look's verdict. Each verdict records its look.
    `plan`: an inconclusive verdict states what its seeds would need (the runner does not ask)."""
    alphas = look_alphas(looks)
    final: list[Verdict | None] = [None] * len(comparisons)
    last: list[Comparison] = list(comparisons)  # each comparison as its deciding (or last) look saw it
    for j, (n, alpha) in enumerate(zip(looks, alphas)):
        available = [j == 0 or c.seeds_run >= n for c in comparisons]
        if j > 0 and not any(ok and not final[i].outcome.final for i, ok in enumerate(available)):
            break
        at_look = [c.truncated(n) if ok else replace(c, better_values=pd.Series(dtype=float),
                                                      than_values=pd.Series(dtype=float))
                   for c, ok in zip(comparisons, available)]
        for i, v in enumerate(verdicts(at_look, alpha, plan=False)):
            if not available[i] or (final[i] is not None and final[i].outcome.final):
                continue
            if v.outcome.final:
                v = replace(v, reason=f"{v.reason}; look {j + 1} of {len(looks)} ({n} seeds, alpha {fmt(alpha)})")
            final[i], last[i] = replace(v, look=j + 1, looks=len(looks), seeds=n), at_look[i]
    return [replace(v, reason=v.reason + plan_text(c, v.diff)) if plan and v.reason == CONTAINS_ZERO else v
            for v, c in zip(final, last) if v is not None]


def seeds_for_next_look(comparisons: Sequence[Comparison], decided: Sequence[Verdict],
                        looks: Sequence[int]) -> dict[str, int]:
    """Group -> the seeds it should have by the next look: the groups of every comparison that
    is still inconclusive below the plan's maximum (an undetermined gate keeps a comparison
    inconclusive unless its difference is decided)."""
    wanted: dict[str, int] = {}
    for c, v in zip(comparisons, decided):
        following = next((n for n in looks if n > c.seeds_run), None)
        if v.outcome.final or following is None:
            continue
        for group in (c.better, c.than):
            wanted[group] = max(wanted.get(group, 0), following)
    return wanted


def grow_seeds(wanted: Callable[[], dict[str, int]], run: Callable[[dict[str, int], dict[str, int]], None],
               start: int) -> None:
    """The add-seeds loop: ask `wanted()` (group -> seeds by the next look) after each round and
    call `run(counts, grown)` with every group's seeds so far and the groups that grew, until no
    group wants more than it has (all ended, at the maximum, or runs that could not finish)."""
    counts: dict[str, int] = {}
    while True:
        grown = {key: n for key, n in wanted().items() if n > counts.get(key, start)}
        if not grown:
            return
        counts.update(grown)
        run(dict(counts), grown)
