"""benchmarks/gpu_speedrun.py's ``--profile`` path on the CPU: the parts of a step timed, the operator table,
the kernel summary and the trace written. A device call of 2026-12-04 lost its profile to this path (``_Run``
had gained its ``phases`` argument; the profile still built it without one)."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from speedrun.training.config import TrainConfig
from synthetic_data import counting_documents, write_dataset

ROOT = Path(__file__).resolve().parents[1]


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("gpu_speedrun", ROOT / "benchmarks" / "gpu_speedrun.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profile_steps_writes_the_parts_table_the_operator_table_and_the_trace(tmp_path):
    bench = _load_benchmark()
    write_dataset(tmp_path / "data", counting_documents(600), shard_tokens=16384)
    config = TrainConfig.from_dict({
        "preset": "tiny", "model": {"n_layer": 2, "model_dim": 32, "n_head": 2, "head_dim": 16}, "steps": 6,
        "tokens_per_step": 512, "micro_batches": 2, "max_seq_len": 128, "val_tokens": 512,
        "val_batch_tokens": 256, "val_every": 3, "compile": False})
    out = tmp_path / "out" / "run.profile"
    out.parent.mkdir()
    bench.profile_steps(config, tmp_path / "data", out)
    summary = Path(f"{out}.kernels.md").read_text()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in summary.splitlines()[2:6]]
    parts = dict(rows)
    assert list(parts) == ["forward + backward", "optimizer step", "zero_grad", "tied copy + FP8 weights"]
    assert all(float(v) >= 0.0 for v in parts.values()) and float(parts["forward + backward"]) > 0.0
    assert "2 steps, wall" in summary                           # kernel summary: no CUDA kernels on the CPU
    assert "Self CPU" in Path(f"{out}.txt").read_text()         # torch.profiler's operator table
    with gzip.open(f"{out}.trace.json.gz", "rt") as f:
        assert json.load(f)["traceEvents"]
    assert not Path(f"{out}.trace.json").exists()


def test_stop_step_times_the_first_stage_alone_and_profiles_it(tmp_path, monkeypatch, capsys):
    """``--stop-step`` (a short lease's stage-1 timing): the run ends at the stop, the figures give its tokens
    per step (the stage's, not the last stage's) and the log's truncated status, and the profile runs too."""
    bench = _load_benchmark()
    write_dataset(tmp_path / "data", counting_documents(600), shard_tokens=16384)
    config = tmp_path / "staged.yaml"
    config.write_text(json.dumps({"train": {
        "preset": "tiny", "model": {"n_layer": 2, "model_dim": 32, "n_head": 2, "head_dim": 16}, "steps": 8,
        "batch_schedule": [[256, 64], [512, 128]], "micro_batches": 2, "val_tokens": 512,
        "val_batch_tokens": 256, "val_every": 0, "compile": False}}))
    out = tmp_path / "out"
    monkeypatch.setattr("sys.argv", ["gpu_speedrun.py", "--config", str(config), "--data", str(tmp_path / "data"),
                                     "--out", str(out), "--name", "s1", "--stop-step", "4", "--skip", "1",
                                     "--profile"])
    bench.main()
    figures = json.loads((out / "figures.jsonl").read_text().splitlines()[-1])
    assert (figures["status"], figures["steps"], figures["stop_step"], figures["tokens_per_step"]) == \
        ("truncated", 8, 4, 256)
    assert [step for step, _, _ in figures["val"]] == [0, 4]
    assert figures["step_ms"] is not None                      # steps 2-4 past --skip 1
    assert "stop_step: 4" in (out / "s1.txt").read_text()
    assert (out / "s1.profile.kernels.md").exists()
