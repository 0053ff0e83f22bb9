"""Verdicts for a study's `expect:` entries: `RULE` states the verdict rule in the words the
reports print under Verdicts, and `verdicts()` is that rule, step by step, on the intervals of
workbench.report.intervals and the learned-at-all gate of workbench.report.learned_gate. An
inconclusive verdict says what its seeds detect and would need (the power of the t test);
adaptive seeds decide look by look, each at the alpha an O'Brien-Fleming-type spending
function adds there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import stats as st
from scipy.optimize import brentq

from workbench.report.document import fmt
from workbench.report.intervals import (ALPHA, LEVEL, UNBOUNDED, Interval, Share, difference, finite, holm, mean_ci,
                                        share_difference)
from workbench.report.learned_gate import MARGIN, Learned

NOT_TESTED = "not tested"
NOT_REACHED = "not reached"  # a *_to_target comparison where a finished run never reached the target

RULE = (
    f"Rule: a verdict compares two groups (one sweep point each, its finished seeds). First, did each learn? At "
    f"the training length, and at the compared length when that differs, a group's mean score must beat the "
    f"strongest of the task's baselines (predictors that cannot solve it: one that ignores the input, one that "
    f"reads only the answer's own prefix, one that knows the input's symbols but not their order, as the task "
    f"declares) by at least {MARGIN:.0%} of the distance from that baseline to a perfect score. Only the expected-"
    f"better group learned: 'holds (only A learned)'; only the other: 'does not hold (only B learned)'; neither: "
    f"'{NOT_TESTED}', naming both; a tuned group none of whose candidates learned is '{NOT_TESTED}'. Cost measures "
    f"need no gate. Both groups at the metric's best value on every seed: 'ceiling: the task does not separate "
    f"them'. Otherwise the difference of the means gets a t interval, paired over seeds when both groups finished "
    f"the same seeds, Welch's otherwise (failure shares: Fisher's exact test). Holm's correction covers every "
    f"`expect:` comparison of the study, fixed before the run (one that ends before a test counts with p = 1): "
    f"taken in order of p-value, the i-th of m uses a {LEVEL:.0%} interval widened to level 1 - {ALPHA:g}/(m - i + "
    f"1), and is decided only while every comparison before it was. With a `margin:`, 'equivalent' when the "
    f"1 - 2*{ALPHA:g}/m interval lies inside ±margin (two one-sided tests). 'holds' when the interval lies "
    f"entirely on the expected side of 0, 'does not hold' when entirely on the other side, 'inconclusive' when it "
    f"contains 0 (with the smallest difference the seeds detect at 80% power, and the seeds the observed one "
    f"would need), when a group has fewer than 2 finished seeds, or when every seed gave the same difference. "
    f"Adaptive seeds: each look tests at the alpha an O'Brien-Fleming-type spending function (Lan & DeMets "
    f"1983) adds at that look, and a comparison keeps the first look that decides it. A comparison of what "
    f"runs spent to reach a stated score (flops_to_target, lower is better) reads '{NOT_REACHED}' when a "
    f"finished run of either group never reached it."
)

# Metric base names (before '@length') where smaller is better; everything else (accuracy,
# bleu, exact match, ...) is higher-is-better.
LOWER_IS_BETTER = ("loss", "perplexity", "ppl", "nll", "error", "cer", "wer", "time", "latency", "memory", "bytes")


def higher_is_better(metric: str) -> bool:
    """accuracy@128 -> True, val_loss -> False: by the metric's base name."""
    base = metric.split("@")[0].lower()
    return not any(word in base for word in LOWER_IS_BETTER)


# ---- planning seeds ---------------------------------------------------------------------------

POWER = 0.8
MAX_PLANNED_SEEDS = 1000


def power(effect: float, sd: float, n: int, alpha: float, paired: bool) -> float:
    """Power of the two-sided t test at level `alpha` to detect a true difference `effect`
    with `n` seeds per group (exact, from the noncentral t): paired over seeds with `sd` the
    spread of the per-seed differences, else two samples with `sd` each group's spread."""
    if n < 2 or sd <= 0:
        return math.nan
    df, scale = (n - 1, sd / math.sqrt(n)) if paired else (2 * n - 2, sd * math.sqrt(2 / n))
    crit = st.t.ppf(1 - alpha / 2, df)
    nc = abs(effect) / scale
    exact = float(st.nct.sf(crit, df, nc) + st.nct.cdf(-crit, df, nc))
    # scipy's noncentral t gives NaN far in the tail, where the normal approximation is exact enough
    return exact if math.isfinite(exact) else float(st.norm.sf(crit - nc) + st.norm.cdf(-crit - nc))


