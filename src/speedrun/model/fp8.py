"""FP8 matrix products for the training forward pass (``torch._scaled_mm``), bf16 in evaluation.

The public speedrun runs the LM head in FP8 since record #19 and the QKV and O projections since the
2026-06-11 RecursiveFromBest record (speedrun-spec.md 2.4, 2.5): the operands are cast to float8 with a
per-tensor scale, multiplied on the FP8 tensor cores (about 1.8x the bf16 rate on an H200: 1,490 against
810 TFLOP/s measured here) and the product comes back in bf16. Evaluation stays bf16.

Three scale policies (:class:`FP8Scales`):

* dynamic (the QKV/O projections here): scale = amax(|t|) / 448 per call, for the activation and the weight,
  so nothing overflows whatever the training phase; the backward pass stays bf16 (as the record's QKV/O).
* unit (:data:`UNIT_SCALES`, record #87's QKV/O, ``GPTConfig.fp8_attention_scales``): scale 1 for both
  operands, the record's plain ``.to(float8_e4m3fn)`` casts; bf16 backward.
* the head's (:data:`HEAD_SCALES`, records #19, #51, #67; speedrun-spec.md 2.5): fixed scales, x / (100/448)
  (x is RMS-normalized, so |x| <= sqrt(model_dim) stays far inside e4m3's range) and W / (1.6/448), and an
  FP8 backward: the output gradient in e5m2 (5 exponent bits) for both gradient products. The record fixes
  the gradient's scale too (0.75/448 of its loss scale); our loss is a mean over the tokens of the
  micro-batch and the micro-batches, so that factor is not known here: the gradient's scale is dynamic.

Fixed-scale casts saturate at the format's largest value instead of overflowing to NaN (the record relies
on weight decay keeping |W| < 1.6).

The weights change once per optimizer step, not once per micro-batch (issue 6): an :class:`FP8WeightCache`
holds a weight's quantized operands for a whole step, refreshed by the training loop after every update
(:meth:`speedrun.model.gpt.GPT.quantize_fp8_weights`) and used only while switched on
(:meth:`speedrun.model.gpt.GPT.use_fp8_weight_cache`); off (the default) every call quantizes its weight.

Shape legend: M rows (tokens), K input features, N output features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.kernels import optional_kernel

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
_MIN_AMAX = 1e-12
_TRITON_TRANSPOSE = optional_kernel("transpose", "transpose_copy")      # None without the triton package


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
# record #87's FP8 q/k/v and o (2026-06-11 RecursiveFromBest, its FP8LinearFunction): both operands cast to
# e4m3 as they are, bf16 backward (GPTConfig.fp8_attention_scales "unit")
UNIT_SCALES = FP8Scales(x=1.0, weight=1.0)
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
    scale_t = torch.full((), scale, dtype=torch.float32, device=t.device)     # a fill: no copy from the host
    return (t.float() / scale).clamp(-largest, largest).to(dtype), scale_t


def transposed(t: torch.Tensor) -> torch.Tensor:
    """``t.t().contiguous()`` for a contiguous (M, N) ``t``: the (N, M) row-major copy an FP8 product needs of
    an operand whose contraction dimension is M (the head's e5m2 logit gradient (T, V) for dL/dW). On CUDA
    the tiled Triton copy :func:`speedrun.kernels.transpose.transpose_copy` (ATen's copy of a float8 tensor
    transposed is an untiled element-wise kernel: 5.1 ms at (16384, 50304) on the H200, see that module);
    elsewhere, or without Triton, PyTorch's copy. Same values either way."""
    if t.is_cuda and t.dim() == 2 and t.is_contiguous() and _TRITON_TRANSPOSE is not None:
        return _TRITON_TRANSPOSE(t)
    return t.t().contiguous()


def scaled_mm(a8: torch.Tensor, a_scale: torch.Tensor, b8: torch.Tensor, b_scale: torch.Tensor, *,
              out_dtype: torch.dtype = torch.bfloat16, fast_accum: bool = True) -> torch.Tensor:
    """``(a8 * a_scale) @ (b8 * b_scale).T`` (M, N) in ``out_dtype`` (bf16 or fp32) from float8 a8 (M, K) and
    b8 (N, K), both row-major.

    On CUDA, K and N must be multiples of 16 (``RuntimeError`` otherwise). ``fast_accum``: Hopper's fast FP8
    accumulation, whose partial sums are not promoted to fp32 as often; the records take it for the forward
    products only and run every backward product without it, the weight gradient out in fp32 (record #88's
    ``mm_t_backward`` and the cross-entropy kernel's backward: ``use_fast_accum=False``). A CPU
    computes torch's emulated product instead (:func:`_cpu_scaled_mm`). e5m2 x e5m2 is not supported by the
    hardware; one operand at least must be e4m3.
    """
    if not a8.is_cuda and a_scale.dim() == 0 and b_scale.dim() == 0:
        return _cpu_scaled_mm(a8, a_scale, b8, b_scale, out_dtype)
    extra = {"use_fast_accum": fast_accum} if a8.is_cuda else {}
    # _scaled_mm wants its second operand column-major: b8 (N, K) row-major, transposed, is exactly that.
    return torch._scaled_mm(a8, b8.t(), scale_a=a_scale, scale_b=b_scale, out_dtype=out_dtype, **extra)


def _cpu_scaled_mm(a8: torch.Tensor, a_scale: torch.Tensor, b8: torch.Tensor, b_scale: torch.Tensor,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """:func:`scaled_mm` on a CPU with per-tensor scales (() fp32): the operands dequantized to fp32, one fp32
    product, cast to ``out_dtype``, the operations of torch's own emulated CPU ``_scaled_mm`` (which it takes
    without oneDNN), so bit for bit that. With oneDNN torch takes oneDNN's FP8 product, a slow loop on a CPU
    without FP8 instructions, AVX-512 and AMX (bf16, int8) notwithstanding: 55 s for (256, 64) x (64, 50304)
    on the project's CPU machine against 0.09 s here (docs/benchmarks.md, 2026-12-07; tests/test_fp8.py
    checks the equality)."""
    return torch.mm(a8.float() * a_scale, (b8.float() * b_scale).t()).to(out_dtype)


def fp8_matmul(x: torch.Tensor, weight: torch.Tensor, scales: FP8Scales = DYNAMIC_SCALES) -> torch.Tensor:
    """``x @ weight.T`` (M, N) bf16 from e4m3 operands: x (M, K) float, weight (N, K) float. Not
    differentiable by itself (see :func:`fp8_linear`); shape rules as :func:`scaled_mm`."""
    x8, x_scale = quantize(x, scales.x)
    w8, w_scale = quantize(weight, scales.weight)
    return scaled_mm(x8, x_scale, w8, w_scale)


class FP8WeightCache(nn.Module):
    """One weight's FP8 operands, quantized once per optimizer step instead of once per call (issue 6).

    Non-persistent buffers (not in checkpoints), empty until the first :meth:`refresh_`, then written in
    place (a compiled graph holds their storage and reads the new values, as the model's schedule buffers):
    ``w8`` (N, K) e4m3 and ``w_scale`` () fp32, the forward operand exactly as :func:`quantize` makes it with
    ``scales.weight`` (dynamic amax/448, or the head's fixed scale); ``w_back``, the backward's operand of
    dL/dx = g W: ``w8.t().contiguous()`` (K, N) e4m3 for the FP8 backward (``scales.backward``, the head's),
    else the weight in bf16 (N, K): a bf16 copy of a wider weight, and none of a bf16 weight, whose
    :meth:`operands` give the weight itself (the records' bf16 weights: a copy would cost two launches and
    2·N·K bytes per refresh for the same values). Memory per weight of N·K elements: N·K bytes (bf16
    weight), 3·N·K bytes (wider weight) or 2·N·K bytes (FP8 backward), held for the whole run.

    Used only while ``enabled`` (default False, set by :meth:`speedrun.model.gpt.GPT.use_fp8_weight_cache`),
    so direct calls (tests, notebooks) quantize per call. Nothing detects a weight changed since the last
    refresh (the products then use the old weight): whoever switches it on refreshes it after every update.
    """

    def __init__(self, scales: FP8Scales = DYNAMIC_SCALES):
        super().__init__()
        self.scales = scales
        self.enabled = False
        back_dtype = E4M3 if scales.backward else torch.bfloat16
        self.register_buffer("w8", torch.empty(0, dtype=E4M3), persistent=False)
        self.register_buffer("w_scale", torch.empty(0, dtype=torch.float32), persistent=False)
        self.register_buffer("w_back", torch.empty(0, dtype=back_dtype), persistent=False)

    @torch.no_grad()
    def refresh_(self, weight: torch.Tensor) -> None:
        """Quantize ``weight`` (N, K) float into the buffers: in place when their shape, dtype and device
        already fit, else as new buffers (the first fill, or after ``.to()`` casts)."""
        w8, w_scale = quantize(weight, self.scales.weight)
        self._store({"w8": w8, "w_scale": w_scale, "w_back": self._backward_copy(weight, w8)})

    def _backward_copy(self, weight: torch.Tensor, w8: torch.Tensor) -> torch.Tensor | None:
        """The ``w_back`` to store: w8ᵀ (K, N) e4m3 for the FP8 backward, a bf16 copy (N, K) of a wider
        weight, or None for a bf16 weight (:meth:`operands` then hands out the weight)."""
        if self.scales.backward:
            return transposed(w8)
        return None if weight.dtype == torch.bfloat16 else weight.detach().to(torch.bfloat16)

    def _store(self, values: dict[str, torch.Tensor | None]) -> None:
        """Write each value into its buffer in place when shape, dtype and device fit, else replace the
        buffer (the first fill, or after ``.to()`` casts); a None value leaves its buffer as it is."""
        for name, value in values.items():
            if value is None:
                continue
            buffer = getattr(self, name)
            if (buffer.shape, buffer.dtype, buffer.device) == (value.shape, value.dtype, value.device):
                buffer.copy_(value)
            else:
                setattr(self, name, value)

    def batchable(self, weight: torch.Tensor) -> bool:
        """Whether :func:`refresh_caches_` may refresh this cache in a batch with others: a plain cache (no
        delayed scale) of the dynamic weight scale and bf16 backward, already filled for ``weight``'s shape
        and device (the first fill goes through :meth:`refresh_`)."""
        return (type(self) is FP8WeightCache and self.scales.weight is None and not self.scales.backward
                and self.w8.dtype == E4M3 and self.w8.shape == weight.shape and self.w8.device == weight.device
                and self.w_scale.shape == () and self.w_scale.dtype == torch.float32
                and (weight.dtype == torch.bfloat16 or self.w_back.shape == weight.shape))

    def operands(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(w8, w_scale, w_back)`` for ``weight`` (N, K). Raises ``RuntimeError`` when the cache was never
        filled for a weight of that shape (or was cast since): call
        :meth:`speedrun.model.gpt.GPT.quantize_fp8_weights` first."""
        own_back = self.scales.backward or weight.dtype != torch.bfloat16
        if (self.w8.dtype != E4M3 or self.w8.shape != weight.shape or self.w_scale.dtype != torch.float32
                or (own_back and self.w_back.numel() != weight.numel())):
            raise RuntimeError(f"the FP8 weight cache is switched on but holds no FP8 copy of this "
                               f"{tuple(weight.shape)} weight: call GPT.quantize_fp8_weights() (after every "
                               "optimizer step) or switch the cache off (GPT.use_fp8_weight_cache(False))")
        return self.w8, self.w_scale, self.w_back if own_back else weight.detach()

    def extra_repr(self) -> str:
        return f"enabled={self.enabled}, backward={'fp8' if self.scales.backward else 'bf16'}"


@torch.no_grad()
def refresh_caches_(pairs: Sequence[tuple["FP8WeightCache", torch.Tensor]]) -> None:
    """Refresh every ``(cache, weight)`` of ``pairs`` as ``cache.refresh_(weight)`` would, bit for bit, with the
    equal ones in one batch: filled caches of the dynamic weight scale and bf16 backward (the QKV/O and MLP
    projections') whose weights share one shape, dtype and device are quantized together
    (:func:`quantize_batch_`, then one multi-tensor copy for the bf16 backward copies of wider weights), in
    about ten kernel launches whatever their number (eleven MLP input weights:
    about 120 host operators one by one); any other pair (a delayed or fixed scale, an FP8 backward, a first
    fill) is refreshed alone. Called once per optimizer step (:meth:`speedrun.model.gpt.GPT.quantize_fp8_weights`).
    """
    batches: dict[tuple, list[tuple[FP8WeightCache, torch.Tensor]]] = {}
    for cache, weight in pairs:
        if cache.batchable(weight):
            batches.setdefault((weight.shape, weight.dtype, weight.device), []).append((cache, weight))
        else:
            cache.refresh_(weight)
    for members in batches.values():
        if len(members) == 1:
            members[0][0].refresh_(members[0][1])
            continue
        quantize_batch_([w for _, w in members], [c.w8 for c, _ in members], [c.w_scale for c, _ in members])
        wider = [(c, w) for c, w in members if w.dtype != torch.bfloat16]       # their bf16 backward copies
        if wider:
            torch._foreach_copy_([c.w_back for c, _ in wider], [w.detach() for _, w in wider])


@torch.no_grad()
def quantize_batch_(weights: Sequence[torch.Tensor], w8s: Sequence[torch.Tensor],
                    scales: Sequence[torch.Tensor]) -> None:
    """:func:`quantize` with the dynamic scale of each of ``weights`` (n tensors of one shape (N, K), float,
    one device), written in place into ``w8s`` (n e4m3 (N, K)) and ``scales`` (n () fp32): the same values, in
    a fixed number of launches (the n maxima in one multi-tensor reduction, the n weights quantized as one
    (n, N, K) stack, written back with multi-tensor copies) instead of about ten per weight."""
    amax = torch.stack(torch._foreach_norm(list(weights), ord=float("inf"))).float()     # (n,) max |w| each
    scale = amax.clamp_min_(_MIN_AMAX).div_(E4M3_MAX)
    stacked = (torch.stack(list(weights)).float() / scale.view(-1, 1, 1)).to(E4M3)         # (n, N, K) e4m3
    torch._foreach_copy_(list(w8s), list(stacked.unbind(0)))
    torch._foreach_copy_(list(scales), list(scale.unbind(0)))


class _FP8Linear(torch.autograd.Function):
    """FP8 forward; backward dL/dx = g W and dL/dW = gᵀ x in bf16, or in FP8 with ``scales.backward``.

    ``w8``, ``w_scale``, ``w_back``: None (the weight is quantized here) or an :class:`FP8WeightCache`'s
    fresh operands of ``weight``, which then serves only for its gradient and dtype: same values either way.
    """

    @staticmethod
    def forward(ctx, x, weight, scales, w8=None, w_scale=None, w_back=None):  # noqa: D102 (autograd API)
        x8, x_scale = quantize(x, scales.x)
        if w8 is None:
            w8, w_scale = quantize(weight, scales.weight)
        ctx.scales, ctx.dtypes = scales, (x.dtype, weight.dtype)
        if scales.backward:
            ctx.save_for_backward(x8, x_scale, w8, w_scale, w_back)                 # w_back: w8ᵀ (K, N) or None
        else:
            ctx.save_for_backward(x.to(torch.bfloat16), weight.to(torch.bfloat16) if w_back is None else w_back)
        return scaled_mm(x8, x_scale, w8, w_scale)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 (autograd API)
        x_dtype, w_dtype = ctx.dtypes
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if ctx.scales.backward:
            x8, x_scale, w8, w_scale, w8_t = ctx.saved_tensors
            w8_t = transposed(w8) if w8_t is None else w8_t                         # (K, N)
            g8, g_scale = quantize(grad_out, None, E5M2)                       # (M, N)
            grad_x = scaled_mm(g8, g_scale, w8_t, w_scale, fast_accum=False) if need_x else None
            grad_w = (scaled_mm(transposed(g8), g_scale, transposed(x8), x_scale, out_dtype=torch.float32,
                                fast_accum=False) if need_w else None)                  # as the records'
        else:
            x_bf16, w_bf16 = ctx.saved_tensors
            g = grad_out.to(torch.bfloat16)
            grad_x = g @ w_bf16 if need_x else None
            grad_w = g.t() @ x_bf16 if need_w else None
        return (None if grad_x is None else grad_x.to(x_dtype),
                None if grad_w is None else grad_w.to(w_dtype), None, None, None, None)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scales: FP8Scales = DYNAMIC_SCALES,
               cache: FP8WeightCache | None = None, *,
               operands: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Differentiable ``x @ weight.T`` with an FP8 forward (and, with ``scales.backward``, FP8 gradient
    products).

    x: (..., K) float; weight: (N, K) float (typically an fp32 parameter). Returns (..., N) bf16; the
    gradients come back in the dtypes of x and weight. On CUDA, K, N and (for the FP8 backward) the number
    of rows M must be multiples of 16. ``cache``: an :class:`FP8WeightCache` of ``weight`` with the same
    ``scales``; while it is ``enabled`` its operands replace the per-call quantization (bit-identical when
    fresh; ``RuntimeError`` when never filled, ``ValueError`` for other scales). ``operands``: such a
    cache's ``(w8, w_scale, w_back)`` passed directly (instead of ``cache``).
    """
    lead = x.shape[:-1]
    if cache is not None and cache.enabled:
        if cache.scales != scales:
            raise ValueError(f"fp8_linear: the weight cache holds {cache.scales}, the call asks for {scales}")
        operands = cache.operands(weight)
    out = _FP8Linear.apply(x.reshape(-1, x.size(-1)), weight, scales, *(operands or (None, None, None)))
    return out.reshape(*lead, weight.size(0))


class FP8Linear(nn.Linear):
    """``nn.Linear`` without bias whose training forward runs in FP8 when ``fp8`` is set.

    Same ``weight`` parameter (out_features, in_features) as ``nn.Linear`` (checkpoints and optimizers see
    no difference). ``forward(x)`` with x (..., in_features): :func:`fp8_linear` with dynamic scales when
    :attr:`runs_fp8` (``fp8`` and training), else the plain product (bf16 under autocast): evaluation is never FP8.
    With ``fp8`` and ``weight_cache`` (default), ``weight_cache`` is an :class:`FP8WeightCache` (off until
    switched on; filled by :meth:`quantize_weight_`), else None (a layer whose weight the owner multiplies
    itself, as the stacked QKV projection of :class:`speedrun.model.block.CausalSelfAttention`).
    """

    def __init__(self, in_features: int, out_features: int, fp8: bool = False, weight_cache: bool = True):
        super().__init__(in_features, out_features, bias=False)
        self.fp8 = fp8
        self.weight_cache = FP8WeightCache(DYNAMIC_SCALES) if fp8 and weight_cache else None

    @torch.no_grad()
    def quantize_weight_(self) -> None:
        """Refresh :attr:`weight_cache` from the current weight (nothing without a cache)."""
        refresh_caches_(self.weight_cache_pairs())

    def weight_cache_pairs(self) -> list[tuple[FP8WeightCache, torch.Tensor]]:
        """``[(weight_cache, weight)]``, or none without a cache: what :func:`refresh_caches_` refreshes."""
        return [] if self.weight_cache is None else [(self.weight_cache, self.weight)]

    @property
    def runs_fp8(self) -> bool:
        """Whether :meth:`forward` runs in FP8 now: ``fp8`` set and the module in training mode."""
        return self.fp8 and self.training

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.runs_fp8:
            return fp8_linear(x, self.weight, cache=self.weight_cache)
        return F.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8={self.fp8}"
