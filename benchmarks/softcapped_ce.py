"""Time of the softcapped cross-entropy kernel at one micro-batch of the record's head: T = 49,152 tokens
(record #88: 16,384 per call, 8 calls per step), V = 50,304, bf16 logits, tanh cap 15 or shifted sigmoid
cap 23 (speedrun-spec.md 2.5; speedrun.kernels.softcapped_cross_entropy), one target per token or, with
``--terms J``, record #88's J weighted terms (J - 1 multi-token terms and the prefix term,
:func:`speedrun.model.loss.loss_terms`; the FP8 head's weight norm divides the e5m2 gradient).

Variants (each the loss and dL/dz of every token; the FP8 head's backward needs the e5m2 gradient in two
layouts, (T, V) for ``g W`` and (V, T) for ``gᵀ x``, which it copies transposed):

  loss only                      the kernel without the gradient (evaluation)
  bf16 gradient                  gradient (T, V) in bf16 (the head without FP8)
  e5m2, exact tanh, + copy       e5m2 gradient with the exact tanh, then ``grad.t().contiguous()`` compiled
                                 (as in the training graph): the FP8 head's path before the seventh session
  e5m2, approx tanh, + copy      the same with ``tanh.approx.f32``: the FP8 head's path until the copy became
                                 speedrun.kernels.transpose
  e5m2, two-sweep                the FP8 head's call now (the operator: approximate tanh, no copy)
  e5m2, one-sweep                the same with ``one_sweep=True``: each row read once and kept in registers,
                                 one cap and one exponential per logit (record #88's kernel keeps the row on
                                 chip in shared memory)

Each is timed with ``triton.testing.do_bench`` (median, L2 flushed between calls) after autotuning, with
the variant's minimum HBM traffic (logits read once, gradients written, the copy read and written) as GB/s.
Also printed: the autotuner's choice for the two e5m2 kernels, the compiled copy alone, the largest
difference of the approximate tanh's losses and e5m2 gradient from the exact tanh's, and of the one-sweep
kernel's from the two-sweep kernel's (e5m2 steps apart, as a share of the elements).

    PYTHONPATH=src python benchmarks/softcapped_ce.py [--softcap tanh|shifted_sigmoid] [--tokens 49152]
        [--vocab 50304] [--terms 0|J] [--rep-ms 200]

Record #88's call: ``--tokens 16384 --softcap shifted_sigmoid --terms 4``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import torch

CAPS = {"tanh": 15.0, "shifted_sigmoid": 23.0}


def direct(module, logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None,
           norm: torch.Tensor | None, cap: float, kind: int, grad_mul: float,
           fast: bool) -> Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The FP8 head's path launched without the operator, so that the exact tanh can be chosen: returns a
    function giving (losses (T,), grad (T, V) e5m2, its transposed copy (V, T))."""
    T, V = logits.shape
    losses = torch.empty(T, dtype=torch.float32, device="cuda")
    grad = torch.empty(T, V, dtype=torch.float8_e5m2, device="cuda")

    def run():
        module._softcapped_ce_kernel[(T,)](
            logits, targets, losses if weights is None else weights, losses if norm is None else norm.reshape(1),
            losses, grad, V, logits.stride(0), V, cap, grad_mul, KIND=kind, WITH_GRAD=True, E5M2=True, FAST=fast,
            TERMS=1 if weights is None else weights.size(1), WEIGHTED=weights is not None, NORMED=norm is not None)
        return losses, grad, transpose(grad)

    return run


@torch.compile(fullgraph=True)
def transpose(grad: torch.Tensor) -> torch.Tensor:
    """``grad.t().contiguous()`` as Inductor compiles it alone (eager's copy of a float8 transpose is several
    times slower; the training graph ran the eager one, profile of 2026-12-04, and now runs
    speedrun.kernels.transpose: benchmarks/transpose_fp8.py)."""
    return grad.t().contiguous()