def detectable(sd: float, n: int, alpha: float, paired: bool) -> float:
    """The smallest true difference the test finds with POWER at `n` seeds."""
    if n < 2 or sd <= 0:
        return math.nan
    high = sd
    while power(high, sd, n, alpha, paired) < POWER:
        high *= 2
    return float(brentq(lambda e: power(e, sd, n, alpha, paired) - POWER, 0.0, high, xtol=1e-6 * sd))


def seeds_needed(effect: float, sd: float, alpha: float, paired: bool) -> int | None:
    """Seeds per group for POWER against a true difference `effect`; None past MAX_PLANNED_SEEDS."""
    if not effect or sd <= 0 or not math.isfinite(effect):
        return None
    n = 2
    while power(effect, sd, n, alpha, paired) < POWER:
        n = n + 1 if n < 64 else int(n * 1.1)
        if n > MAX_PLANNED_SEEDS:
            return None
    return n


def plan_text(c: Comparison, diff: Interval) -> str:
    """'; 3 seeds detect ±0.12 with 80% power; the observed difference 0.05 would need about 9
    seeds': what an inconclusive verdict would need, at the level it was read at."""
    a, b = (finite(v) for v in (c.better_values, c.than_values))
    paired = diff.method == "paired"
    if paired:
        sd = float(np.std(finite(pd.Series(c.better_values).sort_index().to_numpy()
                                 - pd.Series(c.than_values).sort_index().to_numpy()), ddof=1))
    else:
        sd = math.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2) if min(len(a), len(b)) >= 2 else math.nan
    alpha = 1 - diff.level
    if not math.isfinite(sd) or sd <= 0:
        return ""
    mde = detectable(sd, diff.n, alpha, paired)
    target = c.margin or abs(diff.mean)
    needed = seeds_needed(target, sd, alpha, paired)
    what = f"the margin ±{fmt(c.margin)}" if c.margin else f"the observed difference {fmt(target)}"
    more = f"about {needed} seeds" if needed is not None else f"more than {MAX_PLANNED_SEEDS} seeds"
    return f"; {diff.n} seeds detect ±{fmt(mde)} with {POWER:.0%} power; {what} would need {more}"


# ---- verdicts ---------------------------------------------------------------------------------

HOLDS, DOES_NOT_HOLD, INCONCLUSIVE, EQUIVALENT, CEILING = "holds", "does not hold", "inconclusive", "equivalent", "ceiling"
DECIDED = (HOLDS, DOES_NOT_HOLD, EQUIVALENT)  # what a test (rather than a gate) can conclude
CEILING_LABEL = "ceiling: the task does not separate them"


@dataclass(frozen=True)
class Comparison:
    """One `expect:` pair to decide: per-seed values of both groups (index: seed)."""

    metric: str
    better: str
    than: str
    better_values: pd.Series | Sequence[float]  # a Series over seeds pairs with one over the same seeds
    than_values: pd.Series | Sequence[float]
    higher: bool
    bounds: tuple[float, float] = UNBOUNDED
    gates: tuple[Learned, ...] = ()  # both groups at the training length (and the compared one); () = no gate
    note: str = ""
    margin: float | None = None  # the smallest difference of interest: within ±margin is "equivalent"
    counts: bool = False  # values are 0/1 per seed (1: the seed failed): compare the shares of failed seeds
    seeds_run: int = 0  # seeds both groups ran (any outcome): the looks an adaptive study has data for
    unreached: tuple[str, ...] = ()  # *_to_target: per group with finished runs short of the target, in words

    @property
    def shares(self) -> tuple[Share, Share] | None:
        if not self.counts:
            return None
        return tuple(Share(int(finite(v).sum()), len(finite(v))) for v in (self.better_values, self.than_values))

    def learned(self, group: str) -> bool:
        return all(g.learned for g in self.gates if g.group == group)

    def truncated(self, seeds: int) -> Comparison:
        """The comparison on the first `seeds` seeds (by id) of each group: an earlier look."""
        def first(values):
            if not isinstance(values, pd.Series):
                return values
            return values[values.index.isin(sorted(set(values.index))[:seeds])] if len(values) else values
        return replace(self, better_values=first(self.better_values), than_values=first(self.than_values))


