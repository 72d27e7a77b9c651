"""The report's Markdown (``results/report/summary.md``) from the stages' JSON files; computes nothing.

Inputs are the objects of summary.json (docs/formats.md "Statistics"), of the compare stage's JSON files
("Comparison") and the parsed-run records ("Parsed run"). Older files without the newer keys (power, rules,
provenance) render with dashes.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Mapping, Sequence

import pandas as pd

from speedrun.analysis.comparison_tables import STATUS_MARK, sides_lines
from speedrun.analysis.groups import run_label
from speedrun.analysis.tables import DASH, md_table, provenance_table, run_time_table, status_counts
from speedrun.analysis.tests import missing_times


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    return f"{x:.{digits}f}"


def _fmt_p(p: Any) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return DASH
    return f"{p:.4g}"


def _p_cell(g: Mapping[str, Any]) -> str:
    note = g.get("p_value_note")
    if note is None and g.get("p_value") is None and g.get("n", 0) < 2:
        note = f"too few runs: n={g.get('n', 0)}"
    return f"{_fmt_p(g.get('p_value'))} ({note})" if note else _fmt_p(g.get("p_value"))


def _reaches(g: Mapping[str, Any], alpha: float) -> bool | None:
    if "reaches_target" in g:
        return g["reaches_target"]
    p = g.get("p_value")
    return None if p is None else p < alpha


def _verdict(g: Mapping[str, Any], alpha: float) -> str:
    value = _reaches(g, alpha)
    return DASH if value is None else ("yes" if value else "no")


def _runs_needed(g: Mapping[str, Any]) -> str:
    needed, planned = g.get("runs_needed"), g.get("runs_for_power")
    return DASH if needed is None else f"{needed} / {DASH if planned is None else planned}"


def warnings_lines(summary: Sequence[Mapping[str, Any]], comparisons: Sequence[Mapping[str, Any]]) -> list[str]:
    """Bullets of everything that weakens a claim: comparison warnings (violated rules first), group warnings
    and groups with too few runs."""
    out = [f"- {c['candidate']} vs {c['baseline']}: {w}" for c in comparisons for w in c.get("warnings", [])]
    out += [f"- {g['group']}: {w}" for g in summary for w in g.get("warnings", [])]
    out += [f"- {g['group']}: p-value not a verdict: {g['p_value_note']}" for g in summary if g.get("p_value_note")]
    return out


def variants_lines(summary: Sequence[Mapping[str, Any]], alpha: float) -> list[str]:
    """The per-variant statistics table."""
    power = next((g["power"] for g in summary if g.get("power")), 0.8)
    header = ["variant", "n", "steps", "val_loss mean", "val_loss std", "p(mean < target)", "reaches target",
              f"runs for p<{alpha:g} / {power:.0%} power", "train_time mean (s)", "train_time std (s)"]
    rows = [[g["group"], g["n"], g.get("steps", DASH), _fmt(g.get("val_loss_mean")), _fmt(g.get("val_loss_std")),
             _p_cell(g), _verdict(g, alpha), _runs_needed(g), _fmt(g.get("train_time_mean_s"), 2),
             _fmt(g.get("train_time_std_s"), 2)] for g in summary]
    return md_table(header, rows)


def untestable_side(c: Mapping[str, Any], side: str) -> str | None:
    """Why ``side`` (``baseline``/``candidate``) of comparison ``c`` gives no t-test, or ``None``: fewer than 2
    counted runs (``n_<side>``), with the runs not counted by status from ``incomplete`` when the file has it,
    e.g. ``no complete runs (1 diverged)``, ``only 1 complete run (1 failed), too few for a t-test``."""
    n = c.get(f"n_{side}")
    if n is None or n >= 2:
        return None
    by_status = Counter(r["status"] for r in (c.get("incomplete") or {}).get(side, []))
    left_out = ", ".join(status_counts(dict(sorted(by_status.items()))))
    why = f" ({left_out})" if left_out else ""
    return f"no complete runs{why}" if n == 0 else f"only 1 complete run{why}, too few for a t-test"


def speed_not_compared(c: Mapping[str, Any]) -> str:
    """Why comparison ``c`` has no train_time p-value although both sides have counted runs:
    ``speed not compared: no train_time in 3 of 3 candidate runs`` (counted ``n_<side>`` against the timed
    ``train_time.n_<side>``, :func:`speedrun.analysis.tests.missing_times`), else the test's ``reason``
    (``zero variance ...``), else that the file has no train_time test."""
    t = c.get("train_time") or {}
    sides = ("baseline", "candidate")
    counts = [c.get(f"n_{side}") for side in sides] + [t.get(f"n_{side}") for side in sides]
    if all(isinstance(n, int) for n in counts):
        missing = missing_times(dict(zip(sides, counts[:2])), dict(zip(sides, counts[2:])))
        if missing:
            return f"speed not compared: {missing}"
    reason = t.get("reason")
    return f"speed not compared: {reason}" if reason else "speed not compared: the comparison has no train_time test"


def comparison_verdict(c: Mapping[str, Any], reaches_target: bool | None, alpha: float) -> str:
    """Whether the candidate would make a record against this baseline (the record rules, speedrun-spec.md
    7): it reaches the target itself (``reaches_target``, its one-sample test), its train_time is lower with
    Welch p < ``alpha``, and no rule of the comparison is violated. Otherwise ``no:`` and every reason (no
    train_time p-value: why, :func:`speed_not_compared`, not ``not faster``); a side with fewer than 2
    counted runs (:func:`untestable_side`) replaces the tests it makes impossible:
    ``no: no complete runs (1 diverged)``, ``no: target not decided, baseline has no complete runs (2 failed)``."""
    reasons = []
    cand, base = untestable_side(c, "candidate"), untestable_side(c, "baseline")
    if cand:
        reasons.append(cand)
    elif not reaches_target:
        reasons.append("does not reach the target" if reaches_target is not None else "target not decided")
    p_time = (c.get("train_time") or {}).get("p_value")
    if base:
        reasons.append(f"baseline has {base}")
    elif not cand and p_time is None:
        reasons.append(speed_not_compared(c))
    elif not cand and not p_time < alpha:
        reasons.append(f"not faster (p={_fmt_p(p_time)})")
    if any(r["status"] == "violation" for r in c.get("rules", [])):
        reasons.append("rules violated")
    return "**yes**" if not reasons else "no: " + ", ".join(reasons)


def _rules_cell(rules: Sequence[Mapping[str, Any]]) -> str:
    """The rules column: how many are violated, else ``ok`` with how many could not be checked (``unknown``)."""
    status = Counter(r["status"] for r in rules)
    if status["violation"]:
        return f"**{status['violation']} violated**"
    if status["unknown"]:
        return "unknown" if status["unknown"] == len(rules) else f"ok, {status['unknown']} unknown"
    return "ok"


def render_comparisons(comparisons: Sequence[Mapping[str, Any]],
                       summary: Sequence[Mapping[str, Any]] = (), alpha: float = 0.01) -> list[str]:
    """Table of the candidate-vs-baseline Welch tests with the verdict (:func:`comparison_verdict`; whether
    a candidate reaches the target comes from its group in ``summary``), then each candidate's rules
    check. The ``n counted (baseline / candidate)`` column gives both sides' counted runs, ``3 / 0``."""
    reaches = {g["group"]: _reaches(g, alpha) for g in summary}
    header = ["candidate", "n counted (baseline / candidate)", "Δ val_loss (cand − base) [95% CI]", "p (cand lower)",
              "Δ train_time s [95% CI]", "p (cand faster)", "speedup", "rules", "beats the baseline"]
    rows = []
    for c in comparisons:
        v, t = c["val_loss"], c["train_time"]
        speedup = c.get("speedup") or {}
        rules = DASH if "rules" not in c else _rules_cell(c["rules"])
        rows.append([c["candidate"], f"{c['n_baseline']} / {c['n_candidate']}",
                     f"{_fmt(v.get('difference'))} [{_fmt(v.get('ci_low'))}, {_fmt(v.get('ci_high'))}]",
                     _fmt_p(v.get("p_value")),
                     f"{_fmt(t.get('difference'), 2)} [{_fmt(t.get('ci_low'), 2)}, {_fmt(t.get('ci_high'), 2)}]",
                     _fmt_p(t.get("p_value")),
                     f"{_fmt(speedup.get('seconds'), 2)} s ({_fmt(speedup.get('percent'), 1)}%)", rules,
                     comparison_verdict(c, reaches.get(c["candidate"]), alpha)])
    lines = md_table(header, rows)
    for c in comparisons:
        if c.get("rules"):
            lines += ["", f"Rules check, {c['candidate']} against {c['baseline']}:", ""]
            lines += md_table(["rule", "status", "detail"],
                              [[r["rule"], STATUS_MARK.get(r["status"], r["status"]), r["detail"]] for r in c["rules"]])
        if c.get("runs"):
            lines += ["", "What each side runs:", ""] + sides_lines(c["runs"])
    return lines


