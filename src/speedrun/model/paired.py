"""Paired-head attention (record #58; speedrun-spec.md 2.3): two heads share one attention over a doubled
sequence, so that each sees the other's keys and values.

Heads 2p and 2p+1 form pair p. The packed sequence of T tokens becomes one of 2T positions: token t puts
its head-2p row at position 2t and its head-(2p+1) row at 2t+1 (:func:`pair_heads`), and each of the H/2
pairs attends causally within the doubled documents (:meth:`PackedDocuments.doubled`: every document twice
as long). RoPE rotates with the doubled positions: 2·pos(t) for the first head of a pair, 2·pos(t)+1 for
the second (:func:`paired_positions`), pos(t) the token's position in its document. The sliding window keeps
its value in positions, so it spans half as many tokens. The output goes back to (T, H, Dh)
(:func:`unpair_heads`).

Which heads pair up (``layout``): ``"adjacent"`` pairs heads 2p and 2p+1 in slot p, head 2p+e at position
2t+e. ``"split"`` is records #58-#89's own layout: they view q and k as (T, H/2, 2·Dh) for their rotary (heads
2p, 2p+1 together, phases 2·pos and 2·pos+1), then reshape the flat (T, H·Dh) rows to (2T, H/2, Dh), which
places head h at position 2t + h // (H/2) in slot h mod (H/2): slot p pairs heads p and p + H/2 (record
#88 L1101-1112). In both layouts head h is rotated by the phase 2·pos(t) + (h mod 2), so for H = 6 the split
layout's middle slot (heads 1 and 4) rotates each head by the phase of the other's position, as the record's
does. The two layouts differ only in which heads share a slot (heads are interchangeable at initialization,
but the Q/K head-pair blocks of the records' Muon, record #80, group heads 2p and 2p+1) and in that slot's
phases.

Shape legend: T tokens, H n_head (even), Dh head_dim, R rotated pairs of RoPE.
"""

from __future__ import annotations

import torch

from speedrun.model.attention import PackedDocuments, attention
from speedrun.model.config import PairedLayout, RopeMode
from speedrun.model.rotary import apply_rotary


def _is_split(layout: PairedLayout) -> bool:
    """True for ``"split"``, False for ``"adjacent"``; ``ValueError`` for another layout."""
    if layout not in ("adjacent", "split"):
        raise ValueError(f"paired-head layout must be 'adjacent' or 'split', got {layout!r}")
    return layout == "split"


def pair_heads(x: torch.Tensor, layout: PairedLayout = "adjacent") -> torch.Tensor:
    """(T, H, Dh) -> (2T, H/2, Dh). ``"adjacent"``: ``out[2t + e, p] = x[t, 2p + e]`` for e in {0, 1};
    ``"split"`` (the records' flat reshape): ``out[2t + e, p] = x[t, e·H/2 + p]``. Raises ``ValueError`` for an
    odd H or another layout."""
    tokens, heads, dim = x.shape
    if heads % 2:
        raise ValueError(f"paired-head attention needs an even number of heads, got {heads}")
    if _is_split(layout):
        return x.reshape(2 * tokens, heads // 2, dim)
    return x.unflatten(1, (heads // 2, 2)).transpose(1, 2).reshape(2 * tokens, heads // 2, dim)


def unpair_heads(y: torch.Tensor, layout: PairedLayout = "adjacent") -> torch.Tensor:
    """(2T, H/2, Dh) -> (T, H, Dh), the inverse of :func:`pair_heads` of the same layout."""
    doubled, pairs, dim = y.shape
    if _is_split(layout):
        return y.reshape(doubled // 2, 2 * pairs, dim)
    return y.unflatten(0, (doubled // 2, 2)).transpose(1, 2).reshape(doubled // 2, 2 * pairs, dim)


def paired_positions(positions: torch.Tensor) -> torch.Tensor:
    """(2T,) int64 rotary positions of the doubled sequence from the (T,) document positions: 2·pos(t) at
    2t, 2·pos(t)+1 at 2t+1 (the positions of the doubled documents)."""
    offsets = torch.arange(2, dtype=torch.int64, device=positions.device)
    return (2 * positions.to(torch.int64)[:, None] + offsets).reshape(-1)


def paired_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: PackedDocuments,
                     cos: torch.Tensor, sin: torch.Tensor, scale: float | torch.Tensor,
                     window: int | torch.Tensor | None = None, *,
                     rope: RopeMode = "full", backend: str = "reference",
                     layout: PairedLayout = "adjacent") -> torch.Tensor:
    """Paired-head document-causal attention. q, k: (T, H, Dh) QK-normed, not yet rotated; v: (T, H, Dh);
    docs: the T-token documents; cos, sin: (2T, R) rotary tables of :func:`paired_positions`; scale of q·k;
    window in positions of the doubled sequence (tokens/2 of the original) or None (scale and window: as
    :func:`speedrun.model.attention.attention` takes them); rope: the layout of
    :func:`speedrun.model.rotary.apply_rotary`; backend: of :func:`speedrun.model.attention.attention`;
    layout: which heads share a slot (module docstring). Returns (T, H, Dh) in v's dtype. Raises
    ``ValueError`` for an odd H or an unknown layout."""
    v2 = pair_heads(v, layout)                                        # (2T, H/2, Dh); checks H and layout
    q2, k2 = (_rotated_pairs(x, cos, sin, rope, layout).type_as(v) for x in (q, k))
    y = attention(q2, k2, v2, docs.doubled(), scale, window, backend=backend)
    return unpair_heads(y, layout)                                                   # (T, H, Dh)


def _rotated_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: RopeMode,
                   layout: PairedLayout) -> torch.Tensor:
    """x (T, H, Dh) rotated, head h by the phase 2·pos + (h mod 2), in ``layout``'s (2T, H/2, Dh); H even (the
    caller has checked it with :func:`pair_heads`)."""
    if layout == "adjacent":                                          # head 2p+e at position 2t+e, phase 2·pos+e
        return apply_rotary(pair_heads(x), cos, sin, rope)
    tokens, heads, _ = x.shape
    # the doubled rows 2t, 2t+1 as (T, 2, R), repeated over the pairs: head h takes row 2t + h mod 2
    c, s = (table.view(tokens, 2, -1).repeat(1, heads // 2, 1) for table in (cos, sin))   # (T, H, R)
    return pair_heads(apply_rotary(x, c, s, rope), layout)            # the flat reshape: a view
