"""AdamW for the embedding, the LM head and scalar parameters (Loshchilov & Hutter 2019; the speedrun keeps
Adam for these, speedrun-spec.md 3.3). A thin wrapper over ``torch.optim.AdamW`` for now."""

from __future__ import annotations

from typing import Any, Iterable

import torch


def build_adamw(param_groups: Iterable[dict[str, Any]], betas: tuple[float, float], eps: float,
                weight_decay: float, fused: bool) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over ``param_groups`` (each with its own ``lr``), decoupled weight decay
    ``weight_decay``; ``fused`` only on CUDA (``fused=False`` on CPU)."""
    return torch.optim.AdamW(list(param_groups), betas=betas, eps=eps, weight_decay=weight_decay,
                             fused=fused)
