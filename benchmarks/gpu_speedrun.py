"""Throughput and loss-against-time of the speedrun GPT on one GPU, through the train stage itself.

Runs :func:`speedrun.training.loop.run_training` (the code the pipeline runs: loader, compiled model, optimizers,
log) with the ``train`` settings of a config file, on the tokenize and bos_index stages' folders of a
corpus, then reads the log back and prints one JSON line of figures:

* ``compile_s``: compile and warm-up before the first timed step (outside train_time);
* ``step_ms``: median wall time of a training step after the first ``--skip`` steps (from the cumulative
  train_time of the log's train lines), ``tokens_per_s`` = tokens per step / step_ms;
* ``mfu``: model FLOPs per token (:func:`flops_per_token`) x tokens/s against ``--peak-tflops`` (the
  H200's measured dense bf16 rate, 810 TFLOP/s);
* ``peak_mib``: peak allocated memory; ``val``: every (step, train_time s, val_loss) of the log;
* ``graphs``: the graphs Dynamo compiled (:func:`compiled_graphs`; the profile's are not counted).

With ``--profile`` it also times the parts of a step and traces two training steps with torch.profiler
after the run (:func:`profile_steps`: steps 2 and 3, or ``--profile-step N`` and N + 1;
``<out>/<name>.profile.{txt,kernels.md,trace.json.gz}``). With
``--check-data`` it only checks, in seconds and without a GPU, that ``--data`` feeds the config (:func:`check_data`).

    PYTHONPATH=src python benchmarks/gpu_speedrun.py --config configs/h200-record28.yaml \\
        --data .carry/dd --out /tmp/bench --name record28 --steps 30
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

from speedrun.analysis.logs import parse_log, read_record
from speedrun.errors import SpeedrunError
from speedrun.model.config import GPTConfig
from speedrun.model.prefix import prefix_token_table
from speedrun.training.compile_cache import use_compile_cache
from speedrun.training.config import TrainConfig
from speedrun.training.loop import last_step, run_training
from speedrun.workflow.planning import check_training_data

H200_BF16_TFLOPS = 810.0


def flops_per_token(model: GPTConfig, window_tokens: float) -> float:
    """Training FLOPs per token (forward + backward = 3 x forward): 6 x the multiply-adds of the matrix
    parameters (Q, K, V, O of each attention layer, the MLP of every layer, and the head) plus the attention
    products, 4 x n_head x head_dim x the mean number of keys a query sees, times 3. ``window_tokens``: that
    mean context (about half the window for windows shorter than the documents). Layers in
    ``attention_free_layers`` count their MLP only (figures before 2026-11-30 counted their attention too:
    record28's MFU was about 2% high). An estimate: embeddings, norms and the softmax are left out
    (speedrun-spec.md 6 counts about 0.85 GFLOP per token for the record's model)."""
    c, a, f = model.model_dim, model.attn_dim, model.mlp_hidden
    attention_layers = model.n_layer - len(model.attention_free_layers)
    matrices = attention_layers * (3 * c * a + a * c) + model.n_layer * 2 * c * f + model.vocab_size * c
    attention = attention_layers * 4 * a * window_tokens
    return 6.0 * matrices + 3.0 * attention


def compiled_graphs() -> int:
    """Graphs Dynamo compiled in this process so far (``torch._dynamo.utils.counters``): for a training
    run, one per graph key of :func:`speedrun.training.loop.warm_up_plan` when nothing breaks a graph."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_cache_counters() -> dict[str, int]:
    """The compile caches' hits, misses and bypasses in this process (``torch._dynamo.utils.counters``):
    ``aot_autograd`` (the traced forward and backward graphs) and ``inductor`` (``fxgraph_cache_*``, the
    generated kernels' code). A warm start should show hits only; a bypass names a graph that is traced
    and compiled again every run."""
    from torch._dynamo.utils import counters

    keep = ("autograd_cache", "fxgraph_cache")
    return {f"{group}.{name}": int(n) for group in ("aot_autograd", "inductor")
            for name, n in counters[group].items() if name.startswith(keep)}


def load_settings(path: Path, overrides: list[str], steps: int | None) -> dict:
    """The ``train`` mapping of the config file, with ``key=json`` overrides and ``--steps``. ``model=json``
    replaces the config's model overrides; ``model.<field>=json`` sets one of them and keeps the others."""
    settings = dict(yaml.safe_load(path.read_text())["train"])
    for item in overrides:
        key, _, value = item.partition("=")
        if key.startswith("model."):
            settings["model"] = {**settings.get("model", {}), key.removeprefix("model."): json.loads(value)}
        else:
            settings[key] = json.loads(value)
    if steps is not None:
        settings["steps"] = steps
    return settings


def step_times_ms(log: Path) -> list[float]:
    """Per-step wall times (ms) from the cumulative train_time of the train lines (validation excluded)."""
    train = parse_log(log).metrics
    train = train[train["kind"] == "train"].sort_values("step")
    times = [0.0] + train["train_time_ms"].tolist()
    return [b - a for a, b in zip(times[:-1], times[1:])]


def summarize(config: TrainConfig, log: Path, skip: int, peak_tflops: float, stop_step: int | None = None) -> dict:
    record = read_record(log)
    metrics = parse_log(log).metrics
    val = metrics[metrics["kind"] == "val"]
    steps = step_times_ms(log)
    tokens = config.batch_at(last_step(config, stop_step) - 1)[0]        # the last trained step's batch
    model = config.model_config()
    window = model.window_long_blocks * model.window_block_size if model.window_pattern else config.max_seq_len
    flops = flops_per_token(model, min(window, config.max_seq_len) / 2)
    speed = {"step_ms": None, "tokens_per_s": None, "mfu": None}        # a start-up run: no step past --skip
    if len(steps) > skip:
        step_ms = statistics.median(steps[skip:])
        tokens_per_s = tokens / step_ms * 1000.0
        speed = {"step_ms": round(step_ms, 1), "tokens_per_s": round(tokens_per_s),
                 "mfu": round(flops * tokens_per_s / (peak_tflops * 1e12), 3)}
    return {"status": record.status, "compile_s": record.compile_s, "steps": config.steps, "stop_step": stop_step,
            "tokens_per_step": tokens, **speed, "gflop_per_token": round(flops / 1e9, 3),
            "peak_mib": record.peak_memory_mib, "train_time_s": (record.train_time_ms or float("nan")) / 1000,
            "val": [(int(r.step), round(r.train_time_ms / 1000, 1), round(r.val_loss, 4))
                    for r in val.itertuples()]}


KERNEL_KINDS = (  # (kind, pattern on the kernel name), first match wins
    ("matmul", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|scaled_mm|sm90_", re.I)),
    ("attention", re.compile(r"flex|attention|flash|triton_tem", re.I)),
    ("triton (fused elementwise, reductions)", re.compile(r"^triton_")),
)


def kernel_summary(trace: Path, wall_ms: float, steps: int) -> str:
    """Per-step GPU time by kernel kind from a Chrome trace of ``steps`` steps: kernel count, busy time (the
    union of kernel intervals) against ``wall_ms``, and the kernels taking the most time."""
    events = json.loads(trace.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    kinds: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        kind = next((k for k, rx in KERNEL_KINDS if rx.search(e["name"])), e["cat"] if e["cat"] != "kernel" else "other")
        kinds[kind] = kinds.get(kind, 0.0) + e["dur"] / 1000
        by_name.setdefault(e["name"], []).append(e["dur"] / 1000)
    busy, end = 0.0, -1.0
    for start, dur in sorted((e["ts"], e["dur"]) for e in kernels):
        stop = start + dur
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    lines = [f"{steps} steps, wall {wall_ms / steps:.1f} ms per step, {len(kernels) / steps:.0f} kernels per step, "
             f"GPU busy {busy / 1000 / steps:.1f} ms per step ({busy / 1000 / wall_ms:.0%})", "",
             "| kernel kind | ms per step | share of kernel time |", "|---|---|---|"]
    total = sum(kinds.values())
    for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {kind} | {ms / steps:.1f} | {ms / total:.0%} |")
    lines += ["", "| kernel | calls per step | ms per step |", "|---|---|---|"]
    for name, durs in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:30]:
        lines.append(f"| {name[:110]} | {len(durs) / steps:.0f} | {sum(durs) / steps:.2f} |")
    return "\n".join(lines) + "\n"


def profile_steps(config: TrainConfig, data: Path, out: Path, stop_step: int | None = None, first: int = 2) -> None:
    """After warm-up and the steps before ``first - 1`` trained untimed (in order: the loader serves the steps
    one after another): the wall time of the parts of step ``first - 1`` (forward and backward of all
    micro-batches, the optimizer step; CUDA-synchronized, median of 3, on that step's batches), then a
    torch.profiler trace of steps ``first`` and ``first + 1``: the operator table (``<out>.txt``), the kernel
    summary by kind with the GPU's busy share (``<out>.kernels.md``) and the trace itself
    (``<out>.trace.json.gz``, for chrome://tracing or Perfetto). ``first`` = 2 traces stage 1; a later stage's
    steps (e.g. 41 of the parity schedule's stage 2) cost the steps before them, about 0.3-0.5 s each on an H100.
    Raises ``ValueError`` unless 2 <= first and first + 1 < the run's last step (``stop_step`` or the config's
    steps: both traced steps are trained, not validated)."""
    from torch.profiler import ProfilerActivity, profile

    from speedrun.training.data import load_training_data
    from speedrun.training.launch import Launch, resolve_device
    from speedrun.support.phases import RunPhases
    from speedrun.training.loop import _Run, last_step, train_step
    from speedrun.training.runlog import RunLog

    last_trained = last_step(config, stop_step) - 1
    if not 2 <= first < last_trained:
        raise ValueError(f"the profiled steps {first} and {first + 1} must lie in 2..{last_trained} (the run's "
                         f"trained steps past its first two)")
    device = resolve_device(config.compute.device, 0)
    phases = RunPhases(sync=torch.cuda.synchronize if device.type == "cuda" else lambda: None)
    run = _Run(config, 0, load_training_data(data / "shards", data / "bos"), device, Launch({}), RunLog(None),
               phases, stop_step)                     # with --stop-step, the graphs of the steps before it alone
    run.warm_up()
    for step in range(first - 1):                      # the steps before the parts' step, untimed
        run.train(step)
    cuda = device.type == "cuda"

    def timed(fn) -> float:
        run.clock.sync()
        start = time.perf_counter()
        fn()
        run.clock.sync()
        return (time.perf_counter() - start) * 1000

    batches = run.step_batches(first - 1)
    max_seq_len = config.batch_at(first - 1)[1]
    parts = {"forward + backward": [], "optimizer step": [], "zero_grad": [], "tied copy + FP8 weights": []}
    for _ in range(3):
        parts["forward + backward"].append(timed(lambda: train_step(
            run.forward, run.model, batches, device, run.autocast, 1, max_seq_len)))
        parts["optimizer step"].append(timed(run.optimizers.step))
        parts["zero_grad"].append(timed(run.optimizers.zero_grad))
        parts["tied copy + FP8 weights"].append(timed(run.model.after_optimizer_step))
    lines = ["| part of a step (steps re-run on one batch) | ms (median of 3) |", "|---|---|"]
    lines += [f"| {k} | {statistics.median(v):.1f} |" for k, v in parts.items()]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    run.clock.sync()
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for step in (first, first + 1):
            run.train(step)
        run.clock.sync()
    wall_ms = (time.perf_counter() - start) * 1000
    run.close()
    Path(f"{out}.txt").write_text(prof.key_averages().table(
        sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=40, max_name_column_width=80))
    trace = Path(f"{out}.trace.json")
    prof.export_chrome_trace(str(trace))
    summary = "\n".join(lines) + "\n\n" + kernel_summary(trace, wall_ms, 2)
    Path(f"{out}.kernels.md").write_text(summary)
    print(summary, flush=True)
    with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()


def check_data(path: Path, overrides: list[str], steps: int | None, data: Path) -> int:
    """``--check-data``: whether the shards and BOS index under ``data`` (``shards/``, ``bos/``) feed every step
    and the validation of the config at ``path`` (:func:`speedrun.workflow.planning.check_training_data`, the
    workflow's own check: no token is read), after, for a preset with the prefix-token loss (record #88), the
    GPT-2 vocabulary its table is built from (the workflow installs it; a bare GPU image does not have it), so
    that a device call fails in seconds, not after a compile. Prints one line; returns 0, or 1 with the
    check's message."""
    config = TrainConfig.from_dict(load_settings(path, overrides, steps))
    try:
        model = config.model_config()
        if model.prefix_token_loss:
            prefix_token_table(model.vocab_size)
        check_training_data(config.settings(), data / "shards", data / "bos", what=str(path))
    except SpeedrunError as err:
        print(f"gpu_speedrun: {err}", file=sys.stderr)
        return 1
    print(f"{path}: {data} feeds its {config.steps} steps and {config.evaluation.val_tokens} validation tokens")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="a config file with a `train` section")
    parser.add_argument("--data", type=Path, required=True, help="folder holding shards/ and bos/ (the stages' outputs)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the log, the figures and the profile")
    parser.add_argument("--name", required=True, help="run name (log file stem)")
    parser.add_argument("--steps", type=int, default=None, help="override train.steps")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=JSON",
                        help="override one train setting, e.g. --set 'model={\"attention_backend\": \"varlen\"}' (replaces "
                             "the config's model settings) or --set model.fp8_mlp=false (one of them)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the run's seed: its initialization (the token stream is the same for every seed)")
    parser.add_argument("--skip", type=int, default=3, help="train steps left out of the median step time")
    parser.add_argument("--stop-step", type=int, default=None, metavar="N",
                        help="end the run at step N (validated), the schedule that of the config's steps: the first "
                             "stages timed without compiling the later stages' graphs (a short lease's measurement; "
                             "the log reads as truncated)")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_TFLOPS)
    parser.add_argument("--profile", action="store_true", help="also trace two steps with torch.profiler")
    parser.add_argument("--profile-step", type=int, default=2, metavar="N",
                        help="with --profile: trace steps N and N+1 (default 2: stage 1; e.g. 41 for the parity "
                             "schedule's stage 2), the steps before them trained untimed")
    parser.add_argument("--check-data", action="store_true",
                        help="only check that --data feeds the config's steps and validation (the planning-time "
                             "check of the workflow, no GPU, seconds), print one line and exit: status 1 if not")
    parser.add_argument("--compile-cache", type=Path, default=None,
                        help="Inductor/Triton cache folder, as `speedrun train --compile-cache` (a second run "
                             "with the same folder measures the warm start)")
    args = parser.parse_args()
    if args.profile_step < 2:
        parser.error(f"--profile-step must be at least 2, got {args.profile_step}")
    if args.check_data:
        raise SystemExit(check_data(args.config, args.overrides, args.steps, args.data))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.compile_cache is not None:
        use_compile_cache(args.compile_cache, os.environ)
    config = TrainConfig.from_dict(load_settings(args.config, args.overrides, args.steps))
    log = args.out / f"{args.name}.txt"
    started = time.time()
    run_training(config, variant=args.name, seed=args.seed, shards_dir=args.data / "shards", bos_dir=args.data / "bos",
                 log_path=log, env={}, stop_step=args.stop_step)
    figures = summarize(config, log, args.skip, args.peak_tflops, args.stop_step)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    figures.update(name=args.name, seed=args.seed, wall_s=round(time.time() - started, 1), gpu=gpu, torch=torch.__version__,
                   graphs=compiled_graphs(), caches=compile_cache_counters(), host=socket.gethostname(), config=str(args.config),
                   overrides=args.overrides, date=time.strftime("%Y-%m-%d"))
    print(json.dumps(figures), flush=True)
    with open(args.out / "figures.jsonl", "a", encoding="utf-8") as f:    # before the profile: a failed profile
        f.write(json.dumps(figures) + "\n")                               # keeps the run's figures
    if args.profile:
        profile_steps(config, args.data, args.out / f"{args.name}.profile", args.stop_step, args.profile_step)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
