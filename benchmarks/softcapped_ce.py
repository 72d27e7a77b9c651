"""Time of the softcapped cross-entropy kernel at one micro-batch of the record's head: T = 49,152 tokens,
V = 50,304, bf16 logits, tanh cap 15 or shifted sigmoid cap 23 (speedrun-spec.md 2.5;
speedrun.kernels.softcapped_cross_entropy).

Variants (each the loss and dL/dz of every token; the FP8 head's backward needs the e5m2 gradient in two
layouts, (T, V) for ``g W`` and (V, T) for ``gᵀ x``, which it copies transposed):

  loss only                      the kernel without the gradient (evaluation)
  bf16 gradient                  gradient (T, V) in bf16 (the head without FP8)
  e5m2, exact tanh, + copy       e5m2 gradient with the exact tanh, then ``grad.t().contiguous()`` compiled
                                 (as in the training graph): the FP8 head's path before the seventh session
  e5m2, approx tanh, + copy      the same with ``tanh.approx.f32``: the FP8 head's path now

Each is timed with ``triton.testing.do_bench`` (median, L2 flushed between calls) after autotuning, with
the variant's minimum HBM traffic (logits read once, gradients written, the copy read and written) as GB/s.
Also printed: the compiled copy alone, and the largest difference of the approximate tanh's losses and e5m2
gradient from the exact tanh's.

    PYTHONPATH=src python benchmarks/softcapped_ce.py [--softcap tanh|shifted_sigmoid] [--tokens 49152]
        [--vocab 50304] [--rep-ms 200]
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import torch

CAPS = {"tanh": 15.0, "shifted_sigmoid": 23.0}


def direct(module, logits: torch.Tensor, targets: torch.Tensor, cap: float, kind: int, grad_mul: float,
           fast: bool) -> Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The FP8 head's path launched without the operator, so that the exact tanh can be chosen: returns a
    function giving (losses (T,), grad (T, V) e5m2, its transposed copy (V, T))."""
    T, V = logits.shape
    losses = torch.empty(T, dtype=torch.float32, device="cuda")
    grad = torch.empty(T, V, dtype=torch.float8_e5m2, device="cuda")

    def run():
        module._softcapped_ce_kernel[(T,)](logits, targets, losses, grad, V, logits.stride(0), V, cap, grad_mul,
                                           KIND=kind, WITH_GRAD=True, E5M2=True, FAST=fast)
        return losses, grad, transpose(grad)

    return run


@torch.compile(fullgraph=True)
def transpose(grad: torch.Tensor) -> torch.Tensor:
    """``grad.t().contiguous()`` as Inductor compiles it alone (eager's copy of a float8 transpose is several
    times slower; the training graph ran the eager one, profile of 2026-12-04, and now runs
    speedrun.kernels.transpose: benchmarks/transpose_fp8.py)."""
    return grad.t().contiguous()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=49152)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--rep-ms", type=int, default=200, help="do_bench's time budget per measurement")
    parser.add_argument("--softcap", choices=("tanh", "shifted_sigmoid"), default="tanh",
                        help="tanh with c = 15 (record #28) or the shifted sigmoid with c = 23 (record #54, gpt124m)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/softcapped_ce.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from speedrun.kernels import softcapped_cross_entropy as module
    from speedrun.model.loss import _E5M2_TARGET, gradient_bound

    T, V = args.tokens, args.vocab
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(T, V, device="cuda", generator=g) * 4.0).bfloat16()
    targets = torch.randint(0, V, (T,), device="cuda", generator=g)
    cap, kind = CAPS[args.softcap], module.SOFTCAP_KINDS[args.softcap]
    mul = _E5M2_TARGET / gradient_bound((cap, args.softcap))      # the FP8 head's gradient multiplier
    op = module.softcapped_cross_entropy_kernel
    elements = T * V
    g8 = torch.empty(T, V, dtype=torch.float8_e5m2, device="cuda")
    variants = {  # name: (function, bytes moved at least)
        "the compiled copy alone": (lambda: transpose(g8), 2 * elements),
        "loss only": (lambda: op(logits, targets, cap, kind, False, 1.0), 2 * elements),
        "bf16 gradient": (lambda: op(logits, targets, cap, kind, True, 1.0), 4 * elements),
        "e5m2, exact tanh, + copy": (direct(module, logits, targets, cap, kind, mul, False), 5 * elements),
        "e5m2, approx tanh, + copy": (direct(module, logits, targets, cap, kind, mul, True), 5 * elements),
    }
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; T={T} V={V} bf16 logits, {args.softcap} cap {cap}")
    print(f"{'variant':<28}{'ms':>8}{'GB/s':>8}")
    for name, (fn, moved) in variants.items():
        fn()                                                          # compile, autotune
        torch.cuda.synchronize()
        ms = do_bench(fn, rep=args.rep_ms, return_mode="median")
        print(f"{name:<28}{ms:>8.3f}{moved / ms / 1e6:>8.0f}")
    exact_losses, exact, _ = direct(module, logits, targets, cap, kind, mul, False)()
    losses, grad = op(logits, targets, cap, kind, True, mul, True)            # the operator: approximate tanh
    diff = grad.view(torch.uint8) != exact.view(torch.uint8)
    relative = ((grad.float() - exact.float()).abs() / exact.float().abs().clamp_min(2 ** -16))[diff]
    print(f"approx - exact tanh: losses max |diff| {(losses - exact_losses).abs().max().item():.2e} nats "
          f"(mean {(losses - exact_losses).mean().item():+.2e}); e5m2 gradient: {diff.float().mean().item():.3%} "
          f"of elements differ, by at most {relative.max().item() if relative.numel() else 0.0:.3f} relative")
    return 0


if __name__ == "__main__":
    sys.exit(main())
