"""Seeds a study needs, planned by simulating the verdict rule itself (`workbench plan`).

workbench.recipes.train.plan measures each comparison's per-seed noise on a pilot; here, with
that noise, the question is how many seeds per group each `expect:` entry needs to reach its
outcome with 80% power. The answer is not a formula of today's rule: `simulate` draws synthetic
normal per-seed values for every comparison of the study (Holm's family, all m of them) and
decides them with the real decision functions, workbench.stats.family.decide for a fixed list of
seeds and workbench.stats.sequential.looked over the looks of adaptive seeds (`LOOKS.looks`), on
all replications at once, so the plan follows the rule when the rule changes.

What is drawn. Per comparison and seed, both groups' values are normal with the pilot's group
SD, and their difference has the pilot's SD of the paired per-seed differences (together they
set how a seed's two values correlate; the shared data stream of a seed makes that positive)
and a mean `shift` in the expected direction: the stated effect (Goal.HOLDS), 0 (Goal.EQUIVALENT:
Outcome.EQUIVALENT reached when the truth is no difference), or the searched smallest detectable one
(Goal.DETECT). Comparisons planned for nothing are drawn at a difference of 0 and stay in the
family. No gates: a plan assumes the groups learn (the gates qualify a decision, they never make
one); no bounds: the values are centred at 0, so a bounded metric near its bound is planned as
if unbounded.

Monte Carlo. `replications` studies per candidate, one generator per replication (seeded by its
number), whose draws for n seeds begin with those for fewer (common random numbers): power is
then close to monotone in the seeds and exactly monotone in the shift, so a search finds one
crossing. The standard error of a power near 80% is sqrt(0.16 / replications), 0.02 at 400.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from workbench.stats.family import MIN_SEEDS, Family, code, decide
from workbench.stats.intervals import ALPHA, UNBOUNDED
from workbench.stats.outcomes import Outcome
from workbench.stats.power import MAX_PLANNED_SEEDS, POWER
from workbench.stats.rule import Comparison
from workbench.stats.sequential import LOOKS, looked

REPLICATIONS = 400
PLAN_STREAM = 44  # the generators' first key: the plan's draws, apart from any other seeded stream
MAX_SHIFT_SD = 2.0**14  # a detectable effect past this many noise SDs is reported as none


class Goal(StrEnum):
    """What a comparison is planned to reach, with the outcome that counts as reaching it."""

    HOLDS = "effect"  # a stated effect: Outcome.HOLDS with POWER
    EQUIVALENT = "margin"  # its margin: Outcome.EQUIVALENT with POWER when the true difference is 0
    DETECT = "detect"  # neither: the smallest effect that reads Outcome.HOLDS with POWER at the study's seeds

    @property
    def outcome(self) -> Outcome:
        return Outcome.EQUIVALENT if self is Goal.EQUIVALENT else Outcome.HOLDS


@dataclass(frozen=True)
class Planned:
    """One comparison of the study's family as the simulation draws it."""

    comparison: Comparison  # its groups, metric direction and margin (its values are not read)
    sd: float = 1.0  # SD of the paired per-seed differences
    group_sd: float = 1.0  # SD of one group's seeds
    shift: float = 0.0  # true difference of the means in the expected direction (metric units)
    goal: Goal | None = None  # None: in the family only, at a true difference of 0


@dataclass(frozen=True)
class Simulated:
    """The family decided `replications` times at one seed count."""

    seeds: int  # per group: the fixed count, or adaptive seeds' max
    power: tuple[float, ...]  # per comparison: share of replications that reached its goal (NaN: no goal)
    spent: tuple[float, ...]  # per comparison: mean seeds per group at the look that ended it (or the last)
    group_seeds: dict[str, float]  # per group: mean seeds it ran (what the longest of its comparisons asked)


def drawn(planned: Sequence[Planned], seeds: int, replications: int) -> Family:
    """The family with synthetic per-seed values, `replications` studies of `seeds` seeds per group:
    replication r draws from its own generator, so its first n seeds are the same for any `seeds`."""
    m = len(planned)
    z = np.stack([np.random.default_rng([PLAN_STREAM, r]).standard_normal((seeds, 2, m))
                  for r in range(replications)])  # [R, seeds, 2, m]
    better, than = np.full((replications, m, seeds), np.nan), np.full((replications, m, seeds), np.nan)
    for k, p in enumerate(planned):
        if p.comparison.seeds_run == 0:  # no pair of groups to compare (a point the study does not run): no values
            continue
        than[:, k] = p.group_sd * z[:, :, 0, k]
        # the difference's noise, correlated with `than` so that `better` has the group SD as well
        rho = float(np.clip(-p.sd / (2 * p.group_sd), -1.0, 1.0)) if p.group_sd > 0 else 0.0
        noise = p.sd * (rho * z[:, :, 0, k] + math.sqrt(1 - rho**2) * z[:, :, 1, k])
        better[:, k] = than[:, k] + (p.shift if p.comparison.higher else -p.shift) + noise
    no_gate = np.zeros((m, 0))
    return Family(better, than, higher=np.array([p.comparison.higher for p in planned], bool),
                  bounds=np.tile(np.array(UNBOUNDED), (m, 1)),
                  margin=np.array([p.comparison.margin or np.nan for p in planned], float),
                  pairable=np.ones(m, bool), counts=np.zeros(m, bool), ended=np.zeros(m, int),
                  gate_scores=np.zeros((replications, m, 0, seeds)), gate_needed=no_gate, gate_higher=no_gate.astype(bool),
                  gate_group=no_gate.astype(int), gate_bounds=np.zeros((m, 0, 2)))