def e5m2_steps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|code(a) - code(b)| of two e5m2 tensors of the same signs: how many representable values apart (the
    e5m2 codes of one sign are ordered by magnitude); 255 where the signs differ."""
    ca, cb = a.view(torch.uint8).int(), b.view(torch.uint8).int()
    same_sign = (ca >> 7) == (cb >> 7)
    return torch.where(same_sign, ((ca & 127) - (cb & 127)).abs(), torch.full_like(ca, 255))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=49152)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--rep-ms", type=int, default=200, help="do_bench's time budget per measurement")
    parser.add_argument("--softcap", choices=("tanh", "shifted_sigmoid"), default="tanh",
                        help="tanh with c = 15 (record #28) or the shifted sigmoid with c = 23 (record #54, gpt124m)")
    parser.add_argument("--terms", type=int, default=0,
                        help="0: one target per token; J >= 2: record #88's J weighted terms (J - 1 multi-token "
                             "terms and the prefix term)")
    args = parser.parse_args(argv)
    if args.terms == 1 or args.terms < 0:
        parser.error("--terms must be 0 (one target) or at least 2 (multi-token terms and the prefix term)")
    if not torch.cuda.is_available():
        print("benchmarks/softcapped_ce.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from speedrun.kernels import softcapped_cross_entropy as module
    from speedrun.model.loss import _E5M2_TARGET, _weight_norm, gradient_bound, loss_terms

    T, V = args.tokens, args.vocab
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(T, V, device="cuda", generator=g) * 4.0).bfloat16()
    targets = torch.randint(0, V, (T,), device="cuda", generator=g)
    weights = norm = None
    if args.terms:
        prefix = torch.randint(-1, V, (T,), device="cuda", generator=g)
        mtp = torch.tensor([0.5 ** k for k in range(args.terms - 1)], device="cuda")
        targets, weights = loss_terms(targets, mtp, prefix, torch.tensor(0.3, device="cuda"))
        norm = _weight_norm(weights)
    cap, kind = CAPS[args.softcap], module.SOFTCAP_KINDS[args.softcap]
    mul = _E5M2_TARGET / gradient_bound((cap, args.softcap))      # the FP8 head's gradient multiplier
    op = module.softcapped_cross_entropy_kernel
    elements = T * V
    g8 = torch.empty(T, V, dtype=torch.float8_e5m2, device="cuda")
    variants = {  # name: (function, bytes moved at least)
        "the compiled copy alone": (lambda: transpose(g8), 2 * elements),
        "loss only": (lambda: op(logits, targets, cap, kind, False, 1.0, False, weights), 2 * elements),
        "bf16 gradient": (lambda: op(logits, targets, cap, kind, True, 1.0, False, weights), 4 * elements),
        "e5m2, exact tanh, + copy": (direct(module, logits, targets, weights, norm, cap, kind, mul, False),
                                     5 * elements),
        "e5m2, approx tanh, + copy": (direct(module, logits, targets, weights, norm, cap, kind, mul, True),
                                      5 * elements),
        "e5m2, two-sweep": (lambda: op(logits, targets, cap, kind, True, mul, True, weights, norm), 3 * elements),
        "e5m2, one-sweep": (lambda: op(logits, targets, cap, kind, True, mul, True, weights, norm, True),
                            3 * elements),
    }
    terms = "one target" if weights is None else f"{weights.size(1)} weighted terms"
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; T={T} V={V} bf16 logits, {args.softcap} cap "
          f"{cap}, {terms}")
    print(f"{'variant':<28}{'ms':>8}{'GB/s':>8}")
    for name, (fn, moved) in variants.items():
        fn()                                                          # compile, autotune
        torch.cuda.synchronize()
        ms = do_bench(fn, rep=args.rep_ms, return_mode="median")
        print(f"{name:<28}{ms:>8.3f}{moved / ms / 1e6:>8.0f}")
    print(f"autotuned: two-sweep {module._softcapped_ce_kernel.best_config}; "
          f"one-sweep {module._one_sweep_kernels[True].best_config}")
    exact_losses, exact, _ = direct(module, logits, targets, weights, norm, cap, kind, mul, False)()
    losses, grad = op(logits, targets, cap, kind, True, mul, True, weights, norm)   # approximate tanh
    diff = grad.view(torch.uint8) != exact.view(torch.uint8)
    relative = ((grad.float() - exact.float()).abs() / exact.float().abs().clamp_min(2 ** -16))[diff]
    print(f"approx - exact tanh: losses max |diff| {(losses - exact_losses).abs().max().item():.2e} nats "
          f"(mean {(losses - exact_losses).mean().item():+.2e}); e5m2 gradient: {diff.float().mean().item():.3%} "
          f"of elements differ, by at most {relative.max().item() if relative.numel() else 0.0:.3f} relative")
    one_losses, one = op(logits, targets, cap, kind, True, mul, True, weights, norm, True)
    steps = e5m2_steps_apart(one, grad)
    print(f"one-sweep - two-sweep: losses max |diff| {(one_losses - losses).abs().max().item():.2e} nats; e5m2 "
          f"gradient: {(steps > 0).float().mean().item():.3%} of elements differ, at most "
          f"{steps.max().item()} step(s) apart")
    return 0


if __name__ == "__main__":
    sys.exit(main())
