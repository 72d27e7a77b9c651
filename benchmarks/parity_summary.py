"""Compare the logs of a record's own script with ours on the same data and schedule (issue 20's parity check).

    python benchmarks/parity_summary.py --reference R1.txt R2.txt --ours O1.txt [O2.txt] \\
        [--boundaries 0,35,70,105,120] [--json OUT.json] [--race]

Each log is read with :func:`speedrun.analysis.logs.parse_log` (a record's ``logs/<uuid>.txt`` or our run log).
Printed, for every validation step present in a reference log: the reference runs' val_loss, their spread
(max - min), our runs' mean, the difference and the tolerance max(0.02, 2 x spread) of issue 20, and whether ours is
within it; then the median step time (ms, from consecutive train lines' train_time) per stage of ``--boundaries``
(the first two steps of each stage left out: a new batch shape's first steps), reference and ours, over all runs of
a side; then each run alone: its train_time at its last validation and its medians per stage, over all steps and
over the odd and the even steps apart (the records update Adam's parameters on odd steps only, ``adam_every: 2``:
a cost paid on one parity shows as a split there, as record #87's eager C-Optim update did in session 42). The
pooled medians mix runs that shared the GPU with runs alone; the per-run lines tell them apart. A log cut short (a
run that stopped) is compared over the steps it has, and the table says which steps a side is missing.

With ``--race`` (issue 20's race: our HEAD preset against record #88's code, equal training wall-clock): also, at
each of the reference's evaluations, the reference runs' mean train_time and val_loss, and our val_loss at that
train_time, each of our runs read off its own (train_time, val_loss) evaluations by linear interpolation (its last
val_loss past its last evaluation: training over, the model stays), then averaged; "ahead" where ours is at or
below. Linear in time between evaluations 20 steps apart is an approximation of the curve, the same for every run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from speedrun.analysis.logs import parse_log


@dataclass(frozen=True)
class RunTimes:
    """One log, read once: ``curve`` step -> (train_time s, val_loss) of every evaluation, ``times`` step -> its
    own time in ms (train_time of step s minus that of step s-1, for consecutive train lines)."""

    path: Path
    curve: dict[int, tuple[float, float]]
    times: dict[int, float]

    @classmethod
    def read(cls, path: Path) -> "RunTimes":
        """The log at ``path`` (:func:`speedrun.analysis.logs.parse_log`)."""
        metrics = parse_log(path).metrics
        vals, train = metrics[metrics["kind"] == "val"], metrics[metrics["kind"] == "train"]
        curve = {int(s): (float(t) / 1000, float(v)) for s, t, v in zip(vals["step"], vals["train_time_ms"],
                                                                         vals["val_loss"])}
        cumulative = {int(s): float(t) for s, t in zip(train["step"], train["train_time_ms"])}
        times = {s: t - cumulative[s - 1] for s, t in cumulative.items() if s - 1 in cumulative}
        return cls(path, curve, times)

    @property
    def val_losses(self) -> dict[int, float]:
        """step -> val_loss."""
        return {step: loss for step, (_, loss) in self.curve.items()}


def stage_medians(times: list[dict[int, float]], boundaries: list[int]) -> list[float | None]:
    """Median step time (ms) per stage [b_i + 2, b_{i+1}] over every run's steps; None where a stage has none."""
    medians = []
    for start, end in zip(boundaries, boundaries[1:]):
        values = [t for run in times for s, t in run.items() if start + 2 <= s <= end]
        medians.append(statistics.median(values) if values else None)
    return medians


def run_summary(run: RunTimes, boundaries: list[int]) -> dict:
    """One run alone: ``train_time_s`` at its last validation (None without one), and per stage of ``boundaries``
    its median step time (ms) over all steps, odd steps and even steps (``stage_ms``, ``odd_ms``, ``even_ms``)."""
    last = run.curve[max(run.curve)][0] if run.curve else None
    return {"log": str(run.path), "train_time_s": last, "stage_ms": stage_medians([run.times], boundaries),
            "odd_ms": stage_medians([{s: t for s, t in run.times.items() if s % 2}], boundaries),
            "even_ms": stage_medians([{s: t for s, t in run.times.items() if not s % 2}], boundaries)}


