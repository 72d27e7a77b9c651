"""Text and Markdown rendering of the group statistics; computes nothing.

``statistics.md`` follows the public records' layout (2026-05-20_BigramsSignTrick/{baseline,pr299}/
statistics.md): a run table (Run, val_loss, train_time) and a summary table (mean, std, min, max), then the
exact test with its one-line output, the runs needed for p < alpha, a scipy snippet that prints that line, the
runs' provenance, and the runs that were not counted. Comparisons: :mod:`speedrun.analysis.comparison_tables`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from speedrun.analysis.groups import Group, run_label
from speedrun.analysis.snippets import one_sample_snippet
from speedrun.support.phases import PHASES, other_seconds, overhead_seconds

if TYPE_CHECKING:
    from speedrun.analysis.group_stats import GroupStats
    from speedrun.analysis.logs import RunRecord

DASH = "–"


def not_counted(group: Group, label: Callable[[str], str] = str) -> list[tuple["RunRecord", str, str]]:
    """``(run, statuses, reasons)`` for each run of ``group`` left out of n, once, in log (file) order: an
    incomplete run's status and ``reason``, a duplicate's ``duplicate`` and ``<why>, same as <label(run)>``,
    both for an incomplete duplicate (a byte copy of a diverged log): ``("diverged, duplicate",
    "<reason>; identical file, same as <run>")``. What ``speedrun stats`` and ``speedrun compare`` list."""
    out = []
    for run, orig, kind in zip(group.runs, group.duplicate_of, group.duplicate_kind):
        statuses = [run.status] if run.status != "complete" else []
        reasons = [run.reason or DASH] if statuses else []
        if orig is not None:
            statuses.append("duplicate")
            reasons.append(f"{kind}, same as {label(orig)}")
        if statuses:
            out.append((run, ", ".join(statuses), "; ".join(reasons)))
    return out


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


def p_cell(s: "GroupStats") -> str:
    """The p-value as tables show it: never bare when there are too few runs or it is undefined."""
    note = s.p_value_note
    return f"{fmt_p(s.test.p_value)} ({note})" if note else fmt_p(s.test.p_value)


def runs_needed_cell(s: "GroupStats") -> str:
    """``runs for p<alpha / for 80% power``, or a dash when undefined."""
    pw = s.power
    if pw.runs_needed is None:
        return DASH
    return f"{pw.runs_needed} / {DASH if pw.runs_for_power is None else pw.runs_for_power}"


def test_line(s: "GroupStats") -> str:
    """One line: ``n=13 val_loss=3.2789±0.0014 t=-2.815 p(mean<3.28)=0.007803 time=77.34±0.20s``."""
    v, t, time = s.val_loss, s.test, s.train_time_s
    return (f"n={v.n} val_loss={fmt(v.mean, 4)}±{fmt(v.std, 4)} t={fmt(t.t_statistic, 3)} "
            f"p(mean<{s.target:g})={fmt_p(t.p_value)} time={fmt(time.mean, 2)}±{fmt(time.std, 2)}s")


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of a whitespace-aligned table."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    return ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in (header, *rows)]


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Lines of a Markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(str(x) for x in row) + " |" for row in rows]


def status_counts(by_status: Mapping[str, int]) -> list[str]:
    """``["1 diverged", "2 failed"]``: each status with its run count, in the mapping's order."""
    return [f"{k} {status}" for status, k in by_status.items()]


def stats_table(results: Sequence["GroupStats"]) -> str:
    """The console table of ``speedrun stats``: one row per group, then notes (splits, incomplete runs...,
    and the skipped files that look like logs or parsed runs: :func:`skipped_notes`)."""
    target = results[0].target if results else 0.0
    alpha = results[0].alpha if results else 0.0
    power = results[0].power.power if results else 0.0
    header = ["group", "n", "steps", "val_loss mean ± std", f"p(mean<{target:g})",
              f"runs for p<{alpha:g} / {power:.0%} power", "time mean ± std (s)", "incomplete"]
    rows = []
    for s in results:
        incomplete = ", ".join(status_counts(s.incomplete)) or DASH
        rows.append([s.group.name, str(s.val_loss.n), str(s.group.steps or DASH),
                     f"{fmt(s.val_loss.mean, 4)} ± {fmt(s.val_loss.std, 4)}", p_cell(s), runs_needed_cell(s),
                     f"{fmt(s.train_time_s.mean, 2)} ± {fmt(s.train_time_s.std, 2)}", incomplete])
    return "\n".join(text_table(header, rows) + _notes(results))


