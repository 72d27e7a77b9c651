"""Stage ``report``: the experiment's tables and plots in ``results/report/``.

Consumes only files that earlier stages wrote (docs/formats.md): the parsed runs (``.json`` result records
with a ``.csv`` of per-step metrics beside each), the ``summary.json`` of the stats stage and the
comparison ``.json`` files of the compare stage. Plotting functions only draw what was computed there.

Outputs (all written atomically):
- ``summary.md``: per variant n, mean and std of val_loss, the one-sided t-test against the target, the
  train_time; each candidate against the baseline; every run with its status (incomplete runs are listed,
  never counted).
- ``runs.csv``: one row per run (variant, seed, status, val_loss, train_time_s, steps, file).
- ``val_loss.png``: val_loss against step for every run, whole run and the last part zoomed.
- ``final_val_loss.png``: final val_loss of each complete run per variant, mean and std, the target.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from speedrun.atomic import atomic_open, atomic_path, write_text
from speedrun.errors import SpeedrunError


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
    runs, curves = load_runs([Path(p) for p in args.runs])
    summary = _read_json(Path(args.summary))
    comparisons = [_read_json(Path(p)) for p in args.comparisons]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(out / "runs.csv") as f:
        runs.to_csv(f, index=False)
    write_text(out / "summary.md", render_summary(summary, comparisons, runs, args.baseline, args.target, args.alpha))
    plot_val_loss(curves, out / "val_loss.png", args.target, args.zoom_last_fraction)
    plot_final_val_loss(runs, out / "final_val_loss.png", args.target)
    print(f"report written to {out}")
    return 0


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpeedrunError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise SpeedrunError(f"{path}: not valid JSON ({e})") from None


def load_runs(record_paths: Sequence[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read parsed runs: the run table and the val_loss curves.

    The variant of a run is the name of the folder of its record (results/parse/<variant>/seed<N>.json).

    Returns:
        runs: one row per run: variant, seed, status, val_loss, train_time_s, steps, file.
        curves: one row per validation line: variant, seed, step, val_loss.

    Raises:
        SpeedrunError: a record or its ``.csv`` is missing or unreadable.
    """
    rows, curves = [], []
    for path in record_paths:
        record = _read_json(path)
        variant = path.parent.name
        seed = record.get("seed")
        time_ms = record.get("train_time_ms")
        rows.append({
            "variant": variant,
            "seed": seed,
            "status": record["status"],
            "val_loss": record.get("val_loss"),
            "train_time_s": None if time_ms is None else time_ms / 1000.0,
            "steps": record.get("steps"),
            "file": record.get("file"),
        })
        csv_path = path.with_suffix(".csv")
        if not csv_path.is_file():
            raise SpeedrunError(f"{csv_path}: per-step metrics not found beside {path.name}")
        metrics = pd.read_csv(csv_path)
        val = metrics[metrics["kind"] == "val"][["step", "val_loss"]].assign(variant=variant, seed=seed)
        curves.append(val)
    runs = pd.DataFrame(rows, columns=["variant", "seed", "status", "val_loss", "train_time_s", "steps", "file"])
    curve_frame = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(
        columns=["step", "val_loss", "variant", "seed"])
    return runs, curve_frame


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def _fmt_p(p: Any) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    return f"{p:.2e}" if p < 1e-3 else f"{p:.4f}"


