"""Adaptive seeds (`seeds: {first, max}`): repeated looks with alpha spending.

Looks are at `first` seeds per group, then about 1.5 times as many each round, ending at `max`
(`LOOKS`: 3, 4, 6, 9, 14, 20). Each look applies the verdict rule (workbench.stats.family.decide)
at the alpha a Pocock-type spending function (Lan & DeMets 1983) adds there, gates and group
intervals included; a look with fewer than MIN_SEEDS seeds decides nothing and spends nothing, so
the first look that can decide spends all the function has reached by then. A comparison keeps
the first look that ends it (`Outcome.final`). The looks' alphas sum to the study's alpha, so by
the union bound the chance of any false decision over all looks is at most that alpha for normal
outcomes; tests/stats/test_null.py measures it where seeds learn or not. The rules before are
kept (`BEFORE_MIN_SEEDS`, `EARLIER_LOOKS`) so that they can be compared on the same per-seed values.

The runner's add-seeds loop and the report call the same functions, on the comparisons' arrays:
`looked` says which look each comparison's verdict stands at and whether more seeds could decide
it (futility), `next_seeds` which groups get more seeds, `grow_seeds` is the loop itself (the
runner passes a function that trains the runs; `grown_batch` is the same loop over a batch of
simulated studies), and `sequential_verdicts` is what the report prints.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as st

from workbench.stats.family import MIN_SEEDS, Decided, Family, code, decide
from workbench.stats.gate import LEARNED_CODE, NOT_LEARNED_CODE
from workbench.stats.intervals import ALPHA, PAIRED
from workbench.stats.numbers import fmt, fmt_signed
from workbench.stats.outcomes import Outcome
from workbench.stats.power import equivalence_power, noncentrality_at, power
from workbench.stats.rule import (CONTAINS_ZERO, FUTILE_FROM, FUTILE_POWER, Comparison, Verdict, family_of, plan_text,
                                  seed_axis, verdicts)


def obrien_fleming(fraction: float, alpha: float = ALPHA) -> float:
    """Alpha spent by information fraction t, O'Brien-Fleming-type (Lan & DeMets 1983):
    2 - 2 Phi(z_{1 - alpha/2} / sqrt(t)). Spends almost nothing early (4e-7 at t = 0.15)."""
    return 0.0 if fraction <= 0 else float(2 - 2 * st.norm.cdf(st.norm.ppf(1 - alpha / 2) / math.sqrt(fraction)))


def pocock(fraction: float, alpha: float = ALPHA) -> float:
    """Alpha spent by information fraction t, Pocock-type (Lan & DeMets 1983):
    alpha ln(1 + (e - 1) t). Spends nearly evenly over the looks (0.0115 at t = 0.15), so an
    effect every seed shows can end at the first look that decides."""
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
    """When an adaptive study looks (`schedule(first, max)`: seeds per group at each look), what each
    look spends (`spending(t, alpha)`: the alpha spent by information fraction t), from how many
    seeds per group a look decides, and below which power more seeds are not added (`futility`)."""

    name: str
    spending: Callable[[float, float], float]
    schedule: Callable[[int, int], list[int]]
    futile_power: float = 0.0  # stop adding seeds below this power; 0: never stop
    min_seeds: int = MIN_SEEDS  # a look with fewer seeds per group decides nothing

    def looks(self, first: int, most: int) -> list[int]:
        return self.schedule(first, most)

    def alphas(self, looks: Sequence[int], alpha: float = ALPHA) -> list[float]:
        """The alpha each look tests at: what the spending function adds since the previous look
        that could decide (0 at a look with fewer than `min_seeds` seeds). They sum to alpha, so by
        the union bound the chance of any false decision over all looks stays at most alpha (for
        outcomes the t test is exact for), whatever the correlation between looks."""
        return list(_look_alphas(self.spending, tuple(looks), alpha, self.min_seeds))

    def reading_alphas(self, looks: Sequence[int], alpha: float = ALPHA) -> list[float]:
        """The alpha each look reads the gates and the group intervals at: its own, or at a look
        that decides nothing, what the spending function has reached there."""
        return [a if n >= self.min_seeds else self.spending(n / looks[-1], alpha)
                for n, a in zip(looks, self.alphas(looks, alpha))]


@functools.lru_cache(maxsize=64)
def _look_alphas(spending, looks: tuple[int, ...], alpha: float, least: int) -> tuple[float, ...]:
    out, spent = [], 0.0
    for n in looks:
        if n < least:
            out.append(0.0)
            continue
        reached = spending(n / looks[-1], alpha)
        out.append(reached - spent)
        spent = reached
    return tuple(out)


# The rule every adaptive study runs under (issue 44, 2026-12-02: Pocock-type, looks by half;
# futility since 2026-12-04; no decision under 4 seeds since 2026-12-06, issue 62), and the rules
# before it, kept so that `python -m benchmarks --only decide` and the simulations can show them on
# the same per-seed values. `WITHOUT_FUTILITY` is today's rule growing every inconclusive
# comparison to `max`.
LOOKS = LookRule("Pocock-type alpha spending from 4 seeds per group, looks growing by half, futility", pocock,
                 growing_by_half, futile_power=FUTILE_POWER)
WITHOUT_FUTILITY = LookRule("Pocock-type alpha spending from 4 seeds per group, looks growing by half (every "
                            "inconclusive comparison to max)", pocock, growing_by_half)
BEFORE_MIN_SEEDS = LookRule("Pocock-type alpha spending from the first look, looks growing by half, futility (the "
                            "rule of 2026-12-04)", pocock, growing_by_half, futile_power=FUTILE_POWER, min_seeds=2)
EARLIER_LOOKS = LookRule("O'Brien-Fleming-type alpha spending, looks doubling (the rule of 2026-12-01)",
                         obrien_fleming, doubling, min_seeds=2)


# ---- the looks, on arrays ---------------------------------------------------------------------------


def futile_chance(mean, se, n, paired, alpha, most, margin) -> np.ndarray:
    """The power at `most` seeds, at the level `alpha` a verdict was read at, to find the observed
    difference `mean`, and with a margin (NaN: none) its equivalence, were the observed difference
    and spread (standard error `se` at n seeds) the true ones: conditional power at the current
    estimate (stochastic curtailment, Lan, Simon & Halperin 1982). Arrays of one shape."""
    sd = spread(se, n, paired)
    chance = np.asarray(power(np.abs(mean), sd, most, alpha, paired), dtype=float)
    with_margin = np.isfinite(margin) & np.isfinite(sd)
    if with_margin.any():
        chance = chance.copy()
        chance[with_margin] = np.fmax(chance[with_margin], equivalence_power(
            mean[with_margin], sd[with_margin], most, alpha[with_margin], paired[with_margin], margin[with_margin]))
    return chance


def spread(se, n, paired) -> np.ndarray:
    """The per-seed spread behind a standard error at n seeds: of the differences (paired), of each group (Welch)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(paired, se * np.sqrt(n), se * np.sqrt(n / 2))


