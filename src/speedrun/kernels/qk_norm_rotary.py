"""QK-norm and rotary embedding of q and k in one Triton kernel, forward and backward.

Sources: QK-norm (RMS norm of q and k over the head dimension, no gain) record #5; RoPE record #2 (Su et al.
2021, "RoFormer"); half-truncated RoPE record #17 (speedrun-spec.md 2.2, 2.3). The pure-PyTorch reference is
:func:`speedrun.model.norm.rms_norm` followed by :func:`speedrun.model.rotary.apply_rotary`, as
:class:`speedrun.model.block.CausalSelfAttention` does it with ``rotary_kernel: torch``.

Shape legend: T tokens, H heads, Dh head_dim (even), R rotated pairs (Dh/2 for ``"full"``, at most Dh/2 for
``"half_truncated"``: Dh/4 in the model).

* Forward, for each row (t, h) of q and of k (computed in fp32): ``n = x · r``, ``r = rsqrt(mean(x²) + eps)``
  (eps :func:`norm_eps`: ``F.rms_norm``'s default, fp32's machine epsilon for a bf16 input), then each pair (a, b) of n turns by
  its angle: ``(a c − b s, a s + b c)``, c, s = cos, sin[t, i]. Pair i is (n[i], n[i + Dh/2]) for ``"full"``
  and (n[2i], n[2i+1]) for ``"half_truncated"``, whose pairs i ≥ R stay put. One rounding to the input dtype
  at the end (the torch path rounds twice: after the norm and after the rotation).
* Backward, from the output gradient g: un-rotate (the transpose, a turn by −θ) to ``g_n``:
  ``(g_a c + g_b s, g_b c − g_a s)``, then the RMS-norm backward ``dx = r · (g_n − n · mean(g_n · n))``, with
  n and r recomputed from the saved input x: only the inputs q, k (the views of the QKV product) and the
  cos/sin tables are kept from forward to backward.

One program handles BLOCK_ROWS rows (t, h) of q and the same rows of k, which share their cos/sin rows (read
once). q, k and the gradients may have any strides along T and H (q and k are views of the (T, 3·H·Dh) QKV
product) and unit stride along Dh (a tensor without one is copied first); the outputs are new contiguous
(T, H, Dh) tensors. In ``"half_truncated"`` mode a block of rows is loaded as one contiguous tile, reshaped to
(rows, Dh/2, 2) and split into even and odd elements (``tl.split``, within each thread's registers); in
``"full"`` mode as the rows' two contiguous halves. Either way the loads and stores are 16-byte vectors and
no shared memory is used (checked in the PTX of an sm_90 compile with Triton 3.9).

Memory: the forward reads q and k and writes them once (4·T·H·Dh·2 bytes in bf16, plus 8·T·R of cos/sin);
the backward reads the two gradients and q, k and writes dq, dk (6·T·H·Dh·2 bytes). At the record's shape
(T = 49152, H = 6, Dh = 128, R = 32, bf16) that is 315 MB and 466 MB: about 66 µs and 97 µs at the H200's
4.8 TB/s. torch.compile of the torch path runs separate norm reductions, a pointwise norm+rotation kernel
and 4-5 backward kernels: about 66 ms per 8-micro-batch step in an H200 profile of the compiled model
(all attention layers, paired ones included), against a floor of about 15 ms. Speed on an H200: not yet
measured (benchmarks/qk_norm_rotary.py).

torch.compile(fullgraph=True): the two kernels are operators ``speedrun::qk_norm_rotary_fwd`` and
``speedrun::qk_norm_rotary_bwd`` made with ``torch.library.triton_op`` + ``wrap_triton``, so Dynamo and
Inductor trace into them; the gradient is a ``torch.autograd.Function``, which Dynamo traces too. On a CPU the
kernels run only under Triton's interpreter (``TRITON_INTERPRET=1`` set before this module is imported, one
autotune config at a time), which the tests use in float16 and float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from speedrun.kernels import require

MODES = ("full", "half_truncated")
# Memory-bound rows of Dh elements: BLOCK_ROWS rows of q and of k per program. Not yet measured on a GPU.
_CONFIGS = [
    triton.Config({"BLOCK_ROWS": 16}, num_warps=4),
    triton.Config({"BLOCK_ROWS": 32}, num_warps=8),
    triton.Config({"BLOCK_ROWS": 8}, num_warps=2),
]
# bf16/fp16 in the model; float32 too (the tests' interpreter runs, which cannot multiply bf16).
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _load_pairs(ptr, row_offsets, row_mask, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr,
                FULL: tl.constexpr):
    """Pairs (a, b) of BLOCK_ROWS rows as fp32 (BLOCK_ROWS, BLOCK_HALF) each: a[:, i], b[:, i] = x[i],
    x[i + Dh/2] (FULL: two half-row loads) or x[2i], x[2i+1] (one row load, reshaped and split); zeros past
    Dh/2 pairs and on masked rows. Unit stride along Dh."""
    HALF: tl.constexpr = HEAD_DIM // 2
    i = tl.arange(0, BLOCK_HALF)
    if FULL:
        offsets = row_offsets[:, None] + i[None, :]                                # (BLOCK_ROWS, BLOCK_HALF)
        mask = row_mask[:, None] & (i < HALF)[None, :]
        a = tl.load(ptr + offsets, mask=mask, other=0.0)
        b = tl.load(ptr + offsets + HALF, mask=mask, other=0.0)
    else:
        d = tl.arange(0, 2 * BLOCK_HALF)
        offsets = row_offsets[:, None] + d[None, :]                                # (BLOCK_ROWS, 2·BLOCK_HALF)
        x = tl.load(ptr + offsets, mask=row_mask[:, None] & (d < HEAD_DIM)[None, :], other=0.0)
        a, b = tl.split(tl.reshape(x, (x.shape[0], BLOCK_HALF, 2)))
    return a.to(tl.float32), b.to(tl.float32)


@triton.jit
def _store_pairs(ptr, row_offsets, row_mask, a, b, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 FULL: tl.constexpr):
    """Store the pairs (a, b) (BLOCK_ROWS, BLOCK_HALF) where :func:`_load_pairs` reads them, in ptr's dtype."""
    HALF: tl.constexpr = HEAD_DIM // 2
    i = tl.arange(0, BLOCK_HALF)
    dtype = ptr.dtype.element_ty
    if FULL:
        offsets = row_offsets[:, None] + i[None, :]
        mask = row_mask[:, None] & (i < HALF)[None, :]
        tl.store(ptr + offsets, a.to(dtype), mask=mask)
        tl.store(ptr + offsets + HALF, b.to(dtype), mask=mask)
    else:
        d = tl.arange(0, 2 * BLOCK_HALF)
        offsets = row_offsets[:, None] + d[None, :]
        x = tl.reshape(tl.join(a, b), (a.shape[0], 2 * BLOCK_HALF))                # (BLOCK_ROWS, 2·BLOCK_HALF)
        tl.store(ptr + offsets, x.to(dtype), mask=row_mask[:, None] & (d < HEAD_DIM)[None, :])


