"""Forward and forward+backward time of lightweight DC attention (record #85), Triton kernels against torch.

What record #85's last layer adds to its attention output (speedrun.model.dc): y (T, H, Dh) plus, per head,
w2 · (A v) with A the w1-weighted mix of the heads' softmax maps over the last W keys of each document.
T = 49152 tokens (one GPU's micro-batch), H = 6, Dh = 128, W = 112, bf16, documents of 1..2000 tokens,
unless told otherwise. Variants:

  triton             impl="triton" (speedrun.kernels.dc_attention: one kernel forward, one backward), eager;
  triton+compile     the same under torch.compile(fullgraph=True);
  reference          impl="reference" (blocked plain PyTorch in float32), eager;
  reference+compile  the same under torch.compile(fullgraph=True).

Each is timed with ``triton.testing.do_bench`` (median after warm-up) for the forward alone (no_grad) and
for forward + backward (``torch.autograd.grad`` of y, q, k, v, w1, w2 from a random output gradient).
Printed per variant: the times, the memory held from forward to backward (output plus what autograd
saved) and the relative errors of the output and of dq, dk, dv, dw1, dw2 against the float32 reference.

    PYTHONPATH=src python benchmarks/dc_attention.py [--tokens 49152] [--heads 6] [--head-dim 128]
        [--window 112] [--rep-ms 200] [--skip-compile]
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import torch

from speedrun.model.dc import dc_attention

NAMES = ("y", "q", "k", "v", "w1", "w2")


def make_inputs(T: int, H: int, Dh: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Inputs as in the model (q, k with unit RMS per head, w1 near 1, w2 nonzero), cu_seqlens padded with
    T, and an output gradient; all bf16 on CUDA except cu_seqlens (int32)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    opts = {"device": "cuda", "generator": g}
    q, k = torch.randn(T, H, Dh, **opts), torch.randn(T, H, Dh, **opts)
    q, k = (x / x.square().mean(-1, keepdim=True).sqrt() for x in (q, k))
    inputs = {"y": torch.randn(T, H, Dh, **opts), "q": q, "k": k, "v": torch.randn(T, H, Dh, **opts),
              "w1": 1.0 + 0.5 * torch.randn(T, H, **opts), "w2": torch.randn(T, H, **opts)}
    inputs = {name: t.bfloat16().requires_grad_() for name, t in inputs.items()}
    lengths = torch.randint(1, 2000, (T // 50,), **opts).cumsum(0)
    cu = torch.cat([lengths.new_zeros(1), lengths[lengths < T], lengths.new_full((4,), T)]).to(torch.int32)
    return inputs, cu, torch.randn(T, H, Dh, **opts).bfloat16()


def variants(skip_compile: bool) -> dict[str, Callable[..., torch.Tensor]]:
    def triton_path(**kw):
        return dc_attention(**kw, impl="triton")

    def reference_path(**kw):
        return dc_attention(**kw, impl="reference")

    found = {"triton": triton_path, "reference": reference_path}
    if not skip_compile:
        found["triton+compile"] = torch.compile(triton_path, fullgraph=True)
        found["reference+compile"] = torch.compile(reference_path, fullgraph=True)
    return found


def measure(fn, inputs: dict, cu, scale, window: int, g_out, rep_ms: int) -> dict[str, float]:
    """Median ms of forward and of forward+backward, and MiB held from forward to backward."""
    from triton.testing import do_bench

    leaves = [inputs[name] for name in NAMES]

    def forward():
        with torch.no_grad():
            fn(**inputs, cu_seqlens=cu, scale=scale, window=window)

    def forward_backward():
        torch.autograd.grad(fn(**inputs, cu_seqlens=cu, scale=scale, window=window), leaves, g_out)

    forward_backward()                                                  # compile
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = fn(**inputs, cu_seqlens=cu, scale=scale, window=window)
    held = torch.cuda.memory_allocated() - before
    del out
    return {"fwd_ms": do_bench(forward, rep=rep_ms, return_mode="median"),
            "fwd_bwd_ms": do_bench(forward_backward, rep=rep_ms, return_mode="median"),
            "held_mib": held / 2 ** 20}


def results(fn, inputs: dict, cu, scale, window: int, g_out) -> list[torch.Tensor]:
    """Output and gradients of y, q, k, v, w1, w2 (in that order)."""
    out = fn(**inputs, cu_seqlens=cu, scale=scale, window=window)
    return [out, *torch.autograd.grad(out, [inputs[name] for name in NAMES], g_out)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=49152)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--window", type=int, default=112)
    parser.add_argument("--rep-ms", type=int, default=200, help="do_bench's time budget per measurement")
    parser.add_argument("--skip-compile", action="store_true", help="only the eager variants")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/dc_attention.py needs a CUDA GPU", file=sys.stderr)
        return 2
    T, H, Dh, W = args.tokens, args.heads, args.head_dim, args.window
    inputs, cu, g_out = make_inputs(T, H, Dh)
    scale = 0.12
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; T={T} H={H} Dh={Dh} W={W} bf16, "
          f"{cu.numel() - 1} cu_seqlens slots")
    found = variants(args.skip_compile)
    float_inputs = {name: t.detach().float().requires_grad_() for name, t in inputs.items()}
    refs = results(found["reference"], float_inputs, cu, scale, W, g_out.float())
    print(f"{'variant':<19}{'fwd ms':>9}{'fwd+bwd ms':>12}{'held MiB':>10}"
          f"  relative errors (out, dy, dq, dk, dv, dw1, dw2) vs the float32 reference")
    for name, fn in found.items():
        m = measure(fn, inputs, cu, scale, W, g_out, args.rep_ms)
        errors = [((got.float() - ref).norm() / ref.norm()).item()
                  for got, ref in zip(results(fn, inputs, cu, scale, W, g_out), refs)]
        print(f"{name:<19}{m['fwd_ms']:>9.3f}{m['fwd_bwd_ms']:>12.3f}{m['held_mib']:>10.0f}  "
              + ", ".join(f"{e:.1e}" for e in errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
