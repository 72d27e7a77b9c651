"""The README.md of a submission bundle (``speedrun bundle``); computes nothing.

Its results table has the columns of the public records' READMEs (2026-01-26-UntieValueEmbeddings:
``Runs Time μ Time σ Time +/- Time p Loss μ Loss σ Loss +/- p``) plus the step count and the runs needed for
p < alpha; ``Time p`` is the one-sided Welch test of H1: the candidate is faster. A warning block first lists
every warning of the comparison (violated rules, runs identical on both sides, runs without a train_time). Then
the Welch lines, the rules check, and scipy snippets that print every figure of the table and both Welch lines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from speedrun.analysis.comparison_tables import STATUS_MARK, sides_lines, welch_line, z_rule_lines
from speedrun.analysis.groups import run_label
from speedrun.analysis.rules import violations
from speedrun.analysis.snippets import one_sample_snippet, welch_snippet
from speedrun.analysis.tables import DASH, fmt, fmt_p, md_table, p_cell, runs_needed_cell, status_counts, test_line

if TYPE_CHECKING:
    from speedrun.analysis.comparison import Comparison
    from speedrun.analysis.group_stats import GroupStats


def results_rows(base: "GroupStats", cand: "GroupStats", c: "Comparison",
                 titles: Mapping[str, str]) -> list[list[str]]:
    """One row per side: runs, steps, time μ/σ (s), time +/- and Welch p (candidate), loss μ/σ, loss +/-,
    p(mean < target), runs needed for p < alpha / for 80% power."""
    rows = []
    for side, s in (("baseline", base), ("candidate", cand)):
        t, v = s.train_time_s, s.val_loss
        is_cand = side == "candidate"
        rows.append([titles[side], str(v.n), str(s.group.steps or DASH), fmt(t.mean, 4), fmt(t.std, 4),
                     fmt(c.train_time.difference, 4) if is_cand else DASH,
                     fmt_p(c.train_time.p_value) if is_cand else DASH,
                     fmt(v.mean, 4), fmt(v.std, 4), fmt(c.val_loss.difference, 4) if is_cand else DASH,
                     p_cell(s), runs_needed_cell(s)])
    return rows


def not_a_record_reasons(cand: "GroupStats", c: "Comparison") -> list[str]:
    """Why the candidate would not make a record against this baseline (empty when it would): it must reach
    the target itself (p < alpha; "not decided" with the reason when its test cannot say: too few complete
    runs, no p-value), be faster than the baseline (Welch p < alpha; without a p-value the Welch test's
    reason, e.g. ``no train_time in 3 of 3 candidate runs``) and violate no rule."""
    reasons = []
    if cand.reaches_target is None:                  # no p-value, or too few runs to read it
        reasons.append(f"has not shown the target {cand.target:g}: not decided ({cand.p_value_note})")
    elif not cand.reaches_target:
        reasons.append(f"does not reach the target {cand.target:g} (p = {fmt_p(cand.test.p_value)})")
    p_time = c.train_time.p_value
    if p_time is None:                               # say why rather than "not faster (p = –)"
        reasons.append(f"is not compared for speed with the baseline ({c.train_time.reason})")
    elif not p_time < cand.alpha:
        reasons.append(f"is not faster than the baseline at p < {cand.alpha:g} (p = {fmt_p(p_time)})")
    if any(r.status == "violation" for r in c.rules):
        reasons.append("violates a rule (below)")
    return reasons


def _accounting(s: "GroupStats", side: str) -> str:
    """``- `side/`: 5 log(s), 3 counted, 1 diverged, 1 duplicate(s) counted once; ...``: every log once (a copy
    of a diverged log is among the diverged ones, not among the duplicates counted once)."""
    g = s.group
    parts = [f"{len(g.runs)} log(s)", f"{s.val_loss.n} counted"]
    parts += status_counts(s.incomplete)
    complete_duplicates = sum(1 for r, orig in zip(g.runs, g.duplicate_of)
                              if orig is not None and r.status == "complete")
    if complete_duplicates:
        parts.append(f"{complete_duplicates} duplicate(s) counted once")
    return f"- `{side}/`: " + ", ".join(parts) + "; `statistics.md` lists every run."


def _snippets(base: "GroupStats", cand: "GroupStats", c: "Comparison",
              titles: Mapping[str, str]) -> list[str]:
    """The Reproduce section: per side the one-sample t-test snippet (when it has a p-value), then the Welch
    snippets on train_time and on val_loss (when the README's line has a p-value), each headed by the exact line
    it prints (:mod:`speedrun.analysis.snippets`)."""
    lines = []
    for side, s in (("baseline", base), ("candidate", cand)):
        if s.test.p_value is None:
            continue
        counted = s.group.counted
        times = [r.train_time_ms / 1000.0 for r in counted if r.train_time_ms is not None]
        lines += ["", f"{titles[side]}, one-sample t-test; prints `{test_line(s)}`:", "", "```python",
                  *one_sample_snippet([r.val_loss for r in counted], times, s.target).splitlines(), "```"]
    sides = (("baseline", base), ("candidate", cand))
    times = {side: [r.train_time_ms / 1000.0 for r in s.group.counted if r.train_time_ms is not None]
             for side, s in sides}
    losses = {side: [r.val_loss for r in s.group.counted] for side, s in sides}
    for test, values, quantity, unit, title in (
            (c.train_time, times, "train_time_s", "s", "train_time (H1: the candidate is faster)"),
            (c.val_loss, losses, "val_loss", "", "val_loss (H1: the candidate's mean val_loss is lower)")):
        if test.p_value is None or min(len(v) for v in values.values()) < 2:
            continue                                 # the README prints dashes: nothing to reproduce
        lines += ["", f"Welch t-test on {title}; prints `{welch_line(quantity, test, unit)}`:", "", "```python",
                  *welch_snippet(values["baseline"], values["candidate"], quantity, unit).splitlines(), "```"]
    return lines


def warning_lines(c: "Comparison") -> list[str]:
    """The README's warning block: every warning of the comparison (``Comparison.warnings``, those that
    ``speedrun compare`` lists), the violated rules first in one line, then each other warning (runs identical
    on both sides, runs without a train_time) in its own; each a quoted paragraph followed by a blank line.
    Empty without warnings."""
    bad = [r for r in c.rules if r.status == "violation"]
    lines = []
    if bad:
        lines += [f"> **Warning: {len(bad)} rule(s) violated**: " + "; ".join(f"{r.rule} ({r.detail})" for r in bad)
                  + ".", ""]
    rule_warnings = set(violations(c.rules))
    for warning in c.warnings:
        if warning not in rule_warnings:
            lines += [f"> **Warning**: {warning}.", ""]
    return lines


def left_out_lines(left_out: Mapping[str, Sequence[tuple[str, str]]]) -> list[str]:
    """``- not bundled from `baseline/`: notes.md (not a training log or parsed-run .json: a .md file)``: per
    side, each file of the side's folder that is not a run, with why (``left_out``: side -> (file, reason))."""
    return [f"- not bundled from `{side}/`: " + "; ".join(f"{name} ({reason})" for name, reason in files)
            for side, files in left_out.items() if files]