@triton.jit
def _rows(BLOCK_ROWS: tl.constexpr, n_rows, N_HEADS: tl.constexpr):
    """This program's rows r = t·H + h (BLOCK_ROWS,), their mask, t and h."""
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    return rows, rows < n_rows, rows // N_HEADS, rows % N_HEADS


@triton.jit
def _angles(cos_ptr, sin_ptr, t, row_mask, R, BLOCK_HALF: tl.constexpr):
    """cos, sin (BLOCK_ROWS, BLOCK_HALF) fp32 of rows t of the (T, R) tables; 1 and 0 for pairs i ≥ R."""
    i = tl.arange(0, BLOCK_HALF)
    offsets = t.to(tl.int64)[:, None] * R + i[None, :]
    mask = row_mask[:, None] & (i < R)[None, :]
    return tl.load(cos_ptr + offsets, mask=mask, other=1.0), tl.load(sin_ptr + offsets, mask=mask, other=0.0)


@triton.jit
def _rstd(a, b, eps, HEAD_DIM: tl.constexpr):
    """rsqrt(mean(x²) + eps) (BLOCK_ROWS, 1) of the rows split in pairs a, b (zero-padded)."""
    total = tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)
    return tl.rsqrt(total * (1.0 / HEAD_DIM) + eps)[:, None]


