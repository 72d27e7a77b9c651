"""Time of one FP8 product on the CPU (s): torch's ``_scaled_mm`` with oneDNN (its default on a CPU), the same
with oneDNN off (torch's emulated product), and ours (:func:`speedrun.model.fp8.scaled_mm`, which computes the
emulated product itself), at the FP8 head's shape of a CPU test: (T, C) e4m3 x (V, C) e4m3, bf16 out.

    .venv/bin/python benchmarks/cpu_fp8_product.py                  # T 256, C 64, V 50304
    .venv/bin/python benchmarks/cpu_fp8_product.py --vocab 4096     # quicker where oneDNN's loop is slow

Prints one line per path with the best of ``--repeats`` and whether it equals ours bit for bit; and the CPU's
flags that decide oneDNN's FP8 kernel (AVX-512, AMX).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch

from speedrun.model.fp8 import scaled_mm


def best_of(fn, repeats: int) -> tuple[float, torch.Tensor]:
    """(the shortest wall time in s, the result) of ``repeats`` calls of ``fn``."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def cpu_flags() -> str:
    """The AVX-512 and AMX flags of /proc/cpuinfo (Linux), or the platform's processor name."""
    info = Path("/proc/cpuinfo")
    if not info.exists():
        return platform.processor() or "unknown"
    flags = next((line.split(":", 1)[1].split() for line in info.read_text().splitlines()
                  if line.startswith("flags")), [])
    wanted = sorted(f for f in flags if f.startswith(("avx512", "amx")))
    return " ".join(wanted) or "no AVX-512, no AMX"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    a8 = torch.randn(args.tokens, args.dim, generator=g).to(torch.float8_e4m3fn)
    b8 = torch.randn(args.vocab, args.dim, generator=g).to(torch.float8_e4m3fn)
    a_scale, b_scale = torch.tensor(0.5), torch.tensor(0.25)

    def torchs():
        return torch._scaled_mm(a8, b8.t(), scale_a=a_scale, scale_b=b_scale, out_dtype=torch.bfloat16)

    def torchs_emulated():
        with torch.backends.mkldnn.flags(enabled=False):
            return torchs()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU flags: {cpu_flags()}; "
          f"({args.tokens}, {args.dim}) x ({args.dim}, {args.vocab}) e4m3 -> bf16")
    ours_s, ours = best_of(lambda: scaled_mm(a8, a_scale, b8, b_scale), args.repeats)
    for name, fn in (("torch._scaled_mm, oneDNN", torchs), ("torch._scaled_mm, emulated", torchs_emulated)):
        seconds, out = best_of(fn, args.repeats)
        print(f"{name:28s} {seconds:9.4f} s   equal to ours: {torch.equal(out, ours)}")
    print(f"{'ours (fp8.scaled_mm)':28s} {ours_s:9.4f} s")


if __name__ == "__main__":
    main()
