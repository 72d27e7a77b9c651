"""Forward and forward+backward time of the ReLU² MLP at the record's shape, fused Triton kernel against torch.

The MLP ``relu(x W1ᵀ)² W2ᵀ`` (speedrun-spec.md 2.4) on x (T, C) bf16, W1 (F, C), W2 (C, F) bf16 (no
autocast), T = 49152 tokens (one GPU's micro-batch), C = 768, F = 3072. Variants:

  triton            speedrun.kernels.relu_square_mlp (records #59, #87: post = relu(pre)² from the first
                    product's epilogue, relu(pre) rebuilt from post in the backward), eager;
  triton+compile    the same under torch.compile(fullgraph=True);
  torch             the reference ``F.linear(relu(F.linear(x, W1))², W2)``, eager;
  torch+compile     the reference under torch.compile(fullgraph=True) (Inductor fuses relu² into a
                    pointwise kernel but stores ``pre`` for the backward);
  triton-fp8        the records' fused FP8 MLP (records #84, #89; speedrun.kernels.relu_square_mlp_fp8): x
                    quantized per call, the FP8 up projection in the Triton kernel emitting post in bf16 and
                    in e4m3 with a delayed scale (here amax · 1.80/448 of the same input), the down product
                    in torch._scaled_mm, bf16 backward; the weights' e4m3 copies are made once outside the
                    timing (the model's per-step weight cache), eager;
  triton-fp8+compile  the same under torch.compile(fullgraph=True);
  triton-fp8-up     records #84-#88's FP8 MLP: the same up projection writing post in bf16 alone, the down
                    product in bf16 (``down_fp8=False``), one Triton program per output tile, eager;
  triton-fp8-up+compile  the same under torch.compile(fullgraph=True);
  triton-fp8-persistent  triton-fp8-up with the persistent TMA kernels for the up projection and the
                    backward's g_pre (``persistent=True``; record #88's ``linear_relu_square_kernel``), eager;
  triton-fp8-persistent+compile  the same under torch.compile(fullgraph=True).

Each is timed with ``triton.testing.do_bench`` (median of repeated calls after warm-up, L2 flushed between
calls) for the forward alone and for forward + backward (``torch.autograd.grad`` of x, W1, W2). FLOPs:
forward 4·T·C·F, backward 8·T·C·F (four products). Also printed: the memory held between forward and
backward (activations saved for the backward plus the output), and each variant's relative error of the
output and gradients against torch's float32 result on the same bf16 inputs. A variant that raises prints
its error and the others go on.

Then the two hot Triton products alone, per-tile kernel against persistent TMA kernel, on the same inputs:
the FP8 up projection (post (T, F) bf16 from e4m3 x and W1) and the backward's g_pre (T, F) bf16 from g_out,
W2 and that post; 2·T·C·F FLOPs each. Printed: the median ms of each, the speed-up, and how far apart their
outputs are (fraction of bit-equal elements, largest relative difference).

    PYTHONPATH=src python benchmarks/mlp_kernel.py [--tokens 49152] [--dim 768] [--hidden 3072] [--rep-ms 200]
        [--variants triton-fp8-up,triton-fp8-persistent]

Our kernels against record #88's at a training micro-batch (16,384 tokens):

    PYTHONPATH=src python benchmarks/mlp_kernel.py --tokens 16384 \
        --variants triton-fp8-up,triton-fp8-up+compile,triton-fp8-persistent,triton-fp8-persistent+compile
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import torch
import torch.nn.functional as F

MLPFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def torch_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """The reference MLP: x (T, C), w1 (F, C), w2 (C, F) -> (T, C)."""
    return F.linear(torch.relu(F.linear(x, w1)).square(), w2)


def fp8_variant(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, compiled: bool, down_fp8: bool = True,
                persistent: bool = False) -> MLPFn:
    """The fused FP8 MLP as an (x, w1, w2) -> out function: the e4m3 weight operands (as the per-step weight
    cache holds them) and the delayed post scale (amax · 1.80/448 of this input) made here, once. Without
    ``down_fp8`` the down product is bf16 (no W2 operands, no post scale); ``persistent`` (only then) picks
    the persistent TMA kernels."""
    from speedrun.kernels.relu_square_mlp import relu_square_mlp_fp8
    from speedrun.model.fp8 import quantize
    from speedrun.model.fp8_mlp import next_post_scale

    def operands(w):
        w8, scale = quantize(w.detach())
        return w8, scale, w.detach().bfloat16()

    ops1, ops2 = operands(w1), operands(w2)
    post_scale = next_post_scale(torch.relu(x.detach().float() @ w1.detach().float().t()).square().amax())
    fused = torch.compile(relu_square_mlp_fp8, fullgraph=True) if compiled else relu_square_mlp_fp8

    def fn(x, w1, w2):
        if not down_fp8:
            return fused(x, w1, w2, ops1, None, None, down_fp8=False, persistent=persistent)[0]
        return fused(x, w1, w2, ops1, ops2, post_scale)[0]
    return fn


def variants(inputs: list[torch.Tensor]) -> dict[str, MLPFn]:
    from speedrun.kernels.relu_square_mlp import relu_square_mlp

    return {"triton": relu_square_mlp,
            "triton+compile": torch.compile(relu_square_mlp, fullgraph=True),
            "torch": torch_mlp,
            "torch+compile": torch.compile(torch_mlp, fullgraph=True),
            "triton-fp8": fp8_variant(*inputs, compiled=False),
            "triton-fp8+compile": fp8_variant(*inputs, compiled=True),
            "triton-fp8-up": fp8_variant(*inputs, compiled=False, down_fp8=False),
            "triton-fp8-up+compile": fp8_variant(*inputs, compiled=True, down_fp8=False),
            "triton-fp8-persistent": fp8_variant(*inputs, compiled=False, down_fp8=False, persistent=True),
            "triton-fp8-persistent+compile": fp8_variant(*inputs, compiled=True, down_fp8=False, persistent=True)}


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref).norm() / ref.norm()).item()


def measure(fn: MLPFn, inputs: list[torch.Tensor], g_out: torch.Tensor, rep_ms: int) -> dict[str, float]:
    """Median ms of forward and of forward+backward, and MiB held from forward to backward."""
    from triton.testing import do_bench

    def forward():
        with torch.no_grad():
            fn(*inputs)

    def forward_backward():
        torch.autograd.grad(fn(*inputs), inputs, g_out)

    forward_backward()                                          # compile, autotune
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = fn(*inputs)
    held = torch.cuda.memory_allocated() - before
    del out
    return {"fwd_ms": do_bench(forward, rep=rep_ms, return_mode="median"),
            "fwd_bwd_ms": do_bench(forward_backward, rep=rep_ms, return_mode="median"),
            "held_mib": held / 2 ** 20}


def errors(fn: MLPFn, inputs: list[torch.Tensor], g_out: torch.Tensor) -> dict[str, float]:
    """Relative error of out, g_x, g_W1, g_W2 against torch in float32 on the same bf16 values."""
    ref_inputs = [t.detach().float().requires_grad_() for t in inputs]
    ref_out = torch_mlp(*ref_inputs)
    refs = [ref_out, *torch.autograd.grad(ref_out, ref_inputs, g_out.float())]
    out = fn(*inputs)
    gots = [out, *torch.autograd.grad(out, inputs, g_out)]
    return {name: relative_error(got, ref) for name, got, ref in zip(("out", "g_x", "g_w1", "g_w2"), gots, refs)}


def compare_kernels(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, g_out: torch.Tensor, rep_ms: int) -> None:
    """Print the median ms of the FP8 up projection and of g_pre, per-tile kernel against persistent TMA
    kernel, and how far apart their outputs are. x (T, C), w1 (F, C), w2 (C, F), g_out (T, C) bf16."""
    from triton.testing import do_bench

    from speedrun.kernels import relu_square_mlp as kernels
    from speedrun.model.fp8 import quantize

    (x8, x_scale), (w8, w_scale) = quantize(x.detach()), quantize(w1.detach())
    dequant = x_scale * w_scale
    post = kernels.relu_square_matmul_fp8_up(x8, w8, dequant)                           # (T, F) bf16
    products = {
        "fp8 up projection": (kernels.relu_square_matmul_fp8_up, kernels.relu_square_matmul_fp8_up_persistent,
                              (x8, w8, dequant)),
        "g_pre (backward)": (kernels.relu_square_grad, kernels.relu_square_grad_persistent,
                             (g_out, w2.detach(), post)),
    }
    flops = 2 * x.size(0) * x.size(1) * w1.size(0)
    print(f"\n{'product':<20}{'per-tile ms':>12}{'TFLOP/s':>9}{'persistent ms':>15}{'TFLOP/s':>9}{'speed-up':>10}"
          f"  bit-equal, max relative difference")
    for name, (per_tile, persistent, args) in products.items():
        try:
            old, new = per_tile(*args), persistent(*args)                 # compile, autotune
            ms = [do_bench(lambda f=f: f(*args), rep=rep_ms, return_mode="median") for f in (per_tile, persistent)]
        except Exception as e:                                            # report it, time the rest
            print(f"{name:<20}failed: {type(e).__name__}: {e}")
            continue
        equal = (old == new).float().mean().item()
        max_rel = ((old.float() - new.float()).abs().max() / old.float().abs().max()).item()
        print(f"{name:<20}{ms[0]:>12.3f}{flops / ms[0] / 1e9:>9.0f}{ms[1]:>15.3f}{flops / ms[1] / 1e9:>9.0f}"
              f"{ms[0] / ms[1]:>9.2f}x  {equal:.6f}, {max_rel:.1e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=49152)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--hidden", type=int, default=3072)
    parser.add_argument("--rep-ms", type=int, default=200, help="do_bench's time budget per measurement")
    parser.add_argument("--variants", default="", help="comma-separated variant names to run (default: all)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/mlp_kernel.py needs a CUDA GPU", file=sys.stderr)
        return 2
    T, C, Fh = args.tokens, args.dim, args.hidden
    g = torch.Generator(device="cuda").manual_seed(0)
    opts = {"device": "cuda", "generator": g}
    x = torch.randn(T, C, **opts).bfloat16().requires_grad_()
    w1 = (torch.randn(Fh, C, **opts) * 0.5 / C ** 0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(C, Fh, **opts) / Fh ** 0.5).bfloat16().requires_grad_()
    g_out = torch.randn(T, C, **opts).bfloat16()
    inputs = [x, w1, w2]
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; T={T} C={C} F={Fh} bf16")
    every = variants(inputs)
    chosen = [v for v in args.variants.split(",") if v] or list(every)
    unknown = sorted(set(chosen) - set(every))
    if unknown:
        print(f"unknown variants {unknown}; known: {', '.join(every)}", file=sys.stderr)
        return 2
    print(f"{'variant':<31}{'fwd ms':>9}{'TFLOP/s':>9}{'fwd+bwd ms':>12}{'TFLOP/s':>9}{'held MiB':>10}"
          f"  relative errors (out, g_x, g_w1, g_w2) vs fp32")
    flops = 4 * T * C * Fh
    for name in chosen:
        try:
            m = measure(every[name], inputs, g_out, args.rep_ms)
            errs = errors(every[name], inputs, g_out)
        except Exception as e:                                            # report it, time the rest
            print(f"{name:<31}failed: {type(e).__name__}: {e}")
            continue
        print(f"{name:<31}{m['fwd_ms']:>9.3f}{flops / m['fwd_ms'] / 1e9:>9.0f}{m['fwd_bwd_ms']:>12.3f}"
              f"{3 * flops / m['fwd_bwd_ms'] / 1e9:>9.0f}{m['held_mib']:>10.0f}  "
              + ", ".join(f"{v:.1e}" for v in errs.values()))
    compare_kernels(x, w1, w2, g_out, args.rep_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
