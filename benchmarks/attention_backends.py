"""Attention backends head to head on one packed sequence: forward + backward time, and agreement.

One packed sequence of 49,152 tokens (the record's micro-batch), 6 heads of 128, bf16, documents of
geometric length (mean 800 tokens, cut at 2,048: the loader's shape, as in ../shared/docs/gpu-notes.md),
causal sliding windows of 384, 896 and 1,792 tokens, through :func:`speedrun.model.attention.attention`
with each backend asked for (default: flex, varlen, fa3, fa4). Per (backend, window) one JSON line:
``fwd_bwd_ms`` (median of triton's ``do_bench`` on CUDA, of ``--repeats`` wall-clock runs on a CPU), and
the largest absolute difference of the output and of dq, dk, dv from the first backend that ran (the
baseline), each divided by the baseline's largest absolute value. A backend that is not installed or
fails gives a line with ``"error"`` (the exception, on one line, and for a failure its last frame), so that a
GPU session reports exactly what failed. The block mask of ``flex`` is built once per window, outside the
timing (:class:`speedrun.model.attention.PackedDocuments` caches it); its cost is benchmarks/flex_block_mask.py's.

    PYTHONPATH=src python benchmarks/attention_backends.py [--backends flex,varlen,fa3,fa4] [--out FILE]
    PYTHONPATH=src python benchmarks/attention_backends.py --device cpu --tokens 512 --heads 2 \\
        --head-dim 16 --windows 64 --backends reference,sdpa_docs      # a smoke test of the script
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from typing import Any, Callable

import torch

from speedrun.model.attention import PackedDocuments, attention


def documents(tokens: int, g: torch.Generator, mean: int = 800, longest: int = 2048) -> torch.Tensor:
    """cu_seqlens (S,) int32 of documents of geometric length (``mean`` tokens, at most ``longest``) that fill
    ``tokens``, the last one cut at the end."""
    bounds = [0]
    while bounds[-1] < tokens:
        length = min(longest, 1 + int(torch.empty(1).exponential_(1 / mean, generator=g)))
        bounds.append(min(tokens, bounds[-1] + length))
    return torch.tensor(bounds, dtype=torch.int32)


def time_ms(step: Callable[[], None], cuda: bool, repeats: int) -> float:
    """Median milliseconds of ``step``: triton's ``do_bench`` on CUDA, wall clock on a CPU."""
    if cuda:
        from triton.testing import do_bench

        return do_bench(step, warmup=25, rep=100, return_mode="median")
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def relative_difference(got: torch.Tensor, base: torch.Tensor) -> float:
    """max |got - base| / max |base| in float32."""
    got, base = got.detach().float(), base.detach().float()
    return float((got - base).abs().max() / base.abs().max().clamp_min(1e-30))


def one_line(error: BaseException) -> str:
    frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    where = f" (at {frame.filename}:{frame.lineno})" if frame else ""
    return f"{type(error).__name__}: {' '.join(str(error).split())}{where}"


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    g = torch.Generator().manual_seed(args.seed)
    cu = documents(args.tokens, g).to(device)
    shape = (args.tokens, args.heads, args.head_dim)
    q, k, v = (torch.randn(shape, generator=g).to(device, dtype).requires_grad_() for _ in range(3))
    grad_out = torch.randn(shape, generator=g).to(device, dtype)
    scale = args.head_dim ** -0.5
    rows = []
    for window in args.windows:
        docs = PackedDocuments(cu, args.tokens, max_seqlen=2048)      # one per window: flex caches its mask
        base: tuple[torch.Tensor, ...] | None = None
        for backend in args.backends:
            row: dict[str, Any] = {"backend": backend, "window": window, "tokens": args.tokens,
                                   "heads": args.heads, "head_dim": args.head_dim, "device": str(device)}
            try:
                out = attention(q, k, v, docs, scale, window, backend=backend)
                grads = torch.autograd.grad(out, (q, k, v), grad_out)

                def step():
                    o = attention(q, k, v, docs, scale, window, backend=backend)
                    torch.autograd.grad(o, (q, k, v), grad_out)

                row["fwd_bwd_ms"] = round(time_ms(step, cuda, args.repeats), 4)
                results = (out, *grads)
                if base is None:
                    base, row["baseline"] = results, True
                else:
                    for name, got, ref in zip(("out", "dq", "dk", "dv"), results, base):
                        row[f"rel_diff_{name}"] = round(relative_difference(got, ref), 6)
            except Exception as e:           # a missing library or a kernel that fails: reported, not fatal
                row["error"] = one_line(e)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="flex,varlen,fa3,fa4",
                        type=lambda s: [b for b in s.split(",") if b], help="comma-separated backends")
    parser.add_argument("--windows", default="384,896,1792", type=lambda s: [int(w) for w in s.split(",")],
                        help="sliding windows in tokens, comma-separated")
    parser.add_argument("--tokens", type=int, default=49152)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs on a CPU (CUDA: do_bench)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the JSON lines to this file")
    args = parser.parse_args(argv)
    rows = run(args)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return 0 if all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
