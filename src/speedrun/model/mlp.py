"""The MLP of a block: ``relu(x W1ᵀ)² W2ᵀ`` (ReLU², So et al. 2021 "Primer"; record #5).

Shape legend: T tokens, C model_dim, F hidden = mlp_ratio * C.

Two implementations of the same function and parameters, chosen by ``kernel`` (``GPTConfig.mlp_kernel``):
``"torch"``, the reference (two ``nn.Linear`` products around ``relu(.)²``, autograd keeps ``pre`` and
``post``), and ``"triton"``, the fused kernel of records #59 and #87 (:mod:`speedrun.kernels.relu_square_mlp`:
the forward stores only ``post = relu(pre)²``, the backward rebuilds ``relu(pre) = sqrt(post)``). The
Triton path runs only on CUDA tensors; on a CPU the reference runs whatever the switch says. With
``GPTConfig.fp8_mlp`` the two products run in FP8 in training, backward in bf16 (records #84, #89; with
``fp8_mlp_down`` false only the up projection, as records #84-#88):

* with ``"torch"``, :class:`speedrun.model.fp8.FP8Linear` for each (per-tensor dynamic scales, amax/448);
* with ``"triton"``, the records' fused FP8 MLP (:mod:`speedrun.model.fp8_mlp`): x quantized per call
  (amax/448), W1 from its per-step weight cache, the fused kernel's epilogue writing post = relu(pre)² in
  bf16 (for the backward) and in e4m3 with the layer's delayed scale (``post_scale``: the previous training
  forward's amax(post) · 1.80/448), W2 from a weight cache with a delayed scale (1.12/448 of the previous
  refresh's amax, bootstrapped for 17 refreshes), the down product in ``torch._scaled_mm`` (with
  ``fp8_mlp_down`` false: post in bf16 alone, the down product bf16 from ``proj.weight``). On CUDA the
  Triton kernel (:func:`speedrun.kernels.relu_square_mlp.relu_square_mlp_fp8`), elsewhere the same
  quantization in plain PyTorch (:func:`speedrun.model.fp8_mlp.fp8_mlp_reference`);
* with ``"triton_persistent"`` (``fp8_mlp`` with ``fp8_mlp_down`` false only), the same with the up projection
  and the backward's g_pre in persistent TMA kernels (record #88's ``linear_relu_square_kernel``; the same
  values, ``relu_square_mlp_fp8(..., persistent=True)``).
"""

from __future__ import annotations

import torch
from torch import nn

from speedrun.errors import SpeedrunError
from speedrun.kernels import optional_kernel
from speedrun.model.config import MLP_KERNELS, GPTConfig, MlpKernel, check_mlp_kernel
from speedrun.model.fp8 import FP8Linear, quantize
from speedrun.model.fp8_mlp import DelayedFP8WeightCache, FP8Operands, fp8_mlp_reference, next_post_scale
from speedrun.model.init import init_input_, init_output_

_FUSED_DTYPES = (torch.bfloat16, torch.float16)