def below_power(least: float, mean, se, n, paired, alpha, most, margin) -> np.ndarray:
    """futile_chance(...) < least, for a batch: the difference's power compared through the
    noncentrality at which it reaches `least` (one root per distinct degrees of freedom and level),
    the equivalence's computed."""
    sd = spread(se, n, paired)
    df = np.where(paired, most - 1, 2 * most - 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        nc = np.abs(mean) / np.where(paired, sd / np.sqrt(most), sd * np.sqrt(2 / most))
        low = (nc < noncentrality_at(least, df, alpha)) & (sd > 0)
    with_margin = np.isfinite(margin) & low
    if with_margin.any():
        low = low.copy()
        low[with_margin] = equivalence_power(mean[with_margin], sd[with_margin], most, alpha[with_margin],
                                             paired[with_margin], margin[with_margin]) < least
    return low


@dataclass(frozen=True)
class Looked:
    """Per study and comparison ([B, m]): the look whose verdict stands (the first that ended it,
    else the last its groups reached), that verdict's outcome and gates, and whether more seeds up
    to `max` could not decide it (futility, with the power that says so)."""

    look: np.ndarray  # index into the looks
    seeds: np.ndarray  # seeds per group at that look
    outcome: np.ndarray  # codes into workbench.stats.family.OUTCOMES
    neither: np.ndarray  # the data show that neither group learned
    only: np.ndarray  # a decided difference whose winner learned and whose other group did not
    paired: np.ndarray  # the difference was paired (else Welch's or Fisher's)
    futile: np.ndarray
    shown: np.ndarray  # the level the difference is shown (and futility's power read) at

    def rows(self, index) -> Looked:
        return Looked(**{name: value[index] for name, value in vars(self).items()})


def looked(f: Family, looks: Sequence[int], seeds_run: np.ndarray, rule: LookRule = LOOKS,
           stop_futile: bool = False, since: tuple[Looked, int] | None = None) -> Looked:
    """Each look in turn at its alpha, on the comparisons whose groups ran its seeds (the others
    count in Holm's family with p = 1); a comparison keeps the first look that ends it, else its
    last. `seeds_run` [B, m]: the seeds both groups of each comparison ran. `stop_futile`: a futile
    look ends the comparison, as when its groups get no more seeds (`workbench plan` simulates
    comparisons whose groups no other comparison grows). `since` (state, j): the same studies'
    state after every look before look j, which the seeds added since cannot change: go on from j."""
    shape = f.better.shape[:2]
    if since is None:
        state, start = Looked(*(np.zeros(shape, dtype) for dtype in (int, int, int, bool, bool, bool, bool, float))), 0
    else:
        state, start = Looked(**{name: value.copy() for name, value in vars(since[0]).items()}), since[1]
    kept = (state.outcome != code(Outcome.INCONCLUSIVE)) | (stop_futile & state.futile) if start else np.zeros(shape, bool)
    m = shape[1]
    for j, (n, alpha, reading) in list(enumerate(zip(looks, rule.alphas(looks), rule.reading_alphas(looks))))[start:]:
        available = (seeds_run >= n) | (j == 0)
        update = available & ~kept
        if j > 0 and not update.any():
            break
        rows = update.any(axis=1)  # the studies this look can change: the others keep what they have
        d = decide(f.at_look(n, available, rows), alpha, rule.min_seeds, reading)
        inconclusive = d.outcome == code(Outcome.INCONCLUSIVE)
        asked = update[rows] & inconclusive & d.diffs.tested & (rule.futile_power > 0) & (n >= FUTILE_FROM)
        low = np.zeros(asked.shape, bool)
        shown = shown_level(d, reading, m)
        if asked.any():  # only where futility reads it: the power is the costly part of a look
            margin = np.broadcast_to(f.margin[None, :], asked.shape)
            low[asked] = below_power(rule.futile_power, d.diffs.mean[asked], d.diffs.se[asked], d.diffs.n[asked],
                                     d.diffs.paired[asked], shown[asked], looks[-1], margin[asked])
        futile = inconclusive & (rule.futile_power > 0) & (n >= FUTILE_FROM) & (d.neither | low)
        new = {"look": j, "seeds": n, "outcome": d.outcome, "neither": d.neither, "only": only_learned(d),
               "paired": d.diffs.paired, "futile": futile, "shown": shown}
        for name, value in new.items():
            field = getattr(state, name)
            field[rows] = np.where(update[rows], value, field[rows])
        final = np.zeros(shape, bool)
        final[rows] = ~inconclusive | (stop_futile & futile)
        kept |= update & final
    return state


def shown_level(d: Decided, reading: float, m: int) -> np.ndarray:
    """The alpha each difference is read at: its step-down level, or where the step-down stopped
    before it (or the look decides nothing), the first hypothesis' level at the look's reading alpha."""
    return np.where(np.isfinite(d.level) & (d.level > 0), d.level, reading / max(m, 1))


def only_learned(d: Decided) -> np.ndarray:
    """A decided difference whose winner learned and whose other group did not (the gate codes)."""
    holds = d.outcome == code(Outcome.HOLDS)
    winner = np.where(holds, d.group_states[..., 0], d.group_states[..., 1])
    loser = np.where(holds, d.group_states[..., 1], d.group_states[..., 0])
    decided = holds | (d.outcome == code(Outcome.DOES_NOT_HOLD))
    return decided & ~d.neither & (winner == LEARNED_CODE) & (loser == NOT_LEARNED_CODE)


def next_seeds(state: Looked, seeds_run: np.ndarray, groups: np.ndarray, n_groups: int,
               looks: Sequence[int]) -> np.ndarray:
    """[B, G]: the seeds each group should have by the next look (0: none wanted): the groups of
    every comparison still inconclusive below the plan's maximum (an undetermined gate keeps a
    comparison inconclusive unless its difference is decided), unless more seeds could not decide
    it (futility). `groups` [m, 2]: each comparison's better and than group."""
    ahead = np.array(looks)[None, None, :] > seeds_run[..., None]
    following = np.where(ahead.any(axis=-1), np.array(looks)[np.argmax(ahead, axis=-1)], 0)
    open_ = (state.outcome == code(Outcome.INCONCLUSIVE)) & ~state.futile & (following > 0)
    wanted = np.zeros((seeds_run.shape[0], n_groups), int)
    for k, (a, b) in enumerate(groups):
        ask = np.where(open_[:, k], following[:, k], 0)
        for g in (a, b):
            wanted[:, g] = np.maximum(wanted[:, g], ask)
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


def grown_batch(f: Family, groups: np.ndarray, n_groups: int, looks: Sequence[int],
                rule: LookRule = LOOKS) -> tuple[Looked, np.ndarray]:
    """`grow_seeds` over a batch of studies whose every run is drawn in advance (`f` holds `max`
    seeds of each comparison): each round asks `next_seeds` of the looks so far and reveals the
    seeds it wants, until no group of any study wants more. Returns the verdicts' looks and each
    group's seeds ([B, G])."""
    seeds = np.full((f.better.shape[0], n_groups), looks[0])
    run = np.minimum(seeds[:, groups[:, 0]], seeds[:, groups[:, 1]])
    state = looked(f, looks, run, rule)
    while True:
        wanted = next_seeds(state, run, groups, n_groups, looks)
        changed = (wanted > seeds).any(axis=1)  # only these studies' verdicts can change: look again at them
        if not changed.any():
            return state, seeds
        seeds = np.maximum(seeds, wanted)
        grown = np.minimum(seeds[:, groups[:, 0]], seeds[:, groups[:, 1]])
        # where every comparison that grew had run the most seeds of its study, no look already read sees
        # other data: go on from the first look past them; elsewhere read every look again
        most = run.max(axis=1, keepdims=True)
        resume = changed & ((grown == run) | (run == most)).all(axis=1)
        start = np.searchsorted(np.array(looks), most[:, 0], side="right")
        for rows, since in ((changed & ~resume, None),
                            *(((resume & (start == j)), j) for j in np.unique(start[resume]))):
            if rows.any():
                again = looked(f.rows(rows), looks, grown[rows], rule,
                               since=None if since is None else (state.rows(rows), int(since)))
                for name, value in vars(again).items():
                    getattr(state, name)[rows] = value
        run = grown


# ---- the looks, in words -----------------------------------------------------------------------------


def comparison_state(comparisons: Sequence[Comparison], looks: Sequence[int], rule: LookRule,
                     seeds: Sequence | None = None, stop_futile: bool = False) -> Looked:
    """`looked` for a study's comparisons (a batch of one)."""
    f = family_of(comparisons, seeds)
    return looked(f, looks, np.array([[c.seeds_run for c in comparisons]]), rule, stop_futile)


def sequential_verdicts(comparisons: Sequence[Comparison], looks: Sequence[int], plan: bool = True,
                        rule: LookRule = LOOKS, stop_futile: bool = False,
                        seeds: Sequence | None = None) -> list[Verdict]:
    """Verdicts of an adaptive study: each comparison's verdict at the look `looked` keeps for it,
    worded at that look's alpha (RULE on the look's first n seeds, the whole family in Holm's
    step-down). `plan`: an inconclusive verdict states what its seeds would need, and why its
    groups stopped short of the maximum when futility stopped them (the runner does not ask).
    `seeds`: the study's seed ids in run order (default: those the comparisons hold)."""
    if not comparisons:
        return []
    ids = seed_axis(comparisons, seeds)
    state = comparison_state(comparisons, looks, rule, ids, stop_futile)
    alphas, reading = rule.alphas(looks), rule.reading_alphas(looks)
    worded: dict[int, list[Verdict]] = {}
    out = []
    for k, c in enumerate(comparisons):
        j = int(state.look[0, k])
        if j not in worded:
            n = looks[j]
            at_look = [x.at_seeds(ids[:n]) if j == 0 or x.seeds_run >= n else x.at_seeds([]) for x in comparisons]
            worded[j] = verdicts(at_look, alphas[j], plan=False, seeds=ids[:n], min_seeds=rule.min_seeds,
                                 reading=reading[j])
        v = replace(worded[j][k], look=j + 1, looks=len(looks), seeds=looks[j])
        if v.outcome.final:
            v = replace(v, reason=f"{v.reason}; look {j + 1} of {len(looks)} ({looks[j]} seeds, alpha {fmt(alphas[j])})")
        out.append(closing(v, c.at_seeds(ids[:looks[j]]), state, k, looks[-1]) if plan else v)
    return out


def closing(v: Verdict, c: Comparison, state: Looked, k: int, most: int) -> Verdict:
    """An inconclusive verdict with what its seeds would need, and, when its groups stopped short
    of `most` seeds because more could not decide it, why."""
    reason = v.reason + plan_text(c, v.diff) if v.reason == CONTAINS_ZERO else v.reason
    if not (v.seeds and v.seeds < most and state.futile[0, k]):
        return replace(v, reason=reason)
    if state.neither[0, k]:
        why = "neither group learned, so no seed count makes it test the claim"
    else:
        what = f"the observed difference {fmt_signed(v.diff.mean)}" + (
            f" or its equivalence within ±{fmt(c.margin)}" if c.margin else "")
        d = v.diff
        chance = futile_chance(np.array(d.mean), np.array(d.se), np.array(d.n), np.array(d.method == PAIRED),
                               np.array(1 - d.level), most, np.array(c.margin or np.nan))
        why = f"{most} seeds would find {what} with {float(chance):.0%} power"
    return replace(v, reason=f"{reason}; no more seeds after {v.seeds}: {why}")


def seeds_for_next_look(comparisons: Sequence[Comparison], looks: Sequence[int], rule: LookRule = LOOKS,
                        seeds: Sequence | None = None) -> dict[str, int]:
    """Group -> the seeds it should have by the next look (`next_seeds` for a study's comparisons)."""
    if not comparisons:
        return {}
    names = list(dict.fromkeys(g for c in comparisons for g in (c.better, c.than)))
    groups = np.array([[names.index(c.better), names.index(c.than)] for c in comparisons])
    run = np.array([[c.seeds_run for c in comparisons]])
    wanted = next_seeds(comparison_state(comparisons, looks, rule, seeds), run, groups, len(names), looks)[0]
    return {name: int(n) for name, n in zip(names, wanted) if n > 0}
