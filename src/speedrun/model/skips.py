"""Long skip connections between layers: the U-net of record #11 and the single gated skip of records
#45, #55 (speedrun-spec.md 2.2 step 8, 2.6).

Both act between blocks: :meth:`forward` ``(layer, x, outputs)`` returns the input of block ``layer`` given
the residual stream ``x`` (T, C) and ``outputs``, the saved outputs of earlier blocks (the ones for which
:meth:`keeps` is true). Their scalars are ``scalar``-kind (Adam) parameters.

Shape legend: T tokens, C model_dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

GATED_SKIP_INIT = -1.5
SKIP_GATE_CHANNELS = 12


class UNetSkips(nn.Module):
    """Record #11 (U-net): the first n = n_layer // 2 blocks save their outputs, and block n_layer-1-j of the
    second half adds ``weights[n-1-j] · output_j`` to its input (block n_layer-n gets the last saved output,
    the last block the first). ``weights`` (n,) learned from 1, as the record's ``skip_weights``. With an
    odd n_layer the middle block takes no skip."""

    def __init__(self, n_layer: int):
        super().__init__()
        if n_layer < 2:
            raise ValueError(f"U-net skips need n_layer >= 2, got {n_layer}")
        self.n_layer, self.pairs = n_layer, n_layer // 2
        self.weights = nn.Parameter(torch.ones(self.pairs))

    def keeps(self, layer: int) -> bool:
        """Whether block ``layer``'s output is saved for a later block."""
        return layer < self.pairs

    def forward(self, layer: int, x: torch.Tensor, outputs: dict[int, torch.Tensor]) -> torch.Tensor:
        first = self.n_layer - self.pairs
        if layer < first:
            return x
        return x + self.weights[layer - first].type_as(x) * outputs[self.n_layer - 1 - layer]


class GatedSkip(nn.Module):
    """Records #45, #55 (HEAD: 3 -> 6): ``x += sigmoid(lambda_) · output_{skip_from}`` at the input of block
    ``skip_to``; ``lambda_`` (1,) learned from -1.5 (sigmoid 0.18). With ``gate`` (record #55's skip gate,
    records #55-#88), the weight is ``sigmoid(lambda_) · 2·sigmoid(x0[:, :12] Wᵀ)`` per token, W the
    parameter ``gate`` (1, 12) from zero (factor 1 at initialization); HEAD (record #85) multiplies in a
    MUDD-generated gate instead (:meth:`weight`)."""

    def __init__(self, skip_from: int, skip_to: int, gate: bool = False):
        super().__init__()
        if not 0 <= skip_from < skip_to:
            raise ValueError(f"a skip runs forward: need 0 <= skip_from < skip_to, got {skip_from} -> {skip_to}")
        self.skip_from, self.skip_to = skip_from, skip_to
        self.lambda_ = nn.Parameter(torch.tensor([GATED_SKIP_INIT]))
        self.gate = nn.Parameter(torch.zeros(1, SKIP_GATE_CHANNELS)) if gate else None

    def weight(self, x0: torch.Tensor | None = None, mudd_gate: torch.Tensor | None = None) -> torch.Tensor:
        """The skip's weight: (1,) ``sigmoid(lambda_)``; times ``2·sigmoid(x0[:, :12] Wᵀ)`` (T, 1) with the
        ``gate`` parameter (x0 (T, C) then needed: ``ValueError`` without it), or times ``mudd_gate`` (T, 1)
        when given (HEAD's linear MUDD gate)."""
        weight = torch.sigmoid(self.lambda_)
        if mudd_gate is not None:
            return weight.type_as(mudd_gate) * mudd_gate
        if self.gate is None:
            return weight
        if x0 is None:
            raise ValueError("the skip gate reads x0: pass it to GatedSkip.weight")
        gate = 2 * torch.sigmoid(F.linear(x0[:, :SKIP_GATE_CHANNELS], self.gate.type_as(x0)))   # (T, 1)
        return weight.type_as(gate) * gate

    def keeps(self, layer: int) -> bool:
        """Whether block ``layer``'s output is saved for a later block."""
        return layer == self.skip_from

    def forward(self, layer: int, x: torch.Tensor, outputs: dict[int, torch.Tensor]) -> torch.Tensor:
        if layer != self.skip_to:
            return x
        return x + torch.sigmoid(self.lambda_).type_as(x) * outputs[self.skip_from]