def _notes(results: Sequence["GroupStats"]) -> list[str]:
    notes, splits = [], set()
    for s in results:
        g = s.group
        if g.split_reason and g.split_reason not in splits:
            splits.add(g.split_reason)
            notes.append(f"split: {g.split_reason}")
        if s.power.reason and s.val_loss.n >= 2:
            notes.append(f"{g.name}: runs needed: {s.power.reason}")
        notes += [_not_counted_note(g, run, statuses, reasons) for run, statuses, reasons in not_counted(g)]
        notes += [f"{g.name}: warning: {w}" for w in g.warnings()]
    notes += skipped_notes(results)
    return [""] + notes if notes else []


def _not_counted_note(g: Group, run: "RunRecord", statuses: str, reasons: str) -> str:
    """``g: diverged: <file> (<reason>)``; a complete duplicate ``g: duplicate (<why>), counted once: <file> =
    <run>``; an incomplete duplicate ``g: diverged, duplicate: <file> (<reason>; <why>, same as <run>)``."""
    if run.status == "complete":
        orig, kind = g.duplicates[run.file], g.duplicate_kinds[run.file]
        return f"{g.name}: duplicate ({kind}), counted once: {run.file} = {orig}"
    return f"{g.name}: {statuses}: {run.file} ({reasons})"


LOG_SUFFIXES = (".txt", ".log")
NOTED_SUFFIXES = LOG_SUFFIXES + (".json",)  # skipped files the console names: logs and parsed runs


def noted_skips(group: Group) -> list[tuple[str, str]]:
    """(file, reason) of each skipped file of ``group`` that looks like a log (``.txt``/``.log``, also
    compressed, e.g. ``.txt.gz``) or a parsed run (``.json``: a corrupt one would otherwise lower n unseen);
    README.md, statistics.md and the CSVs beside parsed runs are left out."""
    return [(file, reason or "not a training log or parsed-run .json")
            for file, reason in zip(group.skipped, group.skip_reasons)
            if any(x.lower() in NOTED_SUFFIXES for x in Path(file).suffixes)]


def skipped_notes(results: Sequence["GroupStats"]) -> list[str]:
    """``skipped: <path>: <reason>`` for each of :func:`noted_skips`, once even when its directory was split
    into several groups."""
    seen: dict[str, str] = {}
    for s in results:
        for file, reason in noted_skips(s.group):
            seen.setdefault(file, reason)
    return [f"skipped: {file}: {reason}" for file, reason in seen.items()]


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


def statistics_markdown(s: "GroupStats", title: str | None = None, extra: Sequence[str] = ()) -> str:
    """``statistics.md`` of one group (module docstring); ``title`` replaces the group name in the heading and
    ``extra`` Markdown lines (a "vs baseline" section) go after the test."""
    g = s.group
    steps = f", step {g.steps}/{g.steps}" if g.steps else ""
    n = s.val_loss.n
    lines = [f"# {title or g.name} statistics", "", f"{n} complete run{'s' * (n != 1)}{steps}.", ""]
    if g.split_reason:
        lines += [f"Split: {g.split_reason}.", ""]
    lines += md_table(["Run", "val_loss", "train_time"], [
        [run_label(r.file), fmt_loss(r.val_loss), DASH if r.train_time_ms is None else f"{r.train_time_ms:.0f}ms"]
        for r in g.counted])
    lines += ["", "## Summary", ""] + md_table(["", "mean", "std", "min", "max"], _summary_rows(s))
    lines += ["", _p_sentence(s), "", _power_sentence(s), "", "## Test", "",
              f"One-sided one-sample t-test, H1: {s.test.hypothesis} "
              f"(`scipy.stats.ttest_1samp(val_loss, {s.target:g}, alternative=\"less\")`), alpha {s.alpha:g}:",
              "", "    " + test_line(s), "", _verdict(s)]
    lines += _snippet(s) + list(extra) + _provenance(s) + _md_incomplete(s)
    return "\n".join(lines) + "\n"


