"""Triton kernels for CUDA GPUs, each next to a pure-PyTorch reference elsewhere in the package.

``relu_square_mlp``: the fused ReLU² MLP (records #59, #87; reference :class:`speedrun.model.mlp.MLP`), and
its FP8 forward (records #84, #89; reference :func:`speedrun.model.fp8_mlp.fp8_mlp_reference`).
``softcapped_cross_entropy``: loss and logit gradient in one pass (records #60, #75, #79; reference
:func:`speedrun.model.loss.softcapped_cross_entropy` off CUDA).
``qk_norm_rotary``: QK-norm and RoPE of q and k in one kernel (reference: ``rms_norm`` then
:func:`speedrun.model.rotary.apply_rotary`; switch ``model.rotary_kernel``).
``dc_attention``: lightweight DC attention's correction, forward and backward (record #85; reference and
interface :func:`speedrun.model.dc.dc_attention`).
``transpose``: a tiled transposed copy of a 2-D tensor, for the FP8 head's weight gradient (reference
``t.t().contiguous()``; dispatch :func:`speedrun.model.fp8.transposed`).
``adam``: cautious Adam's update in one pass (record #50; reference and dispatch
:class:`speedrun.optim.adam.CautiousAdam`).

Importing this package imports nothing (no Triton, no CUDA); import the kernel module you need, which needs
the ``triton`` package, or ask :func:`optional_kernel` for one of its functions.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from speedrun.errors import SpeedrunError


def optional_kernel(module: str, name: str) -> Callable[..., Any] | None:
    """``speedrun.kernels.<module>.<name>``, or None when the ``triton`` package is not installed (a model
    switch then raises when it is used on CUDA). Any other import error propagates."""
    try:
        loaded = importlib.import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as e:
        if e.name != "triton":
            raise
        return None
    return getattr(loaded, name)


def require(condition: bool, message: str | Callable[[], str]) -> None:
    """Raise :class:`SpeedrunError` with ``message`` unless ``condition``: the kernels' input checks. ``message``
    may be a callable that builds it, for the checks that run at every optimizer step (an f-string naming four
    tensors' shapes costs a few microseconds of host time each call, met or not)."""
    if not condition:
        raise SpeedrunError(message() if callable(message) else message)
