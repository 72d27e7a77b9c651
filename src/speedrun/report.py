"""Stage ``report``: the experiment's tables and plots in ``results/report/``.

Consumes only files that earlier stages wrote (docs/formats.md): the parsed runs (``.json`` result records
with a ``.csv`` of per-step metrics beside each), the ``summary.json`` of the stats stage and the
comparison ``.json`` files of the compare stage, read and checked against each other by
:mod:`speedrun.analysis.report_inputs`. Plotting functions only draw what was computed there
(:mod:`speedrun.analysis.report_plots`).

Outputs (all written atomically):
- ``summary.md``: warnings first (violated rules, doubtful groups); per variant n, mean and std of val_loss,
  the one-sided t-test against the target (never a bare p with fewer than 3 runs), the runs needed for
  p < alpha, the train_time; each candidate against the baseline with its rules check; every run with its
  status (incomplete runs are listed, never counted); the runs' provenance; with ``--describe``, what each
  variant runs, and with ``--replicates``, which variants' seeds are replicates (script variants).
- ``runs.csv``: one row per run (variant, seed, status, val_loss, train_time_s, steps, last_step, file,
  duplicate_of, counted).
- ``val_loss.png``: val_loss against step for every run, whole run and the last part zoomed.
- ``val_loss_band.png``: per variant, mean val_loss over the counted runs and the min-max band, zoomed too.
- ``final_val_loss.png``: final val_loss of each complete run per variant, mean and std, the target.
- ``distributions.png``: final val_loss and train_time of the counted runs per variant (box plots).
- ``p_value_by_n.png``: p-value against the number of runs at each group's observed mean and std.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from speedrun.analysis.group_stats import DEFAULT_ALPHA
from speedrun.analysis.report_inputs import (check_baseline, check_comparison, check_records, described_variants,
                                             load_runs, mark_counted, read_comparison, read_records, read_summary,
                                             report_settings)
from speedrun.analysis.report_plots import (plot_distributions, plot_final_val_loss, plot_p_value_by_n,
                                           plot_val_loss, plot_val_loss_band, val_loss_bands)
from speedrun.analysis.report_tables import console_lines, render_summary
from speedrun.errors import SpeedrunError
from speedrun.support.atomic import atomic_open, write_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", nargs="+", required=True, metavar="JSON",
                        help="parsed-run records (results/parse/<variant>/seed<N>.json; the .csv beside each is read "
                             "too): the runs that speedrun stats read for --summary, each once")
    parser.add_argument("--summary", required=True, help="summary.json of the stats stage")
    parser.add_argument("--comparisons", nargs="*", default=[], metavar="JSON", help="comparison .json files of the compare stage")
    parser.add_argument("--baseline", required=True,
                        help="the baseline: a group of --summary (its name, or its folder's name)")
    parser.add_argument("--target", type=float, default=None,
                        help="target val_loss (default: the summary's; when given, it must be the summary's)")
    parser.add_argument("--alpha", type=float, default=None,
                        help=f"significance level (default: the summary's, else {DEFAULT_ALPHA}; when given, it "
                             "must be the summary's)")
    parser.add_argument("--zoom-last-fraction", type=float, default=0.5,
                        help="the zoomed val_loss panel shows this last fraction of training (default 0.5)")
    parser.add_argument("--describe", nargs="*", default=[], metavar="VARIANT=TEXT",
                        help="what a variant runs, one line each (the workflow: our model's settings, or a script "
                             "variant's script path and sha256)")
    parser.add_argument("--replicates", nargs="*", default=[], metavar="VARIANT",
                        help="variants whose seeds are replicates (script variants: the script draws its own "
                             "initialization, the seed is not passed to it)")
    parser.add_argument("--out-dir", required=True, help="output folder (results/report)")


def main(args: argparse.Namespace) -> int:
    if not 0 < args.zoom_last_fraction <= 1:       # as config.yaml's report.zoom_last_fraction (the schema)
        raise SpeedrunError(f"--zoom-last-fraction must be in (0, 1] (the last fraction of training the zoomed "
                            f"panels show), got {args.zoom_last_fraction}")
    paths = [Path(p) for p in args.runs]
    summary_path = Path(args.summary)
    summary = read_summary(summary_path)
    target, alpha = report_settings(summary, summary_path, args.target, args.alpha)
    records = read_records(paths)
    check_records(paths, records, summary, summary_path)
    baseline = check_baseline(args.baseline, summary, summary_path)
    comparisons = [read_comparison(Path(p)) for p in args.comparisons]
    comparisons = [check_comparison(Path(p), c, summary, summary_path, baseline, target, alpha)
                   for p, c in zip(args.comparisons, comparisons)]
    runs, curves = load_runs(paths)
    runs = mark_counted(runs, summary)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(out / "runs.csv") as f:
        runs.to_csv(f, index=False)
    write_text(out / "summary.md", render_summary(summary, comparisons, runs, baseline, target, alpha, records,
                                                  described_variants(args.describe), args.replicates))
    mask = runs["counted"]
    plot_val_loss(curves, out / "val_loss.png", target, args.zoom_last_fraction, runs["steps"])
    plot_val_loss_band(val_loss_bands(curves[curves["run"].map(mask)]), out / "val_loss_band.png", target,
                       args.zoom_last_fraction)
    plot_final_val_loss(runs, out / "final_val_loss.png", target)
    plot_distributions(runs[mask], out / "distributions.png", target)
    plot_p_value_by_n(summary, out / "p_value_by_n.png", alpha)
    print(f"report written to {out.resolve()}/ (summary.md: the tables and verdicts)")
    print("\n".join(console_lines(summary, comparisons, target, alpha)))
    return 0
