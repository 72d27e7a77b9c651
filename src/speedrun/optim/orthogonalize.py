"""Approximate orthogonalization of a matrix G = U S Vᵀ towards its polar factor U Vᵀ, by odd matrix
polynomials X <- a X + b (X Xᵀ) X + c (X Xᵀ)² X applied to X0 = G / ‖G‖.

Every singular value s of X0 (in (0, 1] after the normalization) is mapped by the scalar polynomial
p(s) = a s + b s³ + c s⁵ at each iteration, while the singular vectors stay put.

* Newton–Schulz quintic (Keller Jordan 2024; records #3-#37, speedrun-spec.md 3.1): 5 iterations of fixed
  (a, b, c) = (3.4445, -4.7750, 2.0315), chosen to maximize the slope at 0 rather than to converge; singular
  values end in about [0.68, 1.13].
* Polar Express (Amsel et al. 2025; record #38): 5 iterations with per-iteration coefficients (the table
  below, speedrun-spec.md 3.1), normalizing by ‖G‖_F · 1.02; singular values end near 1.

A tall matrix (rows > cols) takes the smaller Gram matrix XᵀX and multiplies on the right, X <- a X + X (b A +
c A²) with A = XᵀX (the same polynomial in X's singular values; record #88's ``polar_express``), so no transposed
copy is made and the result keeps X's layout. A stack of matrices (..., rows, cols) is processed in one batch (the
parameter banks of records #48, #56, #61).
"""

from __future__ import annotations

import torch

from speedrun.optim.config import ORTHOGONALIZERS, Orthogonalizer


NEWTON_SCHULZ_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NEWTON_SCHULZ_STEPS = 5
POLAR_EXPRESS_COEFFICIENTS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


def orthogonalization_schedule(method: Orthogonalizer) -> tuple[tuple[tuple[float, float, float], ...],
                                                                  float, float]:
    """``(coefficients per iteration, norm factor, eps)``: X0 = G / (‖G‖_F · factor + eps)."""
    if method == "newton_schulz":
        return (NEWTON_SCHULZ_COEFFICIENTS,) * NEWTON_SCHULZ_STEPS, 1.0, 1e-7
    if method == "polar_express":
        return POLAR_EXPRESS_COEFFICIENTS, 1.02, 1e-6
    raise ValueError(f"unknown orthogonalizer {method!r}; expected one of {', '.join(ORTHOGONALIZERS)}")


def orthogonalize(grad: torch.Tensor, method: Orthogonalizer = "polar_express",
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """The approximate polar factor of each matrix of ``grad`` (..., rows, cols), same shape, in ``dtype``.

    Leading dimensions are a batch (a parameter bank, records #48, #56, #61): every (rows, cols) matrix is
    normalized by its own Frobenius norm and iterated independently, in one batched matrix product per
    term, so a (N, rows, cols) stack costs the kernel launches of one matrix. ``dtype`` is the working
    precision: default bfloat16 on CUDA (as in the speedrun), elsewhere ``grad``'s dtype but at least float32
    (CPU bf16 matrix products are not faster at these sizes; float64 stays float64, for exact tests). A zero
    matrix maps to zero. Raises ``ValueError`` for fewer
    than 2 dimensions or an unknown ``method``.
    """
    if grad.ndim < 2:
        raise ValueError(f"orthogonalize takes a matrix or a stack of matrices, got shape {tuple(grad.shape)}")
    if dtype is None:
        dtype = torch.bfloat16 if grad.is_cuda else torch.promote_types(grad.dtype, torch.float32)
    coefficients, factor, eps = orthogonalization_schedule(method)
    tall = grad.size(-2) > grad.size(-1)
    x = grad.reshape(-1, *grad.shape[-2:])                          # (B, rows, cols)
    norm = torch.linalg.matrix_norm(x.to(torch.promote_types(x.dtype, torch.float32)), keepdim=True)
    x = (x / (norm * factor + eps).to(x.dtype)).to(dtype)
    for a, b, c in coefficients:
        if tall:
            gram = torch.bmm(x.mT, x)                               # A = XᵀX (B, cols, cols)
            poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c) # b·A + c·A²
            x = torch.baddbmm(x, x, poly, beta=a)                   # a·X + X·(b·A + c·A²)
        else:
            gram = torch.bmm(x, x.mT)                               # A = XXᵀ (B, rows, rows)
            poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.baddbmm(x, poly, x, beta=a)                   # a·X + (b·A + c·A²)·X
    return x.reshape(grad.shape)