def console_lines(summary: Sequence[Mapping[str, Any]], comparisons: Sequence[Mapping[str, Any]], target: float,
                  alpha: float) -> list[str]:
    """The verdicts in a few plain lines, for the terminal at the end of a workflow (``speedrun report`` prints
    them after the report's path): per variant its counted runs, mean ± std val_loss, the one-sample p-value
    and whether it reaches ``target`` (as the report's variants table), with its runs not counted by status
    (``incomplete``: status -> count, e.g. ``not counted: 1 diverged``); per
    candidate :func:`comparison_verdict` against its baseline, e.g. ``candidate against baseline: no: does not
    reach the target, not faster (p=0.4568)``."""
    reaches = {g["group"]: _reaches(g, alpha) for g in summary}
    lines = []
    for g in summary:
        verdict = {True: f"reaches the target {target:g}", False: f"does not reach the target {target:g}",
                   None: "target not decided"}[reaches[g["group"]]]
        if reaches[g["group"]] is False and g.get("runs_needed") is not None:
            verdict += f" ({g['runs_needed']} runs would, at this mean and std)"
        skipped = ", ".join(f"{n} {status}" for status, n in (g.get("incomplete") or {}).items() if n)
        line = (f"{g['group']}: {g.get('n', 0)} counted runs, val_loss {_fmt(g.get('val_loss_mean'))} ± "
                f"{_fmt(g.get('val_loss_std'))}, p={_p_cell(g)}: {verdict}")
        lines.append(line + (f"; not counted: {skipped}" if skipped else ""))
    lines += [f"{c['candidate']} against {c['baseline']}: "
              f"{comparison_verdict(c, reaches.get(c['candidate']), alpha).replace('**', '')}" for c in comparisons]
    return lines


