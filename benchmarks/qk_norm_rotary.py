"""Forward and forward+backward time of QK-norm + rotary at the record's shape, fused Triton kernel against torch.

What a non-paired attention layer does to q and k after the QKV product (records #2, #5, #17; see
speedrun.model.block): ``apply_rotary(rms_norm(x), cos, sin, rope)`` for x = q, k, (T, H, Dh) bf16 strided
views of one (T, 3·H·Dh) tensor, cos/sin (T, R) fp32; T = 49152 tokens (one GPU's micro-batch), H = 6,
Dh = 128, rope ``half_truncated`` (R = 32) unless told otherwise. Variants:

  triton            speedrun.kernels.qk_norm_rotary (one kernel forward, one backward), eager;
  triton+compile    the same under torch.compile(fullgraph=True);
  torch             rms_norm then apply_rotary of q and k (the model's ``rotary_kernel: torch``), eager;
  torch+compile     the same under torch.compile(fullgraph=True) (what the compiled model runs today).

Each is timed with ``triton.testing.do_bench`` (median of repeated calls after warm-up, L2 flushed between
calls) for the forward alone and for forward + backward (``torch.autograd.grad`` of q and k from random
output gradients). The memory floor is one read of each input and one write of each output: forward q, k,
cos, sin in and q_out, k_out out; backward g_q, g_k, q, k, cos, sin in and dq, dk out. Printed per variant:
times, the floor's bytes over the time (GB/s), the memory held from forward to backward (outputs plus what
autograd saved), and the relative errors of q_out, k_out, dq, dk against torch in float32 on the same bf16
inputs (with the bf16 eps of the norm, as F.rms_norm uses for bf16 q and k).

    PYTHONPATH=src python benchmarks/qk_norm_rotary.py [--tokens 49152] [--heads 6] [--head-dim 128]
        [--rope half_truncated] [--rep-ms 200] [--bandwidth 4800]
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import torch

from speedrun.model.config import ROPE_MODES
from speedrun.model.norm import rms_norm
from speedrun.model.rotary import apply_rotary, rotary_frequencies, rotary_tables

QKFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def torch_qk_norm_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         mode: str, eps: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's torch path: q, k (T, H, Dh) -> rotated rms_norm of each, (T, H, Dh) in q's dtype."""
    dtype = q.dtype
    q, k = rms_norm(q, eps), rms_norm(k, eps)
    return apply_rotary(q, cos, sin, mode).to(dtype), apply_rotary(k, cos, sin, mode).to(dtype)


def variants() -> dict[str, QKFn]:
    from speedrun.kernels.qk_norm_rotary import qk_norm_rotary

    return {"triton": qk_norm_rotary,
            "triton+compile": torch.compile(qk_norm_rotary, fullgraph=True),
            "torch": torch_qk_norm_rotary,
            "torch+compile": torch.compile(torch_qk_norm_rotary, fullgraph=True)}


def floor_bytes(T: int, H: int, Dh: int, R: int, element_size: int) -> tuple[int, int]:
    """(forward, backward) bytes of one read of every input and one write of every output."""
    heads, tables = T * H * Dh * element_size, 2 * T * R * 4             # one (T, H, Dh) tensor; cos + sin
    return 4 * heads + tables, 6 * heads + tables


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref).norm() / ref.norm()).item()


def measure(fn: QKFn, q, k, cos, sin, mode: str, grads, rep_ms: int) -> dict[str, float]:
    """Median ms of forward and of forward+backward, and MiB held from forward to backward."""
    from triton.testing import do_bench

    def forward():
        with torch.no_grad():
            fn(q, k, cos, sin, mode)

    def forward_backward():
        torch.autograd.grad(fn(q, k, cos, sin, mode), (q, k), grads)

    forward_backward()                                          # compile, autotune
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = fn(q, k, cos, sin, mode)
    held = torch.cuda.memory_allocated() - before
    del out
    return {"fwd_ms": do_bench(forward, rep=rep_ms, return_mode="median"),
            "fwd_bwd_ms": do_bench(forward_backward, rep=rep_ms, return_mode="median"),
            "held_mib": held / 2 ** 20}


def errors(fn: QKFn, q, k, cos, sin, mode: str, grads) -> list[float]:
    """Relative errors of q_out, k_out, dq, dk against torch in float32 on the same bf16 values."""
    eps = torch.finfo(q.dtype).eps
    refs_in = [t.detach().float().requires_grad_() for t in (q, k)]
    ref_out = torch_qk_norm_rotary(*refs_in, cos, sin, mode, eps)
    refs = [*ref_out, *torch.autograd.grad(ref_out, refs_in, [g.float() for g in grads])]
    out = fn(q, k, cos, sin, mode)
    gots = [*out, *torch.autograd.grad(out, (q, k), grads)]
    return [relative_error(got, ref) for got, ref in zip(gots, refs)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=49152)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--rope", choices=ROPE_MODES, default="half_truncated")
    parser.add_argument("--rep-ms", type=int, default=200, help="do_bench's time budget per measurement")
    parser.add_argument("--bandwidth", type=float, default=4800.0,
                        help="HBM GB/s for the floor's time (H200: 4800)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/qk_norm_rotary.py needs a CUDA GPU", file=sys.stderr)
        return 2
    T, H, Dh, mode = args.tokens, args.heads, args.head_dim, args.rope
    g = torch.Generator(device="cuda").manual_seed(0)
    opts = {"device": "cuda", "generator": g}
    qkv = torch.randn(T, 3 * H * Dh, **opts).bfloat16()
    q, k = (t.detach().requires_grad_() for t in qkv.view(T, 3, H, Dh).unbind(1)[:2])   # strided views
    frequencies = rotary_frequencies(Dh, 1e4, torch.device("cuda"), mode)
    positions = torch.randint(0, 4096, (T,), device="cuda", generator=g)
    cos, sin = rotary_tables(positions, frequencies)                                      # (T, R) fp32
    grads = tuple(torch.randn(T, H, Dh, **opts).bfloat16() for _ in range(2))
    fwd_bytes, bwd_bytes = floor_bytes(T, H, Dh, cos.size(1), qkv.element_size())
    total = fwd_bytes + bwd_bytes
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; T={T} H={H} Dh={Dh} rope={mode} bf16")
    print(f"memory floor: forward {fwd_bytes / 1e6:.1f} MB ({fwd_bytes / args.bandwidth / 1e6:.3f} ms), "
          f"forward+backward {total / 1e6:.1f} MB ({total / args.bandwidth / 1e6:.3f} ms) at "
          f"{args.bandwidth:.0f} GB/s")
    print(f"{'variant':<16}{'fwd ms':>9}{'GB/s':>7}{'fwd+bwd ms':>12}{'GB/s':>7}{'held MiB':>10}"
          f"  relative errors (q_out, k_out, dq, dk) vs fp32")
    for name, fn in variants().items():
        m = measure(fn, q, k, cos, sin, mode, grads, args.rep_ms)
        e = errors(fn, q, k, cos, sin, mode, grads)
        print(f"{name:<16}{m['fwd_ms']:>9.3f}{fwd_bytes / m['fwd_ms'] / 1e6:>7.0f}{m['fwd_bwd_ms']:>12.3f}"
              f"{total / m['fwd_bwd_ms'] / 1e6:>7.0f}{m['held_mib']:>10.0f}  " + ", ".join(f"{v:.1e}" for v in e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
