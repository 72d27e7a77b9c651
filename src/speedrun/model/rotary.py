"""Rotary position embeddings (RoPE; Su et al. 2021, "RoFormer"; record #2 of the public speedrun).

Positions come from the packed sequence: they restart at 0 at every document start
(:func:`speedrun.model.packing.document_positions`). Dimension pairs are (i, i + D/2) ("half split", as in
GPT-NeoX and the speedrun). The frequencies are a function of their own so that half-truncation and YaRN
(records #17, #31) only replace :func:`rotary_frequencies`.

Shape legend: T tokens, H heads, D head_dim (even).
"""

from __future__ import annotations

import torch


def rotary_frequencies(head_dim: int, base: float, device: torch.device | None = None) -> torch.Tensor:
    """(D/2,) float32 angular frequencies ``base ** (-2i / D)`` for i = 0..D/2-1 (radians per token)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    return base ** (-exponents)


def rotary_tables(positions: torch.Tensor, frequencies: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each (T, D/2) float32, of the angles ``positions[t] * frequencies[i]``.

    ``positions``: (T,) integer positions in the document.
    """
    angles = positions.to(torch.float32)[:, None] * frequencies[None, :]
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[..., i], x[..., i + D/2]) of ``x`` (T, H, D) by its angle; same shape and dtype.

    ``cos``, ``sin``: (T, D/2) from :func:`rotary_tables`. The dot product of a rotated query at position
    m and a rotated key at position n depends on m - n only.
    """
    x1, x2 = x.to(torch.promote_types(x.dtype, cos.dtype)).chunk(2, dim=-1)   # fp32 (fp64 for fp64 x)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).type_as(x)
