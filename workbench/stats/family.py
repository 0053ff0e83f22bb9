"""The verdict rule on arrays: a study's comparisons (its Holm family), over a batch of studies.

A report decides one study (a batch of 1, workbench.stats.rule.verdicts builds its arrays from
the comparisons and words the outcome); the null simulation of tests/stats/test_null.py and
`workbench plan` (workbench.stats.planning) decide a hundred thousand at once, through these same
functions, so that what is measured is the rule the reports apply.

    Family        per comparison: both groups' per-seed values, their gates' scores, the metric's
                  direction, range and margin (arrays [B, m, seeds], seeds in run order)
    decide        one look at one alpha: each comparison's test, Holm's step-down with Shaffer's
                  count over every hypothesis, the outcome, and what the gates say
    step_down     Holm (1979) with Shaffer (1986): the level each hypothesis is read at

Seeds that learn or not. Below MIN_SEEDS seeds per group nothing is decided (`Status.TOO_FEW`):
at 3 seeds a paired t has 2 degrees of freedom, and three seeds that each fall the same way
between two modes (a seed learned in one arm and not in the other) give it an arbitrarily large
t. Under a null whose seeds learn with chance 1/2 in each arm that happens 2 (1/4)^3 = 3.1% of the
time, well past the 1.15% a first look spends; no test at 3 seeds tells it from an effect every
seed shows (an exact sign-flip test's smallest p there is 1/4). From 4 seeds on the t test keeps
every shape the null simulation draws within the bound (docs/verdicts.md has the figures).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import IntEnum

import numpy as np
from scipy import stats as st

from workbench.stats.gate import LEARNED_CODE, NOT_LEARNED_CODE, UNDETERMINED_CODE, gate_states
from workbench.stats.intervals import Differences, differences, equivalence_p
from workbench.stats.outcomes import Outcome

MIN_SEEDS = 4  # seeds per group a verdict is decided on, at least (failure shares: Fisher's exact test, any)
OUTCOMES = list(Outcome)  # outcome codes index this list


def code(outcome: Outcome) -> int:
    return OUTCOMES.index(outcome)


class Status(IntEnum):
    """Why a comparison ends before its test, or TESTED."""

    TESTED = 0
    NOT_REACHED = 1  # *_to_target: a finished run never reached the target (given with the comparison)
    EMPTY = 2  # a group has no finished run
    CEILING = 3  # both groups at the metric's best value on every seed
    IDENTICAL = 4  # both groups gave the same value on every seed
    ONE_SEED = 5  # a group has one finished seed: no interval
    CONSTANT = 6  # every seed gave the same nonzero difference: no spread, no interval
    TOO_FEW = 7  # fewer than MIN_SEEDS seeds in a group


@dataclass(frozen=True)
class Family:
    """A study's comparisons as arrays over a batch of B studies. Seeds run along the last axis in
    the order the study runs them (an adaptive look at n seeds reads the first n); NaN: no
    finished run of that seed. Gate slots without a gate have a NaN threshold."""

    better: np.ndarray  # [B, m, n] the better group's per-seed values (as the `expect:` entry names them)
    than: np.ndarray  # [B, m, n]
    higher: np.ndarray  # [m] bool: the metric's direction
    bounds: np.ndarray  # [m, 2] the metric's range
    margin: np.ndarray  # [m] NaN: no margin
    pairable: np.ndarray  # [m] bool: values over seed ids (False: plain lists, compared with Welch's)
    counts: np.ndarray  # [m] bool: values are 0/1 failures per seed (Fisher's exact test)
    ended: np.ndarray  # [m] Status decided before any value is read (NOT_REACHED), else TESTED
    gate_scores: np.ndarray  # [B, m, g, n] each gate's per-seed scores
    gate_needed: np.ndarray  # [m, g] the threshold (NaN: no gate in the slot)
    gate_higher: np.ndarray  # [m, g] bool
    gate_group: np.ndarray  # [m, g] 0: the better group's gate, 1: the than group's, -1: none
    gate_bounds: np.ndarray  # [m, g, 2]

    @property
    def seeds(self) -> int:
        return self.better.shape[-1]

    def at_look(self, n: int, available: np.ndarray | None = None, rows: np.ndarray | None = None) -> Family:
        """The first `n` seeds of each comparison (of the studies `rows`, a boolean mask, or all);
        one not `available` ([B, m] bool: its groups have not run n seeds) reads as having none, so
        that it counts in Holm's family with p = 1."""
        def cut(x: np.ndarray) -> np.ndarray:
            x = x[..., :n] if rows is None else x[rows, ..., :n]
            if available is None:
                return x
            mask = available if rows is None else available[rows]
            return np.where(mask.reshape(mask.shape + (1,) * (x.ndim - 2)), x, np.nan)
        return replace(self, better=cut(self.better), than=cut(self.than), gate_scores=cut(self.gate_scores))

    def rows(self, index) -> Family:
        """The studies `index` of the batch (e.g. a boolean mask)."""
        batched = ("better", "than", "gate_scores")
        return replace(self, **{f: getattr(self, f)[index] for f in batched})