@dataclass(frozen=True)
class Verdict:
    """The outcome of one `expect:` entry."""

    metric: str
    better: str
    than: str
    outcome: str  # holds | does not hold | equivalent | ceiling | inconclusive | not tested | not reached
    reason: str  # why, in words: shown in the label's parentheses where the outcome needs one
    better_ci: Interval
    than_ci: Interval
    diff: Interval  # better - than, at the (Holm-widened) level it was decided at
    p_holm: float = math.nan
    gates: tuple[Learned, ...] = ()
    only: str = ""  # the one group that learned, when the other did not

    @property
    def label(self) -> str:
        if self.outcome == CEILING:
            return CEILING_LABEL
        if self.only:
            return f"{self.outcome} (only {self.only} learned)"
        return f"{self.outcome} ({self.reason})" if self.outcome in (INCONCLUSIVE, NOT_TESTED, NOT_REACHED) else self.outcome

    @property
    def statement(self) -> str:
        return f"{self.better} is better than {self.than} on {self.metric}"


def perfect_on_every_seed(values, higher: bool, bounds: tuple[float, float]) -> bool:
    x = finite(values)
    perfect = bounds[1] if higher else bounds[0]
    return len(x) > 0 and math.isfinite(perfect) and bool(np.all(x == perfect))


def gate_verdict(c: Comparison, make) -> Verdict | None:
    """The outcome the learned gate decides alone, or None when both groups learned."""
    untested = [g for g in c.gates if g.untested]
    if untested:
        return make(NOT_TESTED, "; ".join(g.text for g in untested))
    a, b = c.learned(c.better), c.learned(c.than)
    if a and b:
        return None
    if a:
        return replace(make(HOLDS, "did not learn: " + gate_texts(c, c.than)), only=c.better)
    if b:
        return replace(make(DOES_NOT_HOLD, "did not learn: " + gate_texts(c, c.better)), only=c.than)
    return make(NOT_TESTED, "neither group learned: " + gate_texts(c, c.better) + "; " + gate_texts(c, c.than))


def gate_texts(c: Comparison, group: str) -> str:
    return "; ".join(g.text for g in c.gates if g.group == group and not g.learned)


CONTAINS_ZERO = "the interval of the difference contains 0"