def render_summary(summary: list[dict[str, Any]], comparisons: list[dict[str, Any]], runs: pd.DataFrame,
                   baseline: str, target: float, alpha: float) -> str:
    """The report's Markdown: variant statistics, candidate-vs-baseline tests and the run table."""
    lines = [
        "# Speedrun experiment",
        "",
        f"Target val_loss {target}; a variant reaches it when the one-sided one-sample t-test of mean val_loss "
        f"< {target} gives p < {alpha} (`scipy.stats.ttest_1samp(x, {target}, alternative=\"less\")`, the "
        "public record rule). Incomplete runs (diverged, failed, truncated) are listed and never counted in n.",
        "",
        "## Variants",
        "",
        "| variant | n | steps | val_loss mean | val_loss std | p(mean < target) | reaches target | "
        "train_time mean (s) | train_time std (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for g in summary:
        p = g.get("p_value")
        verdict = "–" if p is None else ("yes" if p < alpha else "no")
        lines.append(
            f"| {g['group']} | {g['n']} | {g.get('steps', '–')} | {_fmt(g.get('val_loss_mean'))} | "
            f"{_fmt(g.get('val_loss_std'))} | {_fmt_p(p)} | {verdict} | {_fmt(g.get('train_time_mean_s'), 2)} | "
            f"{_fmt(g.get('train_time_std_s'), 2)} |"
        )
    lines += ["", f"## Candidates against the baseline ({baseline})", ""]
    lines += render_comparisons(comparisons) if comparisons else ["No candidate variant is configured."]
    lines += ["", "## Runs", "", "| variant | seed | status | val_loss | train_time (s) | steps |", "|---|---|---|---|---|---|"]
    for r in runs.itertuples():
        lines.append(f"| {r.variant} | {r.seed} | {r.status} | {_fmt(r.val_loss)} | {_fmt(r.train_time_s, 2)} | {r.steps} |")
    incomplete = runs[runs["status"] != "complete"]
    if len(incomplete):
        lines += ["", f"**{len(incomplete)} incomplete run(s)**, not counted: " + ", ".join(
            f"{r.variant} seed {r.seed} ({r.status})" for r in incomplete.itertuples())]
    return "\n".join(lines) + "\n"


def render_comparisons(comparisons: list[dict[str, Any]]) -> list[str]:
    """Table rows of the candidate-vs-baseline Welch tests (the compare stage's JSON)."""
    lines = [
        "| candidate | n (base/cand) | Δ val_loss (cand − base) [95% CI] | p (cand lower) | "
        "Δ train_time s [95% CI] | p (cand faster) | speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        v, t = c["val_loss"], c["train_time"]
        speedup = c.get("speedup") or {}
        lines.append(
            f"| {c['candidate']} | {c['n_baseline']}/{c['n_candidate']} | {_fmt(v.get('difference'))} "
            f"[{_fmt(v.get('ci_low'))}, {_fmt(v.get('ci_high'))}] | {_fmt_p(v.get('p_value'))} | "
            f"{_fmt(t.get('difference'), 2)} [{_fmt(t.get('ci_low'), 2)}, {_fmt(t.get('ci_high'), 2)}] | "
            f"{_fmt_p(t.get('p_value'))} | {_fmt(speedup.get('seconds'), 2)} s ({_fmt(speedup.get('percent'), 1)}%) |"
        )
    return lines


def _colors(variants: Sequence[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {v: cmap(i % 10) for i, v in enumerate(variants)}


def plot_val_loss(curves: pd.DataFrame, out: Path, target: float, zoom_last_fraction: float) -> None:
    """val_loss against step, one line per run coloured by variant; right panel: the last part zoomed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    variants = list(dict.fromkeys(curves["variant"]))
    colors = _colors(variants)
    max_step = int(curves["step"].max()) if len(curves) else 1
    zoom_from = max_step * (1 - zoom_last_fraction)
    for ax, zoom in zip(axes, (False, True)):
        for (variant, seed), run in curves.groupby(["variant", "seed"], sort=False):
            part = run[run["step"] >= zoom_from] if zoom else run
            label = variant if seed == curves[curves["variant"] == variant]["seed"].iloc[0] else None
            ax.plot(part["step"], part["val_loss"], color=colors[variant], alpha=0.8, marker=".", label=label)
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target}")
        ax.set_xlabel("step")
        ax.set_ylabel("val_loss")
        ax.grid(alpha=0.3)
    axes[0].set_title("val_loss, every run")
    axes[1].set_title(f"last {zoom_last_fraction:.0%} of training")
    axes[0].legend()
    fig.tight_layout()
    _save(fig, out)


def plot_final_val_loss(runs: pd.DataFrame, out: Path, target: float) -> None:
    """Final val_loss of each complete run per variant, with the mean ± sample std and the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = runs[runs["status"] == "complete"]
    variants = list(dict.fromkeys(runs["variant"]))
    colors = _colors(variants)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(variants), 4.2))
    for i, variant in enumerate(variants):
        losses = done[done["variant"] == variant]["val_loss"].astype(float)
        ax.scatter([i] * len(losses), losses, color=colors[variant], zorder=3)
        if len(losses) >= 2:
            ax.errorbar(i + 0.15, losses.mean(), yerr=losses.std(ddof=1), fmt="s", color="black", capsize=4)
        elif len(losses) == 1:
            ax.plot(i + 0.15, losses.mean(), "s", color="black")
    ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target}")
    ax.set_xticks(range(len(variants)), variants)
    ax.set_xlim(-0.6, len(variants) - 0.4)
    ax.set_ylabel("final val_loss")
    ax.set_title("final val_loss per variant (mean ± std)")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    _save(fig, out)


def _save(fig: Any, out: Path) -> None:
    import matplotlib.pyplot as plt

    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
