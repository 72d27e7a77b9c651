"""Text and Markdown rendering of a candidate-vs-baseline comparison; computes nothing.

``speedrun compare`` prints :func:`comparison_text` and writes :func:`comparison_markdown`; a bundle's
candidate ``statistics.md`` ends with :func:`vs_baseline_lines`, the "vs baseline" table of the public records
(2026-05-20_BigramsSignTrick/pr299/statistics.md) with the Welch tests added.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Mapping, Sequence

from speedrun.analysis.groups import run_label
from speedrun.analysis.rules import PUBLIC_TARGET
from speedrun.analysis.tables import DASH, fmt, fmt_p, md_table, not_counted, status_counts, text_table
from speedrun.analysis.tests import WelchTest, ZRule

if TYPE_CHECKING:
    from speedrun.analysis.comparison import Comparison
    from speedrun.analysis.groups import Group
    from speedrun.analysis.logs import RunRecord

STATUS_MARK = {"ok": "ok", "violation": "**VIOLATION**", "note": "note", "unknown": "unknown"}


def n_cell(n: int, incomplete: Sequence["RunRecord"], duplicates: Sequence["RunRecord"] = ()) -> str:
    """Counted runs, and those left out by status, then the complete duplicates (an incomplete one is left out
    for its status already): ``3 (1 diverged, 1 duplicate not counted)``."""
    by_status = Counter(r.status for r in incomplete)
    left_out = status_counts(dict(sorted(by_status.items())))
    dups = sum(1 for r in duplicates if r.status == "complete")
    left_out += [f"{dups} duplicate{'s' * (dups != 1)}"] if dups else []
    return f"{n} ({', '.join(left_out)} not counted)" if left_out else str(n)


def comparison_rows(c: "Comparison") -> list[list[str]]:
    """Rows (quantity, baseline, candidate, difference [95% CI], test) of a comparison."""
    v, t = c.val_loss, c.train_time
    left_out = c.incomplete
    dups = {side: [r for r, _, _ in runs] for side, runs in c.duplicates.items()}
    return [
        ["n", n_cell(v.n_baseline, left_out["baseline"], dups["baseline"]),
         n_cell(v.n_candidate, left_out["candidate"], dups["candidate"]), DASH, DASH],
        ["val_loss mean ± std", f"{fmt(v.mean_baseline, 5)} ± {fmt(v.std_baseline, 5)}",
         f"{fmt(v.mean_candidate, 5)} ± {fmt(v.std_candidate, 5)}",
         f"{fmt(v.difference, 5)} [{fmt(v.ci_low, 5)}, {fmt(v.ci_high, 5)}]",
         f"H1: {v.hypothesis}: t={fmt(v.t_statistic, 3)} dof={fmt(v.dof, 1)} p={fmt_p(v.p_value)}"],
        ["train_time mean ± std (s)", f"{fmt(t.mean_baseline, 3)} ± {fmt(t.std_baseline, 3)}",
         f"{fmt(t.mean_candidate, 3)} ± {fmt(t.std_candidate, 3)}",
         f"{fmt(t.difference, 3)} [{fmt(t.ci_low, 3)}, {fmt(t.ci_high, 3)}]",
         f"H1: {t.hypothesis}: t={fmt(t.t_statistic, 3)} dof={fmt(t.dof, 1)} p={fmt_p(t.p_value)}"],
    ]


def welch_line(quantity: str, test: WelchTest, unit: str) -> str:
    """``train_time_s: diff=-0.9648s t=-30.571 dof=17.0 p=1.2e-16`` (what :mod:`speedrun.analysis.snippets`'s
    Welch snippet prints)."""
    return (f"{quantity}: diff={fmt(test.difference, 4)}{unit} t={fmt(test.t_statistic, 3)} dof={fmt(test.dof, 1)} "
            f"p={fmt_p(test.p_value)}")


def z_rule_text(side: str, z: ZRule) -> str:
    """``baseline z-rule: (3.28 - mean) * sqrt(n) = 0.0052 >= 0.004: passes``."""
    if z.value is None:
        return f"{side} z-rule: {DASH} (no counted run)"
    verdict = "passes" if z.passes else "fails"
    return (f"{side} z-rule: ({z.target:g} - mean) * sqrt(n) = {z.value:.4f} "
            f"{'>=' if z.passes else '<'} {z.margin:g}: {verdict}")


def z_rule_lines(c: "Comparison") -> list[str]:
    """The two sides' z-rule lines when the target is the public 3.28 (the rule's margin assumes its std)."""
    if c.z_rules is None or c.target != PUBLIC_TARGET:
        return []
    return [z_rule_text(side, z) for side, z in zip(("baseline", "candidate"), c.z_rules)]


def _notes(c: "Comparison") -> list[str]:
    sp = c.speedup
    notes = [f"speedup: {fmt(sp.difference, 3)} s ({fmt(sp.percent, 2)}% of the baseline's mean train_time)"
             if sp else "speedup: – (a side has no train_time)"]
    notes += [f"{name}: no p-value: {w.reason}" for name, w in (("val_loss", c.val_loss), ("train_time", c.train_time))
              if w.reason]
    notes += z_rule_lines(c)
    notes += [f"warning: {w}" for w in c.warnings]
    return notes


def not_counted_lines(c: "Comparison") -> list[str]:
    """``not counted: <side>: <statuses>: <file> (<reasons>)`` for each run of each side left out of n, once, in
    log order (:func:`speedrun.analysis.tables.not_counted`): ``diverged: <file> (<reason>)``, ``duplicate:
    <file> (identical file, same as <file>)``, or for a copy of a diverged log ``diverged, duplicate: <file>
    (<reason>; identical file, same as <file>)`` (the console's form of ``speedrun stats``'s notes; the
    Markdown has a table, :func:`incomplete_rows`)."""
    return [f"not counted: {side}: {statuses}: {r.file} ({reasons})"
            for side, g in _sides(c) for r, statuses, reasons in not_counted(g)]


def incomplete_rows(c: "Comparison") -> list[list[str]]:
    """(side, run, status, last step, reason) rows of the runs not counted, once each, in log order, as
    ``statistics.md`` lists them: an incomplete run's status and reason, a duplicate's ``duplicate`` and
    ``<why>, same as <run>``, both joined for an incomplete duplicate."""
    def last(r: "RunRecord") -> str:
        return DASH if r.last_step is None else str(r.last_step)

    return [[side, run_label(r.file), statuses, last(r), reasons]
            for side, g in _sides(c) for r, statuses, reasons in not_counted(g, run_label)]


def _sides(c: "Comparison") -> tuple[tuple[str, "Group"], ...]:
    return ("baseline", c.baseline), ("candidate", c.candidate)


def rules_rows(c: "Comparison") -> list[list[str]]:
    """(rule, status, detail) rows of the rules check."""
    return [[r.rule, STATUS_MARK[r.status], r.detail] for r in c.rules]


def comparison_text(c: "Comparison") -> str:
    """The console output of ``speedrun compare``."""
    header = ["", f"baseline {c.baseline.name}", f"candidate {c.candidate.name}", "difference [95% CI]",
              "Welch t-test (one-sided)"]
    return "\n".join(text_table(header, comparison_rows(c)) + [""] + _notes(c) + not_counted_lines(c)
                     + ["", "rules check:"]
                     + ["  " + line for line in text_table(["rule", "status", "detail"], rules_rows(c))])


def sides_lines(sides: Mapping[str, str]) -> list[str]:
    """``- baseline: <what it runs>`` and ``- candidate: ...`` for the sides ``sides`` describes."""
    return [f"- {side}: {sides[side]}" for side in ("baseline", "candidate") if sides.get(side)]


def comparison_markdown(c: "Comparison", sides: Mapping[str, str] | None = None) -> str:
    """``<candidate>.md``: the rule violations first, the Welch tests, differences with 95% CIs, the speedup,
    the z-rules, the runs not counted (diverged, failed, truncated; duplicates) and the rules check, with what
    each side runs when ``sides`` (``baseline``/``candidate`` -> one line) says."""
    lines = [f"# {c.candidate.name} vs {c.baseline.name}", ""]
    bad = [r for r in c.rules if r.status == "violation"]
    if bad:
        lines += [f"> **Warning: {len(bad)} rule(s) violated**: " + "; ".join(f"{r.rule} ({r.detail})" for r in bad)
                  + ". The comparison does not support a record claim.", ""]
    lines += ["Welch's unequal-variance t-tests (`scipy.stats.ttest_ind(candidate, baseline, equal_var=False, "
              "alternative=\"less\")`), one-sided in the stated direction; differences are candidate − baseline "
              f"with two-sided 95% Welch confidence intervals; alpha {c.alpha:g}. Only complete runs are counted.",
              ""]
    lines += md_table(["", "baseline", "candidate", "difference [95% CI]", "Welch t-test"], comparison_rows(c))
    lines += [""] + [f"- {n}" for n in _notes(c)]
    left_out = incomplete_rows(c)
    if left_out:
        lines += ["", "## Runs not counted", ""] + md_table(["side", "Run", "status", "last step", "reason"],
                                                             left_out)
    target = "not given" if c.target is None else f"{c.target:g}"
    lines += ["", "## Rules check", "", f"Target {target}; the public metric is 3.28 on 10,485,760 validation "
              "tokens.", ""] + md_table(["rule", "status", "detail"], rules_rows(c))
    if sides:
        lines += ["", "What each side runs:", ""] + sides_lines(sides)
    return "\n".join(lines) + "\n"


def vs_baseline_lines(c: "Comparison", baseline_title: str, candidate_title: str) -> list[str]:
    """The "vs baseline" section of a candidate's statistics.md (published layout plus the Welch tests)."""
    v, t = c.val_loss, c.train_time
    ms = (lambda x: None if x is None else x * 1000)
    rows = [["val_loss mean", fmt(v.mean_baseline, 5), fmt(v.mean_candidate, 5), fmt(v.difference, 5)],
            ["train_time mean (ms)", fmt(ms(t.mean_baseline), 1), fmt(ms(t.mean_candidate), 1),
             f"**{fmt(ms(t.difference), 1)}**"]]
    lines = ["", "## vs baseline", ""]
    lines += md_table(["", f"{baseline_title} (n={v.n_baseline})", f"{candidate_title} (n={v.n_candidate})", "delta"],
                      rows)
    lines += ["", "One-sided Welch t-tests, H1: the candidate's mean is lower "
              "(`scipy.stats.ttest_ind(candidate, baseline, equal_var=False, alternative=\"less\")`):", "",
              "    " + welch_line("val_loss", v, ""), "    " + welch_line("train_time_s", t, "s")]
    bad = [r for r in c.rules if r.status == "violation"]
    if bad:
        lines += ["", "**Rules violated:** " + "; ".join(f"{r.rule}: {r.detail}" for r in bad) + "."]
    return lines
