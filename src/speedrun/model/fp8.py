"""FP8 matrix products for the training forward pass (``torch._scaled_mm``), bf16 everywhere else.

The public speedrun runs the LM head in FP8 since record #19 and the QKV and O projections since the
2026-06-11 RecursiveFromBest record (speedrun-spec.md 2.4, 2.5): both operands are cast to e4m3 (largest
finite value 448) with a per-tensor scale, multiplied on the FP8 tensor cores (about 1.8x the bf16 rate on
an H200: 1,490 against 810 TFLOP/s measured here) and the product comes back in bf16. Evaluation and the
backward pass stay bf16.

Scaling here is *dynamic* per tensor: scale = amax(|t|) / 448, computed at every call for the activation
and the weight alike, so no value overflows whatever the training phase (the record fixes the head's
scales to 100/448 and 1.6/448 and uses delayed scales for the MLP; a dynamic amax costs one extra
reduction that the compiler fuses with the cast). The backward pass recomputes nothing: it multiplies the
bf16 output gradient with the saved bf16 input and weight (the record's QKV/O path does the same; its
head quantizes the gradient to e5m2, which this module does not).

Shape legend: M rows (tokens), K input features, N output features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
_MIN_AMAX = 1e-12


def quantize_e4m3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t8, scale)``: ``t8 = t / scale`` in float8 e4m3 (same shape) and ``scale`` = amax(|t|)/448, an fp32
    scalar tensor, so that ``t8.float() * scale`` approximates ``t`` (relative error per element about
    2^-4 from e4m3's 3 mantissa bits). An all-zero ``t`` gets a tiny positive scale and quantizes to 0."""
    scale = t.detach().abs().amax().float().clamp_min(_MIN_AMAX) / E4M3_MAX
    return (t.float() / scale).to(E4M3), scale


def fp8_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` (M, N) bf16 from FP8 e4m3 operands with dynamic per-tensor scales.

    x: (M, K) float; weight: (N, K) float. On CUDA, K and N must be multiples of 16 (``_scaled_mm``'s
    layout rule; ``RuntimeError`` otherwise) and the tensor cores accumulate in fast (reduced-precision)
    mode as in the records; on a CPU torch runs its reference implementation of the same product. Not
    differentiable by itself (see :func:`fp8_linear`).
    """
    x8, x_scale = quantize_e4m3(x)
    w8, w_scale = quantize_e4m3(weight)
    extra = {"use_fast_accum": True} if x.is_cuda else {}
    # _scaled_mm wants the second operand column-major: w8 (N, K) row-major transposed is exactly that.
    return torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=torch.bfloat16, **extra)


class _FP8Linear(torch.autograd.Function):
    """FP8 forward, bf16 backward: dL/dx = g W, dL/dW = gᵀ x with g the bf16 output gradient."""

    @staticmethod
    def forward(ctx, x, weight):  # noqa: D102 (autograd API)
        x_bf16, w_bf16 = x.to(torch.bfloat16), weight.to(torch.bfloat16)
        ctx.save_for_backward(x_bf16, w_bf16)
        ctx.dtypes = (x.dtype, weight.dtype)
        return fp8_matmul(x_bf16, w_bf16)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 (autograd API)
        x_bf16, w_bf16 = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        g = grad_out.to(torch.bfloat16)
        grad_x = (g @ w_bf16).to(x_dtype) if ctx.needs_input_grad[0] else None
        grad_w = (g.t() @ x_bf16).to(w_dtype) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


def fp8_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Differentiable ``x @ weight.T`` with an FP8 forward and a bf16 backward.

    x: (..., K) float; weight: (N, K) float (typically an fp32 parameter). Returns (..., N) bf16; the
    gradients come back in the dtypes of x and weight. Shape rules as :func:`fp8_matmul`.
    """
    lead = x.shape[:-1]
    out = _FP8Linear.apply(x.reshape(-1, x.size(-1)), weight)
    return out.reshape(*lead, weight.size(0))


class FP8Linear(nn.Linear):
    """``nn.Linear`` without bias whose training forward runs in FP8 when ``fp8`` is set.

    Same ``weight`` parameter (out_features, in_features) as ``nn.Linear`` (checkpoints and optimizers see
    no difference). ``forward(x)`` with x (..., in_features): :func:`fp8_linear` when ``self.fp8 and
    self.training``, else the plain product (bf16 under autocast): evaluation is never FP8.
    """

    def __init__(self, in_features: int, out_features: int, fp8: bool = False):
        super().__init__(in_features, out_features, bias=False)
        self.fp8 = fp8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8 and self.training:
            return fp8_linear(x, self.weight)
        return F.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8={self.fp8}"
