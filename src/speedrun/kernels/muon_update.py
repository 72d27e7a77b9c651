"""Muon's weight step on bf16 weights with their fp32 mantissa, in one pass: read the weight's two 16-bit halves
and the update once, write the two halves once.

Reference and caller: :class:`speedrun.optim.muon.Muon` (its ``apply_update`` between ``join_bf16`` and
``split_fp32_`` of :mod:`speedrun.optim.precision`, about twenty elementwise kernels over fp32 and int32
tensors per bank). The records compile the same step into one kernel (record #88's
``_cautious_wd_and_update_inplace``: the fp32 weight rebuilt from the bf16 weight and a 16-bit mantissa, the
cautious decay and the step, the halves written back). Per element, in fp32:

    x  = the fp32 value whose upper half is p and lower half is the mantissa
    x <- x - decay·x   where update·x >= 0          (cautious weight decay, record #43; decay 0: none)
    x <- shrink·x                                     (decoupled decay 1 - lr·λ; 1: none)
    x <- x - lr·update
    p  = upper half of x (x truncated towards zero), mantissa = lower half

``decay``, ``shrink`` and ``lr`` are computed by the caller (:func:`speedrun.optim.muon.step_factors`, which the
eager step uses too).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from speedrun.kernels import require

BLOCK = 2048                    # elements per program: 4 warps, 16 per thread


@triton.jit
def _muon_update_kernel(p_ptr, mantissa_ptr, u_ptr, n, lr, decay, shrink, BLOCK: tl.constexpr):
    """Elements [pid·BLOCK, (pid+1)·BLOCK) of the flat tensors, updated in place (module docstring)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    high = tl.load(p_ptr + offsets, mask=mask, other=0).to(tl.int32)            # p's bits, sign-extended
    low = tl.load(mantissa_ptr + offsets, mask=mask, other=0).to(tl.int32) & 0xFFFF
    x = ((high << 16) | low).to(tl.float32, bitcast=True)
    u = tl.load(u_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    x = tl.where(u * x >= 0, x - decay * x, x)
    x = shrink * x - lr * u
    bits = x.to(tl.int32, bitcast=True)
    tl.store(p_ptr + offsets, (bits >> 16).to(tl.int16), mask=mask)
    tl.store(mantissa_ptr + offsets, (bits & 0xFFFF).to(tl.int16), mask=mask)


def muon_update_(p: torch.Tensor, mantissa: torch.Tensor, update: torch.Tensor, lr: float, decay: float,
                 shrink: float = 1.0) -> None:
    """Muon's weight step on ``p`` and ``mantissa`` in place (module docstring). p: bf16, any shape;
    mantissa: int16, p's shape (the lower halves of the fp32 weights, :mod:`speedrun.optim.precision`);
    update: p's shape, bf16 or fp32; all contiguous on one device (CUDA, or a CPU under
    ``TRITON_INTERPRET=1``). lr: the step's lr (times Muon's shape multiplier); decay: the cautious decay's
    factor (0 for none); shrink: the decoupled decay's factor (1 for none). Raises :class:`SpeedrunError` on
    other shapes, dtypes, layouts or devices."""
    tensors = (p, mantissa, update)
    require(all(t.shape == p.shape and t.is_contiguous() and t.device == p.device for t in tensors),
            lambda: f"muon_update_: p, mantissa, update must be contiguous, of one shape and device, got "
            f"{[(tuple(t.shape), t.is_contiguous(), str(t.device)) for t in tensors]}")
    require(p.dtype == torch.bfloat16 and mantissa.dtype == torch.int16
            and update.dtype in (torch.bfloat16, torch.float32),
            lambda: f"muon_update_: p must be bf16, mantissa int16 and update bf16 or fp32, got "
            f"{[t.dtype for t in tensors]}")
    n = p.numel()
    if n:
        _muon_update_kernel[(triton.cdiv(n, BLOCK),)](p.view(torch.int16), mantissa, update, n, float(lr),
                                                      float(decay), float(shrink), BLOCK=BLOCK, num_warps=4)
