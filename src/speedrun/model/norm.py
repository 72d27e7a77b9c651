"""RMS normalization without a learnable gain (records #5 onward use ``F.rms_norm`` with no weight).

Zhang & Sennrich 2019, "Root Mean Square Layer Normalization".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``x / sqrt(mean(x**2, -1) + eps)`` over the last dimension; same shape and dtype as ``x``, also under
    CUDA autocast, which runs ``rms_norm`` in fp32 (so a bf16 residual stream stays bf16, computed in fp32 and
    rounded once, as the records' ``norm`` of bf16 without autocast).

    ``eps`` defaults to ``F.rms_norm``'s: the machine epsilon of the dtype it computes in (fp32 for bf16 x).
    """
    return F.rms_norm(x, (x.size(-1),), eps=eps).to(x.dtype)
