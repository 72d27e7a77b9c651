"""Learnable exclusive self-attention, XSA (record #82, rewritten in #86; arXiv 2603.09078; speedrun-spec.md
2.3): each head's attention output loses a learned fraction of its component along the head's own value.

    y_h <- y_h - tanh(alpha_h) · (y_h · v_h / |v_h|²) · v_h

with v_h the values the attention read at the query's own position (after the value embeddings and MUDD's
value additions). alpha = 0 (the records' initialization) leaves y unchanged; tanh keeps the fraction in
(-1, 1). Record #82 learns one alpha per (layer, head), zero-initialized; HEAD (#85, #86) generates a
per-token alpha with its MUDD gates (:mod:`speedrun.model.mudd`).

Two forms of the same projection, chosen by ``GPTConfig.xsa_form``: ``"normalized"`` (record #82:
v̂ = v / max(|v|, 1e-4), y - tanh(alpha)·(y·v̂)·v̂) and ``"projection"`` (record #86: the dot product divided
by max(|v|², 1e-8)). max(|v|, 1e-4)² = max(|v|², 1e-8), so they are one function; they round differently in
bf16.

Shape legend: T tokens, H n_head, Dh head_dim.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

XsaForm = Literal["normalized", "projection"]
NORM_EPS = 1e-4


def xsa(y: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor, form: XsaForm = "projection") -> torch.Tensor:
    """y (T, H, Dh) attention output, v (T, H, Dh) the values it read, alpha (H,) or (T, H) raw strengths
    (before tanh): returns (T, H, Dh) in y's dtype, y minus tanh(alpha) times its projection on each head's
    own value (CUDA autocast runs the sums in fp32; the result is cast back, as the records' bf16 XSA keeps
    y's dtype). Raises ``ValueError`` for an unknown form or mismatched shapes."""
    if y.shape != v.shape or y.ndim != 3:
        raise ValueError(f"xsa needs y and v of one (T, H, Dh) shape, got {tuple(y.shape)} and {tuple(v.shape)}")
    strength = torch.tanh(alpha).type_as(y).unsqueeze(-1)                     # (H, 1) or (T, H, 1)
    v = v.type_as(y)
    if form == "normalized":
        unit = F.normalize(v, dim=-1, eps=NORM_EPS)
        return (y - strength * (y * unit).sum(-1, keepdim=True) * unit).type_as(y)
    if form == "projection":
        dot = (y * v).sum(-1, keepdim=True)                                   # (T, H, 1)
        denom = v.square().sum(-1, keepdim=True).clamp_min(NORM_EPS ** 2)
        return (y - strength * (dot / denom) * v).type_as(y)
    raise ValueError(f"unknown xsa form {form!r}; expected normalized or projection")
