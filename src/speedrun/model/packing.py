"""One packed sequence of documents per rank: document ids, positions and the attention mask.

The training and validation batches hold T tokens of several documents back to back (speedrun-spec.md
1.3, B = 1), described by ``cu_seqlens`` (D+1,) int32 = [0, start of document 2, ..., T]. A token attends
only to earlier tokens of its own document (document masking, record #12), and its rotary position
restarts at 0 at each document start.

Shape legend: T tokens, D documents.
"""

from __future__ import annotations

import torch


def document_ids(cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """(T,) int64: the index d of the document [cu_seqlens[d], cu_seqlens[d+1]) each token lies in.

    ``cu_seqlens``: (S,) int32 or int64, starting at 0, strictly increasing up to T = ``num_tokens``, then
    possibly T repeated (empty padding documents, so that a compiled model sees one shape). Computed as the
    running count of document starts (a scatter and a cumsum: unlike ``searchsorted``, this compiles with
    Inductor's Triton backend on torch 2.11); the scatter target has a slot for T, where padding lands.
    """
    starts = torch.zeros(num_tokens + 1, dtype=torch.int64, device=cu_seqlens.device)
    starts[cu_seqlens[1:-1].to(torch.int64)] = 1
    return starts[:num_tokens].cumsum(0)


def document_positions(cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """(T,) int64: each token's position inside its document (0 at every document start)."""
    docs = document_ids(cu_seqlens, num_tokens)
    starts = cu_seqlens.to(torch.int64)[docs]
    return torch.arange(num_tokens, device=cu_seqlens.device) - starts


def document_causal_mask(cu_seqlens: torch.Tensor, num_tokens: int,
                         window: int | None = None) -> torch.Tensor:
    """(T, T) bool: ``mask[i, j]`` is True when query i may attend key j.

    That is: same document, j <= i, and, with a ``window`` (tokens, >= 1), i - j < window (a window of
    W tokens includes the query itself, as ``window_size=(W-1, 0)`` of flash attention).
    """
    docs = document_ids(cu_seqlens, num_tokens)
    pos = torch.arange(num_tokens, device=cu_seqlens.device)
    offset = pos[:, None] - pos[None, :]
    mask = (docs[:, None] == docs[None, :]) & (offset >= 0)
    if window is not None:
        mask &= offset < window
    return mask
