"""The FP8 ReLU² MLP of the records: delayed scales for the down projection and the plain PyTorch reference.

Source: speedrun-spec.md 2.4; records #84 (the up projection in FP8) and #89 (the down projection in FP8,
HEAD). Shape legend: T tokens, C model_dim, F hidden width (4·C).

The forward ``out = relu(x W1ᵀ)² W2ᵀ`` with both products on e4m3 operands (``value = fp8 · scale``):

* up projection (#84): x quantized per tensor at every call, scale amax(|x|)/448; W1 per layer once per
  optimizer step (:class:`speedrun.model.fp8.FP8WeightCache`, amax/448 of the current weight).
* down projection (#89): ``post = relu(pre)²`` quantized with a **delayed** per-layer scale, ``post_scale =
  amax(post of the previous training forward) · 1.80/448`` (:data:`POST_HEADROOM`; :func:`next_post_scale`),
  values past 448 saturating; the first forward uses 1.0, HEAD's initial value. W2 quantized once per step
  with a delayed per-layer scale too (:class:`DelayedFP8WeightCache`): the amax of the weight at the previous
  refresh · 1.12/448 (:data:`W2_HEADROOM`), saturating; the first :data:`W2_BOOTSTRAP_REFRESHES` refreshes
  use the current weight's own amax/448 (HEAD's ``bootstrap_down=(step < 16)``).
* backward in bf16 from the saved bf16 x, post and weights (``d relu(p)²/dp = 2·sqrt(post)``), as HEAD.

Where HEAD differs: its kernel is persistent and keeps a partial amax per SM (reduced by a second kernel
after the forward); ours keeps one per output tile, reduced by ``amax``; the maximum is the same. HEAD
updates the post scales once per forward of the whole model (after the last layer); ours updates each
MLP's scale at the end of its own forward, which for a model that calls every MLP once per forward is the
same sequence of scales. HEAD stores W2 transposed (F, C) and feeds cuBLAS its transposed e4m3 copy; ours
keeps ``proj.weight`` (C, F) row-major and multiplies ``_scaled_mm(post8, w2_8ᵀ)`` (row-major x
column-major), the layout torch 2.11 + CUDA 13's cuBLAS accepts on Hopper (HEAD's own product fails there
with ``CUBLAS_STATUS_NOT_SUPPORTED``, reference-code README).

The fast path is :func:`speedrun.kernels.relu_square_mlp.relu_square_mlp_fp8` (CUDA); :func:`fp8_mlp_reference`
computes the same quantization in plain PyTorch (dequantized operands, fp32 products) on any device.
"""

from __future__ import annotations

import torch

from speedrun.errors import SpeedrunError
from speedrun.model.fp8 import DYNAMIC_SCALES, E4M3, E4M3_MAX, FP8WeightCache

POST_HEADROOM = 1.80
W2_HEADROOM = 1.12
W2_BOOTSTRAP_REFRESHES = 17
_MIN_AMAX = 1e-12

FP8Operands = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def next_post_scale(amax: torch.Tensor, headroom: float = POST_HEADROOM) -> torch.Tensor:
    """The delayed scale of post for the next forward: ``max(amax, 1e-12) · headroom / 448`` (() fp32 from
    amax, the maximum of post = relu(pre)² ≥ 0 over the last forward; record #89)."""
    return amax.float().clamp_min(_MIN_AMAX) * (headroom / E4M3_MAX)


