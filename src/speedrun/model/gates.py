"""The sparse attention output gate (record #28, 2025-08-23 SparseAttnGate; speedrun-spec.md 2.3) and the
value-embedding gate (record #55, "VE gates, skip gates"; tuned in #70; speedrun-spec.md 2.2 item 8).

Each head's attention output is scaled by a gate computed from the first 12 channels of the attention
input: ``y_h *= sigmoid(W_g · x[:, :12])_h``, W_g (n_head, 12). It lets a head do nothing where the
context gives it nothing to do, instead of parking its attention on the BOS token (an "attention sink"
that a sliding window may not even reach). W_g starts at zero, as in the record (its ``dampen`` layer):
every gate starts at sigmoid(0) = 0.5, the same for all tokens and heads, so at initialization the gate
halves the attention output (which the zero-initialized output projection makes zero anyway) and the
gradient of W_g is what first tells tokens apart. HEAD generates these gates with its MUDD network
instead (record #85, linear, init 0.25: ``GPTConfig.mudd_gates``, :class:`speedrun.model.mudd.MuddGates`).

The value-embedding gate scales each head's value embedding before it is added to v:
``v_h += 2·sigmoid(W_g · [x[:, :6], ve[:, :6]])_h · ve_h``, W_g (n_head, 12), a gate in (0, 2) read from the
first 6 channels of the attention input and the first 6 of the value embedding (:class:`ValueEmbedGate`).

Shape legend: T tokens, C model_dim (>= 12 for the attention gate, >= 6 for the value-embedding gate),
H n_head, Dh head_dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.model.config import GATE_CHANNELS, VE_GATE_CHANNELS


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


class ValueEmbedGate(nn.Module):
    """``forward(x, ve)`` -> (T, H, 1): ``2·sigmoid(cat(x[:, :6], ve[:, :6]) W_gᵀ)``, in (0, 2), to multiply the
    (T, H, Dh) value embedding with before it is added to v (record #55, "VE gates"; the current record's
    ``ve_gate_bank`` (5, 6, 12), one (H, 12) slice per layer with a value embedding, speedrun-spec.md 2.2
    item 8 and 2.3). x: (T, C) the attention input (the normed x the QKV product reads); ve: (T, H*Dh) the
    layer's value embedding; the result has x's dtype.

    ``weight`` (H, 12) starts at zero, so every gate starts at 2·sigmoid(0) = 1 and the model at
    initialization equals the one without the gate. speedrun-spec.md gives no init: zero is our choice for
    that reason (the record's train_gpt.py in our reference logs, 2026-05-20, also creates the bank with
    ``torch.zeros``). A ``scalar``-kind (Adam) parameter (speedrun-spec.md 3.3: ve_gate_bank is an Adam
    parameter, betas 0.9/0.99). Raises ``ValueError`` when x or ve has fewer than 6 channels.
    """

    def __init__(self, n_head: int, channels: int = VE_GATE_CHANNELS):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_head, 2 * channels))

    def forward(self, x: torch.Tensor, ve: torch.Tensor) -> torch.Tensor:
        half = self.weight.size(1) // 2
        if x.size(-1) < half or ve.size(-1) < half:
            raise ValueError(f"the value-embedding gate reads {half} channels of x and of ve, x has {x.size(-1)} "
                             f"and ve {ve.size(-1)}")
        inputs = torch.cat((x[:, :half], ve[:, :half].type_as(x)), dim=-1)                # (T, 12)
        return 2 * torch.sigmoid(F.linear(inputs, self.weight.type_as(x))).unsqueeze(-1)  # (T, H, 1)