@triton.jit
def _norm_rotate_rows(x_ptr, out_ptr, rows, row_mask, t, h, stride_t, stride_h, c, s, eps,
                      HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr, FULL: tl.constexpr):
    """out[rows] = rotate(rms_norm(x[t, h])): x strided, out contiguous (T·H, Dh)."""
    x_offsets = t.to(tl.int64) * stride_t + h.to(tl.int64) * stride_h
    a, b = _load_pairs(x_ptr, x_offsets, row_mask, HEAD_DIM, BLOCK_HALF, FULL)
    r = _rstd(a, b, eps, HEAD_DIM)
    a, b = a * r, b * r
    _store_pairs(out_ptr, rows.to(tl.int64) * HEAD_DIM, row_mask, a * c - b * s, a * s + b * c,
                 HEAD_DIM, BLOCK_HALF, FULL)


@triton.jit
def _norm_rotate_grad_rows(g_ptr, x_ptr, dx_ptr, rows, row_mask, t, h, stride_gt, stride_gh, stride_xt,
                           stride_xh, c, s, eps, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr,
                           FULL: tl.constexpr):
    """dx[rows] = r · (g_n − n · mean(g_n · n)), g_n = g[t, h] turned back, n = x[t, h] · r recomputed."""
    xa, xb = _load_pairs(x_ptr, t.to(tl.int64) * stride_xt + h.to(tl.int64) * stride_xh, row_mask,
                         HEAD_DIM, BLOCK_HALF, FULL)
    ga, gb = _load_pairs(g_ptr, t.to(tl.int64) * stride_gt + h.to(tl.int64) * stride_gh, row_mask,
                         HEAD_DIM, BLOCK_HALF, FULL)
    r = _rstd(xa, xb, eps, HEAD_DIM)
    na, nb = xa * r, xb * r
    gna, gnb = ga * c + gb * s, gb * c - ga * s                                      # the transposed turn
    dot = (tl.sum(gna * na, axis=1) + tl.sum(gnb * nb, axis=1))[:, None] * (1.0 / HEAD_DIM)
    _store_pairs(dx_ptr, rows.to(tl.int64) * HEAD_DIM, row_mask, r * (gna - na * dot), r * (gnb - nb * dot),
                 HEAD_DIM, BLOCK_HALF, FULL)


@triton.autotune(configs=_CONFIGS, key=["n_rows", "HEAD_DIM"])
@triton.jit
def _qk_norm_rotary_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr, n_rows, R, eps: tl.constexpr,
                           stride_qt, stride_qh, stride_kt, stride_kh,
                           N_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr,
                           FULL: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """q_out, k_out (T·H, Dh) = rotate(rms_norm(q)), rotate(rms_norm(k)) for BLOCK_ROWS rows (t, h)."""
    rows, row_mask, t, h = _rows(BLOCK_ROWS, n_rows, N_HEADS)
    c, s = _angles(cos_ptr, sin_ptr, t, row_mask, R, BLOCK_HALF)
    _norm_rotate_rows(q_ptr, q_out_ptr, rows, row_mask, t, h, stride_qt, stride_qh, c, s, eps,
                      HEAD_DIM, BLOCK_HALF, FULL)
    _norm_rotate_rows(k_ptr, k_out_ptr, rows, row_mask, t, h, stride_kt, stride_kh, c, s, eps,
                      HEAD_DIM, BLOCK_HALF, FULL)