def _p_sentence(s: "GroupStats") -> str:
    if s.test.p_value is None:
        return f"p(val_loss < {s.target:g}): none ({s.p_value_note})"
    if s.too_few_runs:
        return f"p(val_loss < {s.target:g}) = {fmt_p(s.test.p_value)} ({s.p_value_note}: not evidence either way)"
    return f"p(val_loss < {s.target:g}) = **{fmt_p(s.test.p_value)}**"


def _power_sentence(s: "GroupStats") -> str:
    pw = s.power
    if pw.runs_needed is None:
        return f"Runs needed for p < {s.alpha:g}: none ({pw.reason})."
    planned = DASH if pw.runs_for_power is None else str(pw.runs_for_power)
    return (f"Runs needed for p < {s.alpha:g}: **{pw.runs_needed}** (a group of that many runs with exactly this "
            f"mean and std would pass; {s.val_loss.n} counted), **{planned}** for {pw.power:.0%} power "
            f"(noncentral t, this mean and std taken as the truth; power with {s.val_loss.n} runs: "
            f"{pw.power_now:.0%}).")


def _verdict(s: "GroupStats") -> str:
    if s.val_loss.n == 0:   # no run to test: say why, as the report's verdict does
        left_out = ", ".join(status_counts(s.incomplete))
        return f"No verdict: no complete runs ({left_out})." if left_out else "No verdict: no complete runs."
    if s.test.p_value is None:
        return f"No p-value: {s.test.reason}."
    if s.too_few_runs:
        return f"No verdict: {s.p_value_note}."
    if s.reaches_target:
        return f"Mean val_loss is below {s.target:g} at p < {s.alpha:g}."
    return f"Mean val_loss below {s.target:g} is not shown at p < {s.alpha:g}."


def _snippet(s: "GroupStats") -> list[str]:
    if s.test.p_value is None:
        return []
    counted = s.group.counted
    times = [r.train_time_ms / 1000.0 for r in counted if r.train_time_ms is not None]
    code = one_sample_snippet([r.val_loss for r in counted], times, s.target)
    return ["", "Reproduce with scipy:", "", "```python", *code.splitlines(), "```"]


PROVENANCE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("seed", "seed"), ("git_commit", "git commit"), ("config_sha256", "config sha256"),
    ("train_data_sha256", "train data sha256"), ("val_data_sha256", "val data sha256"),
    ("val_tokens", "val_tokens"), ("world_size", "world size"), ("tokens_per_step", "tokens/step"),
    ("device", "device"), ("compile_s", "compile (s)"), ("python", "Python"), ("torch", "PyTorch"),
    ("cuda", "CUDA"), ("triton", "Triton"),
)


def provenance_cell(run: Mapping[str, Any], key: str) -> str | None:
    """One provenance value of a run (a parsed-run JSON object) as a table shows it, ``None`` when unknown.

    Hashes are cut to 12 hex digits, the commit to 10 (``+dirty`` when ``git_dirty``); ``device`` falls
    back to ``<gpu> x <gpu_count>`` (public logs); versions come from ``versions``.
    """
    if key in ("python", "torch", "cuda", "triton"):
        return (run.get("versions") or {}).get(key)
    value = run.get(key)
    if key == "device" and value is None and run.get("gpu"):
        value = f"{run['gpu']} x {run.get('gpu_count') or '?'}"
    if value is None:
        return None
    if key == "git_commit":
        return str(value)[:10] + ("+dirty" if run.get("git_dirty") else "")
    if key.endswith("sha256"):
        return str(value)[:12]
    if key == "compile_s":
        return f"{value:.1f}"
    return str(value)


