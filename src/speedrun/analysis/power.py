"""How many runs a group needs for the record rule, from its observed mean and std.

The record rule (modded-nanogpt README L207-220) is the one-sided one-sample t-test of H1: mean val_loss <
target at ``p < alpha``. For a group of ``n`` runs with observed mean ``m`` and sample std ``s`` (ddof=1), two
numbers answer "how many runs would it take":

* ``p_value_at(k)``: the p-value a group of ``k`` runs would get if its mean and std were exactly ``m`` and
  ``s``: ``F_{k-1}((m - target) * sqrt(k) / s)``, with ``F_v`` the Student t CDF with ``v`` degrees of
  freedom (it equals ``scipy.stats.ttest_1samp(x, target, alternative="less").pvalue`` for any ``x`` of size
  ``k`` with that mean and std). ``runs_needed`` is the smallest ``k >= 3`` (:data:`MIN_RUNS`: no verdict is
  read from fewer runs) with ``p_value_at(k) < alpha``: the run count at which the observed effect, if it held
  exactly, would pass the rule. For ``m < target``
  ``p_value_at`` falls strictly as ``k`` grows (the statistic grows like sqrt(k) and the t tails thin), so
  ``runs_needed`` is found by bisection. It is the "expected t-statistic passes the critical value" count:
  ``(m - target) * sqrt(k) / s < t_{alpha, k-1}``.
* ``power_at(k)``: the probability that a fresh group of ``k`` runs passes, if run results are normal with
  mean ``m`` and std ``s`` (taken as the truth): ``P(T < t_{alpha, k-1})`` with ``T`` noncentral t with
  ``k - 1`` degrees of freedom and noncentrality ``(m - target) * sqrt(k) / s`` (Cohen 1988, ch. 2;
  ``scipy.stats.nct``). ``runs_for_power`` is the smallest ``k`` with ``power_at(k) >= power`` (0.8 by
  default). ``runs_needed`` gives about 50% power, so planning a submission should use ``runs_for_power``.

Neither number exists when ``m >= target`` (the observed effect points the wrong way: no ``k`` passes) or
when ``s`` is undefined or zero (fewer than 2 runs, all values equal). Both searches stop at ``max_runs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import stats

MIN_RUNS = 3  # fewer counted runs than this: the p-value is shown with "too few runs", never alone
DEFAULT_POWER = 0.8
MAX_RUNS = 100_000


@dataclass(frozen=True)
class PowerEstimate:
    """Run counts for ``p < alpha`` at a group's observed mean and std (module docstring).

    ``runs_needed``: smallest k with ``p_value_at(k) < alpha``; ``runs_for_power``: smallest k with
    ``power_at(k) >= power``; ``power_now``: ``power_at(n)``. All ``None`` with a ``reason`` when undefined.
    """

    n: int
    mean: float | None
    std: float | None
    target: float
    alpha: float
    power: float
    runs_needed: int | None
    runs_for_power: int | None
    power_now: float | None
    reason: str | None


def _check(mean: float, std: float) -> None:
    if not (math.isfinite(mean) and math.isfinite(std) and std > 0):
        raise ValueError(f"mean and std must be finite with std > 0, got mean={mean}, std={std}")


def p_value_at(k: int | np.ndarray, mean: float, std: float, target: float) -> float | np.ndarray:
    """The one-sided p-value (H1: mean < target) of ``k`` runs with sample mean ``mean`` and std ``std``.

    ``k`` is an int or an int array (shape ``(m,)``, every entry >= 2); the result has its shape.
    Raises ValueError when ``std`` is not positive and finite.
    """
    _check(mean, std)
    k_arr = np.asarray(k, dtype=np.float64)
    p = stats.t.cdf((mean - target) * np.sqrt(k_arr) / std, k_arr - 1)
    return float(p) if np.ndim(p) == 0 else p


def power_at(k: int | np.ndarray, mean: float, std: float, target: float, alpha: float) -> float | np.ndarray:
    """Probability that ``k`` new runs pass the one-sided t-test at ``alpha``, if run results are normal with
    mean ``mean`` and std ``std`` (noncentral t; module docstring). Shapes as :func:`p_value_at`."""
    _check(mean, std)
    k_arr = np.asarray(k, dtype=np.float64)
    critical = stats.t.ppf(alpha, k_arr - 1)
    power = stats.nct.cdf(critical, k_arr - 1, (mean - target) * np.sqrt(k_arr) / std)
    return float(power) if np.ndim(power) == 0 else power


def _smallest(passes: Callable[[int], bool], max_runs: int) -> int | None:
    """The smallest k in [MIN_RUNS, max_runs] with ``passes(k)`` for a predicate monotone in k, else ``None``."""
    hi = MIN_RUNS
    while not passes(hi):
        if hi >= max_runs:
            return None
        hi = min(2 * hi, max_runs)
    lo = max(MIN_RUNS, hi // 2)
    if passes(lo):
        return lo
    while hi - lo > 1:  # passes(hi) and not passes(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    return hi


def runs_needed(mean: float, std: float, target: float, alpha: float, max_runs: int = MAX_RUNS) -> int | None:
    """Smallest k >= :data:`MIN_RUNS` with ``p_value_at(k) < alpha``; ``None`` when ``mean >= target`` or beyond
    ``max_runs``."""
    if mean >= target:
        return None
    return _smallest(lambda k: p_value_at(k, mean, std, target) < alpha, max_runs)


def runs_for_power(mean: float, std: float, target: float, alpha: float, power: float = DEFAULT_POWER,
                   max_runs: int = MAX_RUNS) -> int | None:
    """Smallest k >= :data:`MIN_RUNS` with ``power_at(k) >= power``; ``None`` when ``mean >= target`` or beyond
    ``max_runs``."""
    if mean >= target:
        return None
    return _smallest(lambda k: power_at(k, mean, std, target, alpha) >= power, max_runs)


def power_estimate(n: int, mean: float | None, std: float | None, target: float, alpha: float,
                   power: float = DEFAULT_POWER, max_runs: int = MAX_RUNS) -> PowerEstimate:
    """The :class:`PowerEstimate` of a group of ``n`` counted runs with observed ``mean`` and ``std``."""
    common = dict(n=n, mean=mean, std=std, target=target, alpha=alpha, power=power)
    reason = _undefined(n, mean, std, target)
    if reason:
        return PowerEstimate(**common, runs_needed=None, runs_for_power=None, power_now=None, reason=reason)
    needed = runs_needed(mean, std, target, alpha, max_runs)
    planned = runs_for_power(mean, std, target, alpha, power, max_runs)
    reason = None
    if needed is None:
        reason = f"p < {alpha:g} would take more than {max_runs} runs"
    elif planned is None:
        reason = f"power {power:g} would take more than {max_runs} runs"
    return PowerEstimate(**common, runs_needed=needed, runs_for_power=planned,
                         power_now=power_at(n, mean, std, target, alpha), reason=reason)


def _undefined(n: int, mean: float | None, std: float | None, target: float) -> str | None:
    if n < 2 or mean is None or std is None:
        return f"n={n}: the std needs at least 2 complete runs"
    if std == 0:
        return "zero variance (all values equal)"
    if mean >= target:
        return f"the observed mean {mean:.4f} is not below {target:g}: no number of runs passes"
    return None


def p_value_curve(n: int, mean: float, std: float, target: float, runs_needed_: int | None,
                  cap: int = 1000) -> tuple[list[int], list[float]]:
    """``(k, p_value_at(k))`` for k = 2 ... max(20, 2n, 2 * runs_needed), at most ``cap`` (the report's plot)."""
    upto = min(cap, max(20, 2 * n, 2 * (runs_needed_ or 0)))
    ks = np.arange(2, upto + 1)
    return ks.tolist(), np.asarray(p_value_at(ks, mean, std, target), dtype=np.float64).tolist()