@triton.autotune(configs=_CONFIGS, key=["n_rows", "HEAD_DIM"])
@triton.jit
def _qk_norm_rotary_grad_kernel(g_q_ptr, g_k_ptr, q_ptr, k_ptr, cos_ptr, sin_ptr, dq_ptr, dk_ptr, n_rows, R,
                                eps: tl.constexpr, stride_gqt, stride_gqh, stride_gkt, stride_gkh,
                                stride_qt, stride_qh, stride_kt, stride_kh,
                                N_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr,
                                FULL: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """dq, dk (T·H, Dh) from the output gradients g_q, g_k and the inputs q, k, for BLOCK_ROWS rows."""
    rows, row_mask, t, h = _rows(BLOCK_ROWS, n_rows, N_HEADS)
    c, s = _angles(cos_ptr, sin_ptr, t, row_mask, R, BLOCK_HALF)
    _norm_rotate_grad_rows(g_q_ptr, q_ptr, dq_ptr, rows, row_mask, t, h, stride_gqt, stride_gqh, stride_qt,
                           stride_qh, c, s, eps, HEAD_DIM, BLOCK_HALF, FULL)
    _norm_rotate_grad_rows(g_k_ptr, k_ptr, dk_ptr, rows, row_mask, t, h, stride_gkt, stride_gkh, stride_kt,
                           stride_kh, c, s, eps, HEAD_DIM, BLOCK_HALF, FULL)



def _check_heads(name: str, *tensors: torch.Tensor) -> None:
    """(T, H, Dh) tensors of one shape, one dtype of _DTYPES, one device; Dh even."""
    first = tensors[0]
    require(all(t.dim() == 3 and t.shape == first.shape for t in tensors),
           f"{name}: q, k (and their gradients) must be (T, H, Dh) of one shape, got "
           f"{[tuple(t.shape) for t in tensors]}")
    require(first.size(2) % 2 == 0, f"{name}: head_dim must be even (RoPE turns pairs), got {first.size(2)}")
    require(first.dtype in _DTYPES and all(t.dtype == first.dtype for t in tensors),
           f"{name}: q, k must share one dtype of bfloat16, float16 or float32, got {[t.dtype for t in tensors]}")
    require(all(t.device == first.device for t in tensors),
           f"{name}: q, k must be on one device, got {[str(t.device) for t in tensors]}")


def _check_tables(name: str, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mode: str) -> None:
    """cos, sin (T, R) float32 on x's device; R = Dh/2 for "full", R <= Dh/2 for "half_truncated"."""
    require(mode in MODES, f"{name}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    T, _, Dh = x.shape
    require(cos.dim() == 2 and cos.shape == sin.shape and cos.size(0) == T,
           f"{name}: cos and sin must be (T, R) = ({T}, R), got {tuple(cos.shape)} and {tuple(sin.shape)}")
    R = cos.size(1)
    require(R == Dh // 2 if mode == "full" else R <= Dh // 2,
           f"{name}: mode {mode!r} with head_dim {Dh} takes R {'=' if mode == 'full' else '<='} {Dh // 2} "
           f"rotated pairs, got cos/sin with R = {R}")
    require(cos.dtype == sin.dtype == torch.float32,
           f"{name}: cos and sin must be float32, got {cos.dtype} and {sin.dtype}")
    require(cos.device == sin.device == x.device,
           f"{name}: cos and sin must be on q's device {x.device}, got {cos.device} and {sin.device}")


def _outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Two new contiguous (T, H, Dh) tensors of x's shape, dtype and device, and the T·H rows they hold."""
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x.shape, dtype=x.dtype, device=x.device), x.size(0) * x.size(1))