def provenance_table(runs: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> list[str]:
    """Markdown lines of the provenance table (one row per run, ``labels`` naming them); columns that no run
    records are left out. Empty when no run records anything."""
    columns = [(k, h) for k, h in PROVENANCE_COLUMNS if any(provenance_cell(r, k) is not None for r in runs)]
    if not columns:
        return []
    rows = [[label] + [provenance_cell(r, k) or DASH for k, _ in columns] for r, label in zip(runs, labels)]
    return md_table(["Run"] + [h for _, h in columns], rows)


# The run-time table's phase columns: the phases besides training and compile, which have their own columns.
_OVERHEAD_PHASES = tuple(p for p in PHASES if p not in ("training", "compile"))


def run_time_table(runs: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> list[str]:
    """Markdown lines of where each run's wall time went (seconds; parsed-run JSON objects with their
    ``phases_s``, docs/formats.md "Parsed run"): ``wall``, ``train_time``, ``compile``, the overhead
    (``wall - training - compile``: :func:`speedrun.support.phases.overhead_seconds`), then the overhead's
    parts (the other phases, ``validation`` with its count) and ``other`` (what no phase covers). One row per
    run that has phases, ``labels`` naming them; empty when none has (logs written before the ``phases:`` line,
    public logs)."""
    rows = []
    for run, label in zip(runs, labels):
        seconds = run.get("phases_s")
        if not seconds:
            continue
        parts = [f"{seconds.get(p, 0.0):.2f}" for p in _OVERHEAD_PHASES]
        count = run.get("validations")
        parts[_OVERHEAD_PHASES.index("validation")] += f" ({count})" if count is not None else ""
        rows.append([label, f"{seconds['wall']:.2f}", f"{seconds.get('training', 0.0):.2f}",
                     f"{seconds.get('compile', 0.0):.2f}", f"**{overhead_seconds(seconds):.2f}**", *parts,
                     f"{other_seconds(seconds):.2f}"])
    if not rows:
        return []
    header = ["Run", "wall", "train_time", "compile", "overhead",
              *(f"{p} (n)" if p == "validation" else p for p in _OVERHEAD_PHASES), "other"]
    return md_table(header, rows)


def _provenance(s: "GroupStats") -> list[str]:
    runs = s.group.runs
    table = provenance_table([r.to_json() for r in runs], [run_label(r.file) for r in runs])
    versions = s.group.code_versions
    code = ["Code versions (code_hash): " + ", ".join(f"`{h[:12]}` x{k}" for h, k in versions.items()) + "."] \
        if versions else []
    flags = Counter(r.compile_flags for r in s.group.counted if r.compile_flags is not None)
    code += ["Compile settings: " + "; ".join(
        (", ".join(f"`{f}`" for f in fl) or "none") + f" x{k}" for fl, k in flags.most_common()) + "."] if flags else []
    if not table and not code:
        return []
    paragraphs = [line for c in code for line in (c, "")][:-1]
    return ["", "## Provenance", ""] + paragraphs + ([""] if code and table else []) + table


def _md_incomplete(s: "GroupStats") -> list[str]:
    g = s.group
    lines = []
    incomplete = [(r, statuses, reasons) for r, statuses, reasons in not_counted(g, run_label)
                  if r.status != "complete"]      # an incomplete duplicate here, with both reasons
    if incomplete:
        lines += ["", "## Runs not counted", ""] + md_table(["Run", "status", "last step", "reason"], [
            [run_label(r.file), statuses, r.last_step if r.last_step is not None else DASH, reasons]
            for r, statuses, reasons in incomplete])
    complete_dups = [(r.file, orig) for r, orig in zip(g.runs, g.duplicate_of)
                     if orig is not None and r.status == "complete"]
    if complete_dups:
        kinds = g.duplicate_kinds
        lines += ["", "## Duplicates (counted once)", ""] + md_table(
            ["Run", "same as", "why"], [[f, orig, kinds[f]] for f, orig in complete_dups])
    warnings = g.warnings()
    if warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in warnings]
    return lines
