"""Lightweight DC attention's correction in Triton, forward and backward (record #85, Xiao et al. 2024).

The maths and the pure-PyTorch reference are in :mod:`speedrun.model.dc` (:func:`dc_attention`, which
normalises w1 and calls :func:`dc_correction` here). Shape legend: T tokens, H heads, Dh head_dim, W window;
BM = :data:`BLOCK_M` queries per program, BK = next power of two >= BM + W - 1 keys per program.

Forward, one program per block of BM queries t0..t0+BM-1: the keys t0-W+1 .. t0+BM-1 cover every
query's window, so with ``valid[t, s] = 0 <= t - s < W and s >= b(t)`` (b the document start):

1. for each head g: ``P_g = softmax over valid s of (c · q_g kᵀ_g)`` (BM, BK) in fp32, and ``A += u_g P_g``;
2. for each head h: ``out_h = y_h + w2_h · (A v_h)`` (BM, Dh), A rounded to v's dtype for the product.

Nothing but the inputs is kept for the backward, which recomputes P_g (one product per head). Backward,
from the output gradient G (dy = G), per block of queries:

1. A again, as in the forward;
2. for each head h: ``M_h = G_h vᵀ_h`` (BM, BK); ``dw2_h = rowsum(A ⊙ M_h)``; ``dA += w2_h M_h``;
   ``dv_h += (w2_h A)ᵀ G_h`` (BK, Dh), added atomically (neighbouring blocks share keys);
3. for each head g: P_g again; ``du_g = rowsum(dA ⊙ P_g)``; the softmax backward of ``dP_g = u_g dA`` is
   ``dS_g = P_g ⊙ (dP_g - rowsum(dP_g ⊙ P_g)) = u_g P_g ⊙ (dA - du_g)``; ``dq_g = c dS_g k_g`` (stored),
   ``dk_g += c dS_gᵀ q_g`` (atomic).

dk and dv accumulate in fp32 buffers (T, H, Dh), rounded to the input dtype at the end; the order of the
atomic additions varies, so the backward is not bitwise deterministic. P, A and their gradients are fp32;
the operands of the products are rounded to the input dtype (bf16 in the model), as flash attention does.

Inputs: y, q, k, v (T, H, Dh) of one dtype (bf16 or fp16; fp32 too, whose products use TF32 on a GPU),
Dh a power of two >= 16, any H; made contiguous. u, w2 (T, H) fp32; doc starts (T,) int64; the scale a
float or a 0-d tensor (read by the kernels from memory: a YaRN rescale compiles nothing new; it gets no
gradient). torch.compile(fullgraph=True): forward and backward are operators ``speedrun::dc_correction_fwd``
and ``speedrun::dc_correction_bwd`` (``torch.library.triton_op`` + ``wrap_triton``), the gradient a
``torch.autograd.Function``. On a CPU they run only under Triton's interpreter (``TRITON_INTERPRET=1`` set
before this module is imported), which the tests use in float32 and float16.

Speed on an H200: benchmarks/dc_attention.py (not yet measured when written).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from speedrun.kernels import require

BLOCK_M = 16                    # queries per program
MAX_WINDOW = 128                # the largest window W: BK = 256 keys per program at most
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Launch settings as autotune configs (one each: nothing is benchmarked). Not yet measured on a GPU; HEAD's
# kernels of the same tiling (16 queries, 128 keys) run 4-8 warps. A second backward config would need
# ``reset_to_zero=["dk_ptr", "dv_ptr"]`` (benchmarking launches it repeatedly onto its atomic buffers).
_FORWARD_CONFIGS = [triton.Config({}, num_warps=4, num_stages=2)]
_BACKWARD_CONFIGS = [triton.Config({}, num_warps=4, num_stages=2)]


@triton.jit
def _band(starts_ptr, T, WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """This program's queries t (BM,), keys s (BK,) (may lie before 0), their masks, and valid (BM, BK):
    s in t's window and document."""
    t0 = tl.program_id(0) * BLOCK_M
    t = t0 + tl.arange(0, BLOCK_M)
    s = t0 - (WINDOW - 1) + tl.arange(0, BLOCK_K)
    t_mask = t < T
    s_mask = (s >= 0) & (s < T)
    start = tl.load(starts_ptr + t, mask=t_mask, other=0)
    rel = t[:, None] - s[None, :]
    valid = t_mask[:, None] & (rel >= 0) & (rel < WINDOW) & (s[None, :] >= start[:, None])
    return t, s, t_mask, s_mask, valid


