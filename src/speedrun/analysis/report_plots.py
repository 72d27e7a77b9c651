"""The report's plots (``speedrun report``): each function draws estimates computed elsewhere and writes a PNG.

* ``val_loss.png`` (:func:`plot_val_loss`): val_loss against step, one line per run, and the last part zoomed.
* ``val_loss_band.png`` (:func:`plot_val_loss_band`): per variant, the mean over seeds and the min-max band
  (:func:`val_loss_bands`), whole run and the last part zoomed.
* ``final_val_loss.png`` (:func:`plot_final_val_loss`): final val_loss of each run, mean ± std, the target.
* ``distributions.png`` (:func:`plot_distributions`): final val_loss and train_time of the counted runs per
  variant, as box plots with every run drawn.
* ``p_value_by_n.png`` (:func:`plot_p_value_by_n`): the p-value each group would have with n runs at its
  observed mean and std (``p_value_by_n`` of summary.json; :mod:`speedrun.analysis.power`), log scale, with
  the alpha line and the observed n.

matplotlib is imported inside the functions (Agg backend), so importing this module draws nothing.
Colours follow the variants' order (tab10), the same in every plot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from speedrun.support.atomic import atomic_path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(variants: Sequence[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {v: cmap(i % 10) for i, v in enumerate(variants)}


def _save(fig: Any, out: Path) -> None:
    plt = _pyplot()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def _val_loss_axes(ax: Any, target: float) -> None:
    """Label a val_loss-against-step panel, grid it and draw the target as a dashed line."""
    ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target}")
    ax.set_xlabel("step")
    ax.set_ylabel("val_loss")
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.grid(alpha=0.3)


def _integer_ticks() -> Any:
    """A tick locator that puts ticks on whole numbers only (steps, runs)."""
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _zoom_from(steps: pd.Series, zoom_last_fraction: float) -> float:
    max_step = int(steps.max()) if len(steps) else 1
    return max_step * (1 - zoom_last_fraction)


def _zoom_start(run: pd.DataFrame, scheduled: pd.Series | None, zoom_last_fraction: float) -> float:
    """The first step of ``run``'s zoom: the last fraction of its scheduled steps where known, else of its
    own logged steps (:func:`plot_val_loss`)."""
    steps = None if scheduled is None else scheduled.get(run["run"].iloc[0])
    if steps is None or pd.isna(steps):
        return _zoom_from(run["step"], zoom_last_fraction)
    return float(steps) * (1 - zoom_last_fraction)


def plot_val_loss(curves: pd.DataFrame, out: Path, target: float, zoom_last_fraction: float,
                  scheduled: pd.Series | None = None) -> None:
    """val_loss against step, one line per run coloured by variant; right panel: the last part zoomed.

    ``curves``: one row per validation line with columns variant, step, val_loss and run (the run's row in the
    run table: one line per run, also when seeds are unknown, as in the public logs, or repeated).
    ``scheduled``: per run (indexed as ``curves["run"]``) its scheduled steps, NaN where unknown. The zoom of a
    run is the last ``zoom_last_fraction`` of its scheduled steps, so that a run that stopped early (diverged,
    truncated) shows there only what it logged in that part, if anything, and cannot stretch the axes with
    its early losses; a run without scheduled steps is zoomed on the last part of what it logged.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    variants = list(dict.fromkeys(curves["variant"]))
    colors = _colors(variants)
    for ax, zoom in zip(axes, (False, True)):
        labelled = set()
        for _, run in curves.groupby("run", sort=False):
            variant = run["variant"].iloc[0]
            # each run's own last part: a run with fewer scheduled steps is zoomed too, not dropped
            part = run[run["step"] >= _zoom_start(run, scheduled, zoom_last_fraction)] if zoom else run
            if part.empty:
                continue
            label = None if variant in labelled else variant
            labelled.add(variant)
            ax.plot(part["step"], part["val_loss"], color=colors[variant], alpha=0.8, marker=".", label=label)
        _val_loss_axes(ax, target)
    axes[0].set_title("val_loss, every run")
    axes[1].set_title(f"last {zoom_last_fraction:.0%} of each run")
    axes[0].legend(loc="upper right")      # the curves fall: the upper right corner is where none runs
    fig.tight_layout()
    _save(fig, out)


def val_loss_bands(curves: pd.DataFrame) -> pd.DataFrame:
    """Per variant and validation step, over that variant's runs: n, mean, std (ddof=1; NaN for one run),
    min and max of val_loss. ``curves`` as in :func:`plot_val_loss`, already restricted to the runs to pool."""
    order = {v: i for i, v in enumerate(dict.fromkeys(curves["variant"]))}
    grouped = curves.groupby(["variant", "step"], sort=False)["val_loss"]
    bands = grouped.agg(n="count", mean="mean", std="std", min="min", max="max").reset_index()
    rank = bands["variant"].map(order)
    return bands.iloc[np.lexsort((bands["step"].to_numpy(), rank.to_numpy()))].reset_index(drop=True)


