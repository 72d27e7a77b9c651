"""Stage ``compare``: a candidate group of runs against a baseline group (Welch t-tests, CIs, speedup).

``speedrun compare BASELINE CANDIDATE [--alpha 0.01] [--json-out FILE] [--markdown-out FILE]``

Each side is a path as in ``speedrun stats`` that must resolve to exactly one group. Tests (Welch 1947; the
record rules ask a candidate to be faster than the prior record, README L207-226, and the 2026-05-07 verifier
uses a one-sided Welch test on times):

* val_loss, H1: the candidate's mean val_loss is lower, ``ttest_ind(cand, base, equal_var=False,
  alternative="less")``;
* train_time (s), H1: the candidate is faster, same call on the times;
* the differences candidate - baseline with two-sided 95% Welch confidence intervals, and the speedup
  (baseline mean - candidate mean, s and % of the baseline).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from typing import Any

from speedrun.analysis.groups import Group, collect_runs
from speedrun.analysis.tests import Speedup, WelchTest, speedup, welch_test
from speedrun.atomic import write_json, write_text
from speedrun.errors import SpeedrunError
from speedrun.stats import DEFAULT_ALPHA, strict_json

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Comparison:
    """Candidate against baseline: Welch tests on val_loss (nats/token) and train_time (s), and the speedup (s).

    ``warnings`` flags what makes the comparison doubtful (different GPU counts, runs without timing).
    """

    baseline: Group
    candidate: Group
    alpha: float
    val_loss: WelchTest
    train_time: WelchTest
    speedup: Speedup | None
    warnings: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The comparison as JSON (``comparison.json``); times in seconds."""
        sp = self.speedup
        return strict_json({
            "baseline": self.baseline.name, "candidate": self.candidate.name, "alpha": self.alpha,
            "n_baseline": self.val_loss.n_baseline, "n_candidate": self.val_loss.n_candidate,
            "steps_baseline": self.baseline.steps, "steps_candidate": self.candidate.steps,
            "val_loss": _test_json(self.val_loss, self.alpha),
            "train_time": {**_test_json(self.train_time, self.alpha), "unit": "s"},
            "speedup": None if sp is None else {"seconds": sp.difference, "percent": sp.percent,
                                                "baseline_mean_s": sp.baseline_mean,
                                                "candidate_mean_s": sp.candidate_mean},
            "warnings": list(self.warnings),
        })


def _test_json(test: WelchTest, alpha: float) -> dict[str, Any]:
    out = asdict(test)
    out["significant"] = None if test.p_value is None else test.p_value < alpha
    return out


def compare_groups(baseline: Group, candidate: Group, alpha: float = DEFAULT_ALPHA) -> Comparison:
    """Welch tests of ``candidate`` against ``baseline`` over their counted (complete, non-duplicate) runs."""
    base, cand = baseline.counted, candidate.counted
    loss_b, loss_c = [r.val_loss for r in base], [r.val_loss for r in cand]
    time_b = [r.train_time_ms / 1000.0 for r in base if r.train_time_ms is not None]
    time_c = [r.train_time_ms / 1000.0 for r in cand if r.train_time_ms is not None]
    warnings = []
    if baseline.gpu_count != candidate.gpu_count:
        warnings.append(f"GPU counts differ (baseline {baseline.gpu_count}, candidate {candidate.gpu_count}): "
                        "train_time is not comparable")
    shared = {r.content_hash for r in base} & {r.content_hash for r in cand}
    if shared:
        warnings.append(f"{len(shared)} identical run(s) on both sides: the samples are not independent")
    if len(time_b) < len(base) or len(time_c) < len(cand):
        warnings.append("some counted runs have no train_time (llm.c logs); train_time uses the others")
    return Comparison(
        baseline=baseline, candidate=candidate, alpha=alpha,
        val_loss=welch_test(loss_c, loss_b, "less", "candidate mean val_loss < baseline", CONFIDENCE),
        train_time=welch_test(time_c, time_b, "less", "candidate mean train_time < baseline (faster)", CONFIDENCE),
        speedup=speedup(time_b, time_c), warnings=tuple(warnings))


def one_group(path: str, side: str) -> Group:
    """The single group at ``path`` (``side`` names it in errors).

    Raises:
        SpeedrunError: the path resolves to several groups (e.g. a directory split by step count) or none.
    """
    groups = collect_runs([path])
    if len(groups) != 1:
        names = ", ".join(g.name for g in groups)
        reason = groups[0].split_reason if groups else "no runs"
        raise SpeedrunError(f"{side} {path}: resolves to {len(groups)} groups ({names}; {reason}); "
                            "expected one: pass a directory whose runs share one step count and GPU count")
    return groups[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("baseline", metavar="BASELINE", help="baseline runs: a directory, a log or a parsed-run .json")
    parser.add_argument("candidate", metavar="CANDIDATE", help="candidate runs, as BASELINE")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help=f"significance level of the one-sided tests (default {DEFAULT_ALPHA})")
    parser.add_argument("--json-out", metavar="FILE", help="also write the comparison as JSON to FILE")
    parser.add_argument("--markdown-out", metavar="FILE", help="also write the comparison as Markdown to FILE")
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the table")


def main(args: argparse.Namespace) -> int:
    from speedrun.analysis.tables import comparison_markdown, comparison_text

    if not 0 < args.alpha < 1:
        raise SpeedrunError(f"--alpha {args.alpha}: expected a level between 0 and 1")
    result = compare_groups(one_group(args.baseline, "BASELINE"), one_group(args.candidate, "CANDIDATE"),
                            args.alpha)
    if args.json_out:
        write_json(args.json_out, result.to_json())
    if args.markdown_out:
        write_text(args.markdown_out, comparison_markdown(result))
    print(json.dumps(result.to_json(), indent=2) if args.json else comparison_text(result))
    return 0