@triton.jit
def _offsets(rows, h, H: tl.constexpr, DH: tl.constexpr):
    """Element offsets (int64, (rows, Dh)) of rows (t or s) of head h in a contiguous (T, H, Dh) tensor."""
    d = tl.arange(0, DH)
    return (rows.to(tl.int64) * H + h)[:, None] * DH + d[None, :]


@triton.jit
def _load_rows(ptr, rows, mask, h, H: tl.constexpr, DH: tl.constexpr):
    """Rows of head h, (len(rows), Dh) in ptr's dtype, zeros where not mask."""
    return tl.load(ptr + _offsets(rows, h, H, DH), mask=mask[:, None], other=0.0)


@triton.jit
def _load_weight(ptr, t, t_mask, h, H: tl.constexpr):
    """Column h of a (T, H) fp32 weight at the queries t, (BM,)."""
    return tl.load(ptr + t.to(tl.int64) * H + h, mask=t_mask, other=0.0)


@triton.jit
def _probs(q_ptr, k_ptr, t, s, t_mask, s_mask, valid, h, scale, H: tl.constexpr, DH: tl.constexpr):
    """P_h (BM, BK) fp32, the softmax of c·q_h kᵀ_h over the valid keys (rows of masked queries all 0),
    and the tiles q_h (BM, Dh), k_h (BK, Dh)."""
    q = _load_rows(q_ptr, t, t_mask, h, H, DH)
    k = _load_rows(k_ptr, s, s_mask, h, H, DH)
    scores = tl.where(valid, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
    peak = tl.where(t_mask, tl.max(scores, axis=1), 0.0)                      # finite: a query sees itself
    p = tl.exp(scores - peak[:, None])
    total = tl.sum(p, axis=1)
    return p / tl.where(total > 0.0, total, 1.0)[:, None], q, k


@triton.jit
def _mixed(q_ptr, k_ptr, u_ptr, t, s, t_mask, s_mask, valid, scale, H: tl.constexpr, DH: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """A = sum_g u_g P_g (BM, BK) fp32."""
    mixed = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for g in range(H):
        p, _, _ = _probs(q_ptr, k_ptr, t, s, t_mask, s_mask, valid, g, scale, H, DH)
        mixed += _load_weight(u_ptr, t, t_mask, g, H)[:, None] * p
    return mixed


@triton.autotune(configs=_FORWARD_CONFIGS, key=["H", "DH", "WINDOW"])
@triton.jit
def _dc_forward_kernel(y_ptr, q_ptr, k_ptr, v_ptr, u_ptr, w2_ptr, starts_ptr, scale_ptr, out_ptr, T,
                       H: tl.constexpr, DH: tl.constexpr, WINDOW: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """out_h = y_h + w2_h · (A v_h) for the BM queries of this program and every head h."""
    t, s, t_mask, s_mask, valid = _band(starts_ptr, T, WINDOW, BLOCK_M, BLOCK_K)
    scale = tl.load(scale_ptr)
    mixed = _mixed(q_ptr, k_ptr, u_ptr, t, s, t_mask, s_mask, valid, scale, H, DH, BLOCK_M, BLOCK_K)
    for h in range(H):
        v = _load_rows(v_ptr, s, s_mask, h, H, DH)                                      # (BK, Dh)
        w2 = _load_weight(w2_ptr, t, t_mask, h, H)
        corr = tl.dot((w2[:, None] * mixed).to(v.dtype), v)                              # (BM, Dh) fp32
        y = _load_rows(y_ptr, t, t_mask, h, H, DH).to(tl.float32)
        tl.store(out_ptr + _offsets(t, h, H, DH), (y + corr).to(out_ptr.dtype.element_ty),
                 mask=t_mask[:, None])


@triton.autotune(configs=_BACKWARD_CONFIGS, key=["H", "DH", "WINDOW"])
@triton.jit
def _dc_backward_kernel(g_ptr, q_ptr, k_ptr, v_ptr, u_ptr, w2_ptr, starts_ptr, scale_ptr,
                        dq_ptr, dk_ptr, dv_ptr, du_ptr, dw2_ptr, T,
                        H: tl.constexpr, DH: tl.constexpr, WINDOW: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    """dq (stored), dk, dv (added to fp32 buffers), du, dw2 (stored) of this program's BM queries."""
    t, s, t_mask, s_mask, valid = _band(starts_ptr, T, WINDOW, BLOCK_M, BLOCK_K)
    scale = tl.load(scale_ptr)
    mixed = _mixed(q_ptr, k_ptr, u_ptr, t, s, t_mask, s_mask, valid, scale, H, DH, BLOCK_M, BLOCK_K)
    d_mixed = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for h in range(H):
        g = _load_rows(g_ptr, t, t_mask, h, H, DH)                                       # (BM, Dh)
        v = _load_rows(v_ptr, s, s_mask, h, H, DH)                                       # (BK, Dh)
        gv = tl.dot(g, tl.trans(v))                                                      # (BM, BK): G_h vᵀ_h
        w2 = _load_weight(w2_ptr, t, t_mask, h, H)
        tl.store(dw2_ptr + t.to(tl.int64) * H + h, tl.sum(mixed * gv, axis=1), mask=t_mask)
        d_mixed += w2[:, None] * gv
        dv = tl.dot(tl.trans((w2[:, None] * mixed).to(g.dtype)), g)                      # (BK, Dh)
        tl.atomic_add(dv_ptr + _offsets(s, h, H, DH), dv, mask=s_mask[:, None], sem="relaxed")
    d_mixed = tl.where(valid, d_mixed, 0.0)
    for h in range(H):
        p, q, k = _probs(q_ptr, k_ptr, t, s, t_mask, s_mask, valid, h, scale, H, DH)
        du = tl.sum(d_mixed * p, axis=1)                                                 # (BM,)
        tl.store(du_ptr + t.to(tl.int64) * H + h, du, mask=t_mask)
        u = _load_weight(u_ptr, t, t_mask, h, H)
        ds = (u[:, None] * p * (d_mixed - du[:, None])) * scale                          # (BM, BK) ∂/∂(q·k)
        dq = tl.dot(ds.to(k.dtype), k)                                                   # (BM, Dh)
        tl.store(dq_ptr + _offsets(t, h, H, DH), dq.to(dq_ptr.dtype.element_ty), mask=t_mask[:, None])
        dk = tl.dot(tl.trans(ds.to(q.dtype)), q)                                         # (BK, Dh)
        tl.atomic_add(dk_ptr + _offsets(s, h, H, DH), dk, mask=s_mask[:, None], sem="relaxed")


def _meta(q: torch.Tensor, window: int) -> dict:
    """The kernels' shape constants for q (T, H, Dh) and the window."""
    return {"H": q.size(1), "DH": q.size(2), "WINDOW": window, "BLOCK_M": BLOCK_M,
            "BLOCK_K": triton.next_power_of_2(BLOCK_M + window - 1)}


def _grid(T: int) -> tuple[int]:
    return (triton.cdiv(T, BLOCK_M),)


@triton_op("speedrun::dc_correction_fwd", mutates_args={})
def dc_correction_fwd(y: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor,
                      w2: torch.Tensor, starts: torch.Tensor, scale: torch.Tensor, window: int) -> torch.Tensor:
    """y + w2 · (A v): y, q, k, v contiguous (T, H, Dh), u, w2 (T, H) fp32, starts (T,) int64, scale (1,)
    fp32 -> (T, H, Dh) in y's dtype. Checked by :func:`dc_correction`."""
    out = torch.empty_like(y)
    if y.numel() > 0:
        wrap_triton(_dc_forward_kernel)[_grid(y.size(0))](y, q, k, v, u, w2, starts, scale, out, y.size(0),
                                                         **_meta(q, window))
    return out


@triton_op("speedrun::dc_correction_bwd", mutates_args={})
def dc_correction_bwd(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor,
                      w2: torch.Tensor, starts: torch.Tensor, scale: torch.Tensor,
                      window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (T, H, Dh) in q's dtype and du, dw2 (T, H) fp32 of <y + w2·(A v), g>, g contiguous
    (T, H, Dh) in q's dtype; the other arguments as in :func:`dc_correction_fwd`."""
    dq = torch.empty_like(q)
    dk = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    du = torch.empty_like(u)
    dw2 = torch.empty_like(w2)
    if q.numel() > 0:
        wrap_triton(_dc_backward_kernel)[_grid(q.size(0))](g, q, k, v, u, w2, starts, scale, dq, dk, dv, du, dw2,
                                                          q.size(0), **_meta(q, window))
    return dq, dk.to(k.dtype), dv.to(v.dtype), du, dw2


class _DCCorrection(torch.autograd.Function):
    """Autograd of :func:`dc_correction_fwd`, saving only its inputs (P and A are recomputed)."""

    @staticmethod
    def forward(ctx, y, q, k, v, u, w2, starts, scale, window: int):
        ctx.save_for_backward(q, k, v, u, w2, starts, scale)
        ctx.window = window
        return dc_correction_fwd(y, q, k, v, u, w2, starts, scale, window)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        q, k, v, u, w2, starts, scale = ctx.saved_tensors
        dq, dk, dv, du, dw2 = dc_correction_bwd(g.to(q.dtype).contiguous(), q, k, v, u, w2, starts, scale,
                                                ctx.window)
        return g, dq, dk, dv, du, dw2, None, None, None


def _takes_head_dim(head_dim: int) -> bool:
    """head_dim a power of two >= 16: the tiles' dot products."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def takes_shape(head_dim: int, window: int) -> bool:
    """Whether :func:`dc_correction` takes heads of ``head_dim`` and a window of ``window`` tokens (>= 1):
    head_dim a power of two >= 16 (the tiles' dot products), window <= 128 (one key block before the
    query block)."""
    return _takes_head_dim(head_dim) and window <= MAX_WINDOW


def dc_correction(y: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor,
                  w2: torch.Tensor, starts: torch.Tensor, scale: float | torch.Tensor,
                  window: int) -> torch.Tensor:
    """The lightweight DC output ``y + w2 · (A v)`` (record #85) with the Triton kernels; formula in
    :mod:`speedrun.model.dc`, which calls this (use :func:`speedrun.model.dc.dc_attention`).

    y, q, k, v: (T, H, Dh), one dtype of bf16, fp16 or fp32, Dh a power of two >= 16, on one CUDA device (a
    CPU only under ``TRITON_INTERPRET=1``). u: (T, H) the RMS-normalised w1; w2: (T, H); both cast to fp32.
    starts: (T,) document start of each token (int). scale: float or 0-d tensor (no gradient). window:
    1 <= W <= 128 tokens. Returns (T, H, Dh) in y's dtype, differentiable in y, q, k, v, u and w2.

    Raises :class:`SpeedrunError` on other shapes, dtypes, devices or windows.
    """
    require(q.dim() == 3 and all(t.shape == q.shape for t in (y, k, v)),
           f"dc_correction: y, q, k, v must share one (T, H, Dh) shape, got "
           f"{[tuple(t.shape) for t in (y, q, k, v)]}")
    T, H, Dh = q.shape
    require(q.dtype in _DTYPES and all(t.dtype == q.dtype for t in (y, k, v)),
           f"dc_correction: y, q, k, v must share one dtype of bfloat16, float16 or float32, got "
           f"{[t.dtype for t in (y, q, k, v)]}")
    require(_takes_head_dim(Dh), f"dc_correction: head_dim must be a power of two >= 16, got {Dh}")
    require(isinstance(window, int) and 1 <= window <= MAX_WINDOW,
           f"dc_correction: window must be an int in 1..{MAX_WINDOW} tokens, got {window!r}")
    require(u.shape == (T, H) and w2.shape == (T, H) and starts.shape == (T,),
           f"dc_correction: u, w2 must be (T, H) = {(T, H)} and starts (T,), got {tuple(u.shape)}, "
           f"{tuple(w2.shape)}, {tuple(starts.shape)}")
    require(all(t.device == q.device for t in (y, k, v, u, w2, starts)),
           f"dc_correction: all tensors must be on one device, got "
           f"{sorted({str(t.device) for t in (y, q, k, v, u, w2, starts)})}")
    scale_t = torch.as_tensor(scale, dtype=torch.float32, device=q.device).detach().reshape(1)
    y, q, k, v = (t.contiguous() for t in (y, q, k, v))
    return _DCCorrection.apply(y, q, k, v, u.float().contiguous(), w2.float().contiguous(),
                               starts.to(torch.int64).contiguous(), scale_t, window)
