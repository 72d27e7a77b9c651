"""Statistical tests of the speedrun record rules, as small pure functions returning named records.

Inputs are 1-D float sequences of shape ``(n_runs,)``, one value per complete run: final val_loss
(nats/token) or train_time (any unit; the result is in the same unit).

* Record rule (modded-nanogpt README L207-220, "new records must reach <= 3.28 mean val loss with p < 0.01"):
  one-sided one-sample t-test, H1: mean val_loss < target, ``scipy.stats.ttest_1samp(x, target,
  alternative="less")``; spreads are sample standard deviations (ddof=1, as ``torch.std_mean`` prints them).
* Candidate against baseline (rule #4 and 2026-05-07's verifier): Welch's unequal-variance t-test
  (``scipy.stats.ttest_ind(candidate, baseline, equal_var=False, alternative=...)``) with the direction
  stated, the mean difference (candidate - baseline) and its two-sided Welch confidence interval with the
  Welch-Satterthwaite degrees of freedom (Welch 1947, Biometrika 34:28).

* Track-3 style fixed-sigma rule (issue 5, from the public repository's optimization track): a group passes when
  ``(target - mean) * sqrt(n) >= 0.004``, i.e. a one-sided z-test with the run-to-run std fixed in advance
  rather than estimated (0.004 = z_{0.99} * 0.0017 to two digits; meaningful for the public metric only).

A test that cannot be computed (fewer than 2 values, zero variance) returns ``p_value=None`` and a ``reason``.
The record layout follows pingouin's ``ttest`` (statistic, dof, p, CI, n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

import numpy as np
from scipy import stats

Alternative = Literal["less", "greater", "two-sided"]


@dataclass(frozen=True)
class Summary:
    """n, mean, sample std (ddof=1; ``None`` when n < 2), min and max of a sample (``None`` when empty)."""

    n: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None


@dataclass(frozen=True)
class OneSampleTest:
    """One-sided one-sample t-test of H1: mean < target. ``t_statistic``/``p_value`` ``None`` with a ``reason``
    when not computable; ``dof = n - 1``."""

    n: int
    mean: float | None
    std: float | None
    target: float
    hypothesis: str
    alternative: Alternative
    t_statistic: float | None
    dof: int | None
    p_value: float | None
    reason: str | None


@dataclass(frozen=True)
class WelchTest:
    """Welch's t-test of candidate against baseline; ``difference = mean_candidate - mean_baseline`` with its
    two-sided ``confidence`` interval [ci_low, ci_high]; ``dof`` the Welch-Satterthwaite degrees of freedom."""

    n_baseline: int
    n_candidate: int
    mean_baseline: float | None
    mean_candidate: float | None
    std_baseline: float | None
    std_candidate: float | None
    difference: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float
    hypothesis: str
    alternative: Alternative
    t_statistic: float | None
    dof: float | None
    p_value: float | None
    reason: str | None


@dataclass(frozen=True)
class Speedup:
    """Baseline mean time minus candidate mean time (positive: the candidate is faster), in the inputs' unit,
    and as a percentage of the baseline mean."""

    baseline_mean: float
    candidate_mean: float
    difference: float
    percent: float


@dataclass(frozen=True)
class ZRule:
    """The fixed-sigma rule ``value = (target - mean) * sqrt(n) >= margin``; ``None`` fields when n == 0."""

    n: int
    mean: float | None
    target: float
    margin: float
    value: float | None
    passes: bool | None


Z_RULE_MARGIN = 0.004


def _array(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"values must be finite, got {a.tolist()}")
    return a


def summarize(x: Sequence[float]) -> Summary:
    """n, mean, sample std (ddof=1), min, max of ``x`` (shape ``(n,)``). The std is taken of ``x - min(x)``
    (the same value in exact arithmetic): equal values give exactly 0 in any order, where numpy's mean of
    three equal train times (178.811625 s) rounds and left a std of about 1e-14 that differed by run order."""
    a = _array(x)
    if a.size == 0:
        return Summary(0, None, None, None, None)
    std = float(np.std(a - a.min(), ddof=1)) if a.size >= 2 else None
    return Summary(int(a.size), float(np.mean(a)), std, float(np.min(a)), float(np.max(a)))


def _not_testable(*samples: np.ndarray) -> str | None:
    """Why a t-test cannot be computed on these samples, or ``None``."""
    small = [a.size for a in samples if a.size < 2]
    if small:
        return f"n={small[0]}: a t-test needs at least 2 complete runs per sample"
    if all(np.ptp(a) == 0 for a in samples):
        return "zero variance (all values equal): the t statistic is undefined"
    return None


def missing_times(counted: Mapping[str, int], timed: Mapping[str, int]) -> str | None:
    """Why train_time cannot be tested though runs are counted: for each side (``baseline``, ``candidate``)
    with fewer than 2 runs of ``timed`` (those with a train_time; public llm.c logs have none) among its
    ``counted`` ones, ``no train_time in 3 of 3 candidate runs``, joined by ``and``; ``None`` when no side
    lacks times that a t-test needs. Raises ``KeyError`` when a side is missing from either mapping."""
    lacking = [f"{counted[side] - timed[side]} of {counted[side]} {side} run{'s' * (counted[side] != 1)}"
               for side in ("baseline", "candidate") if timed[side] < 2 and timed[side] < counted[side]]
    return "no train_time in " + " and ".join(lacking) if lacking else None


def one_sample_less(x: Sequence[float], target: float) -> OneSampleTest:
    """One-sided one-sample t-test, H1: mean(x) < target (the record rule; module docstring).

    ``x`` has shape ``(n,)``; the p-value is ``scipy.stats.ttest_1samp(x, target, alternative="less").pvalue``.
    """
    a = _array(x)
    s = summarize(a)
    hypothesis = f"mean < {target:g}"
    reason = _not_testable(a)
    if reason:
        return OneSampleTest(s.n, s.mean, s.std, target, hypothesis, "less", None, None, None, reason)
    res = stats.ttest_1samp(a, target, alternative="less")
    return OneSampleTest(s.n, s.mean, s.std, target, hypothesis, "less", float(res.statistic), s.n - 1,
                         float(res.pvalue), None)


def welch_dof(candidate: Sequence[float], baseline: Sequence[float]) -> float:
    """Welch-Satterthwaite degrees of freedom: (v1/n1 + v2/n2)^2 / ((v1/n1)^2/(n1-1) + (v2/n2)^2/(n2-1))."""
    c, b = _array(candidate), _array(baseline)
    vc, vb = np.var(c, ddof=1) / c.size, np.var(b, ddof=1) / b.size
    return float((vc + vb) ** 2 / (vc ** 2 / (c.size - 1) + vb ** 2 / (b.size - 1)))


def welch_ci(candidate: Sequence[float], baseline: Sequence[float],
             confidence: float = 0.95) -> tuple[float, float, float]:
    """Two-sided Welch confidence interval of mean(candidate) - mean(baseline): (difference, low, high).

    difference +- t_{(1+confidence)/2, dof} * sqrt(v_c/n_c + v_b/n_b), dof from :func:`welch_dof`.
    """
    c, b = _array(candidate), _array(baseline)
    diff = float(np.mean(c) - np.mean(b))
    se = math.sqrt(np.var(c, ddof=1) / c.size + np.var(b, ddof=1) / b.size)
    half = float(stats.t.ppf((1 + confidence) / 2, welch_dof(c, b))) * se
    return diff, diff - half, diff + half


def welch_test(candidate: Sequence[float], baseline: Sequence[float], alternative: Alternative,
               hypothesis: str, confidence: float = 0.95) -> WelchTest:
    """Welch's t-test of ``candidate`` against ``baseline`` (shapes ``(n_c,)``, ``(n_b,)``).

    ``alternative`` is scipy's, for mean(candidate) - mean(baseline): ``"less"`` tests H1: candidate lower.
    ``hypothesis`` states H1 in words for the report. The confidence interval is two-sided.
    """
    c, b = _array(candidate), _array(baseline)
    sc, sb = summarize(c), summarize(b)
    reason = _not_testable(c, b)
    common = dict(n_baseline=sb.n, n_candidate=sc.n, mean_baseline=sb.mean, mean_candidate=sc.mean,
                  std_baseline=sb.std, std_candidate=sc.std, confidence=confidence, hypothesis=hypothesis,
                  alternative=alternative)
    if reason:
        diff = None if sc.mean is None or sb.mean is None else sc.mean - sb.mean
        return WelchTest(**common, difference=diff, ci_low=None, ci_high=None, t_statistic=None, dof=None,
                         p_value=None, reason=reason)
    res = stats.ttest_ind(c, b, equal_var=False, alternative=alternative)
    diff, low, high = welch_ci(c, b, confidence)
    return WelchTest(**common, difference=diff, ci_low=low, ci_high=high, t_statistic=float(res.statistic),
                     dof=welch_dof(c, b), p_value=float(res.pvalue), reason=None)


def speedup(baseline_times: Sequence[float], candidate_times: Sequence[float]) -> Speedup | None:
    """Mean time saved by the candidate (same unit as the inputs) and in percent; ``None`` if a side is empty."""
    b, c = _array(baseline_times), _array(candidate_times)
    if b.size == 0 or c.size == 0:
        return None
    bm, cm = float(np.mean(b)), float(np.mean(c))
    return Speedup(bm, cm, bm - cm, 100.0 * (bm - cm) / bm)


def z_rule(x: Sequence[float], target: float, margin: float = Z_RULE_MARGIN) -> ZRule:
    """The fixed-sigma rule (module docstring) on ``x`` (shape ``(n,)``, final val_loss of each run)."""
    a = _array(x)
    if a.size == 0:
        return ZRule(0, None, target, margin, None, None)
    mean = float(np.mean(a))
    value = (target - mean) * math.sqrt(a.size)
    return ZRule(int(a.size), mean, target, margin, value, value >= margin)