def plot_val_loss_band(bands: pd.DataFrame, out: Path, target: float, zoom_last_fraction: float) -> None:
    """Mean val_loss over seeds per variant with its min-max band; right panel: the last part zoomed.

    ``bands``: :func:`val_loss_bands`'s table.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    variants = list(dict.fromkeys(bands["variant"]))
    colors = _colors(variants)
    zoom_from = _zoom_from(bands["step"], zoom_last_fraction)
    for ax, zoom in zip(axes, (False, True)):
        for variant in variants:
            b = bands[bands["variant"] == variant]
            b = b[b["step"] >= zoom_from] if zoom else b
            n = int(b["n"].max()) if len(b) else 0
            ax.fill_between(b["step"], b["min"], b["max"], color=colors[variant], alpha=0.25, linewidth=0)
            ax.plot(b["step"], b["mean"], color=colors[variant], marker=".",
                    label=f"{variant} (mean of {n}, min–max)")
        _val_loss_axes(ax, target)
    axes[0].set_title("val_loss over seeds: mean and min–max band")
    axes[1].set_title(f"last {zoom_last_fraction:.0%} of training")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    _save(fig, out)


def plot_final_val_loss(runs: pd.DataFrame, out: Path, target: float) -> None:
    """Final val_loss of each complete run per variant, with the mean ± sample std and the target.

    ``runs``: one row per run with columns variant, status, val_loss.
    """
    plt = _pyplot()
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


def plot_distributions(runs: pd.DataFrame, out: Path, target: float) -> None:
    """Box plots of final val_loss and train_time (s) of the counted runs per variant, every run drawn.

    ``runs``: one row per counted run with columns variant, val_loss, train_time_s (NaN where absent); a
    variant without runs keeps its place, empty.
    """
    plt = _pyplot()
    variants = list(dict.fromkeys(runs["variant"]))
    colors = _colors(variants)
    fig, axes = plt.subplots(1, 2, figsize=(3 + 2.6 * len(variants), 4.2))
    rng = np.random.default_rng(0)  # fixed horizontal jitter: the same input draws the same picture
    for ax, column, label in zip(axes, ("val_loss", "train_time_s"), ("final val_loss", "train_time (s)")):
        data = [runs.loc[runs["variant"] == v, column].dropna().astype(float).to_numpy() for v in variants]
        ax.boxplot([d if len(d) else [np.nan] for d in data], positions=range(len(variants)), widths=0.5,
                   showfliers=False, medianprops={"color": "black"})
        for i, (variant, values) in enumerate(zip(variants, data)):
            ax.scatter(i + rng.uniform(-0.12, 0.12, len(values)), values, color=colors[variant], zorder=3, s=18)
        if column == "val_loss":
            ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target}")
            ax.legend()
        ax.set_xticks(range(len(variants)), variants)
        ax.set_ylabel(label)
        ax.set_title(f"{label} per variant (counted runs)")
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    _save(fig, out)


def plot_p_value_by_n(summary: Sequence[Mapping[str, Any]], out: Path, alpha: float) -> None:
    """p-value against the number of runs for each group of summary.json that has ``p_value_by_n``, with the
    alpha line, each group's observed n (dot) and runs needed (dotted line)."""
    plt = _pyplot()
    groups = [g for g in summary if g.get("p_value_by_n")]
    colors = _colors([g["group"] for g in summary])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for g in groups:
        ks, ps = np.asarray(g["p_value_by_n"]["n"]), np.asarray(g["p_value_by_n"]["p"], dtype=float)
        color = colors[g["group"]]
        ax.plot(ks, np.clip(ps, 1e-300, 1), color=color, label=g["group"])
        if g["n"] in set(ks.tolist()):
            ax.plot(g["n"], max(ps[ks.tolist().index(g["n"])], 1e-300), "o", color=color)
        if g.get("runs_needed"):
            ax.axvline(g["runs_needed"], color=color, linestyle=":", linewidth=1)
    ax.axhline(alpha, color="black", linestyle="--", linewidth=1, label=f"alpha {alpha:g}")
    if not groups:
        ax.text(0.5, 0.5, "no group has 2 or more runs with a spread", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_yscale("log")
    ax.set_xlabel("runs n")
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.set_ylabel("p(mean < target) at the observed mean and std")
    ax.set_title("p-value against the number of runs (dot: observed n; dotted: runs needed)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, out)