def compare(reference: list[RunTimes], ours: list[RunTimes], boundaries: list[int]) -> dict:
    """The comparison as a dict (``rows`` per validation step, ``stages`` with both sides' medians, ``runs``
    with each run's :func:`run_summary`)."""
    ref_vals = [r.val_losses for r in reference]
    our_vals = [r.val_losses for r in ours]
    rows = []
    for step in sorted(set().union(*ref_vals)):
        ref = [v[step] for v in ref_vals if step in v]
        mine = [v[step] for v in our_vals if step in v]
        spread = max(ref) - min(ref) if len(ref) > 1 else None
        tolerance = max(0.02, 2 * spread) if spread is not None else 0.02
        mean_ours = statistics.fmean(mine) if mine else None
        diff = None if mean_ours is None else mean_ours - statistics.fmean(ref)
        rows.append({"step": step, "reference": ref, "spread": spread, "ours": mine, "diff": diff,
                     "tolerance": tolerance, "within": None if diff is None else abs(diff) <= tolerance})
    stages = {"boundaries": boundaries,
              "reference_ms": stage_medians([r.times for r in reference], boundaries),
              "ours_ms": stage_medians([r.times for r in ours], boundaries)}
    runs = {"reference": [run_summary(r, boundaries) for r in reference],
            "ours": [run_summary(r, boundaries) for r in ours]}
    return {"reference": [str(r.path) for r in reference], "ours": [str(r.path) for r in ours], "rows": rows,
            "stages": stages, "runs": runs}


def val_at(curve: list[tuple[float, float]], seconds: float) -> float:
    """The val_loss of ``curve`` at train_time ``seconds``: linear between the evaluations around it, the last
    evaluation's past the end. Raises ``ValueError`` for an empty curve."""
    if not curve:
        raise ValueError("a run without an evaluation has no val_loss to race with")
    for (t0, v0), (t1, v1) in zip(curve, curve[1:]):
        if t0 <= seconds <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (seconds - t0) / (t1 - t0)
    return curve[-1][1] if seconds >= curve[-1][0] else curve[0][1]


def race(reference: list[RunTimes], ours: list[RunTimes]) -> list[dict]:
    """At each evaluation step of the reference runs: their mean train_time (s) and val_loss, our runs' mean
    val_loss at that train_time (:func:`val_at` of each run), and whether ours is at or below (``ahead``)."""
    our_curves = [[point for _, point in sorted(r.curve.items())] for r in ours]
    rows = []
    for step in sorted(set().union(*(r.curve for r in reference))):
        points = [r.curve[step] for r in reference if step in r.curve]
        seconds = statistics.fmean(t for t, _ in points)
        ref = statistics.fmean(v for _, v in points)
        mine = statistics.fmean(val_at(c, seconds) for c in our_curves)
        rows.append({"step": step, "train_time_s": seconds, "reference": ref, "ours": mine, "ahead": mine <= ref})
    return rows


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", nargs="+", type=Path, required=True)
    parser.add_argument("--ours", nargs="+", type=Path, required=True)
    parser.add_argument("--boundaries", default="0,35,70,105,120",
                        help="stage boundaries in steps (default: a record's 3 stages over 105 + 15 steps)")
    parser.add_argument("--json", type=Path, help="also write the comparison as JSON here")
    parser.add_argument("--race", action="store_true",
                        help="also compare val_loss at the reference's evaluation times (equal wall-clock)")
    args = parser.parse_args()
    reference, ours = [RunTimes.read(p) for p in args.reference], [RunTimes.read(p) for p in args.ours]
    result = compare(reference, ours, [int(b) for b in args.boundaries.split(",")])
    if args.race:
        result["race"] = race(reference, ours)
    print("step  reference runs        spread  ours runs             diff     tol     within")
    for r in result["rows"]:
        ref = " ".join(_fmt(v) for v in r["reference"])
        mine = " ".join(_fmt(v) for v in r["ours"]) or "(missing)"
        print(f"{r['step']:>4}  {ref:<20}  {_fmt(r['spread']):>6}  {mine:<20}  {_fmt(r['diff']):>7}  "
              f"{r['tolerance']:.3f}   {r['within']}")
    stages = result["stages"]
    for i, (ref, mine) in enumerate(zip(stages["reference_ms"], stages["ours_ms"])):
        lo, hi = stages["boundaries"][i], stages["boundaries"][i + 1]
        print(f"stage {i + 1} (steps {lo + 2}-{hi}): median step reference {_fmt(ref, 1)} ms, ours {_fmt(mine, 1)} ms")
    print("per run: train_time, then median ms per stage (all steps; odd / even steps)")
    for side, runs in result["runs"].items():
        for run in runs:
            stages_text = "  ".join(f"{_fmt(a, 1)} ({_fmt(o, 1)} / {_fmt(e, 1)})"
                                    for a, o, e in zip(run["stage_ms"], run["odd_ms"], run["even_ms"]))
            print(f"{side:<9} {_fmt(run['train_time_s'], 2):>7} s  {stages_text}  {run['log']}")
    if args.race:
        print("race: at the reference's evaluation times, ours read off its runs' curves")
        print("step  train_time  reference  ours     ahead")
        for r in result["race"]:
            print(f"{r['step']:>4}  {r['train_time_s']:>8.2f} s  {r['reference']:.4f}     {r['ours']:.4f}   {r['ahead']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