@dataclass(frozen=True)
class Decided:
    """What one look decides, per study and comparison ([B, m] arrays)."""

    outcome: np.ndarray  # codes into OUTCOMES
    status: np.ndarray  # Status
    diffs: Differences
    p: np.ndarray  # the difference's p (Fisher's for failure shares); 1 where it ended before a test
    level: np.ndarray  # the level its "no difference" is read at; NaN: the step-down stopped before it
    equivalence_level: np.ndarray  # the same for "outside ±margin"; NaN: none, or stopped
    p_holm: np.ndarray  # adjusted p (the smallest alpha at which the procedure rejects it)
    p_equivalence_holm: np.ndarray
    decided: np.ndarray  # bool: "no difference" rejected
    group_states: np.ndarray  # [B, m, 2] codes into GATE_STATES of each group; -1: no gate
    gates: np.ndarray  # [B, m, g] each gate slot's code

    @property
    def neither(self) -> np.ndarray:
        """The data show that neither group learned: the verdict does not test its claim."""
        return (self.group_states == NOT_LEARNED_CODE).all(axis=-1)


def step_down(p: np.ndarray, owner: np.ndarray, alpha) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down (Holm 1979) with Shaffer's refinement for logically related hypotheses
    (Shaffer 1986, "Modified sequentially rejective multiple test procedures", JASA 81: 826-831),
    on p [B, H] of the hypotheses whose comparisons are `owner` [H]. Taken in order of p, the r-th
    is read at alpha / t_r, and only while every one before it was rejected; t_r is the most of
    the remaining hypotheses that can be true at once. A comparison's "no difference" and "outside
    ±margin" cannot both be true (margin > 0), so t_r counts the comparisons that still hold an
    unrejected hypothesis: Holm's M when no entry has a margin. Returns each hypothesis' level
    (NaN where the step-down stopped before it) and adjusted p."""
    batch, h = p.shape
    order = np.argsort(p, axis=1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(h)[None, :].repeat(batch, axis=0), axis=1)
    owners = np.unique(owner)
    last = np.stack([np.where(owner[None, :] == k, rank, -1).max(axis=1) for k in owners], axis=1)  # [B, K]
    possible = (last[:, None, :] >= np.arange(h)[None, :, None]).sum(axis=2)  # [B, H] by rank
    levels = alpha / possible
    rejected = ranked <= levels
    reached = np.concatenate([np.ones((batch, 1), bool), np.cumprod(rejected, axis=1)[:, :-1].astype(bool)], axis=1)
    adjusted = np.maximum.accumulate(np.minimum(1.0, possible * ranked), axis=1)
    level, holm = np.where(reached, levels, np.nan), adjusted
    return np.take_along_axis(level, rank, axis=1), np.take_along_axis(holm, rank, axis=1)


def at_best(x: np.ndarray, best) -> np.ndarray:
    """Each row has a finished seed, and every finished seed scored `best` (the metric's best value)."""
    return ((x == best) | ~np.isfinite(x)).all(axis=-1) & np.isfinite(x).any(axis=-1)


def statuses(f: Family, d: Differences, min_seeds: int = MIN_SEEDS) -> np.ndarray:
    """Why each comparison ends before its test (Status), in the order the rule reads them."""
    best = np.where(f.higher, f.bounds[:, 1], f.bounds[:, 0])[None, :, None]
    perfect = np.isfinite(best[..., 0]) & ~f.counts[None, :] & at_best(f.better, best) & at_best(f.than, best)
    status = np.full(d.mean.shape, Status.TESTED, dtype=int)
    counted = f.counts[None, :]
    for hit, why in ((d.n_better == 0, Status.EMPTY), (d.n_than == 0, Status.EMPTY),
                     (perfect, Status.CEILING),
                     (d.constant & (d.mean == 0) & ~counted, Status.IDENTICAL),
                     (((d.n_better == 1) | (d.n_than == 1)) & ~counted, Status.ONE_SEED),
                     (d.constant & ~counted, Status.CONSTANT),
                     ((np.minimum(d.n_better, d.n_than) < min_seeds) & ~counted, Status.TOO_FEW)):
        status = np.where((status == Status.TESTED) & hit, why, status)
    return np.where(f.ended[None, :] != Status.TESTED, f.ended[None, :], status)


def fisher_p(f: Family) -> np.ndarray:
    """Fisher's exact p of each failure-share comparison ([B, m], NaN elsewhere)."""
    out = np.full(f.better.shape[:2], np.nan)
    for b, k in zip(*np.nonzero(np.broadcast_to(f.counts[None, :], out.shape))):
        x, y = f.better[b, k][np.isfinite(f.better[b, k])], f.than[b, k][np.isfinite(f.than[b, k])]
        if len(x) and len(y):
            out[b, k] = st.fisher_exact([[x.sum(), len(x) - x.sum()], [y.sum(), len(y) - y.sum()]]).pvalue
    return out


def gate_codes(f: Family, alpha) -> tuple[np.ndarray, np.ndarray]:
    """Each gate slot's state at 1 - alpha ([B, m, g]) and each group's ([B, m, 2]: did not learn
    when any of its gates did not, learned when all did, else undetermined; -1 without a gate)."""
    levels = np.broadcast_to(np.asarray(1 - alpha, dtype=float), f.gate_scores.shape[:-1])
    codes = np.stack([gate_states(f.gate_scores[..., j, :], f.gate_needed[:, j], f.gate_higher[:, j],
                                  levels[..., j], (f.gate_bounds[:, j, 0], f.gate_bounds[:, j, 1]))
                      for j in range(f.gate_needed.shape[1])], axis=-1) if f.gate_needed.shape[1] else \
        np.zeros(f.gate_scores.shape[:-1], dtype=int)
    groups = []
    for g in (0, 1):
        mine = (f.gate_group == g)[None, :, :]
        any_gate = mine.any(axis=-1)
        not_learned = (mine & (codes == NOT_LEARNED_CODE)).any(axis=-1)
        all_learned = (~mine | (codes == LEARNED_CODE)).all(axis=-1)
        state = np.where(not_learned, NOT_LEARNED_CODE, np.where(all_learned, LEARNED_CODE, UNDETERMINED_CODE))
        groups.append(np.where(any_gate, state, -1))
    return codes, np.stack(groups, axis=-1)


def bound_within_margin(f: Family, d: Differences, which: int) -> np.ndarray:
    """[B, m]: both groups' means lie within the margin of the metric's best (which = 1) or worst
    (0) value, so the range alone keeps their difference inside the margin."""
    side = np.where(f.higher, which, 1 - which)
    bound = np.take_along_axis(f.bounds, side[:, None], axis=1)[:, 0][None, :]
    with np.errstate(invalid="ignore"):
        near = [np.abs(mean - bound) <= f.margin[None, :] for mean in (d.mean_better, d.mean_than)]
        return np.isfinite(bound) & near[0] & near[1]


def decide(f: Family, alpha, min_seeds: int = MIN_SEEDS, reading=None) -> Decided:
    """The rule at one look, at family level `alpha`: every comparison's difference tested (paired
    or Welch's t, Fisher's exact test for failure shares), Holm's step-down over each one's "no
    difference" and, with a margin, "outside ±margin" (a comparison that ends before its test
    counts with p = 1), and the outcome; gates read at 1 - `reading` (default: alpha; a look that
    decides nothing, alpha 0, reads them at what the spending function has reached). `min_seeds`:
    the fewest seeds per group a difference is tested on (MIN_SEEDS; 2 reproduces the rules before
    2026-12-06)."""
    d = differences(f.better, f.than, f.pairable[None, :])
    status = statuses(f, d, min_seeds)
    tested = status == Status.TESTED
    shares = fisher_p(f)
    p = np.where(tested, np.where(f.counts[None, :], shares, d.p), 1.0)
    p = np.where(np.isfinite(p), p, 1.0)
    margins = np.nonzero(np.isfinite(f.margin) & ~f.counts)[0]
    p_eq = np.ones_like(p)
    p_eq[:, margins] = equivalence_p(d.mean[:, margins], d.se[:, margins], d.df[:, margins], f.margin[margins][None, :])
    p_eq = np.where(tested & np.isfinite(p_eq), p_eq, 1.0)
    m = f.better.shape[1]
    owner = np.concatenate([np.arange(m), margins])
    level, holm = step_down(np.concatenate([p, p_eq[:, margins]], axis=1), owner, alpha)
    eq_level, eq_holm = np.full_like(p, np.nan), np.full_like(p, np.nan)
    eq_level[:, margins], eq_holm[:, margins] = level[:, m:], holm[:, m:]
    level, holm = level[:, :m], holm[:, :m]
    with np.errstate(invalid="ignore"):
        decided = tested & (level > 0) & (p <= level)
        equivalent = tested & (eq_level > 0) & (p_eq <= eq_level)
    direction = np.where((d.mean > 0) == f.higher[None, :], code(Outcome.HOLDS), code(Outcome.DOES_NOT_HOLD))
    outcome = np.where(decided, direction, code(Outcome.INCONCLUSIVE))
    if equivalent.any():
        at_bound = np.where(bound_within_margin(f, d, 1), code(Outcome.CEILING),
                            np.where(bound_within_margin(f, d, 0), code(Outcome.FLOOR), code(Outcome.EQUIVALENT)))
        outcome = np.where(equivalent, at_bound, outcome)
    ended = {Status.NOT_REACHED: Outcome.NOT_REACHED, Status.CEILING: Outcome.CEILING,
             Status.IDENTICAL: Outcome.IDENTICAL}
    for why, result in ended.items():
        outcome = np.where(status == why, code(result), outcome)
    gates, groups = gate_codes(f, alpha if reading is None else reading)
    return Decided(outcome, status, d, p, level, eq_level, holm, eq_holm, decided, groups, gates)