def simulate(planned: Sequence[Planned], seeds: int, first: int | None = None, groups: Sequence[str] = (),
             replications: int = REPLICATIONS) -> Simulated:
    """Decide the family `replications` times on `seeds` seeds per group (adaptive seeds from
    `first` to `seeds` when `first` is given), all at once through the rule's own functions
    (workbench.stats.family.decide; workbench.stats.sequential.looked, a comparison ending where
    futility stops its groups). `groups`: every group of the study, so that those in no comparison
    count with the seeds they run (`first`, or all of them)."""
    m = len(planned)
    family = drawn(planned, seeds, replications)
    if first is None:
        outcome, spent = decide(family, ALPHA).outcome, np.full((replications, m), float(seeds))
    else:
        state = looked(family, LOOKS.looks(first, seeds), np.full((replications, m), seeds), LOOKS, stop_futile=True)
        outcome, spent = state.outcome, state.seeds.astype(float)
    reached = np.stack([outcome[:, k] == code(p.goal.outcome) if p.goal is not None else np.zeros(replications, bool)
                        for k, p in enumerate(planned)], axis=1) if m else np.zeros((replications, 0), bool)
    power = tuple(float(reached[:, k].mean()) if p.goal is not None else math.nan for k, p in enumerate(planned))
    group_seeds = {}
    for group in groups:
        mine = [k for k, p in enumerate(planned) if group in (p.comparison.better, p.comparison.than)]
        group_seeds[group] = float(spent[:, mine].max(axis=1).mean()) if mine else float(first or seeds)
    return Simulated(seeds, power, tuple(spent.mean(axis=0)), group_seeds)


class SeedSearch:
    """Searches over the seeds (or adaptive seeds' max, keeping `first`) of one family, with the
    simulations kept: the smallest seeds for each goal, what a given seed count detects."""

    def __init__(self, planned: Sequence[Planned], first: int | None = None, groups: Sequence[str] = (),
                 replications: int = REPLICATIONS):
        self.planned, self.first, self.groups, self.replications = list(planned), first, list(groups), replications
        self._runs: dict[int, Simulated] = {}

    @property
    def lowest(self) -> int:
        """The fewest seeds a plan can have: MIN_SEEDS (no verdict is decided on fewer), or first + 1
        (a max exceeds first)."""
        return MIN_SEEDS if self.first is None else self.first + 1

    def at(self, seeds: int) -> Simulated:
        if seeds not in self._runs:
            self._runs[seeds] = simulate(self.planned, seeds, self.first, self.groups, self.replications)
        return self._runs[seeds]

    def smallest(self) -> dict[int, int | None]:
        """Per comparison with a goal (HOLDS or EQUIVALENT): the smallest seeds whose power reaches
        POWER, to within an eighth (doubling, then bisection); None past MAX_PLANNED_SEEDS."""
        goals = [k for k, p in enumerate(self.planned) if p.goal in (Goal.HOLDS, Goal.EQUIVALENT)]
        failing = dict.fromkeys(goals, self.lowest - 1)  # the most seeds known to fall short
        passing: dict[int, int | None] = dict.fromkeys(goals)
        seeds = self.lowest
        while goals:
            for k in goals:
                if passing[k] is None:
                    if self.at(seeds).power[k] >= POWER:
                        passing[k] = seeds
                    else:
                        failing[k] = seeds
            if all(passing[k] is not None for k in goals) or seeds >= MAX_PLANNED_SEEDS:
                break
            seeds = min(MAX_PLANNED_SEEDS, 2 * seeds)
        for k in goals:
            while passing[k] is not None and passing[k] - failing[k] > max(1, failing[k] // 8):
                middle = (failing[k] + passing[k]) // 2
                if self.at(middle).power[k] >= POWER:
                    passing[k] = middle
                else:
                    failing[k] = middle
        return passing

    def detectable(self, seeds: int) -> tuple[float | None, Simulated]:
        """The smallest shift, in noise SDs, at which the DETECT comparisons hold with POWER at
        `seeds` (with the other comparisons at their planned shifts), to 2%; None past
        MAX_SHIFT_SD. They are drawn alike, so their mean power is each one's, with less Monte
        Carlo error. Also the simulation at that shift (its seeds spent)."""
        detect = [k for k, p in enumerate(self.planned) if p.goal is Goal.DETECT]

        def at(shift_sd: float) -> Simulated:
            planned = [replace(p, shift=shift_sd * p.sd) if p.goal is Goal.DETECT else p for p in self.planned]
            return simulate(planned, seeds, self.first, self.groups, self.replications)

        def reached(s: Simulated) -> bool:
            return float(np.mean([s.power[k] for k in detect])) >= POWER

        low, high = 0.0, 1.0
        found = at(high)
        while not reached(found):
            low, high = high, 2 * high
            if high > MAX_SHIFT_SD:
                return None, found
            found = at(high)
        while high - low > 0.02 * high:
            middle = (low + high) / 2
            trial = at(middle)
            if reached(trial):
                high, found = middle, trial
            else:
                low = middle
        return high, found
