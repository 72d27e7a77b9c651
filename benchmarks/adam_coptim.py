"""Time of one cautious-Adam step over record #87's C-Optim parameters (its five value-embedding tables of
50,304 x 768 and its bigram table of 754,560 x 192: 338M bf16 weights with bf16 gradients and fp32 moments;
``train.adam_kind_coptim: {embed: 0.5}``): the eager update (``CautiousAdam`` without the kernels, about twenty
passes over fp32 tensors; what the record87 preset ran until session 42, 26 ms a step more than record #87's code
on every Adam step) against the two-pass kernel (``speedrun.kernels.adam.cautious_adam_coptim_``) and, for the
scale, the one-pass update without C-Optim. Each after a check that the kernel's parameters match the eager
update's after two steps (at most one bf16 ulp apart at 99 % or more of the elements); times are
``triton.testing.do_bench`` medians in ms, GB/s counting the bytes each update must move (one-pass: p, g, m, v read
and p, m, v written; two-pass: g, m, v read once more; the eager update's figure counts the one-pass bytes, an
effective rate).

    PYTHONPATH=src python benchmarks/adam_coptim.py [--scale 1.0]
"""

from __future__ import annotations

import argparse
import sys

import torch

SHAPES = [(50304, 768)] * 5 + [(754560, 192)]          # record #87's value-embedding and bigram tables


def make(scale: float, seed: int = 0) -> tuple[list[torch.nn.Parameter], list[torch.Tensor]]:
    """The tables (rows scaled by ``scale``) as bf16 parameters on CUDA, and a bf16 gradient for each."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [(max(1, int(rows * scale)), cols) for rows, cols in SHAPES]
    params = [torch.nn.Parameter((torch.randn(s, device="cuda", generator=g) * 0.1).bfloat16()) for s in shapes]
    grads = [torch.randn(s, device="cuda", generator=g).bfloat16() for s in shapes]
    return params, grads


def optimizer(params, coptim: float):
    from speedrun.optim.adam import CautiousAdam

    return CautiousAdam([{"params": params, "lr": 0.6, "coptim": coptim}], betas=(0.75, 0.95), eps=1e-10,
                        weight_decay=0.005 * 5)


def step_fn(params, grads, coptim: float):
    opt = optimizer(params, coptim)

    def step():
        for p, grad in zip(params, grads):
            p.grad = grad
        opt.step()
    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of each table's rows (default all)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("adam_coptim.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton.testing

    import speedrun.optim.adam as adam

    kernel = adam._FUSED_COPTIM
    results = {}
    for name, fused in (("eager", None), ("kernel", kernel)):
        adam._FUSED_COPTIM = fused
        params, grads = make(args.scale)
        step = step_fn(params, grads, 0.5)
        step(), step()
        results[name] = [p.detach().float() for p in params]
    adam._FUSED_COPTIM = kernel
    for want, got in zip(results["eager"], results["kernel"]):
        ulp = torch.finfo(torch.bfloat16).eps * want.abs()
        if not (((got - want).abs() <= ulp).all() and (got == want).float().mean() >= 0.99):
            print("the kernel's C-Optim step differs from the eager update's", file=sys.stderr)
            return 1
    del results
    n = sum(rows * cols for rows, cols in SHAPES) * args.scale
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {n / 1e6:.0f}M bf16 weights, "
          f"bf16 gradients, fp32 moments")
    print("| update | ms per Adam step | GB/s |")
    print("|---|---|---|")
    variants = (("eager C-Optim (CautiousAdam without the kernels)", None, 0.5, 0),
                ("two-pass C-Optim kernel", kernel, 0.5, 2 + 2 * 4),
                ("one-pass update, no C-Optim (the scale)", kernel, 0.0, 0))
    for name, fused, coptim, extra in variants:
        adam._FUSED_COPTIM = fused
        params, grads = make(args.scale)
        ms = triton.testing.do_bench(step_fn(params, grads, coptim), warmup=10, rep=100)
        moved = n * (2 + 2 + 4 + 4 + 2 + 4 + 4 + extra)        # bytes: p, g, m, v read; p, m, v written
        print(f"| {name} | {ms:.2f} | {moved / ms / 1e6:.0f} |")
        del params, grads
    adam._FUSED_COPTIM = kernel
    return 0


if __name__ == "__main__":
    sys.exit(main())
