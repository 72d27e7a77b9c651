"""Adam with cautious weight decay in one pass over a parameter: read p, g, m and v once, write p, m and v once.

Reference and caller: :class:`speedrun.optim.adam.CautiousAdam` (record #50's cautious decay; its formula is
there). The eager update is about fifteen elementwise kernels per parameter, each a full pass over fp32
tensors; the records compile theirs into one (record #88's ``_adam_update_step`` under ``torch.compile``).
This kernel is that one pass, per element in fp32:

    m <- m + (1-β1)·(g - m);  v <- β2·v + (1-β2)·g²
    s  = step_size · m / (sqrt(v) + eps)
    s <- s + decay·p   where s·p > 0
    p <- round(p - s)  (to p's dtype: one rounding for bf16 weights, as the records)

with ``step_size = lr·sqrt(1-β2^t)/(1-β1^t)`` and ``decay = lr²·λ`` computed by the caller.

:func:`cautious_adam_coptim_` adds C-Optim's sign-agreement mask (record #87, its value-embedding and bigram
tables): ``s <- s·((1 - c) + c·k / max(mean(k), 1e-3))`` with ``k = [m/(sqrt(v)+eps)·g > 0]``, the mean over the
whole tensor. The mean needs every element before any is updated, so it takes two passes: the first computes the
new moments without storing them and counts the agreeing elements into one int32 on the GPU; the second is the
pass above with the scale (7 reads and 3 writes per element against the one-pass update's 4 and 3, and no host
sync). The eager update it replaces is about twenty full passes over fp32 tensors: on record #87's 338M table
elements, 26 ms on every Adam step of an H100 (docs/benchmarks.md, session 42).

:func:`cautious_adam_many_` applies the same pass to many small parameters in one launch (one program per
parameter, its addresses read from a table): the records' scalars, gates and lambdas are about forty tensors of
2 to 49,152 elements, and a launch per tensor costs more host time than the GPU spends on all of them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from speedrun.kernels import require

BLOCK = 2048                    # elements per program: 4 warps, 16 per thread
MANY_MAX_NUMEL = 65536          # cautious_adam_many_'s largest parameter: one program loops over at most 32 blocks
_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _moments(g_ptr, m_ptr, v_ptr, offsets, mask, beta1, beta2, eps):
    """The gradient g (fp32), the new moments m and v and the unscaled step m / (sqrt(v) + eps) of the elements at
    ``offsets`` (0 where not ``mask``); nothing stored."""
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offsets, mask=mask, other=0.0)
    v = tl.load(v_ptr + offsets, mask=mask, other=0.0)
    m = m + (1.0 - beta1) * (g - m)
    v = beta2 * v + (1.0 - beta2) * (g * g)
    return g, m, v, m / (tl.sqrt_rn(v) + eps)


@triton.jit
def _cautious_adam_block(p_ptr, g_ptr, m_ptr, v_ptr, offsets, mask, beta1, beta2, eps, step_size, decay,
                         coptim, keep_mean, COPTIM: tl.constexpr):
    """The update (module docstring) of the elements at ``offsets`` where ``mask``, in place; with ``COPTIM``,
    C-Optim's scale of strength ``coptim`` and mask mean ``keep_mean`` (already clamped) on the step."""
    p = tl.load(p_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    g, m, v, update = _moments(g_ptr, m_ptr, v_ptr, offsets, mask, beta1, beta2, eps)
    if COPTIM:
        keep = tl.where(update * g > 0, 1.0, 0.0)
        update = update * ((1.0 - coptim) + coptim * keep / keep_mean)
    step = step_size * update
    step = tl.where(step * p > 0, step + decay * p, step)
    tl.store(m_ptr + offsets, m, mask=mask)
    tl.store(v_ptr + offsets, v, mask=mask)
    tl.store(p_ptr + offsets, (p - step).to(p_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)


@triton.jit
def _cautious_adam_many_kernel(table_ptr, hyper_ptr, P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr,
                               BLOCK: tl.constexpr):
    """Parameter ``pid``: its p, g, m, v addresses and numel from row pid of ``table`` (int64, 5 per row), its
    beta1, beta2, eps, step size and decay from row pid of ``hyper`` (fp32, 5 per row), every block in turn."""
    row = tl.program_id(0).to(tl.int64) * 5
    p_ptr = tl.load(table_ptr + row).to(tl.pointer_type(P_DTYPE))
    g_ptr = tl.load(table_ptr + row + 1).to(tl.pointer_type(G_DTYPE))
    m_ptr = tl.load(table_ptr + row + 2).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(table_ptr + row + 3).to(tl.pointer_type(tl.float32))
    n = tl.load(table_ptr + row + 4)
    beta1, beta2 = tl.load(hyper_ptr + row), tl.load(hyper_ptr + row + 1)
    eps, step_size, decay = tl.load(hyper_ptr + row + 2), tl.load(hyper_ptr + row + 3), tl.load(hyper_ptr + row + 4)
    for start in range(0, n, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        _cautious_adam_block(p_ptr, g_ptr, m_ptr, v_ptr, offsets, offsets < n, beta1, beta2, eps, step_size, decay,
                             0.0, 1.0, COPTIM=False)


@triton.jit
def _cautious_adam_kernel(p_ptr, g_ptr, m_ptr, v_ptr, n, beta1, beta2, eps, step_size, decay,
                          BLOCK: tl.constexpr):
    """Elements [pid·BLOCK, (pid+1)·BLOCK) of the flat tensors, updated in place (module docstring)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _cautious_adam_block(p_ptr, g_ptr, m_ptr, v_ptr, offsets, offsets < n, beta1, beta2, eps, step_size, decay,
                         0.0, 1.0, COPTIM=False)


@triton.jit
def _coptim_count_kernel(g_ptr, m_ptr, v_ptr, count_ptr, n, beta1, beta2, eps, BLOCK: tl.constexpr):
    """C-Optim's first pass: add to ``count`` the number of elements of block pid whose new step agrees in sign
    with the gradient (moments computed, not stored)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    g, _, _, update = _moments(g_ptr, m_ptr, v_ptr, offsets, mask, beta1, beta2, eps)
    tl.atomic_add(count_ptr, tl.sum(tl.where(mask & (update * g > 0), 1, 0)))


@triton.jit
def _cautious_adam_coptim_kernel(p_ptr, g_ptr, m_ptr, v_ptr, count_ptr, n, beta1, beta2, eps, step_size, decay,
                                 coptim, BLOCK: tl.constexpr):
    """C-Optim's second pass: block pid updated in place with the mask mean read from ``count``."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep_mean = tl.maximum(tl.load(count_ptr).to(tl.float32) / n, 1e-3)
    _cautious_adam_block(p_ptr, g_ptr, m_ptr, v_ptr, offsets, offsets < n, beta1, beta2, eps, step_size, decay,
                         coptim, keep_mean, COPTIM=True)


def _check_one(name: str, p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
               exp_avg_sq: torch.Tensor) -> None:
    """The argument checks of :func:`cautious_adam_` and :func:`cautious_adam_coptim_`."""
    tensors = (p, grad, exp_avg, exp_avg_sq)
    require(all(t.shape == p.shape and t.is_contiguous() and t.device == p.device for t in tensors),
            lambda: f"{name}: p, grad, exp_avg, exp_avg_sq must be contiguous, of one shape and device, "
            f"got {[(tuple(t.shape), t.is_contiguous(), str(t.device)) for t in tensors]}")
    require(p.dtype in (torch.bfloat16, torch.float16, torch.float32) and grad.is_floating_point()
            and exp_avg.dtype == exp_avg_sq.dtype == torch.float32,
            lambda: f"{name}: p must be bf16, fp16 or fp32 with fp32 moments, got {[t.dtype for t in tensors]}")


def cautious_adam_(p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                   beta1: float, beta2: float, eps: float, step_size: float, decay: float) -> None:
    """One cautious-Adam update of ``p`` in place (module docstring). p: any shape, bf16, fp16 or fp32; grad:
    p's shape, any float dtype; exp_avg, exp_avg_sq: p's shape, fp32 (updated in place); all contiguous on one
    device (CUDA, or a CPU under ``TRITON_INTERPRET=1``). step_size: lr·sqrt(1-β2^t)/(1-β1^t); decay: lr²·λ
    (0 for none). Raises :class:`SpeedrunError` on other shapes, dtypes, layouts or devices."""
    _check_one("cautious_adam_", p, grad, exp_avg, exp_avg_sq)
    n = p.numel()
    if n:
        _cautious_adam_kernel[(triton.cdiv(n, BLOCK),)](p, grad, exp_avg, exp_avg_sq, n, float(beta1),
                                                        float(beta2), float(eps), float(step_size),
                                                        float(decay), BLOCK=BLOCK, num_warps=4)


def cautious_adam_coptim_(p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                          beta1: float, beta2: float, eps: float, step_size: float, decay: float,
                          coptim: float) -> None:
    """One cautious-Adam update of ``p`` in place with C-Optim's sign-agreement mask of strength ``coptim`` in
    [0, 1] (record #87; module docstring), in two passes and without a host sync: the arguments of
    :func:`cautious_adam_`, at most 2^31 - 1 elements (the count is an int32). Raises :class:`SpeedrunError` on
    other shapes, dtypes, layouts, devices or sizes."""
    _check_one("cautious_adam_coptim_", p, grad, exp_avg, exp_avg_sq)
    n = p.numel()
    require(n < 2 ** 31, lambda: f"cautious_adam_coptim_: at most 2^31 - 1 elements, got {n}")
    if n:
        count = torch.zeros(1, dtype=torch.int32, device=p.device)
        grid = (triton.cdiv(n, BLOCK),)
        _coptim_count_kernel[grid](grad, exp_avg, exp_avg_sq, count, n, float(beta1), float(beta2), float(eps),
                                   BLOCK=BLOCK, num_warps=4)
        _cautious_adam_coptim_kernel[grid](p, grad, exp_avg, exp_avg_sq, count, n, float(beta1), float(beta2),
                                           float(eps), float(step_size), float(decay), float(coptim),
                                           BLOCK=BLOCK, num_warps=4)


def cautious_adam_many_(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                        exp_avg_sqs: list[torch.Tensor], hyper: list[tuple[float, float, float, float, float]]) -> None:
    """:func:`cautious_adam_` of every ``params[i]`` with ``grads[i]``, ``exp_avgs[i]``, ``exp_avg_sqs[i]`` and
    ``hyper[i]`` = (beta1, beta2, eps, step_size, decay), in one launch per (parameter dtype, gradient dtype):
    the same values, bit for bit. Each parameter at most :data:`MANY_MAX_NUMEL` elements (the caller sends larger
    ones to :func:`cautious_adam_`), bf16, fp16 or fp32, with a float gradient of its shape and fp32 moments, all
    contiguous on one device (CUDA, or a CPU under ``TRITON_INTERPRET=1``). The addresses and settings travel as
    two small tables through pinned memory, without a host sync. Raises :class:`SpeedrunError` on other sizes,
    shapes, dtypes, layouts or devices."""
    groups: dict[tuple[torch.dtype, torch.dtype], list[int]] = {}
    for i, p in enumerate(params):
        tensors = (p, grads[i], exp_avgs[i], exp_avg_sqs[i])
        require(all(t.shape == p.shape and t.is_contiguous() and t.device == params[0].device for t in tensors)
                and p.numel() <= MANY_MAX_NUMEL and p.dtype in _DTYPES and grads[i].dtype in _DTYPES
                and exp_avgs[i].dtype == exp_avg_sqs[i].dtype == torch.float32,
                lambda: f"cautious_adam_many_: parameter {i} must have at most {MANY_MAX_NUMEL} elements, bf16, "
                        f"fp16 or fp32, with a float gradient and fp32 moments of its shape, contiguous on one "
                        f"device, got {[(tuple(t.shape), t.dtype, t.is_contiguous(), str(t.device)) for t in tensors]}")
        groups.setdefault((p.dtype, grads[i].dtype), []).append(i)
    for (p_dtype, g_dtype), members in groups.items():
        device = params[members[0]].device
        pinned = device.type == "cuda"
        table = torch.tensor([[params[i].data_ptr(), grads[i].data_ptr(), exp_avgs[i].data_ptr(),
                               exp_avg_sqs[i].data_ptr(), params[i].numel()] for i in members],
                             dtype=torch.int64, pin_memory=pinned).to(device, non_blocking=True)
        settings = torch.tensor([hyper[i] for i in members], dtype=torch.float32,
                                pin_memory=pinned).to(device, non_blocking=True)
        _cautious_adam_many_kernel[(len(members),)](table, settings, P_DTYPE=_DTYPES[p_dtype], G_DTYPE=_DTYPES[g_dtype],
                                                    BLOCK=BLOCK, num_warps=4)