class MLP(nn.Module):
    """(..., C) -> (..., C). ``fc`` (F, C) is initialized uniform with std 0.5/sqrt(C); ``proj`` (C, F) at
    zero, so a fresh block adds nothing to the residual stream (record #5).

    ``kernel``: ``"torch"``, ``"triton"`` or ``"triton_persistent"`` (see the module docstring); None reads
    ``config.mlp_kernel``.
    ``fc`` and ``proj`` are :class:`speedrun.model.fp8.FP8Linear` (FP8 in training with ``config.fp8_mlp``).
    Both kernels hold the same parameters ``fc.weight`` and ``proj.weight``, so optimizer groups and
    checkpoints do not depend on the switch. The Triton path computes in the autocast dtype when autocast
    is on, else in x's dtype, which must be bf16 or fp16.

    With ``config.fp8_mlp`` and ``"triton"`` (the records' fused FP8 MLP, see the module docstring), the
    training forward reads ``fc.weight_cache`` (dynamic) and ``proj.weight_cache`` (a
    :class:`speedrun.model.fp8_mlp.DelayedFP8WeightCache`) while they are switched on, else quantizes both
    weights per call (amax/448); it multiplies post with the buffer ``post_scale`` () fp32 (non-persistent,
    1.0 at construction) and then overwrites it with ``amax(post) · 1.80/448`` for the next training
    forward. With ``config.fp8_mlp_down`` false (records #84-#88) proj has no weight cache and the module no
    ``post_scale``: the down product is bf16 from ``proj.weight``, and the kernel writes no e4m3 post. Its
    compute dtype is bf16 (x is cast); C and F must be multiples of 16 on CUDA.

    Raises :class:`SpeedrunError` for an unknown kernel, for ``"triton_persistent"`` without ``fp8_mlp`` or with
    ``fp8_mlp_down``; in forward, on CUDA with ``"triton"``, when the
    ``triton`` package is missing or the compute dtype is not 16-bit.
    """

    def __init__(self, config: GPTConfig, kernel: MlpKernel | None = None):
        super().__init__()
        kernel = config.mlp_kernel if kernel is None else kernel
        if kernel not in MLP_KERNELS:
            raise SpeedrunError(f"model.mlp_kernel must be one of {', '.join(MLP_KERNELS)}; got {kernel!r}")
        self.kernel: MlpKernel = kernel
        self.fc = FP8Linear(config.model_dim, config.mlp_hidden, fp8=config.fp8_mlp)
        self.proj = FP8Linear(config.mlp_hidden, config.model_dim, fp8=config.fp8_mlp and config.fp8_mlp_down)
        init_input_(self.fc.weight)
        init_output_(self.proj.weight)
        fused = kernel != "torch"                                      # "triton" or "triton_persistent"
        self._fused = optional_kernel("relu_square_mlp", "relu_square_mlp") if fused else None
        self.fused_fp8 = config.fp8_mlp and fused
        self.persistent = kernel == "triton_persistent"
        check_mlp_kernel(kernel, config.fp8_mlp, config.fp8_mlp_down)
        self.down_fp8 = config.fp8_mlp_down
        self._fused_fp8 = optional_kernel("relu_square_mlp", "relu_square_mlp_fp8") if self.fused_fp8 else None
        if self.fused_fp8 and self.down_fp8:         # the FP8 down product's delayed scales (record #89)
            self.proj.weight_cache = DelayedFP8WeightCache()
            self.register_buffer("post_scale", torch.ones((), dtype=torch.float32), persistent=False)

    def own_parameter_roles(self) -> dict[str, list[nn.Parameter]]:
        """The roles of its weights (:mod:`speedrun.model.roles`): ``fc.weight`` ``mlp_fc``, ``proj.weight``
        ``mlp_proj``."""
        return {"mlp_fc": [self.fc.weight], "mlp_proj": [self.proj.weight]}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_fp8 and self.training:
            return self._fp8_forward(x)
        if self.kernel != "torch" and x.is_cuda:
            return self._fused_forward(x)
        return self.proj(torch.relu(self.fc(x)).square())

    def _fp8_forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and self._fused_fp8 is None:
            raise SpeedrunError("model.mlp_kernel 'triton' needs the triton package, which is not installed")
        fn = self._fused_fp8 if x.is_cuda else fp8_mlp_reference
        x = x.to(torch.bfloat16) if x.is_cuda else x
        if not self.down_fp8:                        # records #84-#88: the down product in bf16 from proj.weight
            persistent = {"persistent": True} if self.persistent and x.is_cuda else {}
            return fn(x, self.fc.weight, self.proj.weight, _fp8_operands(self.fc), None, None, False, **persistent)[0]
        out, amax = fn(x, self.fc.weight, self.proj.weight, _fp8_operands(self.fc), _fp8_operands(self.proj),
                       self.post_scale, True)
        with torch.no_grad():
            self.post_scale.copy_(next_post_scale(amax))                # the delayed scale of the next forward
        return out

    def _fused_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fused is None:
            raise SpeedrunError("model.mlp_kernel 'triton' needs the triton package, which is not installed")
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        if dtype not in _FUSED_DTYPES:
            raise SpeedrunError(f"model.mlp_kernel 'triton' computes in bfloat16 or float16 (train dtype "
                                f"bfloat16 turns on autocast); got {dtype}")
        return self._fused(x.to(dtype), self.fc.weight.to(dtype), self.proj.weight.to(dtype))


def _fp8_operands(layer: FP8Linear) -> FP8Operands:
    """(w8 (N, K) e4m3, scale () fp32, w (N, K) bf16) of ``layer.weight``: its cache's while switched on,
    else quantized now (amax/448)."""
    cache = layer.weight_cache
    if cache is not None and cache.enabled:
        return cache.operands(layer.weight)
    w8, scale = quantize(layer.weight)
    return w8, scale, layer.weight.to(torch.bfloat16)
