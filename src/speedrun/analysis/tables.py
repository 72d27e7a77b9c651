"""Text and Markdown rendering of the statistics records; computes nothing.

``statistics.md`` follows the public records' layout (2026-05-20_BigramsSignTrick/{baseline,pr299}/
statistics.md): a run table (Run, val_loss, train_time) and a summary table (mean, std, min, max), then the
exact test with its one-line output, and the runs that were not counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from speedrun.analysis.groups import run_label

if TYPE_CHECKING:
    from speedrun.compare import Comparison
    from speedrun.stats import GroupStats

DASH = "–"


def fmt(x: float | None, digits: int) -> str:
    """``x`` with ``digits`` decimals, or a dash for a missing value."""
    return DASH if x is None else f"{x:.{digits}f}"


def fmt_p(p: float | None) -> str:
    """A p-value with 4 significant digits (``0.007803``, ``4.7e-05``), or a dash."""
    return DASH if p is None else f"{p:.4g}"


def fmt_loss(x: float | None) -> str:
    """A val_loss as logged: 4 decimals, more when the log had more (llm.c prints 6)."""
    if x is None:
        return DASH
    return f"{x:.4f}" if round(x, 4) == x else repr(x)


def test_line(s: "GroupStats") -> str:
    """One line: ``n=13 val_loss=3.2789±0.0014 t=-2.815 p(mean<3.28)=0.007803 time=77.34±0.20s``."""
    v, t, time = s.val_loss, s.test, s.train_time_s
    return (f"n={v.n} val_loss={fmt(v.mean, 4)}±{fmt(v.std, 4)} t={fmt(t.t_statistic, 3)} "
            f"p(mean<{s.target:g})={fmt_p(t.p_value)} time={fmt(time.mean, 2)}±{fmt(time.std, 2)}s")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    return ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in (header, *rows)]


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(str(x) for x in row) + " |" for row in rows]


def stats_table(results: Sequence["GroupStats"]) -> str:
    """The console table of ``speedrun stats``: one row per group, then notes (splits, incomplete runs...)."""
    target = results[0].target if results else 0.0
    header = ["group", "n", "steps", "val_loss mean ± std", f"p(mean<{target:g})", "time mean ± std (s)",
              "incomplete"]
    rows = []
    for s in results:
        incomplete = ", ".join(f"{k} {status}" for status, k in s.incomplete.items()) or DASH
        rows.append([s.group.name, str(s.val_loss.n), str(s.group.steps or DASH),
                     f"{fmt(s.val_loss.mean, 4)} ± {fmt(s.val_loss.std, 4)}", fmt_p(s.test.p_value),
                     f"{fmt(s.train_time_s.mean, 2)} ± {fmt(s.train_time_s.std, 2)}", incomplete])
    return "\n".join(_table(header, rows) + _notes(results))


def _notes(results: Sequence["GroupStats"]) -> list[str]:
    notes, splits = [], set()
    for s in results:
        g = s.group
        if g.split_reason and g.split_reason not in splits:
            splits.add(g.split_reason)
            notes.append(f"split: {g.split_reason}")
        if s.test.reason:
            notes.append(f"{g.name}: no p-value: {s.test.reason}")
        notes += [f"{g.name}: {r.status}: {r.file} ({r.reason})" for r in g.runs if r.status != "complete"]
        notes += [f"{g.name}: duplicate, counted once: {f} = {orig}" for f, orig in g.duplicates.items()]
        notes += [f"{g.name}: warning: {w}" for w in g.warnings()]
    return [""] + notes if notes else []


def _summary_rows(s: "GroupStats") -> list[list[str]]:
    v = s.val_loss
    counted = s.group.counted
    times = [r.train_time_ms for r in counted if r.train_time_ms is not None]
    t = s.train_time_s
    rows = [["val_loss", fmt(v.mean, 5), fmt(v.std, 5), fmt_loss(v.min), fmt_loss(v.max)]]
    if times:
        rows.append(["train_time (ms)", fmt(t.mean * 1000, 1), fmt(None if t.std is None else t.std * 1000, 1),
                     f"{min(times):.0f}", f"{max(times):.0f}"])
    return rows


def statistics_markdown(s: "GroupStats") -> str:
    """``statistics.md`` of one group (module docstring)."""
    g = s.group
    steps = f", step {g.steps}/{g.steps}" if g.steps else ""
    lines = [f"# {g.name} statistics", "", f"{s.val_loss.n} complete runs{steps}.", ""]
    if g.split_reason:
        lines += [f"Split: {g.split_reason}.", ""]
    lines += _md_table(["Run", "val_loss", "train_time"], [
        [run_label(r.file), fmt_loss(r.val_loss), DASH if r.train_time_ms is None else f"{r.train_time_ms:.0f}ms"]
        for r in g.counted])
    lines += ["", "## Summary", ""] + _md_table(["", "mean", "std", "min", "max"], _summary_rows(s))
    lines += ["", f"p(val_loss < {s.target:g}) = **{fmt_p(s.test.p_value)}**", "", "## Test", "",
              f"One-sided one-sample t-test, H1: {s.test.hypothesis} "
              f"(`scipy.stats.ttest_1samp(val_loss, {s.target:g}, alternative=\"less\")`), alpha {s.alpha:g}:",
              "", "    " + test_line(s), "", _verdict(s)]
    lines += _md_incomplete(s)
    return "\n".join(lines) + "\n"


def _verdict(s: "GroupStats") -> str:
    if s.test.p_value is None:
        return f"No p-value: {s.test.reason}."
    if s.reaches_target:
        return f"Mean val_loss is below {s.target:g} at p < {s.alpha:g}."
    return f"Mean val_loss below {s.target:g} is not shown at p < {s.alpha:g}."


def _md_incomplete(s: "GroupStats") -> list[str]:
    g = s.group
    lines = []
    incomplete = [r for r in g.runs if r.status != "complete"]
    if incomplete:
        lines += ["", "## Runs not counted", ""] + _md_table(["Run", "status", "last step", "reason"], [
            [run_label(r.file), r.status, r.last_step if r.last_step is not None else DASH, r.reason or DASH]
            for r in incomplete])
    if g.duplicates:
        lines += ["", "## Duplicates (identical files, counted once)", ""] + _md_table(
            ["Run", "same as"], [[f, orig] for f, orig in g.duplicates.items()])
    warnings = g.warnings()
    if warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in warnings]
    return lines


def comparison_rows(c: "Comparison") -> list[list[str]]:
    """Rows (quantity, baseline, candidate, difference [95% CI], test) of a comparison."""
    v, t = c.val_loss, c.train_time
    return [
        ["n", str(v.n_baseline), str(v.n_candidate), DASH, DASH],
        ["val_loss mean ± std", f"{fmt(v.mean_baseline, 5)} ± {fmt(v.std_baseline, 5)}",
         f"{fmt(v.mean_candidate, 5)} ± {fmt(v.std_candidate, 5)}",
         f"{fmt(v.difference, 5)} [{fmt(v.ci_low, 5)}, {fmt(v.ci_high, 5)}]",
         f"H1: {v.hypothesis}: t={fmt(v.t_statistic, 3)} dof={fmt(v.dof, 1)} p={fmt_p(v.p_value)}"],
        ["train_time mean ± std (s)", f"{fmt(t.mean_baseline, 3)} ± {fmt(t.std_baseline, 3)}",
         f"{fmt(t.mean_candidate, 3)} ± {fmt(t.std_candidate, 3)}",
         f"{fmt(t.difference, 3)} [{fmt(t.ci_low, 3)}, {fmt(t.ci_high, 3)}]",
         f"H1: {t.hypothesis}: t={fmt(t.t_statistic, 3)} dof={fmt(t.dof, 1)} p={fmt_p(t.p_value)}"],
    ]


def _comparison_notes(c: "Comparison") -> list[str]:
    sp = c.speedup
    notes = [f"speedup: {fmt(sp.difference, 3)} s ({fmt(sp.percent, 2)}% of the baseline's mean train_time)"
             if sp else "speedup: – (a side has no train_time)"]
    notes += [f"{name}: no p-value: {w.reason}" for name, w in (("val_loss", c.val_loss), ("train_time", c.train_time))
              if w.reason]
    notes += [f"warning: {w}" for w in c.warnings]
    return notes


def comparison_text(c: "Comparison") -> str:
    """The console output of ``speedrun compare``."""
    header = ["", f"baseline {c.baseline.name}", f"candidate {c.candidate.name}", "difference [95% CI]",
              "Welch t-test (one-sided)"]
    return "\n".join(_table(header, comparison_rows(c)) + [""] + _comparison_notes(c))


def comparison_markdown(c: "Comparison") -> str:
    """``comparison.md``: the Welch tests, differences with 95% CIs and the speedup."""
    lines = [f"# {c.candidate.name} vs {c.baseline.name}", "",
             "Welch's unequal-variance t-tests (`scipy.stats.ttest_ind(candidate, baseline, equal_var=False, "
             "alternative=\"less\")`), one-sided in the stated direction; differences are candidate − baseline "
             f"with two-sided 95% Welch confidence intervals; alpha {c.alpha:g}. Only complete runs are counted.",
             ""]
    lines += _md_table(["", "baseline", "candidate", "difference [95% CI]", "Welch t-test"], comparison_rows(c))
    lines += [""] + [f"- {n}" for n in _comparison_notes(c)]
    return "\n".join(lines) + "\n"
