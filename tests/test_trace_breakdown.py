"""benchmarks/trace_breakdown.py on a hand-made Chrome trace of two steps: kernels attributed through their
launches' correlation ids to the outermost host operator of the launching thread, per step; GPU gaps over the
threshold counted as idle with the main thread's operator at the gap's start; a file that is no trace refused
by name."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("trace_breakdown", ROOT / "benchmarks" / "trace_breakdown.py")
trace_breakdown = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = trace_breakdown              # its dataclass looks its module up there
_SPEC.loader.exec_module(trace_breakdown)

MAIN, AUTOGRAD = 1, 2


def host(name, ts, dur, tid=MAIN):
    return {"cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid}


def launch(correlation, ts, tid=MAIN):
    return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2, "tid": tid,
            "args": {"correlation": correlation}}


def kernel(name, correlation, ts, dur):
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": 7, "args": {"correlation": correlation}}


def two_steps() -> list[dict]:
    """Per step (1000 us apart): a forward op on the main thread launching two kernels (one inside a nested
    op), a backward on the autograd thread launching one, an optimizer step launching one after a 310 us gap
    of the GPU while the main thread runs ``log``; 300 us of GPU idle between the steps."""
    events = []
    for step in range(2):
        t, c = step * 1000, step * 10
        events += [host("forward", t, 100), host("aten::mm", t + 10, 20), launch(c + 1, t + 5),
                   launch(c + 2, t + 15), kernel("fwd_a", c + 1, t + 50, 100), kernel("fwd_b", c + 2, t + 150, 50),
                   host("backward", t + 120, 100, AUTOGRAD), launch(c + 3, t + 130, AUTOGRAD),
                   kernel("bwd", c + 3, t + 200, 200),
                   host("log", t + 300, 400),
                   host("Optimizer.step#Muon.step", t + 705, 50), launch(c + 4, t + 710),
                   kernel("muon", c + 4, t + 700 + 10, 40)]
    return events


def test_kernels_are_attributed_to_the_outermost_host_operator_per_step():
    result = trace_breakdown.breakdown(two_steps(), steps=2)
    assert result.owners == {"forward": (0.15, 2.0), "backward": (0.2, 1.0),
                             "Optimizer.step#Muon.step": (0.04, 1.0)}
    assert result.busy_ms == pytest.approx(0.39)


def test_gpu_gaps_over_the_threshold_are_idle_with_what_the_host_did():
    result = trace_breakdown.breakdown(two_steps(), steps=2, gap_us=20)
    # per step 310 us before the Muon kernel (the host in `log`); 300 us between the steps, which began as
    # the host still ran the optimizer step
    assert [(round(ms, 3), host, kernel) for ms, host, kernel in result.gaps] == [
        (0.31, "log", "muon"), (0.31, "log", "muon"), (0.3, "Optimizer.step#Muon.step", "fwd_a")]
    assert result.idle_ms == pytest.approx((0.31 + 0.31 + 0.3) / 2)
    assert [ms for ms, _, _ in trace_breakdown.breakdown(two_steps(), 2, gap_us=305).gaps] == pytest.approx([0.31] * 2)
    assert trace_breakdown.breakdown(two_steps(), steps=2, gap_us=400).idle_ms == 0.0


def test_main_reads_a_gzipped_trace_and_refuses_a_file_that_is_none(tmp_path, capsys):
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": two_steps()}, f)
    assert trace_breakdown.main([str(path), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "| backward | 0.20 | 1 |" in out and "| 0.31 | log | muon |" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"other": []}))
    assert trace_breakdown.main([str(bad)]) == 1
    assert f"{bad}: not a torch.profiler Chrome trace" in capsys.readouterr().err