def norm_eps(dtype: torch.dtype) -> float:
    """``F.rms_norm``'s default eps for an input of ``dtype``: the machine epsilon of the dtype it computes in,
    fp32 for bf16 and fp16 input (1.19e-7, not bf16's 7.8e-3), as the records' ``norm(q)`` gets it."""
    return torch.finfo(torch.promote_types(dtype, torch.float32)).eps


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last stride is 1 (the kernels' layout), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _launch_meta(x: torch.Tensor, mode: str) -> dict:
    """The shape constants of the kernels and the norm's eps (a compile-time constant: Inductor would pass a
    runtime float as fp64, promoting the norm to fp64): :func:`norm_eps` of x's dtype."""
    _, H, Dh = x.shape
    return {"eps": norm_eps(x.dtype), "N_HEADS": H, "HEAD_DIM": Dh,
            "BLOCK_HALF": triton.next_power_of_2(Dh // 2), "FULL": mode == "full"}


def _grid(n_rows: int):
    def grid(meta):
        return (triton.cdiv(n_rows, meta["BLOCK_ROWS"]),)
    return grid


@triton_op("speedrun::qk_norm_rotary_fwd", mutates_args={})
def qk_norm_rotary_fwd(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """rotate(rms_norm(q)), rotate(rms_norm(k)): q, k (T, H, Dh) bf16/fp16/fp32, any strides along T and H;
    cos, sin (T, R) fp32 -> two new contiguous (T, H, Dh) tensors in q's dtype (records #2, #5, #17).

    Raises :class:`SpeedrunError` on mismatched shapes, dtypes or devices and on an unknown mode or R.
    """
    _check_heads("qk_norm_rotary", q, k)
    _check_tables("qk_norm_rotary", q, cos, sin, mode)
    q, k, cos, sin = _unit_last(q), _unit_last(k), cos.contiguous(), sin.contiguous()
    q_out, k_out, n_rows = _outputs(q)                                                  # (T, H, Dh) each
    if n_rows == 0:
        return q_out, k_out
    wrap_triton(_qk_norm_rotary_kernel)[_grid(n_rows)](
        q, k, cos, sin, q_out, k_out, n_rows, cos.size(1), stride_qt=q.stride(0), stride_qh=q.stride(1),
        stride_kt=k.stride(0), stride_kh=k.stride(1), **_launch_meta(q, mode))
    return q_out, k_out


@triton_op("speedrun::qk_norm_rotary_bwd", mutates_args={})
def qk_norm_rotary_bwd(g_q: torch.Tensor, g_k: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                       cos: torch.Tensor, sin: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """dq, dk of :func:`qk_norm_rotary_fwd` from the gradients g_q, g_k of its outputs: all four (T, H, Dh)
    in one dtype, any strides along T and H; q, k the forward's inputs; cos, sin (T, R) fp32 -> two new
    contiguous (T, H, Dh) tensors in q's dtype: un-rotate, then the RMS-norm backward with n recomputed.

    Raises :class:`SpeedrunError` on mismatched shapes, dtypes or devices and on an unknown mode or R.
    """
    _check_heads("qk_norm_rotary backward", g_q, g_k, q, k)
    _check_tables("qk_norm_rotary backward", q, cos, sin, mode)
    g_q, g_k, q, k = (_unit_last(t) for t in (g_q, g_k, q, k))
    cos, sin = cos.contiguous(), sin.contiguous()
    dq, dk, n_rows = _outputs(q)                                                        # (T, H, Dh) each
    if n_rows == 0:
        return dq, dk
    wrap_triton(_qk_norm_rotary_grad_kernel)[_grid(n_rows)](
        g_q, g_k, q, k, cos, sin, dq, dk, n_rows, cos.size(1),
        stride_gqt=g_q.stride(0), stride_gqh=g_q.stride(1), stride_gkt=g_k.stride(0), stride_gkh=g_k.stride(1),
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_kt=k.stride(0), stride_kh=k.stride(1),
        **_launch_meta(q, mode))
    return dq, dk


class _QKNormRotary(torch.autograd.Function):
    """Autograd of :func:`qk_norm_rotary_fwd`, saving only q, k (views of the QKV product) and cos, sin."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mode: str):
        q_out, k_out = qk_norm_rotary_fwd(q, k, cos, sin, mode)                    # (T, H, Dh) each
        ctx.save_for_backward(q, k, cos, sin)
        ctx.mode = mode
        return q_out, k_out

    @staticmethod
    def backward(ctx, g_q: torch.Tensor, g_k: torch.Tensor):
        q, k, cos, sin = ctx.saved_tensors
        dq, dk = qk_norm_rotary_bwd(g_q, g_k, q, k, cos, sin, ctx.mode)           # (T, H, Dh) each
        return (dq if ctx.needs_input_grad[0] else None, dk if ctx.needs_input_grad[1] else None,
                None, None, None)


def qk_norm_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """QK-norm then RoPE of q and k in one Triton kernel each way: ``apply_rotary(rms_norm(x), cos, sin,
    mode)`` for x = q, k, computed in fp32 and rounded once.

    q, k: (T, H, Dh) bf16 or fp16 (float32 also works), one dtype, on one CUDA device (a CPU only under
    ``TRITON_INTERPRET=1``), any strides along T and H (views of the (T, 3·H·Dh) QKV product). cos, sin:
    (T, R) float32, no gradient (the model's rotary tables). mode: ``"full"`` (pairs (x[i], x[i + Dh/2]),
    R = Dh/2) or ``"half_truncated"`` (pairs (x[2i], x[2i+1]) for i < R <= Dh/2, the other dims unchanged).
    Returns (q_out, k_out), new contiguous (T, H, Dh) tensors in q's dtype, differentiable in q and k; the
    backward keeps only q, k, cos and sin. eps of the norm: :func:`norm_eps` (``F.rms_norm``'s).

    Sources: QK-norm record #5; RoPE record #2 (Su et al. 2021, "RoFormer"); half-truncated RoPE record #17.

    Raises :class:`SpeedrunError` on mismatched shapes, dtypes or devices, an unknown mode, an R that does
    not fit the mode, or cos/sin that require a gradient.
    """
    require(not (cos.requires_grad or sin.requires_grad),
           "qk_norm_rotary: cos and sin get no gradient; pass tables that do not require one")
    return _QKNormRotary.apply(q, k, cos, sin, mode)
