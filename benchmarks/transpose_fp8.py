"""Time of the FP8 head's transposed copy of its e5m2 logit gradient (T, V) -> (V, T), the operand of dL/dW
(speedrun.kernels.transpose; speedrun.model.fp8.transposed): ATen's eager ``t().contiguous()`` (what the
training graph ran, 5.1 ms per call at T = 16,384 in the profile of 2026-12-04), Inductor's compiled copy, and
the tiled Triton kernel eager and compiled, at the micro-batches of the record's stages (T = 16,384 and
49,152; V = 50,304). Each timed with ``triton.testing.do_bench`` (median ms) after a bit-equality check
against ATen's copy; GB/s counts one read and one write of the T·V bytes.

    PYTHONPATH=src python benchmarks/transpose_fp8.py [--tokens 16384 49152] [--vocab 50304]
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[16384, 49152])
    parser.add_argument("--vocab", type=int, default=50304)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("transpose_fp8.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton.testing

    from speedrun.kernels.transpose import transpose_copy

    variants = {
        "ATen eager t().contiguous()": lambda t: t.t().contiguous(),
        "Inductor compiled t().contiguous()": torch.compile(lambda t: t.t().contiguous(), fullgraph=True),
        "Triton tile kernel, eager": transpose_copy,
        "Triton tile kernel, compiled": torch.compile(lambda t: transpose_copy(t), fullgraph=True),
    }
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, V = {args.vocab}, float8 e5m2")
    print("| tokens | variant | ms | GB/s |")
    print("|---|---|---|---|")
    for tokens in args.tokens:
        grad = (torch.randn(tokens, args.vocab, device="cuda") * 1000).to(torch.float8_e5m2)
        want = grad.t().contiguous().view(torch.uint8)
        for name, fn in variants.items():
            got = fn(grad)
            if not torch.equal(got.view(torch.uint8), want):
                print(f"{name}: the copy differs from ATen's at T = {tokens}", file=sys.stderr)
                return 1
            ms = triton.testing.do_bench(lambda: fn(grad), warmup=25, rep=200)
            print(f"| {tokens} | {name} | {ms:.3f} | {2 * grad.numel() / ms / 1e6:.0f} |")
        del grad, want
    return 0


if __name__ == "__main__":
    sys.exit(main())
