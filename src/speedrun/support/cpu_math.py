"""A workaround for a PyTorch CPU bug that makes a fresh process's first float math silently inexact.

ATen sends contiguous float32/float64 unary math on the CPU (``sqrt``, ``exp``, ``log``, ``tanh``, ...) to MKL's
vector math library, one call per intra-op thread on its chunk of the tensor. MKL picks each function's kernel
on that function's first call; when that first call runs on several threads at once, one thread may run a
low-accuracy kernel over its whole chunk (pytorch/pytorch#188792, open, torch 2.10-2.13). Seen here with torch
2.13.0+cpu on two threads: in about one fresh process in ten, the first ``v.sqrt()`` of a 5,000-element fp32
tensor was wrong by up to 1.7e-4 (relative) on half its elements, so that cautious Adam's first eager update
differed from the same update computed a second time (``tests/test_kernels_adam.py``, session 42). Later calls
are exact again, so the only symptom is a first step that depends on thread timing: runs of one seed that are
not bit-for-bit equal.

:func:`resolve_cpu_math_dispatch` calls each such function once on a tensor small enough to run on the calling
thread alone, so that MKL makes its choice there, before any call that threads share.
"""

from __future__ import annotations

import torch

# ATen's unary functions with an MKL vector-math path (aten/src/ATen/cpu/vml.h), and rsqrt, which CautiousAdam
# and the norms reach through sqrt; a function without one is only a cheap extra call
_UNARY = (torch.sqrt, torch.rsqrt, torch.exp, torch.expm1, torch.log, torch.log1p, torch.log2, torch.log10,
          torch.sin, torch.cos, torch.tan, torch.asin, torch.acos, torch.atan, torch.sinh, torch.cosh, torch.tanh,
          torch.erf, torch.erfc, torch.erfinv, torch.lgamma, torch.trunc)
_resolved = False


def resolve_cpu_math_dispatch() -> None:
    """Call every function of ``_UNARY`` once on 8 float32 and 8 float64 values (0.5: inside every domain) on the
    calling thread (module docstring). Idempotent: a later call does nothing. Costs well under a millisecond."""
    global _resolved
    if _resolved:
        return
    for dtype in (torch.float32, torch.float64):
        x = torch.full((8,), 0.5, dtype=dtype)
        for fn in _UNARY:
            fn(x)
    _resolved = True