def bundle_readme(title: str, base: "GroupStats", cand: "GroupStats", c: "Comparison",
                  titles: Mapping[str, str], left_out: Mapping[str, Sequence[tuple[str, str]]] | None = None,
                  sides: Mapping[str, str] | None = None) -> str:
    """The bundle's README.md (module docstring). ``left_out``: per side, the files of its folder that are not
    runs and were not copied, with why (:func:`left_out_lines`); ``sides``: what each side runs, after the rules
    check (:func:`~speedrun.analysis.comparison_tables.sides_lines`)."""
    target, alpha = cand.target, cand.alpha
    lines = [f"# {title}", ""]
    lines += warning_lines(c)
    reasons = not_a_record_reasons(cand, c)
    if reasons:
        lines += ["> **Not a record claim as it stands**: the candidate " + "; ".join(reasons) + ".", ""]
    lines += [f"Candidate `candidate/` against baseline `baseline/`: final val_loss of each complete run against "
              f"the target {target:g} (one-sided one-sample t-test, p < {alpha:g} with at least 3 runs; "
              "modded-nanogpt README, record rules) and train_time against the baseline (one-sided Welch t-test). "
              "Times are the `train_time` of each run's final `step:N/N val_loss` line, in seconds; std is the "
              "sample std (ddof=1).", "", "## Results", ""]
    header = ["", "Runs", "Steps", "Time μ (s)", "Time σ", "Time +/-", "Time p", "Loss μ", "Loss σ", "Loss +/-",
              f"p(mean<{target:g})", f"runs for p<{alpha:g} / {cand.power.power:.0%} power"]
    lines += md_table(header, results_rows(base, cand, c, titles))
    sp = c.speedup
    lines += ["", f"Speedup: {fmt(sp.difference, 4)} s ({fmt(sp.percent, 2)}%)." if sp else "Speedup: –.", "",
              "    " + welch_line("train_time_s", c.train_time, "s"),
              "    " + welch_line("val_loss", c.val_loss, "")]
    z_lines = [f"- {line}" for line in z_rule_lines(c)]
    lines += ([""] + z_lines if z_lines else []) + ["", "## Rules check", ""] + md_table(["rule", "status", "detail"],
                                                   [[r.rule, STATUS_MARK[r.status], r.detail] for r in c.rules])
    if sides:
        lines += ["", "What each side runs:", ""] + sides_lines(sides)
    lines += ["", "## Runs", "", _accounting(base, "baseline"), _accounting(cand, "candidate"),
              *left_out_lines(left_out or {}), "",
              "Counted runs: baseline " + ", ".join(run_label(r.file) for r in base.group.counted) + "; candidate "
              + ", ".join(run_label(r.file) for r in cand.group.counted) + "."]
    lines += ["", "## Reproduce"] + _snippets(base, cand, c, titles)
    return "\n".join(lines) + "\n"
