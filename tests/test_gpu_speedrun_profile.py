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


def test_profile_step_traces_a_later_stage_after_training_the_steps_before_it(tmp_path, monkeypatch):
    """``--profile-step N`` (stage 2 of a parity run, whose 3 ms session 41 left open): the steps before N - 1
    are trained in order, the parts are timed on step N - 1's batches (that stage's shape) and steps N and
    N + 1 are traced; steps that the run does not train are refused before anything runs."""
    bench = _load_benchmark()
    from speedrun.training import loop

    write_dataset(tmp_path / "data", counting_documents(600), shard_tokens=16384)
    config = TrainConfig.from_dict({
        "preset": "tiny", "model": {"n_layer": 2, "model_dim": 32, "n_head": 2, "head_dim": 16}, "steps": 8,
        "batch_schedule": [[256, 64], [512, 128]], "micro_batches": 2, "val_tokens": 512,
        "val_batch_tokens": 256, "val_every": 0, "compile": False})
    trained, fetched = [], []
    train, step_batches = loop._Run.train, loop._Run.step_batches
    monkeypatch.setattr(loop._Run, "train", lambda self, step: (trained.append(step), train(self, step))[1])
    monkeypatch.setattr(loop._Run, "step_batches",
                        lambda self, step: (fetched.append(step), step_batches(self, step))[1])
    out = tmp_path / "out" / "run.profile"
    out.parent.mkdir()
    bench.profile_steps(config, tmp_path / "data", out, first=5)
    assert trained == [0, 1, 2, 3, 5, 6]
    assert fetched == [0, 1, 2, 3, 4, 5, 6]                     # step 4's batches: the parts' (stage 2's shape)
    assert config.batch_at(4) == (512, 128)
    assert "2 steps, wall" in Path(f"{out}.kernels.md").read_text()
    for first, stop in [(7, None), (1, None), (4, 5)]:          # step 8 / step 5 is validated, not trained
        with pytest.raises(ValueError, match="profiled steps"):
            bench.profile_steps(config, tmp_path / "data", out, stop_step=stop, first=first)


def test_profile_step_below_two_is_refused_by_the_command_line(tmp_path, monkeypatch, capsys):
    bench = _load_benchmark()
    monkeypatch.setattr("sys.argv", ["gpu_speedrun.py", "--config", str(tmp_path / "c.yaml"), "--data",
                                     str(tmp_path), "--out", str(tmp_path / "out"), "--name", "x", "--profile",
                                     "--profile-step", "1"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "--profile-step must be at least 2, got 1" in capsys.readouterr().err
