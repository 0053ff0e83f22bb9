"""Adaptive seeds (`seeds: {first, max}`): repeated looks with alpha spending.

Looks are at `first` seeds per group, then about 1.5 times as many each round, ending at `max`
(`LOOKS`: 3, 4, 6, 9, 14, 20). Each look applies the verdict rule (workbench.recipes.train.stats.verdicts)
at the alpha a Pocock-type spending function (Lan & DeMets 1983) adds there, gates and group
intervals included; a comparison keeps the first look that ends it (`Outcome.final`). The looks'
alphas sum to the study's alpha, so by the union bound the chance of any false decision over all
looks is at most that alpha. `EARLIER_LOOKS` is the rule before 2026-12-02 (O'Brien-Fleming-type,
doubling), kept so that the two can be compared on the same per-seed values.

The runner's add-seeds loop and the report call the same functions: `seeds_for_next_look` says
which groups get more seeds, `grow_seeds` is the loop itself (the runner passes a function that
trains the runs; tests/recipes/test_sequential.py passes one that draws synthetic scores), and
`sequential_verdicts` is what the report prints.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import pandas as pd
from scipy import stats as st

from workbench.report.document import fmt
from workbench.report.intervals import ALPHA
from workbench.recipes.train.stats import (CONTAINS_ZERO, FUTILE_FROM, FUTILE_POWER, INCONCLUSIVE, Comparison, Verdict,
                                          equivalence_power, plan_text, power, verdicts)


def obrien_fleming(fraction: float, alpha: float = ALPHA) -> float:
    """Alpha spent by information fraction t, O'Brien-Fleming-type (Lan & DeMets 1983):
    2 - 2 Phi(z_{1 - alpha/2} / sqrt(t)). Spends almost nothing early (4e-7 at t = 0.15)."""
    return 0.0 if fraction <= 0 else float(2 - 2 * st.norm.cdf(st.norm.ppf(1 - alpha / 2) / math.sqrt(fraction)))


def pocock(fraction: float, alpha: float = ALPHA) -> float:
    """Alpha spent by information fraction t, Pocock-type (Lan & DeMets 1983):
    alpha ln(1 + (e - 1) t). Spends nearly evenly over the looks (0.0115 at t = 0.15), so an
    effect every seed shows can end at the first look."""
    return 0.0 if fraction <= 0 else alpha * math.log(1 + (math.e - 1) * min(fraction, 1.0))


def doubling(first: int, most: int) -> list[int]:
    """Seeds at each look: `first`, then twice as many each round, ending at `most` (3, 6, 12, 20)."""
    looks = [first]
    while looks[-1] < most:
        looks.append(min(most, 2 * looks[-1]))
    return looks


def growing_by_half(first: int, most: int) -> list[int]:
    """Seeds at each look: from `first` to `most` in equal steps on a log scale, each about
    1.5 times the one before (3, 4, 6, 9, 14, 20; 3, 4, 6, 8, 12). Smaller steps than doubling
    let a comparison end nearer the seeds it needs; more looks cost little alpha under a
    spending function that spreads it."""
    rounds = max(1, math.ceil(math.log(most / first) / math.log(1.5) - 1e-9))
    looks = [first]
    for k in range(1, rounds + 1):
        looks.append(min(most, max(looks[-1] + 1, round(first * (most / first) ** (k / rounds)))))
    return looks


@dataclass(frozen=True)
class LookRule:
    """When an adaptive study looks (`schedule(first, max)`: seeds per group at each look) and
    what each look spends (`spending(t, alpha)`: the alpha spent by information fraction t)."""

    name: str
    spending: Callable[[float, float], float]
    schedule: Callable[[int, int], list[int]]
    futile_power: float = 0.0  # stop adding seeds below this power (`futility`); 0: never stop

    def looks(self, first: int, most: int) -> list[int]:
        return self.schedule(first, most)

    def alphas(self, looks: Sequence[int], alpha: float = ALPHA) -> list[float]:
        """The alpha each look tests at: what the spending function adds since the previous
        look. They sum to alpha, so by the union bound the chance of any false decision over
        all looks stays at most alpha, whatever the correlation between looks."""
        return list(_look_alphas(self.spending, tuple(looks), alpha))


@functools.lru_cache(maxsize=64)
def _look_alphas(spending, looks: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    fractions = [n / looks[-1] for n in looks]
    return tuple(spending(t, alpha) - spending(prev, alpha) for prev, t in zip([0.0, *fractions], fractions))


# The rule every adaptive study runs under (chosen 2026-12-02, issue 44: the same error rate, fewer
# seeds where every seed shows the effect; docs/verdicts.md has the simulation's figures), and the
# rule before it, kept so that `python -m benchmarks --only decide` and tests/recipes/test_sequential.py
# can show both on the same per-seed values. Since 2026-12-04 an inconclusive comparison whose seeds
# cannot decide it gets no more (`futility`); `WITHOUT_FUTILITY` is the same rule that grows every
# inconclusive comparison to `max`, kept for the same comparison.
LOOKS = LookRule("Pocock-type alpha spending, looks growing by half, futility", pocock, growing_by_half,
                 futile_power=FUTILE_POWER)
WITHOUT_FUTILITY = LookRule("Pocock-type alpha spending, looks growing by half (every inconclusive comparison "
                            "to max: the rule of 2026-12-02)", pocock, growing_by_half)
EARLIER_LOOKS = LookRule("O'Brien-Fleming-type alpha spending, looks doubling (the rule of 2026-12-01)",
                         obrien_fleming, doubling)


def futility(c: Comparison, v: Verdict, most: int, futile_power: float) -> str:
    """Why more seeds, up to `most` per group, would not let the inconclusive `v` decide its
    claim, in words ("" when they could): neither group learned (then no seed count makes it test
    the claim), or the test at `most` seeds would find the observed difference, and, for an entry
    with a margin, the equivalence within it, each with under `futile_power` power at the level
    `v` was read at, were the observed difference and spread the true ones (conditional power at
    the current estimate: stochastic curtailment, Lan, Simon & Halperin 1982). Non-binding:
    verdicts are read from whatever seeds the groups have, at the looks' alphas, so stopping only
    removes chances to decide, never adds one, and the error rate stays what the looks bound.
    `futile_power` 0: never futile."""
    d = v.diff
    if v.outcome is not INCONCLUSIVE or futile_power <= 0 or v.seeds < FUTILE_FROM:
        return ""
    if v.neither:
        return "neither group learned, so no seed count makes it test the claim"
    if d.method not in ("paired", "Welch") or not (math.isfinite(d.se) and d.se > 0):
        return ""
    paired, alpha = d.method == "paired", 1 - d.level
    sd = d.se * math.sqrt(d.n) if paired else d.se * math.sqrt(d.n / 2)
    chance = power(abs(d.mean), sd, most, alpha, paired)
    if c.margin:
        chance = max(chance, equivalence_power(d.mean, sd, most, alpha, paired, c.margin))
    if not chance < futile_power:
        return ""
    what = f"the observed difference {fmt(d.mean)}" + (f" or its equivalence within ±{fmt(c.margin)}" if c.margin else "")
    return f"{most} seeds would find {what} with {chance:.0%} power"


def sequential_verdicts(comparisons: Sequence[Comparison], looks: Sequence[int], plan: bool = True,
                        rule: LookRule = LOOKS, stop_futile: bool = False) -> list[Verdict]:
    """Verdicts of an adaptive study: at each look (its first n seeds, for the comparisons
    whose groups ran them) RULE runs at that look's spent alpha; a comparison keeps the first
    look that ends it, otherwise its last look's verdict. Each verdict records its look.
    `plan`: an inconclusive verdict states what its seeds would need, and why its groups stopped
    short of the maximum when `futility` stopped them (the runner does not ask). `stop_futile`: a
    futile look ends the comparison, as when its groups get no more seeds (`workbench plan`
    simulates comparisons whose groups no other comparison grows)."""
    alphas = rule.alphas(looks)
    stopped: set[int] = set()  # comparisons a futile look ended (stop_futile)
    final: list[Verdict | None] = [None] * len(comparisons)
    last: list[Comparison] = list(comparisons)  # each comparison as its deciding (or last) look saw it
    for j, (n, alpha) in enumerate(zip(looks, alphas)):
        available = [j == 0 or c.seeds_run >= n for c in comparisons]
        if j > 0 and not any(ok and not final[i].outcome.final and i not in stopped for i, ok in enumerate(available)):
            break
        at_look = [c.truncated(n) if ok else replace(c, better_values=pd.Series(dtype=float),
                                                      than_values=pd.Series(dtype=float))
                   for c, ok in zip(comparisons, available)]
        for i, v in enumerate(verdicts(at_look, alpha, plan=False)):
            if not available[i] or (final[i] is not None and (final[i].outcome.final or i in stopped)):
                continue
            if v.outcome.final:
                v = replace(v, reason=f"{v.reason}; look {j + 1} of {len(looks)} ({n} seeds, alpha {fmt(alpha)})")
            final[i], last[i] = replace(v, look=j + 1, looks=len(looks), seeds=n), at_look[i]
            if stop_futile and futility(at_look[i], final[i], looks[-1], rule.futile_power):
                stopped.add(i)
    return [closing(v, c, looks[-1], rule) if plan else v for v, c in zip(final, last) if v is not None]


def closing(v: Verdict, c: Comparison, most: int, rule: LookRule) -> Verdict:
    """An inconclusive verdict with what its seeds would need, and, when its groups stopped short
    of `most` seeds because more could not decide it, why."""
    reason = v.reason + plan_text(c, v.diff) if v.reason == CONTAINS_ZERO else v.reason
    why = futility(c, v, most, rule.futile_power) if v.seeds and v.seeds < most else ""
    return replace(v, reason=f"{reason}; no more seeds after {v.seeds}: {why}" if why else reason)


def seeds_for_next_look(comparisons: Sequence[Comparison], decided: Sequence[Verdict],
                        looks: Sequence[int], rule: LookRule = LOOKS) -> dict[str, int]:
    """Group -> the seeds it should have by the next look: the groups of every comparison that
    is still inconclusive below the plan's maximum (an undetermined gate keeps a comparison
    inconclusive unless its difference is decided), unless more seeds could not decide it
    (`futility`)."""
    wanted: dict[str, int] = {}
    for c, v in zip(comparisons, decided):
        following = next((n for n in looks if n > c.seeds_run), None)
        if v.outcome.final or following is None or futility(c, v, looks[-1], rule.futile_power):
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
