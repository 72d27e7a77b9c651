"""RMS normalization without a learnable gain (records #5 onward use ``F.rms_norm`` with no weight).

Zhang & Sennrich 2019, "Root Mean Square Layer Normalization".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``x / sqrt(mean(x**2, -1) + eps)`` over the last dimension; same shape and dtype as ``x``.

    ``eps`` defaults to the machine epsilon of ``x.dtype`` (the ``F.rms_norm`` default).
    """
    return F.rms_norm(x, (x.size(-1),), eps=eps)
