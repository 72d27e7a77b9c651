"""Adam with cautious weight decay in one pass over a parameter: read p, g, m and v once, write p, m and v once.

Reference and caller: :class:`speedrun.optim.adam.CautiousAdam` (record #50's cautious decay; its formula is
there). The eager update is about fifteen elementwise kernels per parameter, each a full pass over fp32
tensors; the records compile theirs into one (record #88's ``_adam_update_step`` under ``torch.compile``).
This kernel is that one pass, per element in fp32:

    m <- m + (1-β1)·(g - m);  v <- β2·v + (1-β2)·g²
    s  = step_size · m / (sqrt(v) + eps)
    s <- s + decay·p   where s·p > 0
    p <- round(p - s)  (to p's dtype: one rounding for bf16 weights, as the records)

with ``step_size = lr·sqrt(1-β2^t)/(1-β1^t)`` and ``decay = lr²·λ`` computed by the caller. The sign-agreement
mask of C-Optim (record #87) needs the mean of a mask over the whole tensor first; the caller keeps the eager
path for it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from speedrun.kernels import require

BLOCK = 2048                    # elements per program: 4 warps, 16 per thread


@triton.jit
def _cautious_adam_kernel(p_ptr, g_ptr, m_ptr, v_ptr, n, beta1, beta2, eps, step_size, decay,
                          BLOCK: tl.constexpr):
    """Elements [pid·BLOCK, (pid+1)·BLOCK) of the flat tensors, updated in place (module docstring)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    p = tl.load(p_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offsets, mask=mask, other=0.0)
    v = tl.load(v_ptr + offsets, mask=mask, other=0.0)
    m = m + (1.0 - beta1) * (g - m)
    v = beta2 * v + (1.0 - beta2) * (g * g)
    step = step_size * (m / (tl.sqrt_rn(v) + eps))
    step = tl.where(step * p > 0, step + decay * p, step)
    tl.store(m_ptr + offsets, m, mask=mask)
    tl.store(v_ptr + offsets, v, mask=mask)
    tl.store(p_ptr + offsets, (p - step).to(p_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)


def cautious_adam_(p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                   beta1: float, beta2: float, eps: float, step_size: float, decay: float) -> None:
    """One cautious-Adam update of ``p`` in place (module docstring). p: any shape, bf16, fp16 or fp32; grad:
    p's shape, any float dtype; exp_avg, exp_avg_sq: p's shape, fp32 (updated in place); all contiguous on one
    device (CUDA, or a CPU under ``TRITON_INTERPRET=1``). step_size: lr·sqrt(1-β2^t)/(1-β1^t); decay: lr²·λ
    (0 for none). Raises :class:`SpeedrunError` on other shapes, dtypes, layouts or devices."""
    tensors = (p, grad, exp_avg, exp_avg_sq)
    require(all(t.shape == p.shape and t.is_contiguous() and t.device == p.device for t in tensors),
           f"cautious_adam_: p, grad, exp_avg, exp_avg_sq must be contiguous, of one shape and device, got "
           f"{[(tuple(t.shape), t.is_contiguous(), str(t.device)) for t in tensors]}")
    require(p.dtype in (torch.bfloat16, torch.float16, torch.float32) and grad.is_floating_point()
            and exp_avg.dtype == exp_avg_sq.dtype == torch.float32,
            f"cautious_adam_: p must be bf16, fp16 or fp32 with fp32 moments, got "
            f"{[t.dtype for t in tensors]}")
    n = p.numel()
    if n:
        _cautious_adam_kernel[(triton.cdiv(n, BLOCK),)](p, grad, exp_avg, exp_avg_sq, n, float(beta1),
                                                        float(beta2), float(eps), float(step_size),
                                                        float(decay), BLOCK=BLOCK, num_warps=4)
