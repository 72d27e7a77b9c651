"""The sparse attention output gate (record #28, 2025-08-23 SparseAttnGate; speedrun-spec.md 2.3).

Each head's attention output is scaled by a gate computed from the first 12 channels of the attention
input: ``y_h *= sigmoid(W_g · x[:, :12])_h``, W_g (n_head, 12). It lets a head do nothing where the
context gives it nothing to do, instead of parking its attention on the BOS token (an "attention sink"
that a sliding window may not even reach). W_g starts at zero, as in the record (its ``dampen`` layer):
every gate starts at sigmoid(0) = 0.5, the same for all tokens and heads, so at initialization the gate
halves the attention output (which the zero-initialized output projection makes zero anyway) and the
gradient of W_g is what first tells tokens apart. HEAD generates these gates with its MUDD network
instead (record #85, init 0.25), which this model does not have.

Shape legend: T tokens, C model_dim (>= 12), H n_head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.model.config import GATE_CHANNELS


class AttentionGate(nn.Module):
    """``forward(x)`` (T, C) -> (T, H, 1): ``sigmoid(x[:, :12] W_gᵀ)``, to multiply the (T, H, Dh) attention
    output with. ``weight`` (H, 12) starts at zero (gates 0.5); a ``scalar``-kind (Adam) parameter."""

    def __init__(self, n_head: int, channels: int = GATE_CHANNELS):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_head, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels = self.weight.size(1)
        if x.size(-1) < channels:
            raise ValueError(f"the attention gate reads {channels} channels, x has {x.size(-1)}")
        return torch.sigmoid(F.linear(x[:, :channels], self.weight.type_as(x))).unsqueeze(-1)
