"""The MLP of a block: ``relu(x W1ᵀ)² W2ᵀ`` (ReLU², So et al. 2021 "Primer"; record #5).

Shape legend: T tokens, C model_dim, F hidden = mlp_ratio * C.
"""

from __future__ import annotations

import torch
from torch import nn

from speedrun.model.config import GPTConfig
from speedrun.model.init import init_input_, init_output_


class MLP(nn.Module):
    """(T, C) -> (T, C). ``fc`` (F, C) is initialized uniform with std 0.5/sqrt(C); ``proj`` (C, F) at zero,
    so a fresh block adds nothing to the residual stream (record #5)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.model_dim, config.mlp_hidden, bias=False)
        self.proj = nn.Linear(config.mlp_hidden, config.model_dim, bias=False)
        init_input_(self.fc.weight)
        init_output_(self.proj.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.fc(x)).square())
