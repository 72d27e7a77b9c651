"""FP8 matrix products for the training forward pass (``torch._scaled_mm``), bf16 in evaluation.

The public speedrun runs the LM head in FP8 since record #19 and the QKV and O projections since the
2026-06-11 RecursiveFromBest record (speedrun-spec.md 2.4, 2.5): the operands are cast to float8 with a
per-tensor scale, multiplied on the FP8 tensor cores (about 1.8x the bf16 rate on an H200: 1,490 against
810 TFLOP/s measured here) and the product comes back in bf16. Evaluation stays bf16.

Two scale policies (:class:`FP8Scales`):

* dynamic (the QKV/O projections here): scale = amax(|t|) / 448 per call, for the activation and the weight,
  so nothing overflows whatever the training phase; the backward pass stays bf16 (as the record's QKV/O).
* the head's (:data:`HEAD_SCALES`, records #19, #51, #67; speedrun-spec.md 2.5): fixed scales, x / (100/448)
  (x is RMS-normalized, so |x| <= sqrt(model_dim) stays far inside e4m3's range) and W / (1.6/448), and an
  FP8 backward: the output gradient in e5m2 (5 exponent bits) for both gradient products. The record fixes
  the gradient's scale too (0.75/448 of its loss scale); our loss is a mean over the tokens of the
  micro-batch and the micro-batches, so that factor is not known here: the gradient's scale is dynamic.

Fixed-scale casts saturate at the format's largest value instead of overflowing to NaN (the record relies
on weight decay keeping |W| < 1.6). Shape legend: M rows (tokens), K input features, N output features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
_MIN_AMAX = 1e-12


@dataclass(frozen=True)
class FP8Scales:
    """How :func:`fp8_linear` scales its operands: ``value = fp8 * scale``.

    ``x``, ``weight``: fixed scales, or None for dynamic (amax / 448). ``backward``: the gradient products in
    FP8 too (the output gradient as e5m2 with a dynamic scale, amax / 57344), else in bf16.
    """

    x: float | None = None
    weight: float | None = None
    backward: bool = False


DYNAMIC_SCALES = FP8Scales()
HEAD_SCALES = FP8Scales(x=100.0 / E4M3_MAX, weight=1.6 / E4M3_MAX, backward=True)


def quantize(t: torch.Tensor, scale: float | None = None, dtype: torch.dtype = E4M3
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t8, scale)``: ``t8 = t / scale`` in ``dtype`` (float8 e4m3 or e5m2; same shape) and ``scale`` an
    fp32 scalar tensor, so that ``t8.float() * scale`` approximates ``t`` (relative error per element about
    2^-4 for e4m3, 2^-3 for e5m2). ``scale`` None: amax(|t|) / the format's largest value (an all-zero t
    gets a tiny positive scale and quantizes to 0); a fixed scale saturates values beyond the range."""
    largest = E4M3_MAX if dtype == E4M3 else E5M2_MAX
    if scale is None:
        scale_t = t.detach().abs().amax().float().clamp_min(_MIN_AMAX) / largest
        return (t.float() / scale_t).to(dtype), scale_t
    scale_t = torch.tensor(scale, dtype=torch.float32, device=t.device)
    return (t.float() / scale).clamp(-largest, largest).to(dtype), scale_t


def scaled_mm(a8: torch.Tensor, a_scale: torch.Tensor, b8: torch.Tensor, b_scale: torch.Tensor
              ) -> torch.Tensor:
    """``(a8 * a_scale) @ (b8 * b_scale).T`` (M, N) bf16 from float8 a8 (M, K) and b8 (N, K), both row-major.

    On CUDA, K and N must be multiples of 16 (``RuntimeError`` otherwise) and the tensor cores accumulate in
    fast mode as in the records; on a CPU torch runs its reference implementation. e5m2 x e5m2 is not
    supported by the hardware; one operand at least must be e4m3.
    """
    extra = {"use_fast_accum": True} if a8.is_cuda else {}
    # _scaled_mm wants its second operand column-major: b8 (N, K) row-major, transposed, is exactly that.
    return torch._scaled_mm(a8, b8.t(), scale_a=a_scale, scale_b=b_scale, out_dtype=torch.bfloat16, **extra)


def fp8_matmul(x: torch.Tensor, weight: torch.Tensor, scales: FP8Scales = DYNAMIC_SCALES) -> torch.Tensor:
    """``x @ weight.T`` (M, N) bf16 from e4m3 operands: x (M, K) float, weight (N, K) float. Not
    differentiable by itself (see :func:`fp8_linear`); shape rules as :func:`scaled_mm`."""
    x8, x_scale = quantize(x, scales.x)
    w8, w_scale = quantize(weight, scales.weight)
    return scaled_mm(x8, x_scale, w8, w_scale)


class _FP8Linear(torch.autograd.Function):
    """FP8 forward; backward dL/dx = g W and dL/dW = gᵀ x in bf16, or in FP8 with ``scales.backward``."""

    @staticmethod
    def forward(ctx, x, weight, scales):  # noqa: D102 (autograd API)
        x8, x_scale = quantize(x, scales.x)
        w8, w_scale = quantize(weight, scales.weight)
        ctx.scales, ctx.dtypes = scales, (x.dtype, weight.dtype)
        if scales.backward:
            ctx.save_for_backward(x8, x_scale, w8, w_scale)
        else:
            ctx.save_for_backward(x.to(torch.bfloat16), weight.to(torch.bfloat16))
        return scaled_mm(x8, x_scale, w8, w_scale)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 (autograd API)
        x_dtype, w_dtype = ctx.dtypes
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if ctx.scales.backward:
            x8, x_scale, w8, w_scale = ctx.saved_tensors
            g8, g_scale = quantize(grad_out, None, E5M2)                       # (M, N)
            grad_x = scaled_mm(g8, g_scale, w8.t().contiguous(), w_scale) if need_x else None
            grad_w = scaled_mm(g8.t().contiguous(), g_scale, x8.t().contiguous(), x_scale) if need_w else None
        else:
            x_bf16, w_bf16 = ctx.saved_tensors
            g = grad_out.to(torch.bfloat16)
            grad_x = g @ w_bf16 if need_x else None
            grad_w = g.t() @ x_bf16 if need_w else None
        return (None if grad_x is None else grad_x.to(x_dtype),
                None if grad_w is None else grad_w.to(w_dtype), None)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scales: FP8Scales = DYNAMIC_SCALES) -> torch.Tensor:
    """Differentiable ``x @ weight.T`` with an FP8 forward (and, with ``scales.backward``, FP8 gradient
    products).

    x: (..., K) float; weight: (N, K) float (typically an fp32 parameter). Returns (..., N) bf16; the
    gradients come back in the dtypes of x and weight. On CUDA, K, N and (for the FP8 backward) the number
    of rows M must be multiples of 16.
    """
    lead = x.shape[:-1]
    out = _FP8Linear.apply(x.reshape(-1, x.size(-1)), weight, scales)
    return out.reshape(*lead, weight.size(0))


class FP8Linear(nn.Linear):
    """``nn.Linear`` without bias whose training forward runs in FP8 when ``fp8`` is set.

    Same ``weight`` parameter (out_features, in_features) as ``nn.Linear`` (checkpoints and optimizers see
    no difference). ``forward(x)`` with x (..., in_features): :func:`fp8_linear` with dynamic scales when
    ``self.fp8 and self.training``, else the plain product (bf16 under autocast): evaluation is never FP8.
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
