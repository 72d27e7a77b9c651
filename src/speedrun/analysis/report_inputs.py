"""The report's inputs, read and cross-checked: parsed runs, the stats stage's summary.json and the compare
stage's comparisons (docs/formats.md), so that the report's tables and plots never contradict its statistics.

* readers: :func:`read_record` / :func:`read_records` (parsed-run records, ``variant`` = their folder's name),
  :func:`read_summary`, :func:`read_comparison`, and :func:`load_runs` (the run table and the val_loss curves
  from each record's ``.csv``);
* checks: :func:`report_settings` (the target and alpha the summary was computed with), :func:`check_records`
  (the records are the summary's runs, each once), :func:`check_baseline` and :func:`check_comparison`;
* :func:`mark_counted` / :func:`counted`: which runs the statistics count (complete, not a duplicate).

Every refusal is one :class:`~speedrun.errors.SpeedrunError` naming the file, the value found and what was
expected. The ``speedrun report`` stage (:mod:`speedrun.report`) reads, checks, then renders
(:mod:`speedrun.analysis.report_tables`, :mod:`speedrun.analysis.report_plots`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from speedrun.analysis.group_stats import DEFAULT_ALPHA, check_alpha, check_target
from speedrun.errors import SpeedrunError
from speedrun.support.arguments import name_value_pairs


def _same(a: float, b: float) -> bool:
    """Whether two settings are the same number (a float written as JSON and read back, or typed twice)."""
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)


def _number(value: Any, what: str) -> float:
    """``value`` as a float, for a setting read from a JSON file (``what`` names the file and key in errors).

    Raises:
        SpeedrunError: it is not a number.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpeedrunError(f"{what}: {value!r} is not a number")
    return float(value)


def _summary_value(summary: Sequence[Mapping[str, Any]], key: str, path: Path) -> float | None:
    """The one ``key`` (``target``/``alpha``) of the summary's groups, ``None`` when no group records it.

    Raises:
        SpeedrunError: a value is not a number, or groups of the summary disagree on it (naming them and their
            values).
    """
    values = [(g["group"], _number(g[key], f"--summary {path}: group {g['group']}: {key}"))
              for g in summary if g.get(key) is not None]
    if any(not _same(v, values[0][1]) for _, v in values):
        raise SpeedrunError(f"--summary {path}: its groups disagree on {key} ("
                            + ", ".join(f"{name}: {v:g}" for name, v in values)
                            + "); expected one summary.json of one speedrun stats call")
    return values[0][1] if values else None


def report_settings(summary: Sequence[Mapping[str, Any]], path: Path, target: float | None,
                    alpha: float | None) -> tuple[float, float]:
    """The target val_loss (nats/token) and the significance level of the report: those that the stats of
    ``summary`` (read from ``path``) were computed with (every p-value, verdict and runs needed in it is at that
    target and level). A ``--target``/``--alpha`` given must be the same; one not given is the summary's. A
    summary of an older version without them takes the given values (alpha: 0.01 when not given either).

    Raises:
        SpeedrunError: a given value disagrees with the summary's (naming both and the file), is out of range
            (:func:`speedrun.analysis.group_stats.check_target`/``check_alpha``), or no target is given or recorded.
    """
    chosen = []
    for key, given, default in (("target", target, None), ("alpha", alpha, DEFAULT_ALPHA)):
        recorded = _summary_value(summary, key, path)
        if given is not None and recorded is not None and not _same(given, recorded):
            raise SpeedrunError(f"--{key} {given:g}: the statistics of --summary {path} were computed with {key} "
                                f"{recorded:g}, and their p-values and verdicts hold for that value only; expected "
                                f"--{key} {recorded:g} (or leave --{key} out), or run speedrun stats --{key} "
                                f"{given:g} again")
        value = next((v for v in (given, recorded, default) if v is not None), None)
        if value is None:
            raise SpeedrunError(f"--target: not given, and --summary {path} records none (a summary.json of an older "
                                "version); expected --target <val_loss>, the target speedrun stats was given")
        chosen.append(float(value))
    check_target(chosen[0])
    check_alpha(chosen[1])
    return chosen[0], chosen[1]


def _folder(name: str) -> str:
    """The last part of a group's path (``results/parse/baseline`` -> ``baseline``): the folder of its runs."""
    return Path(name).name


def _group_folder(g: Mapping[str, Any]) -> str:
    """The folder that a summary group's runs come from (``path``; the name for a file without it)."""
    return _folder(str(g.get("path") or g["group"]))


