"""Time `speedrun stats` over about 1,000 reference-like training logs (about 200 MB).

Writes synthetic logs in the modded-nanogpt HEAD layout (speedrun-spec.md 4.1) into a temporary folder:
a code dump of about 130 KB (including `print0(f"step:...")` strings, as real dumps have), a separator,
`Running Python/PyTorch/Triton` lines and an 8-GPU nvidia-smi table, a separator, warm-up lines, then
val lines every 250 steps and a train line after each of 1,700 steps, and a peak-memory line. Every log
differs (seeded losses and times), so no duplicate is skipped. One log in 50 is cut short (truncated).
The logs are spread over 50 directories of 20 runs, one group each. Then runs `speedrun stats DIR... --json`
as a subprocess (the command a user types, import time included) and prints the wall time.

    python benchmarks/stats_logs.py [--logs 1000] [--per-dir 20] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEPARATOR = "=" * 100
STEPS = 1700


def code_dump(target_bytes: int = 130_000) -> str:
    """Python-like source of about ``target_bytes``, with the logging f-strings a real dump contains."""
    block = "\n".join([
        "def train_step(model, batch, step):",
        "    loss = model(batch)  # forward",
        "    loss.backward()",
        '    print0(f"step:{step+1}/{args.num_iterations} train_time:{approx_ms:.0f}ms step_avg:{avg:.2f}ms")',
        '    print0(f"step:{step}/{args.num_iterations} val_loss:{val_loss:.4f} train_time:{t:.0f}ms")',
        "    return loss",
        "",
    ])
    return (block * (target_bytes // len(block) + 1))[:target_bytes]


def nvidia_smi(gpus: int = 8) -> str:
    rows = [f"|   {i}  NVIDIA H100 80GB HBM3          On  |   00000000:{i:02X}:00.0 Off |                    0 |\n"
            "| N/A   40C    P0            130W /  700W |    1521MiB /  81559MiB |      0%      Default |\n"
            "+-----------------------------------------+------------------------+----------------------+"
            for i in range(gpus)]
    return "Wed May 20 07:35:38 2026\n+---+\n" + "\n".join(rows) + "\n"


def synthetic_log(rng: random.Random, code: str, truncated: bool) -> str:
    """One log; ``truncated`` stops it before the final val line."""
    lines = [code, SEPARATOR, "Running Python 3.12.13", "Running PyTorch 2.10.0+cu128 compiled for CUDA 12.8",
             "Running Triton version 3.6.0", nvidia_smi(), SEPARATOR,
             "Compiling model and warming up kernels (~7 minutes on first execution)", "Resetting Model"]
    step_ms = rng.uniform(57.0, 58.0)
    last = STEPS - rng.randint(50, 200) if truncated else STEPS
    for step in range(last + 1):
        t = step * step_ms
        if step % 250 == 0 or step == STEPS:
            loss = 3.28 + 7.5 * (1 - step / STEPS) ** 3 + rng.gauss(0, 0.0013)
            lines.append(f"step:{step}/{STEPS} val_loss:{loss:.4f} train_time:{t:.0f}ms "
                         f"step_avg:{t / max(step, 1):.2f}ms")
        if step < last:
            t1 = (step + 1) * step_ms
            lines.append(f"step:{step + 1}/{STEPS} train_time:{t1:.0f}ms step_avg:{t1 / (step + 1):.2f}ms")
    if not truncated:
        lines.append("peak memory allocated: 31344 MiB reserved: 47100 MiB")
    return "\n".join(lines) + "\n"


def write_logs(root: Path, n_logs: int, per_dir: int) -> int:
    """Write the logs under ``root``; return their total size in bytes."""
    rng = random.Random(1234)
    code = code_dump()
    total = 0
    for i in range(n_logs):
        folder = root / f"record_{i // per_dir:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        text = synthetic_log(rng, code, truncated=i % 50 == 49)
        path = folder / f"{rng.getrandbits(128):032x}.txt"
        path.write_text(text, encoding="utf-8")
        total += len(text)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=1000)
    parser.add_argument("--per-dir", type=int, default=20)
    parser.add_argument("--keep", help="write the logs here and keep them (default: a temporary folder)")
    args = parser.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="speedrun-stats-bench-"))
    try:
        size = write_logs(root, args.logs, args.per_dir)
        dirs = sorted(str(p) for p in root.iterdir() if p.is_dir())
        speedrun = [sys.executable, "-m", "speedrun"]
        start = time.perf_counter()
        proc = subprocess.run(speedrun + ["stats", *dirs, "--json"], capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"speedrun stats failed:\n{proc.stderr[-3000:]}")
        groups = json.loads(proc.stdout)
        counted = sum(g["n"] for g in groups)
        print(f"speedrun stats: {args.logs} logs, {size / 1e6:.0f} MB, {len(groups)} groups, {counted} complete "
              f"runs counted: {elapsed:.2f} s wall ({size / 1e6 / elapsed:.0f} MB/s) on {os.cpu_count()} CPUs")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
