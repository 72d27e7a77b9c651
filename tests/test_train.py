"""The ``speedrun train`` stage: the log format (by hand and through the log parser), short runs on synthetic
and on real text, the schedules the loop applies, divergence and failure handling, and (slow) a 2-rank gloo
run against a 1-rank run with 2 accumulation steps. The settings themselves: test_train_config.py."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from speedrun import cli
from speedrun.analysis.logs import read_record
from speedrun.data.shards import sha256_file
from speedrun.errors import SpeedrunError
from speedrun.training.config import TrainConfig
from speedrun.training.data import load_training_data, steps_fed
from speedrun.training.loop import run_training
from speedrun.training.runlog import SEPARATOR, RunLog, peak_memory_line, stopped_path, train_line, val_line
from synthetic_data import counting_documents, write_dataset

STEP_RE = re.compile(r"^step:(\d+)/(\d+) (train|val)_loss:(\S+) train_time:(\d+)ms step_avg:([0-9.]+)ms$")
# A model small enough for seconds-long runs; the head still spans the full GPT-2 vocabulary.
SMALL = {"n_layer": 2, "model_dim": 32, "n_head": 2, "head_dim": 16}
QUICK = {"preset": "tiny", "model": SMALL, "steps": 6, "tokens_per_step": 512, "micro_batches": 2,
         "max_seq_len": 128, "val_tokens": 512, "val_batch_tokens": 256, "val_every": 3,
         "momentum_warmup_steps": 3, "embed_lr": 0.3, "head_lr": 0.02}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, Path]:
    return write_dataset(tmp_path_factory.mktemp("synth"), counting_documents(600), shard_tokens=16384)


def read_log(path: Path) -> tuple[list[str], list[str], list[tuple]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    sep = lines.index(SEPARATOR)
    steps = [m.groups() for m in map(STEP_RE.match, lines[sep + 1:]) if m]
    return lines[:sep], lines[sep + 1:], steps


# ---- the log -----------------------------------------------------------------------------------------


def test_log_lines_by_hand():
    assert val_line(0, 60, 10.825839, 0.0) == "step:0/60 val_loss:10.8258 train_time:0ms step_avg:0.00ms"
    assert val_line(20, 60, 5.41884, 30512.6) == \
        "step:20/60 val_loss:5.4188 train_time:30513ms step_avg:1525.63ms"
    assert train_line(3, 60, 9.89844, 4500.0) == "step:3/60 train_loss:9.8984 train_time:4500ms step_avg:1500.00ms"
    assert train_line(1, 2, float("nan"), 10.0) == "step:1/2 train_loss:nan train_time:10ms step_avg:10.00ms"
    assert peak_memory_line(12, 34) == "peak memory allocated: 12 MiB reserved: 34 MiB"
    assert SEPARATOR == "=" * 100


def test_run_log_appears_under_its_name_only_when_finished(tmp_path, capsys):
    log = RunLog(tmp_path / "sub" / "run.txt")
    log.write("speedrun: 0")
    assert not (tmp_path / "sub" / "run.txt").exists()
    assert log.tmp_path.read_text() == "speedrun: 0\n"              # flushed: a user can tail it
    log.finish()
    assert (tmp_path / "sub" / "run.txt").read_text() == "speedrun: 0\n"
    assert list((tmp_path / "sub").iterdir()) == [tmp_path / "sub" / "run.txt"]
    assert capsys.readouterr().out == "speedrun: 0\n"
    silent = RunLog(None)
    silent.write("nothing")
    silent.finish()


def test_a_new_run_log_removes_the_temporary_logs_a_killed_run_left(tmp_path):
    """A run killed with SIGKILL leaves its .tmp-seed0.txt.* behind (a new-user run found one, mode 0600); the
    next run of the same path removes it, and no other file."""
    folder = tmp_path / "train"
    folder.mkdir()
    for name in (".tmp-seed0.txt.ab12cd", ".tmp-seed0.txt.zz", ".tmp-seed1.txt.ab12cd", "seed0.csv", ".tmp-seed0.txt"):
        (folder / name).write_text("old")
    log = RunLog(folder / "seed0.txt", echo=False)
    assert sorted(p.name for p in folder.iterdir()) == sorted([log.tmp_path.name, ".tmp-seed1.txt.ab12cd", "seed0.csv",
                                                               ".tmp-seed0.txt"])
    log.finish()
    assert (folder / "seed0.txt").read_text() == ""


def test_a_stopped_run_log_goes_beside_its_name_and_the_next_run_removes_it(tmp_path):
    """A run stopped by a signal is not done: its log goes to ``<name>.stopped``, never under the name that the
    workflow takes as the finished run (Snakemake interrupted with its jobs keeps what its jobs wrote); the
    next run of the same name removes it, and the stopped log of another name stays."""
    folder = tmp_path / "train"
    log = RunLog(folder / "seed0.txt", echo=False)
    log.write("run failed: interrupted by SIGINT")
    log.finish(stopped=True)
    assert stopped_path(folder / "seed0.txt") == folder / "seed0.txt.stopped"
    assert sorted(p.name for p in folder.iterdir()) == ["seed0.txt.stopped"]
    assert (folder / "seed0.txt.stopped").read_text() == "run failed: interrupted by SIGINT\n"
    (folder / "seed1.txt.stopped").write_text("other")
    again = RunLog(folder / "seed0.txt", echo=False)
    assert sorted(p.name for p in folder.iterdir()) == sorted([again.tmp_path.name, "seed1.txt.stopped"])
    again.finish()
    assert sorted(p.name for p in folder.iterdir()) == ["seed0.txt", "seed1.txt.stopped"]


# ---- runs --------------------------------------------------------------------------------------------


def test_a_short_run_writes_the_documented_log_and_learns(synthetic, tmp_path):
    shards, bos = synthetic
    cfg = TrainConfig.from_dict({**QUICK, "steps": 12, "val_every": 5})
    log = tmp_path / "train" / "seed3.txt"
    result = run_training(cfg, variant="base", seed=3, shards_dir=shards, bos_dir=bos, log_path=log, env={})
    assert result.status == "complete"
    header, body, steps = read_log(log)
    fields = dict(line.split(": ", 1) for line in header if not line.startswith("Running "))
    assert list(fields)[:4] == ["speedrun", "variant", "seed", "config"]
    assert fields["speedrun"] == "0.1.0" and fields["variant"] == "base" and fields["seed"] == "3"
    assert cfg.compute.dtype == "auto" and json.loads(fields["config"])["dtype"] == "float32"   # resolved for the CPU
    assert fields["config"] == cfg.resolved_for("cpu").to_json()
    assert fields["config_sha256"] == hashlib.sha256(fields["config"].encode()).hexdigest()
    assert (fields["world_size"], fields["tokens_per_step"], fields["val_tokens"], fields["device"]) == \
        ("1", "512", "512", "cpu")
    assert fields["val_data_sha256"] == sha256_file(shards / "synth_val_000000.bin")
    assert re.fullmatch(r"[0-9a-f]{64}", fields["train_data_sha256"])
    assert fields["compile_s"] == "0.0"
    assert any(h.startswith("Running Python ") for h in header)
    assert any(h.startswith("Running PyTorch ") for h in header)
    assert [(int(s), k) for s, _, k, *_ in steps if k == "val"] == [(0, "val"), (5, "val"), (10, "val"),
                                                                   (12, "val")]
    assert [int(s) for s, _, k, *_ in steps if k == "train"] == list(range(1, 13))
    assert body[-2].startswith("peak memory allocated: ") and body[-1].startswith("phases: ")
    assert len(body) == 12 + 4 + 2
    times = [int(t) for *_, t, _ in steps]
    assert times == sorted(times)
    val = [float(x) for _, _, k, x, *_ in steps if k == "val"]
    assert val[0] == pytest.approx(math.log(50304), abs=1e-3)
    assert val[-1] < val[0] - 3.0
    record = read_record(log)
    assert (record.status, record.steps, record.seed, record.variant, record.world_size) == \
        ("complete", 12, 3, "base", 1)
    assert (record.val_tokens, record.tokens_per_step, record.compile_s) == (512, 512, 0.0)
    assert record.val_data_sha256 == fields["val_data_sha256"]
    assert record.val_loss == pytest.approx(val[-1], abs=1e-4)
    assert [(s, k) for s, k, _ in result.losses] == [(int(s), k) for s, _, k, *_ in steps]
    assert [round(x, 4) for *_, x in result.losses] == pytest.approx([float(x) for _, _, _, x, *_ in steps])
    assert sorted(p.name for p in log.parent.iterdir()) == ["seed3.txt"]


def test_the_same_seed_repeats_and_another_seed_differs(synthetic, tmp_path):
    shards, bos = synthetic
    cfg = TrainConfig.from_dict({**QUICK, "steps": 2, "val_every": 0})
    losses = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        run_training(cfg, variant="v", seed=seed, shards_dir=shards, bos_dir=bos, log_path=tmp_path / name,
                     env={})
        losses.append([x for _, _, k, x, *_ in read_log(tmp_path / name)[2] if k == "train"])
    assert losses[0] == losses[1] and losses[0] != losses[2]


def test_absurd_lr_diverges_with_exit_status_zero(synthetic, tmp_path, capsys):
    shards, bos = synthetic
    settings = json.dumps({**QUICK, "head_lr": 1e36})      # head weights ~1e36: the summed loss overflows
    log = tmp_path / "diverged.txt"
    rc = cli.main(["train", "--config", settings, "--variant", "v", "--seed", "0", "--shards-dir", str(shards),
                   "--bos-dir", str(bos), "--out", str(log)])
    assert rc == 0
    lines = log.read_text().splitlines()
    assert lines[-1] == "run diverged: non-finite train_loss at step 2"
    assert lines[-2].startswith("phases: ") and lines[-3].startswith("peak memory allocated: ")
    assert re.match(r"step:2/6 train_loss:(nan|inf) ", lines[-4])
    assert read_record(log).status == "diverged"


def test_a_loss_that_explodes_without_nan_stops_as_diverged(synthetic, tmp_path):
    # head_lr 30: the train loss jumps from ln(50304) = 10.83 to about 170 at step 2, finite (issue 22: such
    # runs ended with val_loss 562,200 as `complete` and were counted).
    shards, bos = synthetic
    log = tmp_path / "exploded.txt"
    result = run_training(TrainConfig.from_dict({**QUICK, "head_lr": 30.0}), variant="v", seed=0,
                          shards_dir=shards, bos_dir=bos, log_path=log, env={})
    assert result.status == "diverged"
    train = [loss for _, kind, loss in result.losses if kind == "train"]
    assert all(math.isfinite(loss) for loss in train) and train[-1] > 2 * train[0]
    last = log.read_text().splitlines()[-1]
    assert re.fullmatch(r"run diverged: smoothed train_loss \S+ at step \d+ above its first value 10\.8258 "
                        r"\(train_loss \S+\)", last), last
    record = read_record(log)
    assert (record.status, record.val_loss, record.reason) == ("diverged", None, last)


def test_a_clock_that_never_ran_gives_zero_for_a_steps_event():
    """A step run outside the loop (benchmarks/gpu_speedrun.py's profile) logs against a clock never started:
    elapsed_ms_at gives the time so far, 0, instead of failing on the missing start event."""
    import torch

    from speedrun.training.loop import TrainClock

    assert TrainClock(torch.device("cpu")).elapsed_ms_at(object()) == 0.0


class _QueuedStepLoss:
    """Stands in for StepLoss as on a GPU: the value is read later (an ``event`` that is not None)."""

    log: list[str] = []

    def __init__(self, mean):
        self.mean, self.event = mean, "queued"

    def value(self):
        self.log.append("read")
        return float(self.mean[0])


def test_a_steps_loss_is_read_only_after_the_next_step_is_queued(synthetic, tmp_path, monkeypatch):
    """No device sync between steps (the records'): on a GPU step s+1's work is queued before step s's loss is read,
    a validation reads the pending loss first, and the log keeps every line in step order, each train line with the
    time at its step's end (the GPU's, here a stand-in clock)."""
    import speedrun.training.loop as train_module

    shards, bos = synthetic
    events = _QueuedStepLoss.log = []
    real_step = train_module.train_step
    monkeypatch.setattr(train_module, "train_step", lambda *a, **k: events.append("queue") or real_step(*a, **k))
    monkeypatch.setattr(train_module, "StepLoss", _QueuedStepLoss)
    monkeypatch.setattr(train_module.TrainClock, "elapsed_ms_at", lambda self, event: 1000.0 * len(events))
    log = tmp_path / "pipelined.txt"
    run_training(TrainConfig.from_dict(QUICK), variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=log,
                 env={})
    # steps 1, 2, 4, 5 read once the next is queued; 3 and 6 by the validation after them
    assert events == ["queue", "queue", "read", "queue", "read", "read", "queue", "queue", "read", "queue", "read",
                      "read"]
    train_ms = [int(ms) for s, _, kind, _, ms, *_ in read_log(log)[2] if kind == "train"]
    assert train_ms == [3000, 5000, 6000, 9000, 11000, 12000]    # the stand-in's reading as each line is written
    steps = [(int(s), kind) for s, _, kind, *_ in read_log(log)[2]]
    assert steps == [(0, "val"), (1, "train"), (2, "train"), (3, "train"), (3, "val"), (4, "train"), (5, "train"),
                     (6, "train"), (6, "val")]


def test_an_exception_is_logged_as_failed_and_raised(synthetic, tmp_path, monkeypatch):
    import speedrun.training.loop as train_module

    shards, bos = synthetic
    real_step = train_module.train_step
    calls = []

    def failing_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk on fire\nsecond line")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train_module, "train_step", failing_step)
    log = tmp_path / "failed.txt"
    with pytest.raises(RuntimeError, match="disk on fire"):
        run_training(TrainConfig.from_dict(QUICK), variant="v", seed=0, shards_dir=shards, bos_dir=bos,
                     log_path=log, env={})
    lines = log.read_text().splitlines()
    assert lines[-1] == "run failed: RuntimeError: disk on fire second line"
    assert lines[-4].startswith("step:1/6 train_loss:")        # the step before the failure: its pending line
    assert lines[-2].startswith("phases: ") and lines[-3].startswith("peak memory allocated: ")
    assert read_record(log).status == "failed"


def test_mismatched_world_size_and_too_little_data_fail_before_writing(synthetic, tmp_path):
    shards, bos = synthetic
    log = tmp_path / "never.txt"
    two = TrainConfig.from_dict({**QUICK, "world_size": 2})
    with pytest.raises(SpeedrunError, match="world_size is 2 but this run was launched with WORLD_SIZE=1"):
        run_training(two, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=log,
                     env={"WORLD_SIZE": "1"})
    long = TrainConfig.from_dict({**QUICK, "steps": 10_000})
    with pytest.raises(SpeedrunError, match="feed .* steps") as short_of_data:
        run_training(long, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=log, env={})
    assert "max_seq_len" not in str(short_of_data.value)              # documents of 20-200 tokens, cut at 128
    cut = TrainConfig.from_dict({**QUICK, "steps": 10_000, "max_seq_len": 16})
    with pytest.raises(SpeedrunError, match="documents longer than max_seq_len 16 lose their tails"):
        run_training(cut, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=log, env={})
    with pytest.raises(SpeedrunError, match="manifest.json: not found"):
        run_training(TrainConfig.from_dict(QUICK), variant="v", seed=0, shards_dir=tmp_path, bos_dir=bos,
                     log_path=log, env={})
    assert not log.exists() and list(tmp_path.iterdir()) == []


def test_a_contiguous_run_reads_every_whole_slice_of_the_shards_and_learns(tmp_path):
    """train_batches contiguous (record #12's loader) in the loop: a run of exactly the steps that the train shards'
    whole slices of T + 1 tokens feed completes, although the BOS-aligned loader would feed fewer (it loses each
    shard's head before its first BOS and the rest after the last whole document), and its loss falls."""
    shards, bos = write_dataset(tmp_path / "data", counting_documents(150, seed=1), shard_tokens=4096)
    data = load_training_data(shards, bos)
    T, micro_batches = 256, 2
    steps = sum((len(s) - 1) // T for s in data.train_shards) // micro_batches
    stages = [(0, T * micro_batches, T)]
    lengths = [len(s) for s in data.train_shards]
    assert steps_fed(10**6, micro_batches, stages, lengths, data.train_bos) < steps
    assert steps_fed(10**6, micro_batches, stages, lengths, data.train_bos, "contiguous") == steps
    cfg = TrainConfig.from_dict({**QUICK, "steps": steps, "val_every": 0, "max_seq_len": T,
                                 "train_batches": "contiguous"})
    log = tmp_path / "contiguous.txt"
    result = run_training(cfg, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=log, env={})
    assert result.status == "complete" and read_record(log).steps == steps
    val = [x for _, kind, x in result.losses if kind == "val"]
    assert len(val) == 2 and val[-1] < val[0] - 1.0 and np.isfinite(val).all()


def test_the_cut_documents_hint_by_hand():
    from speedrun.training.data import cut_documents_hint

    # the H200 race of 2026-11-30: 4 copies of debian-docs' train shard fed 52 steps of 393,216 tokens
    hint = cut_documents_hint(52, 393_216, 56_316_000, 2048)
    assert hint == (" Those steps read about 20447232 of the 56316000 train tokens: documents longer than "
                    "max_seq_len 2048 lose their tails; a larger max_seq_len uses more of them.")
    assert cut_documents_hint(72, 393_216, 56_316_000, 2048) == ""     # 28.3M: half or more was read


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory) -> tuple[Path, Path]:
    """The embedded corpus through the real corpus, tokenize and bos-index stages."""
    root = tmp_path_factory.mktemp("shakespeare")
    docs = root / "documents.parquet"
    assert cli.main(["corpus", "--shuffle-seed", "1234", "--out", str(docs)]) == 0
    assert cli.main(["tokenize", "--documents", str(docs), "--dataset", "shakespeare", "--shard-tokens",
                     "262144", "--out-dir", str(root / "shards")]) == 0
    assert cli.main(["bos-index", "--shards-dir", str(root / "shards"), "--out-dir", str(root / "bos")]) == 0
    return root / "shards", root / "bos"


def test_loss_falls_on_shakespeare(shakespeare, tmp_path):
    shards, bos = shakespeare
    cfg = TrainConfig.from_dict({**QUICK, "steps": 16, "tokens_per_step": 1024, "val_tokens": 1024,
                                 "val_batch_tokens": 512, "val_every": 0, "max_seq_len": 512})
    run_training(cfg, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=tmp_path / "s.txt", env={})
    val = [float(x) for _, _, k, x, *_ in read_log(tmp_path / "s.txt")[2] if k == "val"]
    assert val[0] == pytest.approx(math.log(50304), abs=1e-3)
    assert val[-1] < 7.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_worker(rank, world, port, settings, shards, bos, log, queue):
    """One rank of a gloo run started by torch.multiprocessing; puts its full-precision losses."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)})
    import torch

    torch.set_num_threads(1)
    result = run_training(TrainConfig.from_dict(settings), variant="v", seed=0, shards_dir=shards,
                          bos_dir=bos, log_path=log)
    queue.put((rank, result.losses))


def _run_ranks(world, settings, shards, bos, log):
    """Start ``world`` spawned ranks; their losses by rank. Fails as soon as a rank dies (not after a timeout)."""
    import queue as queue_module
    import time

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_worker, args=(r, world, port, settings, shards, bos, log, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + 300
    try:
        while len(results) < world:
            try:
                rank, losses = queue.get(timeout=1)
                results[rank] = losses
            except queue_module.Empty:
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not failed and time.monotonic() < deadline, f"rank exit codes {failed}"
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return results


@pytest.mark.slow
@pytest.mark.parametrize("extra", [{}, {"dtype": "float32", "model": {**SMALL, "tie_embed_head": True},
                                         "untie_step": 3}, {"train_batches": "contiguous", "max_seq_len": 256}],
                         ids=["untied", "tied-then-untied-fp32", "contiguous"])
def test_two_gloo_ranks_equal_one_rank_with_two_accumulation_steps(synthetic, tmp_path, extra):
    """Tied, the embedding's gradient is folded into the head's before the all-reduce (fp32 here: in bf16 the
    tied sums' order moves the losses by about 7e-5)."""
    shards, bos = synthetic
    base = {**QUICK, "steps": 5, "val_every": 2, "micro_batches": 2, **extra}
    one = _run_ranks(1, {**base, "world_size": 1}, shards, bos, tmp_path / "one.txt")[0]
    two = _run_ranks(2, {**base, "world_size": 2}, shards, bos, tmp_path / "two.txt")
    assert two[0] == two[1]                                   # every rank saw the same averaged losses
    assert [(s, k) for s, k, _ in one] == [(s, k) for s, k, _ in two[0]] and len(one) == 5 + 4
    for (_, _, a), (_, _, b) in zip(one, two[0]):
        assert a == pytest.approx(b, abs=1e-5)
    assert "world_size: 2" in (tmp_path / "two.txt").read_text()
    assert read_record(tmp_path / "two.txt").status == "complete"


@pytest.mark.slow
def test_torchrun_launches_the_stage_on_two_ranks(synthetic, tmp_path):
    shards, bos = synthetic
    bin_dir = Path(sys.executable).parent
    log = tmp_path / "torchrun.txt"
    settings = json.dumps({**QUICK, "steps": 2, "world_size": 2})
    cmd = [str(bin_dir / "torchrun"), "--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", "--no-python", str(bin_dir / "speedrun"), "train", "--config",
           settings, "--variant", "v", "--seed", "0", "--shards-dir", str(shards), "--bos-dir", str(bos),
           "--out", str(log)]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    record = read_record(log)
    assert (record.status, record.world_size, record.steps) == ("complete", 2, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_a_short_run_on_the_gpu(synthetic, tmp_path):
    shards, bos = synthetic
    cfg = TrainConfig.from_dict({**QUICK, "device": "cuda"})
    result = run_training(cfg, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=tmp_path / "g.txt",
                          env={})
    record = read_record(tmp_path / "g.txt")
    assert result.status == record.status == "complete" and record.gpu_count == 1
    assert result.losses[-1][2] < result.losses[0][2]


# ---- schedules and compiled warm-up ---------------------------------------------------------------------


def test_warm_up_covers_every_stage_start():
    from speedrun.training.loop import warm_up_steps

    cfg = TrainConfig.from_dict({**QUICK, "steps": 12, "batch_schedule": [[256, 64], [512, 128]],
                                 "model": {**SMALL, "window_pattern": "SL", "tie_embed_head": True},
                                 "window_schedule": [[1, 1], [1, 2], [2, 3]], "untie_step": 9})
    assert warm_up_steps(cfg) == [0, 4, 6, 8]                  # not the untie step: it changes no graph
    assert warm_up_steps(TrainConfig.from_dict(QUICK)) == [0]



def test_warm_up_plan_meets_every_validation_state_once_in_run_order():
    from speedrun.training.loop import validation_steps, warm_up_plan

    settings = {**QUICK, "steps": 12, "val_every": 3,
                "model": {**SMALL, "window_pattern": "SL", "tie_embed_head": True},
                "window_schedule": [[1, 1], [1, 2], [2, 3]], "untie_step": 9, "final_window_long_blocks": 4}
    cfg = TrainConfig.from_dict(settings)
    assert validation_steps(cfg) == [0, 3, 6, 9, 12]
    # windows (1,1) until 4, (1,2) until 8, (2,3) after, (2,4) at the final validation; the untie at 9
    # changes no graph
    assert warm_up_plan(cfg) == [(0, "val"), (0, "train"), (4, "train"), (6, "val"), (8, "train"), (9, "val"),
                                 (12, "val")]
    assert warm_up_plan(TrainConfig.from_dict({**QUICK, "val_every": 0})) == [(0, "val"), (0, "train")]
    # FlexAttention takes the windows as graph inputs: one graph for training, one for validation
    flex = TrainConfig.from_dict({**settings, "device": "cuda",
                                  "model": {**settings["model"], "attention_backend": "flex"}})
    assert warm_up_plan(flex) == [(0, "val"), (0, "train")]
    # other backends compile each training stage start: back at windows (1, 2) at step 8, YaRN's scale (a
    # float there) is not what it was at step 0
    back = TrainConfig.from_dict({**settings, "model": {**settings["model"], "yarn": True, "rope": "half_truncated"},
                                  "window_schedule": [[1, 2], [1, 3], [1, 2]], "untie_step": None})
    assert [step for step, kind in warm_up_plan(back) if kind == "train"] == [0, 4, 8]


def test_a_run_stopped_early_warms_up_and_validates_only_up_to_its_stop_step():
    """``stop_step`` (benchmarks/gpu_speedrun.py --stop-step): the schedule of all the steps, the plan cut at the
    stop, which is validated as the last step."""
    from speedrun.training.loop import validation_steps, warm_up_plan, warm_up_steps

    cfg = TrainConfig.from_dict({**QUICK, "steps": 12, "val_every": 3, "batch_schedule": [[256, 64], [512, 128]],
                                 "model": {**SMALL, "window_pattern": "SL"}, "window_schedule": [[1, 1], [1, 2], [2, 3]],
                                 "final_window_long_blocks": 4})
    assert warm_up_steps(cfg) == [0, 4, 6, 8]
    assert warm_up_steps(cfg, stop_step=5) == [0, 4]
    assert validation_steps(cfg, stop_step=5) == [0, 3, 5]
    assert validation_steps(cfg, stop_step=6) == [0, 3, 6]
    # windows (1, 1) until 4, (1, 2) at the stop's validation: no graph of the second batch stage (6), of the
    # (2, 3) windows (8) nor of the final extension to 4 blocks
    assert warm_up_plan(cfg, stop_step=5) == [(0, "val"), (0, "train"), (4, "train"), (5, "val")]
    assert warm_up_plan(cfg, stop_step=3) == [(0, "val"), (0, "train")]
    assert warm_up_plan(cfg, stop_step=12) == warm_up_plan(cfg)


def test_a_run_stopped_early_logs_its_stop_and_reads_as_truncated(synthetic, tmp_path):
    shards, bos = synthetic
    cfg = TrainConfig.from_dict({**QUICK, "steps": 12, "val_every": 5})
    log = tmp_path / "stopped.txt"
    result = run_training(cfg, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=log, env={},
                          stop_step=7)
    header, body, steps = read_log(log)
    fields = dict(line.split(": ", 1) for line in header if not line.startswith("Running "))
    assert fields["stop_step"] == "7" and list(fields).index("stop_step") == list(fields).index("compile_s") - 1
    assert [(int(s), int(n), k) for s, n, k, *_ in steps if k == "val"] == [(0, 12, "val"), (5, 12, "val"),
                                                                           (7, 12, "val")]
    assert [int(s) for s, _, k, *_ in steps if k == "train"] == list(range(1, 8))
    assert result.status == "complete" and [s for s, k, _ in result.losses if k == "val"] == [0, 5, 7]
    record = read_record(log)
    assert record.status == "truncated" and record.val_loss is None
    for bad in (0, 13):
        with pytest.raises(SpeedrunError, match=f"stop_step {bad}: expected a step from 1 to the run's 12 steps"):
            run_training(cfg, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=tmp_path / "bad.txt",
                         env={}, stop_step=bad)
    assert not (tmp_path / "bad.txt").exists()


def test_warm_up_line_names_each_graph_with_its_shape_and_windows():
    """The warm-up's progress on stderr (a record preset's cold compile is minutes per graph): the plan's index,
    the graph's step, its batch shape (training) and its windows, and the seconds."""
    from speedrun.training.loop import warm_up_line

    cfg = TrainConfig.from_dict({**QUICK, "steps": 12, "val_every": 3, "batch_schedule": [[256, 64], [512, 128]],
                                 "model": {**SMALL, "window_pattern": "SL"}, "window_schedule": [[1, 1], [1, 2]],
                                 "final_window_long_blocks": 4})
    assert warm_up_line(cfg, 2, 7, 6, "train", 76.94) == (
        "warm-up 2/7: train graph of step 6 (512 tokens per step, max_seq_len 128, windows [1, 2] blocks): 76.9 s")
    assert warm_up_line(cfg, 7, 7, 12, "val", 32.6) == "warm-up 7/7: validation graph of step 12 (windows [1, 4] " \
                                                       "blocks): 32.6 s"
    assert warm_up_line(TrainConfig.from_dict(QUICK), 1, 2, 0, "val", 0.04) == (
        "warm-up 1/2: validation graph of step 0 (the model's windows): 0.0 s")


def test_a_batch_schedule_run_draws_each_stage_and_learns(synthetic, tmp_path):
    shards, bos = synthetic
    cfg = TrainConfig.from_dict({**QUICK, "steps": 8, "val_every": 0, "tokens_per_step": 4096,
                                 "batch_schedule": [[256, 64], [512, 128]]})
    result = run_training(cfg, variant="b", seed=0, shards_dir=shards, bos_dir=bos, log_path=tmp_path / "b.txt",
                          env={})
    assert result.status == "complete"
    assert read_record(tmp_path / "b.txt").tokens_per_step == 512        # the last stage's, not the setting
    val = [x for _, kind, x in result.losses if kind == "val"]
    assert val[-1] < val[0] - 1.0


def test_the_loop_applies_the_stage_lr_multipliers_and_the_momentum_cooldown(synthetic, tmp_path, monkeypatch):
    from speedrun.optim.groups import Optimizers

    applied = []
    real_apply = Optimizers.apply_schedule

    def recording_apply(self, step, schedule):
        real_apply(self, step, schedule)
        muon = next(g for g in self.groups() if g["kind"] == "matrix")
        applied.append((step, muon["lr"], muon["momentum"]))

    monkeypatch.setattr(Optimizers, "apply_schedule", recording_apply)
    shards, bos = synthetic
    cfg = TrainConfig.from_dict({**QUICK, "steps": 6, "val_every": 0, "muon_lr": 0.04, "cooldown_frac": 0.5,
                                 "lr_floor": 0.25, "lr_stage_multipliers": [1.0, 2.0],
                                 "momentum_warmup_steps": 2, "momentum_cooldown_steps": 2})
    run_training(cfg, variant="s", seed=0, shards_dir=shards, bos_dir=bos, log_path=tmp_path / "s.txt", env={})
    # halves from step 3; cooldown from int(6 * 0.5) = 3 (t = 0, 1/3, 2/3); momentum 0.85 -> 0.95 over steps
    # 0-2, back down from step 6 - 2 = 4 (step 5: half way)
    assert [s for s, _, _ in applied] == list(range(6))
    assert [lr for _, lr, _ in applied] == pytest.approx(
        [0.04, 0.04, 0.04, 0.04 * 2.0, 0.04 * (2.0 * 2 / 3 + 0.25 / 3), 0.04 * (2.0 / 3 + 0.25 * 2 / 3)])
    assert [m for _, _, m in applied] == pytest.approx([0.85, 0.90, 0.95, 0.95, 0.95, 0.90])


@pytest.mark.slow
def test_a_compiled_run_warms_up_every_graph_and_matches_eager(synthetic, tmp_path):
    """torch.compile on the CPU (Inductor's C++ backend): the warm-up compiles the graphs of every
    schedule phase and restores the schedule state, so the compiled run's losses equal the eager run's."""
    shards, bos = synthetic
    settings = {**QUICK, "steps": 4, "val_every": 0, "dtype": "float32",
                "batch_schedule": [[256, 64], [512, 128]],
                "model": {**SMALL, "window_pattern": "SL", "tie_embed_head": True, "yarn": True},
                "window_schedule": [[1, 1], [1, 2]], "untie_step": 2}
    logs = {}
    for compiled in (False, True):
        cfg = TrainConfig.from_dict({**settings, "compile": compiled})
        logs[compiled] = run_training(cfg, variant="c", seed=0, shards_dir=shards, bos_dir=bos,
                                      log_path=tmp_path / f"{compiled}.txt", env={})
    assert read_record(tmp_path / "True.txt").compile_s > 0
    eager = [x for *_, x in logs[False].losses]
    compiled = [x for *_, x in logs[True].losses]
    assert compiled == pytest.approx(eager, rel=1e-4)


def test_compile_cache_points_inductor_and_triton_into_one_folder_unless_set(tmp_path):
    from speedrun.training.compile_cache import use_compile_cache

    env = {}
    use_compile_cache(tmp_path / "cache", env)
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache" / "inductor"),
                   "TRITON_CACHE_DIR": str(tmp_path / "cache" / "triton")}
    mine = {"TRITON_CACHE_DIR": "/elsewhere"}
    use_compile_cache(tmp_path / "cache", mine)
    assert mine["TRITON_CACHE_DIR"] == "/elsewhere"
    assert mine["TORCHINDUCTOR_CACHE_DIR"].endswith("inductor")


def test_gradients_accumulate_in_one_multi_tensor_add_bit_for_bit_as_backward():
    """accumulate_gradients (train_step's): over three micro-batches of the record88 preset at a tiny width, from a
    kept gradient on one parameter (Adam's between its updates), the same gradients bit for bit as autograd's own
    accumulation by ``backward()``, with one multi-tensor add per micro-batch instead of an add per parameter."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from record_models import tiny_config
    from speedrun.model.gpt import GPT
    from speedrun.training.loop import accumulate_gradients

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    config = tiny_config("record88", bigram_dim=32, rotary_positions=256, fp8_mlp=False, prefix_token_loss=False)
    gen = torch.Generator().manual_seed(4)
    batches = [torch.randint(0, 50304, (33,), generator=gen) for _ in range(3)]
    results, adds = [], []
    for ours in (False, True):
        torch.manual_seed(0)
        model = GPT(config)
        params = [p for p in model.parameters() if p.requires_grad]
        model.lm_head.weight.grad = torch.full_like(model.lm_head.weight, 0.5)          # a kept gradient
        with Ops() as ops:
            for tokens in batches:
                cu = torch.tensor([0, 32], dtype=torch.int32)
                loss = model(tokens[:-1], tokens[1:], cu, 32) / 3
                accumulate_gradients(loss, params) if ours else loss.backward()
        results.append([None if p.grad is None else p.grad.clone() for p in params])
        adds.append((ops.names.count("add_"), ops.names.count("_foreach_add_")))
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(*results, strict=True))
    with_grads = sum(g is not None for g in results[1])
    assert with_grads > 80
    assert adds[1][1] == 3 and adds[0][1] == 0                 # one multi-tensor add per micro-batch
    # autograd's own: an add per parameter in micro-batches 2 and 3, and one for the kept gradient (358 - 129)
    assert adds[0][0] - adds[1][0] == 2 * with_grads + 1