def check_records(paths: Sequence[Path], records: Sequence[Mapping[str, Any]],
                  summary: Sequence[Mapping[str, Any]], summary_path: Path) -> None:
    """Refuse ``--runs`` that do not describe the runs of the summary, so that the report's run table and plots
    show the runs its statistics count: a record given twice (the same file, or two records of one log with one
    content), a record whose folder (its variant) is no group's folder of the summary, a record that is not
    among its group's ``runs`` (by the log's path, ``file``) and a run of the summary that no record gives.
    Groups of an older summary without ``runs`` are checked by folder only.

    Raises:
        SpeedrunError: naming the record file(s) or the group, the summary file and what was expected.
    """
    seen_path: dict[str, Path] = {}
    seen_run: dict[tuple[Any, Any], Path] = {}
    for path, record in zip(paths, records):
        key = os.path.realpath(path)
        if key in seen_path:
            also = "" if str(seen_path[key]) == str(path) else f" (also as {seen_path[key]})"
            raise SpeedrunError(f"--runs {path}: given twice{also}; expected each run record once")
        seen_path[key] = path
        run = (record.get("file"), record.get("content_hash"))
        if run in seen_run:
            raise SpeedrunError(f"--runs {path}: the same run as {seen_run[run]} (the log {run[0]}, same content); "
                                "expected each run record once")
        seen_run[run] = path
    by_folder: dict[str, list[Mapping[str, Any]]] = {}
    for g in summary:
        by_folder.setdefault(_group_folder(g), []).append(g)
    listed = ", ".join(g["group"] for g in summary)
    expected = "expected the parsed runs that speedrun stats read to write this summary.json"
    given: dict[str, set[Any]] = {}
    for path, record in zip(paths, records):
        groups = by_folder.get(record["variant"])
        if not groups:
            raise SpeedrunError(f"--runs {path}: its variant {record['variant']!r} (the record's folder) is no group "
                                f"of --summary {summary_path} (its groups: {listed}); {expected}")
        files = _run_files(groups)
        if files is not None and record.get("file") not in files:
            raise SpeedrunError(f"--runs {path}: the run of {record.get('file')} is not among the runs of group "
                                f"{', '.join(g['group'] for g in groups)} of --summary {summary_path}; {expected} "
                                "(this summary.json may be of another experiment or other seeds)")
        if files is not None:
            differs = _differences(record, files[record.get("file")])
            if differs:
                raise SpeedrunError(f"--runs {path}: the run of {record.get('file')} differs from that run in group "
                                    f"{', '.join(g['group'] for g in groups)} of --summary {summary_path} ("
                                    f"{differs}); {expected} (a log of the same path in another experiment?)")
        given.setdefault(record["variant"], set()).add(record.get("file"))
    for folder, groups in by_folder.items():
        files = _run_files(groups)
        missing = [f for f in files or () if f not in given.get(folder, set())]
        if missing or folder not in given:
            what = f"its run {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "") \
                if missing else "its runs"
            raise SpeedrunError(f"--summary {summary_path}: group {', '.join(g['group'] for g in groups)} counts "
                                f"{what}, which no record of --runs gives; {expected}, all of them")


def _run_files(groups: Sequence[Mapping[str, Any]]) -> dict[Any, Mapping[str, Any]] | None:
    """``file`` -> run of every run of ``groups`` (summary.json's ``runs``), ``None`` when a group lacks the key."""
    if any("runs" not in g for g in groups):
        return None
    return {r.get("file"): r for g in groups for r in g["runs"]}


# What a summary.json run shares with the parsed-run record it was read from (docs/formats.md "Statistics", runs).
SAME_RUN_KEYS = ("status", "steps", "val_loss", "train_time_ms", "seed", "code_hash", "config_sha256")