def described_lines(described: Mapping[str, str], replicates: Sequence[str]) -> list[str]:
    """What each variant runs (``described``: variant -> one line), and which variants' seeds are replicates
    (script variants, whose script draws its own initialization)."""
    lines = [f"- {name}: {text}" for name, text in described.items()]
    if replicates:
        lines += ["", f"{', '.join(replicates)}: each seed is a replicate. A script variant runs a script of its "
                  "own, which draws its own initialization (the seed only names the run), so the spread between its "
                  "seeds is the script's run-to-run spread."]
    return lines


def _run_name(r: Any) -> str:
    """A run in the list of incomplete runs: ``variant seed S``, or ``variant <file>`` when the seed is unknown
    (public logs have none)."""
    if r.seed is None:
        return f"{r.variant} {r.file if isinstance(r.file, str) else 'run without seed or file'}"
    return f"{r.variant} seed {r.seed}"


def _seed_cell(seed: Any) -> str:
    """A run's seed in the run table (:func:`~speedrun.analysis.report_inputs.load_runs`' ints): the integer, or
    a dash when the log has none (public logs)."""
    return DASH if seed is None else str(seed)


def _duplicate_of(r: Any) -> str | None:
    """The log a run repeats (the ``duplicate_of`` column of
    :func:`speedrun.analysis.report_inputs.mark_counted`), or None."""
    of = getattr(r, "duplicate_of", None)
    return of if isinstance(of, str) and of else None


def _status_cell(r: Any) -> str:
    """A run's status, with ``duplicate of <run>`` for a complete run that repeats another's log."""
    of = _duplicate_of(r)
    return f"{r.status}, duplicate of {run_label(of)}" if of else r.status


def _steps_cell(r: Any) -> str:
    """A complete run's steps; where an incomplete one stopped, ``<last logged step> of <steps>``."""
    if r.status == "complete" or pd.isna(r.last_step):
        return str(r.steps)
    return f"{int(r.last_step)} of {r.steps}"


