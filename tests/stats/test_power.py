"""What seeds detect (workbench.stats.power): the t test's power from the noncentral t, and the two
one-sided tests' power integrated over the sample SD, each against simulated tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from workbench.stats.power import POWER, detectable, equivalence_power, power, seeds_for_equivalence, seeds_needed


def simulated(n: int, difference: float, sd: float, studies: int = 200_000, seed: int = 3) -> tuple[np.ndarray, ...]:
    """Paired per-seed differences: their means and standard errors over `studies` simulated studies."""
    d = np.random.default_rng(seed).normal(difference, sd, (studies, n))
    return d.mean(axis=1), d.std(axis=1, ddof=1) / math.sqrt(n)


@pytest.mark.parametrize("n, effect, alpha", [(4, 1.5, 0.0226), (8, 0.8, 0.0084), (12, 0.5, 0.0118)])
def test_the_power_is_the_t_tests_rejection_rate(n, effect, alpha):
    mean, se = simulated(n, effect, 1.0)
    rejected = np.abs(mean / se) > stats.t.ppf(1 - alpha / 2, n - 1)
    assert power(effect, 1.0, n, alpha, True) == pytest.approx(rejected.mean(), abs=4 * math.sqrt(0.25 / len(mean)))


@pytest.mark.parametrize("n, difference, margin, alpha", [(4, 0.0, 1.5, 0.0226), (4, 0.5, 2.0, 0.0226),
                                                         (8, 0.2, 1.0, 0.0084), (12, 0.0, 0.7, 0.0118)])
def test_the_equivalence_power_is_the_two_one_sided_tests_rate(n, difference, margin, alpha):
    """The chance that the 1 - 2 alpha t interval lies inside ±margin, exact: it integrates over the
    sample SD, which the normal approximations take as known: at 4 to 8 seeds they miss it by 0.1 to 0.4
    either way, so futility would stop comparisons it could decide, or grow ones it cannot."""
    mean, se = simulated(n, difference, 1.0)
    half = stats.t.ppf(1 - alpha, n - 1) * se
    shown = np.mean((mean - half > -margin) & (mean + half < margin))
    exact = equivalence_power(difference, 1.0, n, alpha, True, margin)
    assert exact == pytest.approx(shown, abs=4 * math.sqrt(0.25 / len(mean)) + 0.003)
    # the spread taken as known, with the t quantile (futility before 2026-12-06) or the normal one (what the
    # docs said): the first understates the power at few seeds, the second overstates it
    def known(crit: float) -> float:
        scale = 1 / math.sqrt(n)
        return max(0.0, stats.norm.cdf((margin - difference) / scale - crit)
                   + stats.norm.cdf((margin + difference) / scale - crit) - 1)
    if n <= 8:
        assert known(stats.t.ppf(1 - alpha, n - 1)) < shown - 0.1 and known(stats.norm.ppf(1 - alpha)) > shown + 0.1


def test_seeds_needed_reach_the_power_and_one_fewer_does_not():
    n = seeds_needed(0.8, 1.0, 0.05, True, least=4)
    assert power(0.8, 1.0, n, 0.05, True) >= POWER > power(0.8, 1.0, n - 1, 0.05, True)
    assert seeds_needed(5.0, 1.0, 0.05, True, least=4) == 4  # never fewer than a verdict needs
    m = seeds_for_equivalence(0.0, 1.0, 0.05, True, 1.0, least=4)
    assert equivalence_power(0.0, 1.0, m, 0.05, True, 1.0) >= POWER > equivalence_power(0.0, 1.0, m - 1, 0.05, True, 1.0)
    assert seeds_for_equivalence(1.2, 1.0, 0.05, True, 1.0) is None  # outside the margin: no seed count shows it inside
    assert power(detectable(1.0, 6, 0.05, True), 1.0, 6, 0.05, True) == pytest.approx(POWER, abs=1e-4)
