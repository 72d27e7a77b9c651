"""The statistics of a group of runs: its val_loss and train_time summaries, the record-rule t-test and the
power estimate (:class:`GroupStats`, :func:`group_stats`, :func:`compute_stats`), what ``speedrun stats``
prints and writes and what the bundle and the report read.

Only complete, non-duplicate runs are counted in ``n``; incomplete runs (diverged, failed, truncated) and
duplicates are listed. The test is the record rule (modded-nanogpt README L207-220): one-sided
``scipy.stats.ttest_1samp(val_loss, target, alternative="less")``, met when ``p < alpha`` with at least 3
counted runs; next to p, the runs needed for ``p < alpha`` at the observed mean and std
(:mod:`speedrun.analysis.power`). Output layout: docs/formats.md "Statistics".
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from speedrun.analysis.groups import CodeSplit, Group, check_only, collect_runs
from speedrun.analysis.logs import RunRecord
from speedrun.analysis.power import MIN_RUNS, PowerEstimate, p_value_curve, power_estimate
from speedrun.analysis.tests import OneSampleTest, Summary, ZRule, one_sample_less, summarize, z_rule
from speedrun.errors import SpeedrunError

DEFAULT_TARGET = 3.28
DEFAULT_ALPHA = 0.01


@dataclass(frozen=True)
class GroupStats:
    """The statistics of one group: its val_loss summary, t-test and power, and train_time in seconds.

    ``val_loss``, ``test``, ``power`` and ``z_rule`` are over the counted runs (complete, not duplicates);
    ``train_time_s`` over those of them that have a train_time (llm.c logs have none). ``incomplete`` counts
    the other runs by status.
    """

    group: Group
    target: float
    alpha: float
    val_loss: Summary
    test: OneSampleTest
    train_time_s: Summary
    incomplete: dict[str, int]
    power: PowerEstimate
    z_rule: ZRule

    @property
    def too_few_runs(self) -> bool:
        """Fewer than :data:`~speedrun.analysis.power.MIN_RUNS` counted runs: no verdict, whatever p is."""
        return self.val_loss.n < MIN_RUNS

    @property
    def p_value_note(self) -> str | None:
        """Why the p-value must not be read alone (too few runs, or undefined), else ``None``."""
        if self.too_few_runs:
            return f"too few runs: n={self.val_loss.n} < {MIN_RUNS}"
        return self.test.reason

    @property
    def reaches_target(self) -> bool | None:
        """``p < alpha`` (the record rule); ``None`` without a p-value or with too few runs."""
        if self.test.p_value is None or self.too_few_runs:
            return None
        return self.test.p_value < self.alpha

    def to_json(self) -> dict[str, Any]:
        """The docs/formats.md "Statistics" object (``summary.json`` holds a list of these)."""
        g, pw = self.group, self.power
        curve = None
        if pw.mean is not None and pw.std:
            ks, ps = p_value_curve(pw.n, pw.mean, pw.std, self.target, pw.runs_needed)
            curve = {"n": ks, "p": ps}
        return strict_json({
            "group": g.name, "path": g.path, "slug": g.slug, "n": self.val_loss.n, "steps": g.steps,
            "gpu_count": g.gpu_count, "split_reason": g.split_reason, "code_split": g.code_split,
            "code_versions": g.code_versions,
            "val_loss_mean": self.val_loss.mean, "val_loss_std": self.val_loss.std,
            "val_loss_min": self.val_loss.min, "val_loss_max": self.val_loss.max,
            "t_statistic": self.test.t_statistic, "p_value": self.test.p_value,
            "p_value_reason": self.test.reason, "p_value_note": self.p_value_note, "min_runs": MIN_RUNS,
            "too_few_runs": self.too_few_runs, "hypothesis": self.test.hypothesis,
            "target": self.target, "alpha": self.alpha, "reaches_target": self.reaches_target,
            "runs_needed": pw.runs_needed, "runs_for_power": pw.runs_for_power, "power": pw.power,
            "power_now": pw.power_now, "power_reason": pw.reason, "p_value_by_n": curve,
            "z_rule": {"value": self.z_rule.value, "margin": self.z_rule.margin, "passes": self.z_rule.passes},
            "train_time_n": self.train_time_s.n,
            "train_time_mean_s": self.train_time_s.mean, "train_time_std_s": self.train_time_s.std,
            "train_time_min_s": self.train_time_s.min, "train_time_max_s": self.train_time_s.max,
            "incomplete": dict(self.incomplete), "duplicates": dict(g.duplicates),
            "duplicate_kinds": dict(g.duplicate_kinds), "warnings": g.warnings(), "skipped_files": list(g.skipped),
            "skip_reasons": dict(zip(g.skipped, g.skip_reasons)),
            "runs": [_run_json(r, orig, kind) for r, orig, kind in zip(g.runs, g.duplicate_of, g.duplicate_kind)],
        })


def strict_json(obj: Any) -> Any:
    """``obj`` with non-finite floats (in nested dicts and lists) replaced by ``None``, so the JSON is strict."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [strict_json(v) for v in obj]
    return obj