def verdicts(comparisons: Sequence[Comparison], alpha: float = ALPHA, plan: bool = True) -> list[Verdict]:
    """Apply RULE to a study's comparisons. Holm's family is every comparison: one that ends
    before a test (not reached, not tested, one group only, ceiling) counts in m with p = 1. `plan`: an
    inconclusive verdict states what its seeds detect and what it would need (`plan_text`)."""
    m = len(comparisons)
    out: list[Verdict | None] = []
    tested: dict[int, tuple[Comparison, Interval, Interval]] = {}
    pvalues = [1.0] * m
    for i, c in enumerate(comparisons):
        if c.shares is not None:
            a, b = (s.interval for s in c.shares)
            diff = share_difference(*c.shares)
        else:
            a, b = (mean_ci(v, bounds=c.bounds) for v in (c.better_values, c.than_values))
            diff = difference(c.better_values, c.than_values, bounds=c.bounds)

        def make(outcome: str, reason: str, c=c, a=a, b=b, diff=diff) -> Verdict:
            return Verdict(c.metric, c.better, c.than, outcome, reason, a, b, diff, gates=c.gates)

        empty = [name for name, iv in ((c.better, a), (c.than, b)) if iv.n == 0]
        few = [name for name, iv in ((c.better, a), (c.than, b)) if iv.n == 1]
        decided_by_gate = gate_verdict(c, make)
        if c.unreached:
            out.append(make(NOT_REACHED, "; ".join(c.unreached)))
        elif decided_by_gate is not None:
            out.append(decided_by_gate)
        elif empty:
            out.append(make(INCONCLUSIVE, f"no finished run of {empty[0]} reports {c.metric}"))
        elif c.shares is None and all(perfect_on_every_seed(v, c.higher, c.bounds)
                                      for v in (c.better_values, c.than_values)):
            out.append(make(CEILING, "both groups scored the metric's best value on every seed"))
        elif few and c.shares is None:
            out.append(make(INCONCLUSIVE, f"{few[0]} has 1 finished seed; an interval needs 2"))
        elif diff.constant:
            out.append(make(INCONCLUSIVE, "every seed gave the same difference: no spread, no interval"))
        else:
            tested[i] = (c, a, b)
            pvalues[i] = diff.p
            out.append(None)
    adjusted = holm(pvalues)
    order = np.argsort(pvalues, kind="stable")
    for rank, k in enumerate(order):
        if k not in tested:
            continue
        c, a, b = tested[k]
        level = 1 - alpha / (m - rank)
        if c.shares is not None:
            diff = share_difference(*c.shares)
        else:
            diff = difference(c.better_values, c.than_values, level=level, bounds=c.bounds)  # p: before Holm

        def make(outcome: str, reason: str, c=c, a=a, b=b, diff=diff, p=adjusted[k]) -> Verdict:
            return Verdict(c.metric, c.better, c.than, outcome, reason, a, b, diff, p_holm=p, gates=c.gates)

        if c.margin and c.shares is None:
            # Two one-sided tests at Bonferroni's alpha/m each (Schuirmann 1987): equivalent when
            # the 1 - 2 alpha/m interval lies inside ±margin.
            tost = difference(c.better_values, c.than_values, level=1 - 2 * alpha / m, bounds=c.bounds)
            if -c.margin < tost.lo and tost.hi < c.margin:
                out[k] = replace(make(EQUIVALENT, f"the {tost.level:.1%} interval lies within ±{fmt(c.margin)}"),
                                 diff=tost)
                continue
        if adjusted[k] > alpha:
            stopped = not math.isnan(diff.lo) and (diff.lo > 0 or diff.hi < 0)  # an earlier one did not separate
            why = ("Holm: an earlier comparison did not separate" if stopped
                   else f"Fisher's exact p = {fmt(diff.p)}" if c.shares is not None else CONTAINS_ZERO)
            out[k] = make(INCONCLUSIVE, why + (plan_text(c, diff) if plan and why == CONTAINS_ZERO else ""))
            continue
        above = diff.mean > 0
        where = f"the difference lies entirely {'above' if above else 'below'} 0"
        out[k] = make(HOLDS if above == c.higher else DOES_NOT_HOLD, where)
    return [v for v in out if v is not None]


# ---- adaptive seeds: repeated looks with alpha spending ----------------------------------------


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
    fractions = [n / looks[-1] for n in looks]
    return [spent(t, alpha) - spent(prev, alpha) for prev, t in zip([0.0, *fractions], fractions)]


def sequential_verdicts(comparisons: Sequence[Comparison], looks: Sequence[int]) -> list[Verdict]:
    """Verdicts of an adaptive study: at each look (its first n seeds, for the comparisons
    whose groups ran them) RULE runs at that look's spent alpha; a comparison keeps the first
    look that decides it, otherwise its last look's verdict."""
    alphas = look_alphas(looks)
    final: list[Verdict | None] = [None] * len(comparisons)
    last: list[Comparison] = list(comparisons)  # each comparison as its deciding (or last) look saw it
    for j, (n, alpha) in enumerate(zip(looks, alphas)):
        available = [j == 0 or c.seeds_run >= n for c in comparisons]
        at_look = [c.truncated(n) if ok else replace(c, better_values=pd.Series(dtype=float),
                                                      than_values=pd.Series(dtype=float))
                   for c, ok in zip(comparisons, available)]
        for i, v in enumerate(verdicts(at_look, alpha, plan=False)):
            if not available[i] or (final[i] is not None and final[i].outcome in DECIDED):
                continue
            if v.outcome in DECIDED:
                v = replace(v, reason=f"{v.reason}; look {j + 1} of {len(looks)} ({n} seeds, alpha {fmt(alpha)})")
            final[i], last[i] = v, at_look[i]
    return [replace(v, reason=v.reason + plan_text(c, v.diff)) if v.reason == CONTAINS_ZERO else v
            for v, c in zip(final, last) if v is not None]


def verdict(better_values, than_values, metric: str, better: str, than: str, higher: bool | None = None,
            bounds: tuple[float, float] = UNBOUNDED, margin: float | None = None) -> Verdict:
    """One comparison on its own (m = 1, no gate). Series over seeds (index = seed) pair when
    they hold the same seeds; plain lists are compared with Welch's interval."""
    higher = higher_is_better(metric) if higher is None else higher
    return verdicts([Comparison(metric, better, than, better_values, than_values, higher=higher, bounds=bounds,
                                margin=margin)])[0]
