"""Helpers of the tests that count a preset's parameters by hand: the record presets' widths, and the presets
built on the meta device (their full shapes, nothing allocated)."""

from __future__ import annotations

import torch
from torch import nn

from speedrun.model.config import PRESETS
from speedrun.model.gpt import GPT

C, V, HIDDEN = 768, 50304, 3072           # model_dim, vocab_size and MLP width of the 124M-parameter records
ATTENTION_PARAMS, MLP_PARAMS = 4 * C * C, 2 * C * HIDDEN  # one attention's q, k, v, o; one MLP's fc and proj


def meta_presets(*names: str) -> list[GPT]:
    """The presets ``names`` (keys of :data:`speedrun.model.config.PRESETS`) built on the meta device."""
    with torch.device("meta"):
        return [GPT(PRESETS[name]) for name in names]


def parameter_count(model: nn.Module) -> int:
    """The number of scalars in ``model``'s parameters (a tied weight once)."""
    return sum(p.numel() for p in model.parameters())
