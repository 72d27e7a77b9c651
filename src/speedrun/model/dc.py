"""Lightweight dynamically composable attention (DC): a cross-head mix of windowed softmax maps added to y.

Source: Xiao et al. 2024, "Improving Transformers with Dynamically Composable Multi-Head Attention" (DCMHA),
in the trimmed form of the public speedrun's record #85 (MUDD gates + lightweight DC, on the last layer
only; speedrun-spec.md 2.3). Of DCMHA's compositions only the post-softmax one is kept, with a per-token
rank-1 cross-head matrix and no dynamic dense part: the weights w1, w2 come from the MUDD "post" gate.

Shape legend: T tokens of one packed sequence (B = 1), H heads, Dh head_dim, W window, S cu_seqlens slots.

For query t, let b(t) be the start of its document and K(t) = {s : max(b(t), t - W + 1) <= s <= t} its
window: the W most recent keys of its own document, the query's own key included (fewer near a document
start). With c the attention scale (the same as the attention's, applied to q·k) and for every head g:

    P_g[t, s] = exp(c q_g[t]·k_g[s]) / sum_{s' in K(t)} exp(c q_g[t]·k_g[s'])     for s in K(t), else 0

(a softmax renormalised over the window alone, whatever window the attention itself used),

    u[t, g]   = w1[t, g] / sqrt(mean_g' w1[t, g']² + 1e-6)            (RMS norm over the H heads, no gain)
    A[t, s]   = sum_g u[t, g] P_g[t, s]                                (summed over the source heads g)
    out_h[t]  = y_h[t] + w2[t, h] · sum_{s in K(t)} A[t, s] v_h[s]

So every head h adds the same mixed map A, scaled by its own w2[t, h]: in DCMHA's terms the post-softmax
composition P'_h = P_h + sum_g w2[t, h] u[t, g] P_g (P_h itself being the attention that made y). With
w2 = 0 (its initialisation in record #85) the output is y exactly. q and k are those the attention used
(after QK-norm, rotary and the key offset), v with its value-embedding additions.

Implementations, one interface (:func:`dc_attention`):

* ``"reference"``: plain PyTorch, any device and float dtype (computed in float32, or float64 for float64
  inputs), differentiable by autograd in y, q, k, v, w1, w2 (and a tensor scale). The queries are cut into
  blocks of :data:`BLOCK_QUERIES`; each block scores against its W - 1 + block keys at once, so the memory
  is O(T·(W + block)·H) for the probabilities and O(T·H·Dh·(1 + W / block)) for the keys and values of
  the blocks, never the (T, T) matrix.
* ``"triton"``: :mod:`speedrun.kernels.dc_attention`, a Triton forward and backward (CUDA; bf16 in the
  model, window <= 128).
* ``"auto"``: ``"triton"`` for CUDA tensors when the ``triton`` package is installed, else ``"reference"``.

Importing this module imports the Triton kernels' module (and so ``triton``) when the package is installed:
a compiled model cannot import it inside its graph. The reference traces as one graph (a CPU test, eager
backend); the Triton path is one graph of two custom operators (a GPU test compiles it with Inductor).

Against record #85's own code (HEAD's dc_triton_kernels.py): the same maths, window, masking and scale; its
dc_gate rounds the normalised w1 and w2 to bf16 before the kernel, here they stay fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speedrun.errors import SpeedrunError
from speedrun.kernels import optional_kernel
from speedrun.model.packing import document_ids

DC_WINDOW = 112                 # record #85's window W in tokens, the query's own key included
W1_NORM_EPS = 1e-6              # eps of the RMS norm of w1 over the heads (record #85's dc_gate)
BLOCK_QUERIES = 128             # queries per block of the reference implementation
IMPLS = ("auto", "reference", "triton")
# The Triton path, resolved at import (None without the triton package): torch.compile cannot trace an import.
_TRITON_CORRECTION = optional_kernel("dc_attention", "dc_correction")
_TRITON_TAKES = optional_kernel("dc_attention", "takes_shape")


def document_starts(cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """(T,) int64: the first token b(t) of each token's document. ``cu_seqlens`` (S,) int32/int64 as in
    :func:`speedrun.model.packing.document_ids` (0, the document starts, T, possibly T repeated)."""
    return cu_seqlens.to(torch.int64)[document_ids(cu_seqlens, num_tokens)]


def _check(y, q, k, v, w1, w2, cu_seqlens, window, impl) -> None:
    """Shapes, dtypes and devices of :func:`dc_attention`'s arguments, SpeedrunError naming the culprit."""
    if impl not in IMPLS:
        raise SpeedrunError(f"dc_attention: impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if q.dim() != 3 or any(t.shape != q.shape for t in (y, k, v)):
        raise SpeedrunError(f"dc_attention: y, q, k, v must share one (T, H, Dh) shape, got y {tuple(y.shape)}, "
                            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if w1.shape != q.shape[:2] or w2.shape != q.shape[:2]:
        raise SpeedrunError(f"dc_attention: w1 and w2 must be (T, H) = {tuple(q.shape[:2])}, got "
                            f"{tuple(w1.shape)} and {tuple(w2.shape)}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise SpeedrunError(f"dc_attention: cu_seqlens must be (S,) int32 with S >= 2 (0, ..., T), got "
                            f"{tuple(cu_seqlens.shape)} {cu_seqlens.dtype}")
    if not all(t.is_floating_point() for t in (y, q, k, v, w1, w2)):
        raise SpeedrunError("dc_attention: y, q, k, v, w1, w2 must be floating point")
    if any(t.device != q.device for t in (y, k, v, w1, w2, cu_seqlens)):
        raise SpeedrunError("dc_attention: all tensors must be on one device, got "
                            f"{sorted({str(t.device) for t in (y, q, k, v, w1, w2, cu_seqlens)})}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise SpeedrunError(f"dc_attention: window must be an int >= 1 (tokens), got {window!r}")


def dc_attention(y: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w1: torch.Tensor,
                 w2: torch.Tensor, cu_seqlens: torch.Tensor, scale: float | torch.Tensor,
                 window: int = DC_WINDOW, impl: str = "auto") -> torch.Tensor:
    """y plus the lightweight DC correction (record #85; formula in the module docstring).

    y: (T, H, Dh) the attention's output; q, k, v: (T, H, Dh) the attention's inputs (q, k after QK-norm,
    rotary and key offset; v with its additions), one float dtype with y. w1, w2: (T, H) raw per-token
    weights of any float dtype (w1 is RMS-normalised over the heads here, eps 1e-6). cu_seqlens: (S,) int32
    (0, the document starts, T, possibly T repeated as padding). scale: float or 0-d tensor, the factor of
    q·k. window: W >= 1 tokens (the query's own key included); the Triton path takes W <= 128 and Dh a power
    of two >= 16. impl: one of :data:`IMPLS` (``"auto"``: the Triton path on CUDA where it takes the shape,
    else the reference). Returns (T, H, Dh) in y's dtype, differentiable in y, q, k, v, w1 and w2 (a tensor scale
    gets a gradient on the reference path only).

    Raises :class:`SpeedrunError` on mismatched shapes or devices, non-float inputs, a bad window or impl,
    ``impl="triton"`` without the ``triton`` package, and (Triton path) shapes or dtypes it does not take.
    """
    _check(y, q, k, v, w1, w2, cu_seqlens, window, impl)
    T, H, _ = q.shape
    compute = torch.promote_types(q.dtype, torch.float32)
    u = F.rms_norm(w1.to(compute), (H,), eps=W1_NORM_EPS)                                # (T, H)
    starts = document_starts(cu_seqlens, T)                                              # (T,)
    kernel = _TRITON_CORRECTION
    if impl == "triton" and kernel is None:
        raise SpeedrunError("dc_attention: impl 'triton' needs the triton package (pip install triton)")
    if impl == "triton" or (impl == "auto" and q.is_cuda and kernel is not None
                            and _TRITON_TAKES(q.size(-1), window)):
        return kernel(y, q, k, v, u.float(), w2.float(), starts, scale, window)
    return dc_attention_reference(y, q, k, v, u, w2.to(compute), starts, scale, window)


def _blocks(x: torch.Tensor, n_blocks: int, block: int, before: int) -> torch.Tensor:
    """(n_blocks, before + block, H, Dh): block i holds rows i·block - before .. (i+1)·block - 1 of
    x (T, H, Dh), zeros outside 0..T-1 (a gather: rows shared by neighbouring blocks appear in both)."""
    T = x.size(0)
    padded = F.pad(x, (0, 0, 0, 0, before, n_blocks * block - T))             # (before + n·block, H, Dh)
    rows = torch.arange(n_blocks, device=x.device)[:, None] * block + torch.arange(before + block, device=x.device)
    return padded[rows]                                                         # (n, before + block, H, Dh)


def dc_attention_reference(y: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           u: torch.Tensor, w2: torch.Tensor, starts: torch.Tensor,
                           scale: float | torch.Tensor, window: int) -> torch.Tensor:
    """The DC correction in plain PyTorch: y + w2 · (A v) with the already normalised u (T, H) and w2 (T, H)
    in the compute dtype, ``starts`` (T,) int64 from :func:`document_starts`; q, k, v, y (T, H, Dh).
    Computes in u's dtype (float32 or float64), returns y's dtype. Query block i (B queries) scores against
    keys i·B - W + 1 .. i·B + B - 1, so query a of the block and key j of that range are W - 1 + a - j
    tokens apart."""
    T, H, Dh = q.shape
    compute = u.dtype
    if T == 0:
        return y.clone()
    block = min(BLOCK_QUERIES, T)
    n_blocks = -(-T // block)
    before = window - 1
    qb = _blocks(q.to(compute), n_blocks, block, 0)                             # (n, B, H, Dh)
    kb = _blocks(k.to(compute), n_blocks, block, before)                        # (n, B + W - 1, H, Dh)
    vb = _blocks(v.to(compute), n_blocks, block, before)
    t = torch.arange(n_blocks * block, device=q.device).view(n_blocks, block)   # (n, B) query positions
    s = t[:, :1] - before + torch.arange(block + before, device=q.device)       # (n, B + W - 1) key positions
    rel = t[:, :, None] - s[:, None, :]                                         # (n, B, B + W - 1)
    padded_starts = torch.cat([starts, torch.arange(T, n_blocks * block, device=q.device)])   # pads: self only
    valid = (rel >= 0) & (rel < window) & (s[:, None, :] >= padded_starts.view(n_blocks, block, 1))
    scores = torch.einsum("nahd,njhd->nhaj", qb, kb) * scale                    # (n, H, B, B + W - 1)
    probs = torch.softmax(scores.masked_fill(~valid[:, None], float("-inf")), dim=-1)
    ub = F.pad(u, (0, 0, 0, n_blocks * block - T)).view(n_blocks, block, H)
    mixed = torch.einsum("nah,nhaj->naj", ub, probs)                            # (n, B, B + W - 1): A
    corr = torch.einsum("naj,njhd->nahd", mixed, vb).reshape(-1, H, Dh)[:T]     # (T, H, Dh): A v per head
    return (y.to(compute) + w2[:, :, None] * corr).to(y.dtype)
