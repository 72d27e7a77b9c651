"""Where a profiled training step's GPU time and GPU idle time go, read from a torch.profiler Chrome trace.

    python benchmarks/trace_breakdown.py TRACE.json[.gz] [--steps 2] [--gap-us 20] [--top 25]

For the traces that ``benchmarks/gpu_speedrun.py --profile`` (ours) and ``benchmarks/record_profile.py`` (a
record's own script) write, so that the two sides' steps compare part by part (issue 20: our step against the
record's on one card). Printed, per profiled step:

* **kernel time by owner**: each kernel (and GPU memcpy/memset) attributed through its launch (the CUDA runtime
  or driver call with the same ``correlation`` id) to the outermost CPU operator or annotation around that
  launch on the launching thread (e.g. ``Optimizer.step#Muon.step``, ``CompiledFunctionBackward``,
  ``aten::add_``); ms and kernels per step, largest first;
* **GPU idle**: the gaps between consecutive GPU activities longer than ``--gap-us`` (default 20 us), their
  total per step, and the largest ones with the outermost CPU operator running on the main thread when the gap
  began (what the host was doing while the GPU waited) and the kernel that ended the gap.

Both sides' traces cover whole optimizer steps (``--steps``, default 2), so figures are per step. Stdlib only;
runs on the CPU machine after a device call brought the trace back.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
HOST_CATEGORIES = ("cpu_op", "user_annotation")


@dataclass(frozen=True)
class Breakdown:
    """Per-step figures of one trace: ``owners`` {outermost host op: (ms, kernels)}, ``busy_ms`` (sum of GPU
    activity durations), ``idle_ms`` (sum of the gaps over the threshold), ``gaps`` [(ms, host op, next
    kernel)] largest first (not divided by the steps)."""

    owners: dict[str, tuple[float, float]]
    busy_ms: float
    idle_ms: float
    gaps: list[tuple[float, str, str]]


def load_trace(path: Path) -> list[dict]:
    """The ``traceEvents`` of a Chrome trace (``.json`` or ``.json.gz``). Raises ``ValueError`` naming the
    file when it holds no ``traceEvents`` list."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"{path}: not a torch.profiler Chrome trace (no traceEvents list)")
    return events


class _Outermost:
    """The outermost host operator (or annotation) around a time on each thread."""

    def __init__(self, events: list[dict]):
        by_thread: dict[object, list[dict]] = defaultdict(list)
        for e in events:
            if e.get("cat") in HOST_CATEGORIES and "dur" in e:
                by_thread[e["tid"]].append(e)
        self.spans: dict[object, tuple[list[float], list[dict]]] = {}
        for tid, ops in by_thread.items():
            ops.sort(key=lambda e: (e["ts"], -e["dur"]))
            outer, end = [], float("-inf")
            for e in ops:
                if e["ts"] >= end:                              # not nested in the previous outermost one
                    outer.append(e)
                    end = e["ts"] + e["dur"]
            self.spans[tid] = ([e["ts"] for e in outer], outer)
        counts = Counter({tid: len(spans[1]) for tid, spans in self.spans.items()})
        self.main_thread = counts.most_common(1)[0][0] if counts else None

    def at(self, tid, ts: float) -> str | None:
        starts, outer = self.spans.get(tid, ([], []))
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts <= outer[i]["ts"] + outer[i]["dur"]:
            return outer[i]["name"]
        return None


def breakdown(events: list[dict], steps: int, gap_us: float = 20.0) -> Breakdown:
    """The :class:`Breakdown` of a trace's ``events`` over ``steps`` optimizer steps (figures per step)."""
    outermost = _Outermost(events)
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATEGORIES and "dur" in e), key=lambda e: e["ts"])
    owners: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in gpu:
        launch = launches.get(e.get("args", {}).get("correlation"))
        owner = None if launch is None else outermost.at(launch["tid"], launch["ts"])
        owner = owner or ("(no host operator)" if launch is not None else "(launch not traced)")
        owners[owner][0] += e["dur"] / 1000.0
        owners[owner][1] += 1
    gaps, end = [], None
    for e in gpu:
        if end is not None and e["ts"] - end > gap_us:
            host = outermost.at(outermost.main_thread, end) or "(host idle or between operators)"
            gaps.append(((e["ts"] - end) / 1000.0, host, e["name"]))
        end = e["ts"] + e["dur"] if end is None else max(end, e["ts"] + e["dur"])
    gaps.sort(reverse=True)
    return Breakdown(owners={k: (v[0] / steps, v[1] / steps) for k, v in owners.items()},
                     busy_ms=sum(e["dur"] for e in gpu) / 1000.0 / steps,
                     idle_ms=sum(g[0] for g in gaps) / steps, gaps=gaps)


def render(result: Breakdown, gaps_over: float, top: int) -> str:
    """The breakdown as text: the owners table, then the idle summary and its largest gaps."""
    lines = ["| outermost host operator | ms per step | kernels per step |", "|---|---|---|"]
    for name, (ms, count) in sorted(result.owners.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"| {name[:90]} | {ms:.2f} | {count:.0f} |")
    lines += ["", f"GPU busy {result.busy_ms:.1f} ms per step; idle in gaps over {gaps_over:g} us "
                  f"{result.idle_ms:.1f} ms per step ({len(result.gaps)} gaps in the trace)", ""]
    lines += ["| gap ms | host operator when the gap began | kernel after the gap |", "|---|---|---|"]
    lines += [f"| {ms:.2f} | {host[:70]} | {kernel[:70]} |" for ms, host, kernel in result.gaps[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps the trace covers (default 2)")
    parser.add_argument("--gap-us", type=float, default=20.0, help="shortest GPU gap counted as idle (us)")
    parser.add_argument("--top", type=int, default=25, help="rows of each table")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    try:
        events = load_trace(args.trace)
    except (OSError, ValueError) as e:
        print(f"trace_breakdown: {e}", file=sys.stderr)
        return 1
    print(render(breakdown(events, args.steps, args.gap_us), args.gap_us, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