PROVENANCE_KEYS = ("git_commit", "git_dirty", "config_sha256", "train_data_sha256", "val_data_sha256",
                   "val_tokens", "world_size", "tokens_per_step", "device", "gpu", "gpu_count", "compile_s",
                   "code_hash")


def _run_json(run: RunRecord, duplicate_of: str | None, duplicate_kind: str | None) -> dict[str, Any]:
    return {"file": run.file, "val_loss": run.val_loss, "train_time_ms": run.train_time_ms, "steps": run.steps,
            "status": run.status, "seed": run.seed, "reason": run.reason,
            "duplicate_of": duplicate_of, "duplicate_kind": duplicate_kind,
            **{k: getattr(run, k) for k in PROVENANCE_KEYS}, "versions": dict(run.versions)}


def group_stats(group: Group, target: float = DEFAULT_TARGET, alpha: float = DEFAULT_ALPHA) -> GroupStats:
    """The statistics of ``group`` against ``target`` val_loss at level ``alpha`` (units: nats/token, s)."""
    counted = group.counted
    losses = [r.val_loss for r in counted]
    times = [r.train_time_ms / 1000.0 for r in counted if r.train_time_ms is not None]
    incomplete = Counter(r.status for r in group.runs if r.status != "complete")
    loss = summarize(losses)
    return GroupStats(group=group, target=target, alpha=alpha, val_loss=loss,
                      test=one_sample_less(losses, target), train_time_s=summarize(times),
                      incomplete=dict(sorted(incomplete.items())),
                      power=power_estimate(loss.n, loss.mean, loss.std, target, alpha), z_rule=z_rule(losses, target))


def compute_stats(paths: Sequence[str], target: float = DEFAULT_TARGET, alpha: float = DEFAULT_ALPHA,
                  code_split: CodeSplit = "pool", only: Sequence[str] | None = None,
                  notes: list[str] | None = None) -> list[GroupStats]:
    """Group the runs at ``paths`` (``code_split``, ``only``, ``notes``: see
    :func:`speedrun.analysis.groups.collect_runs`) and compute each group's statistics.

    Raises:
        SpeedrunError: as :func:`speedrun.analysis.groups.collect_runs` and
            :func:`~speedrun.analysis.groups.check_only`.
    """
    check_only(paths, only)
    return [group_stats(g, target, alpha) for g in collect_runs(paths, code_split, only, notes)]


def check_alpha(alpha: float) -> None:
    """Refuse a significance level outside (0, 1) (``--alpha`` of ``speedrun stats`` and ``compare``).

    Raises:
        SpeedrunError: naming the value.
    """
    if not 0 < alpha < 1:
        raise SpeedrunError(f"--alpha {alpha}: expected a level between 0 and 1")


def check_target(target: float) -> None:
    """Refuse a val_loss target that no cross-entropy can be compared with: 0, negative, infinite or NaN
    (``--target`` of ``speedrun stats`` and ``compare``).

    Raises:
        SpeedrunError: naming the value; for inf and NaN, that the target must be finite.
    """
    if not 0 < target < math.inf:
        finite = "" if math.isfinite(target) else f"; it must be finite, and {target} is not"
        raise SpeedrunError(f"--target {target}: expected a val_loss above 0 (cross-entropy in nats per "
                            f"token, e.g. {DEFAULT_TARGET}){finite}")
