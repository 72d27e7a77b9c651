"""Runs needed for p < alpha: the p-value at n runs, power (noncentral t), and the run counts."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats as sps

from speedrun.analysis.power import (p_value_at, p_value_curve, power_at, power_estimate, runs_for_power,
                                     runs_needed)


def sample_with(n: int, mean: float, std: float) -> np.ndarray:
    """n values whose sample mean and std (ddof=1) are exactly ``mean`` and ``std`` (up to rounding)."""
    z = np.arange(n, dtype=np.float64) - (n - 1) / 2
    return mean + std * z / np.std(z, ddof=1)


def scipy_p(n: int, mean: float, std: float, target: float) -> float:
    return sps.ttest_1samp(sample_with(n, mean, std), target, alternative="less").pvalue


def brute_runs_needed(mean, std, target, alpha, limit=2000):
    """First n >= 3 (the record rule reads no verdict from fewer runs) with scipy's p < alpha, by linear search."""
    return next((n for n in range(3, limit) if scipy_p(n, mean, std, target) < alpha), None)


means = st.floats(3.270, 3.2799)
stds = st.floats(0.0005, 0.005)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 200), st.floats(3.2, 3.4), stds, st.floats(3.2, 3.4))
def test_p_value_at_is_scipy_on_a_sample_with_that_mean_and_std(n, mean, std, target):
    assert p_value_at(n, mean, std, target) == pytest.approx(scipy_p(n, mean, std, target), rel=1e-7, abs=1e-300)


@settings(max_examples=60, deadline=None)
@given(means, stds)
def test_p_value_falls_with_n_and_power_rises(mean, std):
    ks = np.arange(2, 400)
    p = p_value_at(ks, mean, std, 3.28)
    power = power_at(ks, mean, std, 3.28, 0.01)
    positive = p[1:] > 0  # far out, p underflows to 0.0
    assert np.all(np.diff(p)[positive] < 0) and np.all(p[1:][~positive] == 0)
    assert np.all(np.diff(power) >= -1e-12)


@settings(max_examples=25, deadline=None)
@given(means, stds, st.sampled_from([0.01, 0.05]))
def test_runs_needed_is_the_first_n_with_p_below_alpha(mean, std, alpha):
    needed = runs_needed(mean, std, 3.28, alpha)
    expected = brute_runs_needed(mean, std, 3.28, alpha)
    if expected is None:
        assert needed is None or needed >= 2000
    else:
        assert needed == expected


def test_runs_needed_and_for_power_are_never_below_the_rules_three_runs():
    """An effect so clear that 2 runs would give p < alpha still needs the 3 runs below which no verdict is
    read (a report said 'runs for p<0.01: 2' beside 'too few runs: n=2 < 3')."""
    assert p_value_at(2, 3.0, 0.001, 3.28) < 0.01
    assert runs_needed(3.0, 0.001, 3.28, 0.01) == 3 and runs_for_power(3.0, 0.001, 3.28, 0.01) == 3


def test_runs_needed_by_hand():
    # mean 3.2787, std 0.0016 (2025-08-23_SparseAttnGate, published p=0.0059 with n=14)
    n = runs_needed(3.2787, 0.0016, 3.28, 0.01)
    t = lambda k: (3.2787 - 3.28) * math.sqrt(k) / 0.0016  # noqa: E731
    assert t(n) < sps.t.ppf(0.01, n - 1) and t(n - 1) >= sps.t.ppf(0.01, n - 2)
    assert runs_needed(3.28, 0.001, 3.28, 0.01) is None and runs_needed(3.29, 0.001, 3.28, 0.01) is None


def noncentral_power(k: int, mean: float, std: float, target: float, alpha: float) -> float:
    """P(T' < t_alpha) with T' = (Z + delta) / sqrt(V / nu), integrated over V ~ chi2(nu) (no scipy.nct)."""
    nu, delta = k - 1, (mean - target) * math.sqrt(k) / std
    critical = sps.t.ppf(alpha, nu)
    integrand = lambda v: sps.norm.cdf(critical * math.sqrt(v / nu) - delta) * sps.chi2.pdf(v, nu)  # noqa: E731
    return integrate.quad(integrand, 0, math.inf, limit=200)[0]


@pytest.mark.parametrize("k, mean, std", [(5, 3.278, 0.0015), (14, 3.2787, 0.0016), (30, 3.2795, 0.0012),
                                          (3, 3.27, 0.004)])
def test_power_against_integration(k, mean, std):
    assert power_at(k, mean, std, 3.28, 0.01) == pytest.approx(noncentral_power(k, mean, std, 3.28, 0.01), abs=1e-6)


def test_power_against_simulation():
    rng = np.random.default_rng(1234)
    k, mean, std, sims = 10, 3.2786, 0.0013, 40_000
    x = rng.normal(mean, std, size=(sims, k))
    p = sps.ttest_1samp(x, 3.28, axis=1, alternative="less").pvalue
    simulated = np.mean(p < 0.01)
    assert abs(power_at(k, mean, std, 3.28, 0.01) - simulated) < 4 * math.sqrt(0.25 / sims)


def test_runs_for_power_is_the_first_n_reaching_the_power():
    planned = runs_for_power(3.2787, 0.0016, 3.28, 0.01, 0.8)
    assert power_at(planned, 3.2787, 0.0016, 3.28, 0.01) >= 0.8 > power_at(planned - 1, 3.2787, 0.0016, 3.28, 0.01)
    assert runs_for_power(3.2787, 0.0016, 3.28, 0.01, 0.9) > planned


def test_estimate_reasons():
    assert "at least 2" in power_estimate(1, 3.27, None, 3.28, 0.01).reason
    assert "zero variance" in power_estimate(3, 3.27, 0.0, 3.28, 0.01).reason
    assert "not below 3.28" in power_estimate(3, 3.281, 0.001, 3.28, 0.01).reason
    far = power_estimate(5, 3.27999, 0.01, 3.28, 0.01, max_runs=1000)
    assert far.runs_needed is None and "more than 1000" in far.reason
    ok = power_estimate(14, 3.2787, 0.0016, 3.28, 0.01)
    assert ok.reason is None and ok.runs_needed <= 14 and 0 < ok.power_now < 1


def test_p_value_curve_covers_runs_needed():
    ks, ps = p_value_curve(14, 3.2787, 0.0016, 3.28, 12)
    assert ks[0] == 2 and ks[-1] == 28 and len(ks) == len(ps)
    assert ps[ks.index(14)] == pytest.approx(scipy_p(14, 3.2787, 0.0016, 3.28), rel=1e-7)