def _differences(record: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """``val_loss 6.91 in the record, 6.9 in the summary`` for each of :data:`SAME_RUN_KEYS` that both have and
    that differs; empty when the record is that run."""
    return ", ".join(f"{key} {record[key]!r} in the record, {run[key]!r} in the summary" for key in SAME_RUN_KEYS
                     if key in record and key in run and record[key] != run[key])


def _group_named(name: str, summary: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The groups of ``summary`` called ``name``, else those whose folder is ``name``'s last part."""
    exact = [g for g in summary if g["group"] == name]
    return exact or [g for g in summary if _group_folder(g) == _folder(name)]


def check_baseline(baseline: str, summary: Sequence[Mapping[str, Any]],
                   summary_path: Path | str = "summary.json") -> str:
    """The summary group that ``--baseline`` names: by its name (``results/parse/baseline`` when speedrun stats
    ran at the project root, ``baseline`` in the workflow, which runs it in ``results/parse``) or by its
    folder's name (``baseline``). Returns the group's name.

    Raises:
        SpeedrunError: it names no group, or several (a folder split by step count), listing the group names.
    """
    groups = _group_named(baseline, summary)
    if len(groups) != 1:
        names = ", ".join(g["group"] for g in summary)
        what = "names no group" if not groups else f"names {len(groups)} groups"
        raise SpeedrunError(f"--baseline {baseline}: {what} of --summary {summary_path}; expected one of its "
                            f"groups: {names}")
    return groups[0]["group"]


def check_comparison(path: Path, c: dict[str, Any], summary: Sequence[Mapping[str, Any]], summary_path: Path,
                     baseline: str, target: float, alpha: float) -> dict[str, Any]:
    """Refuse a comparison that the report's tables would contradict: computed at another ``alpha`` or
    ``target`` than the summary's (a ``null`` target, compare without ``--target``, is fine), against another
    baseline than ``baseline``, or with a candidate that is no group of the summary. Returns ``c`` with both
    sides called by their summary group names (matched as ``--baseline`` is, :func:`check_baseline`).

    Raises:
        SpeedrunError: naming the comparison file, the value found and the one expected.
    """
    for key, value in (("alpha", alpha), ("target", target)):
        if c.get(key) is not None and not _same(_number(c[key], f"--comparisons {path}: {key}"), value):
            raise SpeedrunError(f"--comparisons {path}: {key} {c[key]:g}, but the statistics of --summary "
                                f"{summary_path} are at {key} {value:g}; expected a comparison of speedrun compare "
                                f"--{key} {value:g}")
    names = {}
    for side in ("baseline", "candidate"):
        groups = _group_named(str(c[side]), summary)
        if len(groups) != 1:
            raise SpeedrunError(f"--comparisons {path}: its {side} {c[side]} is no group of --summary {summary_path} "
                                f"(its groups: {', '.join(g['group'] for g in summary)}); expected a comparison of "
                                "that experiment's runs")
        names[side] = groups[0]["group"]
    if names["baseline"] != baseline:
        raise SpeedrunError(f"--comparisons {path}: compares {c['candidate']} with {c['baseline']}, not with the "
                            f"baseline {baseline} (--baseline); expected comparisons against {baseline}")
    return {**c, **names}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpeedrunError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpeedrunError(f"{path}: not valid JSON ({e})") from None


def _kind(obj: Any) -> str:
    """What a JSON file of the pipeline holds, for error messages."""
    if isinstance(obj, dict) and "status" in obj:
        return "a parsed-run record (of speedrun parse)"
    if isinstance(obj, dict) and "candidate" in obj:
        return "a comparison (of speedrun compare)"
    if isinstance(obj, list) and obj and all(isinstance(g, dict) and "group" in g for g in obj):
        return "a summary.json (of speedrun stats)"
    return f"a JSON {type(obj).__name__}"


def read_record(path: Path) -> dict[str, Any]:
    """One parsed-run record (docs/formats.md "Parsed run") with ``variant`` set to its folder's name.

    Raises:
        SpeedrunError: the file is missing, not JSON, or not a parsed-run record (a JSON object with ``status``).
    """
    obj = _read_json(path)
    if not (isinstance(obj, dict) and "status" in obj):
        raise SpeedrunError(f"{path}: --runs expects parsed-run records (a JSON object with a 'status', written by "
                            f"speedrun parse), this is {_kind(obj)}")
    return {**obj, "variant": path.parent.name}


def read_records(record_paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The parsed-run records (:func:`read_record`), each with ``variant`` set to its folder's name.

    Raises:
        SpeedrunError: a record is missing, not JSON or not a parsed-run record.
    """
    return [read_record(path) for path in record_paths]


def read_summary(path: Path) -> list[dict[str, Any]]:
    """The stats stage's summary.json (docs/formats.md "Statistics"): a list of group objects.

    Raises:
        SpeedrunError: the file is missing, not JSON, or not a list of objects with a ``group`` key.
    """
    obj = _read_json(path)
    if not (isinstance(obj, list) and all(isinstance(g, dict) and "group" in g for g in obj)):
        raise SpeedrunError(f"{path}: --summary expects the summary.json of speedrun stats (a list of group "
                            f"objects with a 'group' key), this is {_kind(obj)}")
    return obj


# The keys of a comparison (docs/formats.md "Comparison") that the report reads without a default.
COMPARISON_KEYS = frozenset({"baseline", "candidate", "n_baseline", "n_candidate", "val_loss", "train_time"})


def read_comparison(path: Path) -> dict[str, Any]:
    """One comparison of the compare stage (docs/formats.md "Comparison", ``speedrun compare --json-out``), checked
    before anything is written: a JSON object with the keys of :data:`COMPARISON_KEYS`.

    Raises:
        SpeedrunError: the path is missing or a folder, the file is not JSON, or not a comparison (a summary.json,
            a parsed-run record, an object without those keys); one line naming the file and what was expected.
    """
    expected = "--comparisons expects the .json files of speedrun compare --json-out"
    if path.is_dir():
        raise SpeedrunError(f"{path}: {expected}, this is a folder")
    if not path.exists():
        raise SpeedrunError(f"{path}: {expected}, no such file")
    obj = _read_json(path)
    if not (isinstance(obj, dict) and "candidate" in obj):
        raise SpeedrunError(f"{path}: {expected}, this is {_kind(obj)}")
    missing = sorted(COMPARISON_KEYS - obj.keys())
    if missing:
        raise SpeedrunError(f"{path}: {expected}, this one lacks {', '.join(map(repr, missing))}")
    return obj


def load_runs(record_paths: Sequence[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read parsed runs: the run table and the val_loss curves.

    The variant of a run is the name of the folder of its record (results/parse/<variant>/seed<N>.json).

    Returns:
        runs: one row per run: variant, seed (a Python int, None where the log names none), status, val_loss,
            train_time_s (s), steps (scheduled), last_step (the last logged step: where an incomplete run
            stopped), file.
        curves: one row per validation line: variant, seed, step, val_loss, run (the run's row in ``runs``).

    Raises:
        SpeedrunError: a record or its ``.csv`` is missing or unreadable.
    """
    rows, curves = [], []
    for i, (path, record) in enumerate(zip(record_paths, read_records(record_paths))):
        time_ms = record.get("train_time_ms")
        rows.append({"variant": record["variant"], "seed": record.get("seed"), "status": record["status"],
                     "val_loss": record.get("val_loss"), "train_time_s": None if time_ms is None else time_ms / 1000.0,
                     "steps": record.get("steps"), "last_step": record.get("last_step"), "file": record.get("file")})
        csv_path = path.with_suffix(".csv")
        if not csv_path.is_file():
            raise SpeedrunError(f"{csv_path}: per-step metrics not found beside {path.name}")
        try:
            metrics = pd.read_csv(csv_path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise SpeedrunError(f"{csv_path}: not a per-step metrics CSV ({e})") from None
        missing = {"kind", "step", "val_loss"} - set(metrics.columns)
        if missing:
            raise SpeedrunError(f"{csv_path}: lacks column(s) {', '.join(sorted(missing))}")
        val = metrics[metrics["kind"] == "val"][["step", "val_loss"]]
        curves.append(val.assign(variant=record["variant"], run=i))
    runs = pd.DataFrame(rows, columns=["variant", "seed", "status", "val_loss", "train_time_s", "steps", "last_step",
                                       "file"])
    curve_frame = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(
        columns=["step", "val_loss", "variant", "run"])
    # seeds as Python ints (None where a log names none): pandas would make a column with a missing seed float,
    # which prints 0.0 and rounds a seed past 2^53 (a seed is up to 2^64 - 1); each curve's is its run's
    runs["seed"] = pd.Series([row["seed"] for row in rows], index=runs.index, dtype=object)
    curve_frame["seed"] = curve_frame["run"].map(runs["seed"]).astype(object)
    return runs, curve_frame


def mark_counted(runs: pd.DataFrame, summary: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """``runs`` with two more columns: ``duplicate_of`` (the log a duplicate repeats, from the groups'
    ``duplicates`` in summary.json, which name a run by its log's path, the record's ``file``; empty for the
    others) and ``counted`` (complete and not a duplicate)."""
    originals = {f: of for g in summary for f, of in (g.get("duplicates") or {}).items()}
    duplicate_of = runs["file"].map(originals)
    return runs.assign(duplicate_of=duplicate_of, counted=(runs["status"] == "complete") & duplicate_of.isna())


def counted(runs: pd.DataFrame, summary: Sequence[Mapping[str, Any]]) -> pd.Series:
    """Boolean mask over ``runs``: complete and not a duplicate (:func:`mark_counted`)."""
    return mark_counted(runs, summary)["counted"]


def described_variants(pairs: Sequence[str]) -> dict[str, str]:
    """``report --describe VARIANT=TEXT`` pairs as variant -> text.

    Raises:
        SpeedrunError: a pair without ``=`` or without a variant name.
    """
    return name_value_pairs(pairs, "--describe", "VARIANT=TEXT")