def runs_lines(runs: pd.DataFrame) -> list[str]:
    """The run table (a dash for an unknown seed; a duplicate marked in its status) and the runs not counted:
    incomplete ones and duplicates (named by seed, or by file when the seed is unknown)."""
    lines = md_table(["variant", "seed", "status", "val_loss", "train_time (s)", "steps"], [
        [r.variant, _seed_cell(r.seed), _status_cell(r), _fmt(r.val_loss), _fmt(r.train_time_s, 2), _steps_cell(r)]
        for r in runs.itertuples()])
    incomplete = [r for r in runs.itertuples() if r.status != "complete"]
    if incomplete:
        lines += ["", f"**{len(incomplete)} incomplete run(s)**, not counted: " + ", ".join(
            f"{_run_name(r)} ({r.status})" for r in incomplete)]
    duplicates = [r for r in runs.itertuples() if r.status == "complete" and _duplicate_of(r)]
    if duplicates:
        lines += ["", f"**{len(duplicates)} duplicate run(s)**, not counted: " + ", ".join(
            f"{_run_name(r)} (of {run_label(_duplicate_of(r))})" for r in duplicates)]
    return lines


def no_comparison_line(summary: Sequence[Mapping[str, Any]], baseline: str) -> str:
    """What the candidates section says without ``--comparisons``: with the baseline alone in the summary (an
    experiment of one variant), that there is no candidate; else that no comparison was given, and which groups
    besides ``baseline`` are therefore not tested against it."""
    others = [g["group"] for g in summary if g["group"] != baseline]
    if not others:
        return (f"The experiment has one variant, `{baseline}` (the baseline): no candidate to test against it; a "
                "second variant under `variants` in the config would be one.")
    return (f"No comparison was given (`--comparisons`: the .json files of `speedrun compare`): {', '.join(others)} "
            f"{'is' if len(others) == 1 else 'are'} not tested against the baseline.")


RUN_TIME_NOTE = ("Each run's process from its start to its log's `phases:` line (docs/formats.md \"Training log\"): "
                 "overhead = wall - train_time - compile, made of the phases after it (start-up with the imports, "
                 "device set-up, data, process group, model and optimizer builds, every validation, teardown) and "
                 "`other`, what no phase covers. The launcher's and torchrun's own time and the interpreter's exit "
                 "are outside wall.")


def render_summary(summary: Sequence[Mapping[str, Any]], comparisons: Sequence[Mapping[str, Any]],
                   runs: pd.DataFrame, baseline: str, target: float, alpha: float,
                   records: Sequence[Mapping[str, Any]] = (), described: Mapping[str, str] | None = None,
                   replicates: Sequence[str] = ()) -> str:
    """The report's Markdown: warnings, variant statistics (with what each variant runs, ``described``, and
    which variants' seeds are ``replicates``), candidate-vs-baseline tests and rules, the run table, the runs'
    wall time by phase (logs with a ``phases:`` line) and the runs' provenance (``records``: parsed-run records
    with their ``variant``)."""
    lines = ["# Speedrun experiment", "",
             f"Target val_loss {target}; a variant reaches it when the one-sided one-sample t-test of mean val_loss "
             f"< {target} gives p < {alpha} with at least 3 counted runs (`scipy.stats.ttest_1samp(x, {target}, "
             "alternative=\"less\")`, the public record rule). Runs needed: the smallest n at which a group with "
             "the observed mean and std would reach p < alpha, and the n that reaches it with 80% power. "
             "Incomplete runs (diverged, failed, truncated) and duplicates are listed and never counted in n.", ""]
    warnings = warnings_lines(summary, comparisons)
    if warnings:
        lines += ["## Warnings", ""] + warnings + [""]
    lines += ["## Variants", ""] + variants_lines(summary, alpha)
    if described or replicates:
        lines += ["", "What each variant runs:", ""] + described_lines(described or {}, replicates)
    lines += ["", f"## Candidates against the baseline ({baseline})", ""]
    lines += (render_comparisons(comparisons, summary, alpha) if comparisons
              else [no_comparison_line(summary, baseline)])
    lines += ["", "## Runs", ""] + runs_lines(runs)
    labels = [f"{r.get('variant', '')} {run_label(str(r.get('file', '')))}" for r in records]
    times = run_time_table(records, labels)
    if times:
        lines += ["", "## Run time (s)", "", RUN_TIME_NOTE, ""] + times
    table = provenance_table(records, labels)
    if table:
        lines += ["", "## Provenance", ""] + table
    return "\n".join(lines) + "\n"
