"""Training and validation throughput of a model preset on the CPU (tokens/s), on one thread by default.

Runs the stage's own step (:func:`speedrun.training.loop.train_step` + the optimizers) on synthetic packed
micro-batches of random tokens (documents of 300-1500 tokens), after untimed warm-up steps, and the
validation forward on chunks of ``--val-batch-tokens``. The figure sizes the default experiment: a run
costs about steps * tokens_per_step / train_tokens_per_s + evaluations * val_tokens / val_tokens_per_s.

    .venv/bin/python benchmarks/train_cpu.py                      # tiny preset, 1 thread
    .venv/bin/python benchmarks/train_cpu.py --model '{"model_dim": 96, "n_head": 3}' --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch

from speedrun.data.loader import MicroBatch, to_torch
from speedrun.model.gpt import GPT
from speedrun.optim.groups import build_optimizers
from speedrun.training.config import TrainConfig
from speedrun.training.loop import evaluate, store_weights, train_step


def synthetic_micro_batch(tokens: int, rng: np.random.Generator) -> MicroBatch:
    """Random GPT-2 token ids in documents of 300-1500 tokens, packed into ``tokens`` positions."""
    lengths = []
    while sum(lengths) < tokens:
        lengths.append(int(rng.integers(300, 1500)))
    starts = np.cumsum([0] + lengths[:-1])
    cu_seqlens = np.append(starts[starts < tokens], tokens).astype(np.int32)
    ids = rng.integers(0, 50257, tokens + 1)
    return MicroBatch(inputs=ids[:-1].astype(np.int32), targets=ids[1:].astype(np.int64), cu_seqlens=cu_seqlens)


def bench(config: TrainConfig, steps: int, warmup: int, val_batches: int) -> dict[str, float]:
    """Median ms per optimizer step, train tokens/s and validation tokens/s of ``config`` on the CPU."""
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    config = config.resolved_for("cpu")                  # dtype auto: fp32 here, and the weights with it
    model = GPT(config.model_config())
    store_weights(model, config.compute.weight_dtype)
    optimizers = build_optimizers(model, model.parameter_kinds(), config.optimizer)
    device = torch.device("cpu")
    bf16 = config.compute.dtype == "bfloat16"
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)  # noqa: E731
    times = []
    for step in range(warmup + steps):
        batches = [synthetic_micro_batch(config.micro_batch_tokens, rng) for _ in range(config.micro_batches)]
        start = time.perf_counter()
        optimizers.apply_schedule(step % config.steps, config.schedule_config())
        train_step(model, model, [to_torch(mb, device) for mb in batches], device, autocast, 1,
                   config.max_seq_len)
        optimizers.step()
        optimizers.zero_grad()
        model.after_optimizer_step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    val = [to_torch(synthetic_micro_batch(config.evaluation.val_batch_tokens, rng), device) for _ in range(val_batches)]
    evaluate(model, val[:1], autocast, 1)
    start = time.perf_counter()
    evaluate(model, val, autocast, 1)
    val_s = time.perf_counter() - start
    step_s = statistics.median(times)
    return {"ms_per_step": 1000 * step_s, "train_tokens_per_s": config.tokens_per_step / step_s,
            "val_tokens_per_s": val_batches * config.evaluation.val_batch_tokens / val_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--model", default="{}", help="GPTConfig overrides as JSON")
    parser.add_argument("--train", default="{}", help="other TrainConfig settings as JSON")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps first")
    parser.add_argument("--val-batches", type=int, default=8, help="validation chunks to time")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    config = TrainConfig.from_dict({"preset": args.preset, "model": json.loads(args.model),
                                    **json.loads(args.train)})
    result = bench(config, args.steps, args.warmup, args.val_batches)
    shape = config.model_config()
    print(f"preset {args.preset} ({shape.n_layer} layers, dim {shape.model_dim}, {shape.n_head}x{shape.head_dim} "
          f"heads, vocab {shape.vocab_size}), dtype {config.compute.dtype}, {args.threads} thread(s), "
          f"{config.tokens_per_step} tokens/step in {config.micro_batches} micro-batches:")
    print(f"  train: {result['ms_per_step']:.0f} ms/step = {result['train_tokens_per_s']:.0f} tokens/s (median "
          f"of {args.steps} steps)")
    print(f"  validation: {result['val_tokens_per_s']:.0f} tokens/s (chunks of {config.evaluation.val_batch_tokens})")
    print(f"  load average before the run: {load:.2f} (other jobs on the machine lower these figures)")


if __name__ == "__main__":
    main()
