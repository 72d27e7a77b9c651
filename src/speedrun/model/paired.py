"""Paired-head attention (record #58; speedrun-spec.md 2.3): two heads share one attention over a doubled
sequence, so that each sees the other's keys and values.

Heads 2p and 2p+1 form pair p. The packed sequence of T tokens becomes one of 2T positions: token t puts
its head-2p row at position 2t and its head-(2p+1) row at 2t+1 (:func:`pair_heads`), and each of the H/2
pairs attends causally within the doubled documents (:meth:`PackedDocuments.doubled`: every document twice
as long). RoPE rotates with the doubled positions: 2·pos(t) for the first head of a pair, 2·pos(t)+1 for
the second (:func:`paired_positions`), pos(t) the token's position in its document. The sliding window keeps
its value in positions, so it spans half as many tokens. The output goes back to (T, H, Dh)
(:func:`unpair_heads`).

Which heads pair up: the record views q and k as (T, H/2, 2·Dh) for its rotary (heads 2p, 2p+1 together,
positions 2t and 2t+1), then reshapes the flat (T, H·Dh) rows to (2T, H/2, Dh), which places head h at
position 2t + h // (H/2) in slot h mod (H/2): its attention pairs heads p and p + H/2, and for H = 6 its
middle slot rotates heads 1 and 4 with phases that disagree with their positions (2t+1 at 2t, 2t at 2t+1).
Here one pairing serves both, heads (2p, 2p+1) with phase = position, which is the record's described
design (and the Q/K head-pair blocks of its Muon groups, record #80). Heads are interchangeable at
initialization, so the two differ only in that middle slot's rotary phases.

Shape legend: T tokens, H n_head (even), Dh head_dim, R rotated pairs of RoPE.
"""

from __future__ import annotations

import torch

from speedrun.model.attention import PackedDocuments, attention
from speedrun.model.config import RopeMode
from speedrun.model.rotary import apply_rotary


def pair_heads(x: torch.Tensor) -> torch.Tensor:
    """(T, H, Dh) -> (2T, H/2, Dh): ``out[2t + e, p] = x[t, 2p + e]`` for e in {0, 1}."""
    tokens, heads, dim = x.shape
    if heads % 2:
        raise ValueError(f"paired-head attention needs an even number of heads, got {heads}")
    return x.unflatten(1, (heads // 2, 2)).transpose(1, 2).reshape(2 * tokens, heads // 2, dim)


def unpair_heads(y: torch.Tensor) -> torch.Tensor:
    """(2T, H/2, Dh) -> (T, H, Dh), the inverse of :func:`pair_heads`."""
    doubled, pairs, dim = y.shape
    return y.unflatten(0, (doubled // 2, 2)).transpose(1, 2).reshape(doubled // 2, 2 * pairs, dim)


def paired_positions(positions: torch.Tensor) -> torch.Tensor:
    """(2T,) int64 rotary positions of the doubled sequence from the (T,) document positions: 2·pos(t) at
    2t, 2·pos(t)+1 at 2t+1 (the positions of the doubled documents)."""
    offsets = torch.arange(2, dtype=torch.int64, device=positions.device)
    return (2 * positions.to(torch.int64)[:, None] + offsets).reshape(-1)


def paired_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: PackedDocuments,
                     cos: torch.Tensor, sin: torch.Tensor, scale: float | torch.Tensor,
                     window: int | torch.Tensor | None = None, *,
                     rope: RopeMode = "full", backend: str = "reference") -> torch.Tensor:
    """Paired-head document-causal attention. q, k: (T, H, Dh) QK-normed, not yet rotated; v: (T, H, Dh);
    docs: the T-token documents; cos, sin: (2T, R) rotary tables of :func:`paired_positions`; scale of q·k;
    window in positions of the doubled sequence (tokens/2 of the original) or None (scale and window: as
    :func:`speedrun.model.attention.attention` takes them); rope: the layout of
    :func:`speedrun.model.rotary.apply_rotary`; backend: of :func:`speedrun.model.attention.attention`.
    Returns (T, H, Dh) in v's dtype. Raises ``ValueError`` for an odd H."""
    q2 = apply_rotary(pair_heads(q), cos, sin, rope).type_as(v)                      # (2T, H/2, Dh)
    k2 = apply_rotary(pair_heads(k), cos, sin, rope).type_as(v)
    y = attention(q2, k2, pair_heads(v), docs.doubled(), scale, window, backend=backend)
    return unpair_heads(y)                                                           # (T, H, Dh)
