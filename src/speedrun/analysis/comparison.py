"""A candidate group of runs against a baseline group: Welch t-tests on val_loss and train_time with
confidence intervals, the speedup, each side's z-rule and the rules check (:class:`Comparison`,
:func:`compare_groups`), what ``speedrun compare`` prints and writes and what the bundle and the report read.
The tests and their sources: :mod:`speedrun.compare`'s docstring.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from speedrun.analysis.group_stats import DEFAULT_ALPHA, strict_json
from speedrun.analysis.groups import CodeSplit, DuplicateKind, Group, collect_runs
from speedrun.analysis.logs import RunRecord
from speedrun.analysis.rules import RuleCheck, check_rules, violations
from speedrun.analysis.tests import Speedup, WelchTest, ZRule, missing_times, speedup, welch_test, z_rule
from speedrun.errors import SpeedrunError

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Comparison:
    """Candidate against baseline: Welch tests on val_loss (nats/token) and train_time (s), the speedup (s),
    each side's z-rule at ``target`` (``None`` without a target), and the rules check.

    ``warnings`` flags what makes the comparison doubtful: violated rules, runs shared by both sides, runs
    without timing. :attr:`incomplete` lists each side's runs that are not counted for their status,
    :attr:`duplicates` those that repeat a run of the same side.
    """

    baseline: Group
    candidate: Group
    alpha: float
    target: float | None
    val_loss: WelchTest
    train_time: WelchTest
    speedup: Speedup | None
    z_rules: tuple[ZRule, ZRule] | None
    rules: tuple[RuleCheck, ...]
    warnings: tuple[str, ...]

    @property
    def incomplete(self) -> dict[str, tuple[RunRecord, ...]]:
        """``baseline``/``candidate`` -> the side's runs that are not complete (diverged, failed, truncated), in
        file order: listed with their ``reason``, never counted (as ``speedrun stats`` lists them)."""
        return {side: tuple(r for r in g.runs if r.status != "complete")
                for side, g in (("baseline", self.baseline), ("candidate", self.candidate))}

    @property
    def duplicates(self) -> dict[str, tuple[tuple[RunRecord, str, DuplicateKind], ...]]:
        """``baseline``/``candidate`` -> the side's duplicate runs in file order, each with the file of the earlier
        run it repeats and why (:data:`~speedrun.analysis.groups.DuplicateKind`): listed, never counted (as
        ``speedrun stats`` lists a group's ``duplicates``)."""
        return {side: tuple((r, orig, kind) for r, orig, kind in zip(g.runs, g.duplicate_of, g.duplicate_kind)
                            if orig is not None)
                for side, g in (("baseline", self.baseline), ("candidate", self.candidate))}

    def to_json(self) -> dict[str, Any]:
        """The comparison as JSON (``results/stats/compare/<candidate>.json``); times in seconds."""
        sp = self.speedup
        return strict_json({
            "baseline": self.baseline.name, "candidate": self.candidate.name, "alpha": self.alpha,
            "target": self.target, "n_baseline": self.val_loss.n_baseline, "n_candidate": self.val_loss.n_candidate,
            "steps_baseline": self.baseline.steps, "steps_candidate": self.candidate.steps,
            "val_loss": _test_json(self.val_loss, self.alpha),
            "train_time": {**_test_json(self.train_time, self.alpha), "unit": "s"},
            "speedup": None if sp is None else {"seconds": sp.difference, "percent": sp.percent,
                                                "baseline_mean_s": sp.baseline_mean,
                                                "candidate_mean_s": sp.candidate_mean},
            "z_rule": None if self.z_rules is None else {
                side: asdict(z) for side, z in zip(("baseline", "candidate"), self.z_rules)},
            "rules": [r.to_json() for r in self.rules],
            "rules_ok": rules_ok(self.rules),
            "warnings": list(self.warnings),
            "incomplete": {side: [{"file": r.file, "status": r.status, "last_step": r.last_step, "reason": r.reason}
                                  for r in runs] for side, runs in self.incomplete.items()},
            "duplicates": {side: [{"file": r.file, "duplicate_of": orig, "duplicate_kind": kind}
                                  for r, orig, kind in dups] for side, dups in self.duplicates.items()},
        })


def rules_ok(rules: Sequence[RuleCheck]) -> bool | None:
    """False when a rule is violated, None when none is but one could not be checked (``unknown``: e.g. a side
    without a counted run), True when every rule was checked and holds (``ok`` or ``note``)."""
    if any(r.status == "violation" for r in rules):
        return False
    return None if any(r.status == "unknown" for r in rules) else True


def _test_json(test: WelchTest, alpha: float) -> dict[str, Any]:
    out = asdict(test)
    out["significant"] = None if test.p_value is None else test.p_value < alpha
    return out


def compare_groups(baseline: Group, candidate: Group, alpha: float = DEFAULT_ALPHA,
                   target: float | None = None) -> Comparison:
    """Welch tests of ``candidate`` against ``baseline`` over their counted (complete, non-duplicate) runs, the
    z-rule of each side at ``target`` (when given) and the rules check. A train_time test that lacks times
    gives the counts as its ``reason`` (:func:`speedrun.analysis.tests.missing_times`)."""
    base, cand = baseline.counted, candidate.counted
    loss_b, loss_c = [r.val_loss for r in base], [r.val_loss for r in cand]
    time_b = [r.train_time_ms / 1000.0 for r in base if r.train_time_ms is not None]
    time_c = [r.train_time_ms / 1000.0 for r in cand if r.train_time_ms is not None]
    rules = check_rules(baseline, candidate, target)
    warnings = violations(rules)
    seen = {r.content_hash for r in base} | {r.curve_hash for r in base if r.curve_hash}
    shared = sum(1 for r in cand if r.content_hash in seen or r.curve_hash in seen)
    if shared:
        warnings.append(f"{shared} identical run(s) on both sides (same file or loss curve): the samples are not "
                        "independent")
    if len(time_b) < len(base) or len(time_c) < len(cand):
        warnings.append("some counted runs have no train_time (llm.c logs); train_time uses the others")
    train_time = welch_test(time_c, time_b, "less", "candidate mean train_time < baseline (faster)", CONFIDENCE)
    missing = missing_times({"baseline": len(base), "candidate": len(cand)},
                            {"baseline": len(time_b), "candidate": len(time_c)})
    if train_time.p_value is None and missing:       # not "n=0 ... complete runs": the runs are complete
        train_time = replace(train_time, reason=f"{missing}: a t-test needs at least 2 timed runs per sample")
    return Comparison(
        baseline=baseline, candidate=candidate, alpha=alpha, target=target,
        val_loss=welch_test(loss_c, loss_b, "less", "candidate mean val_loss < baseline", CONFIDENCE),
        train_time=train_time, speedup=speedup(time_b, time_c), rules=rules,
        z_rules=None if target is None else (z_rule(loss_b, target), z_rule(loss_c, target)),
        warnings=tuple(warnings))


def one_group(path: str, side: str, code_split: CodeSplit = "pool", only: Sequence[str] | None = None) -> Group:
    """The single group at ``path`` (``side`` names it in errors; ``code_split`` and ``only`` as in
    ``collect_runs``: with ``only``, just the files listed there).

    Raises:
        SpeedrunError: the path resolves to several groups (e.g. a directory split by step count) or none.
    """
    groups = collect_runs([path], code_split, only)
    if len(groups) != 1:
        names = ", ".join(g.name for g in groups)
        reason = groups[0].split_reason if groups else "no runs"
        raise SpeedrunError(f"{side} {path}: resolves to {len(groups)} groups ({names}; {reason}); "
                            "expected one: pass a directory whose runs share one step count and GPU count"
                            + (" and code version" if code_split == "split" else ""))
    return groups[0]
