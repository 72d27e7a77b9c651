"""Stage ``report``: the experiment's tables and plots in ``results/report/``.

Consumes only files that earlier stages wrote (docs/formats.md): the parsed runs (``.json`` result records
with a ``.csv`` of per-step metrics beside each), the ``summary.json`` of the stats stage and the
comparison ``.json`` files of the compare stage. Plotting functions only draw what was computed there
(:mod:`speedrun.analysis.report_plots`).

Outputs (all written atomically):
- ``summary.md``: warnings first (violated rules, doubtful groups); per variant n, mean and std of val_loss,
  the one-sided t-test against the target (never a bare p with fewer than 3 runs), the runs needed for
  p < alpha, the train_time; each candidate against the baseline with its rules check; every run with its
  status (incomplete runs are listed, never counted); the runs' provenance.
- ``runs.csv``: one row per run (variant, seed, status, val_loss, train_time_s, steps, file).
- ``val_loss.png``: val_loss against step for every run, whole run and the last part zoomed.
- ``val_loss_band.png``: per variant, mean val_loss over the counted runs and the min-max band, zoomed too.
- ``final_val_loss.png``: final val_loss of each complete run per variant, mean and std, the target.
- ``distributions.png``: final val_loss and train_time of the counted runs per variant (box plots).
- ``p_value_by_n.png``: p-value against the number of runs at each group's observed mean and std.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from speedrun.analysis.report_plots import (plot_distributions, plot_final_val_loss, plot_p_value_by_n,
                                           plot_val_loss, plot_val_loss_band, val_loss_bands)
from speedrun.analysis.report_tables import render_summary
from speedrun.atomic import atomic_open, write_text
from speedrun.errors import SpeedrunError

__all__ = ["add_arguments", "main", "load_runs", "read_record", "read_records", "read_summary", "read_comparison",
           "counted", "render_summary", "plot_val_loss", "plot_val_loss_band", "plot_final_val_loss",
           "plot_distributions", "plot_p_value_by_n"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", nargs="+", required=True, metavar="JSON",
                        help="parsed-run records (results/parse/<variant>/seed<N>.json; the .csv beside each is read too)")
    parser.add_argument("--summary", required=True, help="summary.json of the stats stage")
    parser.add_argument("--comparisons", nargs="*", default=[], metavar="JSON", help="comparison .json files of the compare stage")
    parser.add_argument("--baseline", required=True, help="name of the baseline variant")
    parser.add_argument("--target", type=float, required=True, help="target val_loss")
    parser.add_argument("--alpha", type=float, default=0.01, help="significance level (default 0.01)")
    parser.add_argument("--zoom-last-fraction", type=float, default=0.5,
                        help="the zoomed val_loss panel shows this last fraction of training (default 0.5)")
    parser.add_argument("--out-dir", required=True, help="output folder (results/report)")


def main(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.runs]
    runs, curves = load_runs(paths)
    check_baseline(args.baseline, list(dict.fromkeys(runs["variant"])))
    records = read_records(paths)
    summary = read_summary(Path(args.summary))
    comparisons = [read_comparison(Path(p)) for p in args.comparisons]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(out / "runs.csv") as f:
        runs.to_csv(f, index=False)
    write_text(out / "summary.md", render_summary(summary, comparisons, runs, args.baseline, args.target, args.alpha,
                                                  records))
    mask = counted(runs, summary)
    plot_val_loss(curves, out / "val_loss.png", args.target, args.zoom_last_fraction)
    plot_val_loss_band(val_loss_bands(curves[curves["run"].map(mask)]), out / "val_loss_band.png", args.target,
                       args.zoom_last_fraction)
    plot_final_val_loss(runs, out / "final_val_loss.png", args.target)
    plot_distributions(runs[mask], out / "distributions.png", args.target)
    plot_p_value_by_n(summary, out / "p_value_by_n.png", args.alpha)
    print(f"report written to {out}")
    return 0


def check_baseline(baseline: str, variants: Sequence[str]) -> None:
    """Refuse a ``--baseline`` that is none of ``variants`` (the folders of the ``--runs`` records).

    Raises:
        SpeedrunError: naming the baseline and the known variants.
    """
    if baseline not in variants:
        raise SpeedrunError(f"--baseline {baseline}: not a variant of the runs given; expected one of "
                            f"{', '.join(variants)}")


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
        runs: one row per run: variant, seed, status, val_loss, train_time_s (s), steps, file.
        curves: one row per validation line: variant, seed, step, val_loss, run (the run's row in ``runs``).

    Raises:
        SpeedrunError: a record or its ``.csv`` is missing or unreadable.
    """
    rows, curves = [], []
    for i, (path, record) in enumerate(zip(record_paths, read_records(record_paths))):
        time_ms = record.get("train_time_ms")
        rows.append({"variant": record["variant"], "seed": record.get("seed"), "status": record["status"],
                     "val_loss": record.get("val_loss"), "train_time_s": None if time_ms is None else time_ms / 1000.0,
                     "steps": record.get("steps"), "file": record.get("file")})
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
        curves.append(val.assign(variant=record["variant"], seed=record.get("seed"), run=i))
    runs = pd.DataFrame(rows, columns=["variant", "seed", "status", "val_loss", "train_time_s", "steps", "file"])
    curve_frame = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(
        columns=["step", "val_loss", "variant", "seed", "run"])
    return runs, curve_frame


def counted(runs: pd.DataFrame, summary: Sequence[Mapping[str, Any]]) -> pd.Series:
    """Boolean mask over ``runs``: complete and not a duplicate, i.e. not a key of any group's
    ``duplicates`` in summary.json (both name a run by its log's path, the record's ``file``)."""
    dups = {f for g in summary for f in g.get("duplicates") or {}}
    return (runs["status"] == "complete") & ~runs["file"].isin(dups)