def quantize_with_scale(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``t / scale`` saturated to [-448, 448] in e4m3 (same shape); ``scale`` () fp32 tensor."""
    return (t.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


class DelayedFP8WeightCache(FP8WeightCache):
    """An :class:`speedrun.model.fp8.FP8WeightCache` whose weight scale is delayed (record #89's W2).

    At each :meth:`refresh_` the weight is quantized with ``next_scale`` = amax(|weight at the previous
    refresh|) · ``headroom``/448, saturating at ±448, and ``next_scale`` becomes this weight's amax ·
    headroom/448. The first ``bootstrap_refreshes`` refreshes (default 17: in training the one before step 0
    and those after steps 0-15, HEAD's ``bootstrap_down=(step < 16)``) use the current weight's own amax/448
    instead. Buffers as the base class (``w8`` (N, K) e4m3, ``w_scale`` () fp32 the scale used, ``w_back``
    (N, K) bf16 for a wider weight only) plus ``next_scale`` () fp32; ``refreshes`` counts the refreshes so far (a host int: the
    refresh runs outside compiled graphs). ``scales`` is the dynamic policy's (the operands fit
    :func:`speedrun.model.fp8.fp8_linear` with a bf16 backward).
    """

    def __init__(self, headroom: float = W2_HEADROOM, bootstrap_refreshes: int = W2_BOOTSTRAP_REFRESHES):
        super().__init__(DYNAMIC_SCALES)
        self.headroom, self.bootstrap_refreshes, self.refreshes = headroom, bootstrap_refreshes, 0
        self.register_buffer("next_scale", torch.empty(0, dtype=torch.float32), persistent=False)

    @property
    def bootstrapping(self) -> bool:
        """True while the next refresh uses the current weight's own amax."""
        return self.refreshes < self.bootstrap_refreshes or self.next_scale.shape != ()

    @torch.no_grad()
    def refresh_(self, weight: torch.Tensor) -> None:
        """Quantize ``weight`` (N, K) float into the buffers with the delayed scale (see the class)."""
        amax = weight.detach().abs().amax().float().clamp_min(_MIN_AMAX)
        scale = amax / E4M3_MAX if self.bootstrapping else self.next_scale.clone()
        w8 = quantize_with_scale(weight, scale)
        self._store({"w8": w8, "w_scale": scale, "w_back": self._backward_copy(weight, w8),
                     "next_scale": amax * (self.headroom / E4M3_MAX)})
        self.refreshes += 1

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, headroom={self.headroom}, bootstrap_refreshes={self.bootstrap_refreshes}"


class _FP8MLPReference(torch.autograd.Function):
    """The quantization of the fused kernel in plain PyTorch; backward in fp32 products of the bf16-rounded
    saved values (the kernel's are bf16 products with fp32 accumulation)."""

    @staticmethod
    def forward(ctx, x, w1, w2, w1_8, w1_scale, w1_back, w2_8, w2_scale, w2_back, post_scale, down_fp8=True):
        x_scale = x.detach().abs().amax().float().clamp_min(_MIN_AMAX) / E4M3_MAX      # per tensor, each call
        x8 = (x.float() / x_scale).to(E4M3)
        pre = (x8.float() * x_scale) @ (w1_8.float() * w1_scale).t()                    # (T, F) fp32
        post = torch.relu(pre).square()
        if down_fp8:
            post8 = torch.clamp(post * (1.0 / post_scale), max=E4M3_MAX).to(E4M3)       # delayed, saturating
            out = ((post8.float() * post_scale) @ (w2_8.float() * w2_scale).t()).to(torch.bfloat16)  # (T, C)
        else:                                                   # records #84-#88: the down product in bf16
            out = (post.to(torch.bfloat16).float() @ w2_back.float().t()).to(torch.bfloat16)        # (T, C)
        amax = post.amax() if down_fp8 and post.numel() else torch.zeros((), device=x.device)
        ctx.mark_non_differentiable(amax)
        ctx.dtypes = (x.dtype, w1.dtype, w2.dtype)
        ctx.save_for_backward(x.to(torch.bfloat16), w1_back, w2_back, post.to(torch.bfloat16))
        return out, amax

    @staticmethod
    def backward(ctx, g_out, _g_amax):
        x, w1, w2, post = (t.float() for t in ctx.saved_tensors)     # (T, C), (F, C), (C, F), (T, F)
        x_dtype, w1_dtype, w2_dtype = ctx.dtypes
        g_out = g_out.to(torch.bfloat16).float()
        g_pre = (g_out @ w2) * (2.0 * post.sqrt())                   # d relu(p)²/dp = 2·relu(p) = 2·sqrt(post)
        return ((g_pre @ w1).to(x_dtype), (g_pre.t() @ x).to(w1_dtype), (g_out.t() @ post).to(w2_dtype),
                None, None, None, None, None, None, None, None)


def fp8_mlp_reference(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w1_fp8: FP8Operands,
                      w2_fp8: FP8Operands | None, post_scale: torch.Tensor | None,
                      down_fp8: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Plain PyTorch ``relu(x W1ᵀ)² W2ᵀ`` with the quantization of
    :func:`speedrun.kernels.relu_square_mlp.relu_square_mlp_fp8` (same arguments and results; any device):
    x (..., C) quantized per tensor (amax/448), the weights' e4m3 operands dequantized, fp32 products,
    post quantized with ``post_scale`` and saturated at 448, the down product rounded to bf16, and (out
    (..., C) bf16, amax () fp32 of post, before its quantization) returned. With ``down_fp8`` False (records
    #84-#88, the up projection alone in FP8) the down product is post (bf16) times the bf16 ``w2_fp8[2]``,
    or w2 cast to bf16 when ``w2_fp8`` is None, ``post_scale`` is unused (may be None) and the amax is
    None. Differentiable in x, w1 and w2: the bf16 backward of the records (from x, post and the weights'
    bf16 copies ``w1_fp8[2]``, ``w2_fp8[2]``), with fp32 products. ``SpeedrunError`` when ``down_fp8``
    lacks ``w2_fp8`` or ``post_scale``.
    """
    if down_fp8 and (w2_fp8 is None or post_scale is None):
        raise SpeedrunError("fp8_mlp_reference: the FP8 down product (down_fp8) needs w2_fp8 and post_scale")
    if not down_fp8:
        w2_fp8 = (None, None, w2.to(torch.bfloat16) if w2_fp8 is None else w2_fp8[2])
    out, amax = _FP8MLPReference.apply(x.reshape(-1, x.size(-1)), w1, w2, *w1_fp8, *w2_fp8, post_scale, down_fp8)
    return out.reshape(*x.shape[:-1], w2.size(0)), amax if down_fp8 else None
