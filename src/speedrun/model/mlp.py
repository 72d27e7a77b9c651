"""The MLP of a block: ``relu(x W1ᵀ)² W2ᵀ`` (ReLU², So et al. 2021 "Primer"; record #5).

Shape legend: T tokens, C model_dim, F hidden = mlp_ratio * C.

Two implementations of the same function and parameters, chosen by ``kernel`` (``GPTConfig.mlp_kernel``):
``"torch"``, the reference (two ``nn.Linear`` products around ``relu(.)²``, autograd keeps ``pre`` and
``post``), and ``"triton"``, the fused kernel of records #59 and #87 (:mod:`speedrun.kernels.relu_square_mlp`:
the forward stores only ``post = relu(pre)²``, the backward rebuilds ``relu(pre) = sqrt(post)``). The
Triton path runs only on CUDA tensors; on a CPU the reference runs whatever the switch says. With
``GPTConfig.fp8_mlp`` the reference's two products run in FP8 in training (records #84, #89;
:class:`speedrun.model.fp8.FP8Linear`: per-tensor dynamic scales, bf16 backward).
"""

from __future__ import annotations

import torch
from torch import nn

from speedrun.errors import SpeedrunError
from speedrun.kernels import optional_kernel
from speedrun.model.config import MLP_KERNELS, GPTConfig, MlpKernel
from speedrun.model.fp8 import FP8Linear
from speedrun.model.init import init_input_, init_output_

_FUSED_DTYPES = (torch.bfloat16, torch.float16)


class MLP(nn.Module):
    """(..., C) -> (..., C). ``fc`` (F, C) is initialized uniform with std 0.5/sqrt(C); ``proj`` (C, F) at
    zero, so a fresh block adds nothing to the residual stream (record #5).

    ``kernel``: ``"torch"`` or ``"triton"`` (see the module docstring); None reads ``config.mlp_kernel``.
    ``fc`` and ``proj`` are :class:`speedrun.model.fp8.FP8Linear` (FP8 in training with ``config.fp8_mlp``).
    Both kernels hold the same parameters ``fc.weight`` and ``proj.weight``, so optimizer groups and
    checkpoints do not depend on the switch. The Triton path computes in the autocast dtype when autocast
    is on, else in x's dtype, which must be bf16 or fp16.

    Raises :class:`SpeedrunError` for an unknown kernel; in forward, on CUDA with ``"triton"``, when the
    ``triton`` package is missing or the compute dtype is not 16-bit.
    """

    def __init__(self, config: GPTConfig, kernel: MlpKernel | None = None):
        super().__init__()
        kernel = config.mlp_kernel if kernel is None else kernel
        if kernel not in MLP_KERNELS:
            raise SpeedrunError(f"model.mlp_kernel must be one of {', '.join(MLP_KERNELS)}; got {kernel!r}")
        self.kernel: MlpKernel = kernel
        self.fc = FP8Linear(config.model_dim, config.mlp_hidden, fp8=config.fp8_mlp)
        self.proj = FP8Linear(config.mlp_hidden, config.model_dim, fp8=config.fp8_mlp)
        init_input_(self.fc.weight)
        init_output_(self.proj.weight)
        self._fused = optional_kernel("relu_square_mlp", "relu_square_mlp") if kernel == "triton" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "triton" and x.is_cuda:
            return self._fused_forward(x)
        return self.proj(torch.relu(self.fc(x)).square())

    def _fused_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fused is None:
            raise SpeedrunError("model.mlp_kernel 'triton' needs the triton package, which is not installed")
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        if dtype not in _FUSED_DTYPES:
            raise SpeedrunError(f"model.mlp_kernel 'triton' computes in bfloat16 or float16 (train dtype "
                                f"bfloat16 turns on autocast); got {dtype}")
        return self._fused(x.to(dtype), self.fc.weight.to(dtype), self.proj.weight.to(dtype))
