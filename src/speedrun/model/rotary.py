"""Rotary position embeddings (RoPE; Su et al. 2021, "RoFormer"; record #2 of the public speedrun), their
half-truncated variant (record #17) and YaRN rescaling when the attention window grows (record #31).

Positions come from the packed sequence: they restart at 0 at every document start
(:func:`speedrun.model.packing.document_positions`). Two layouts of the rotated pairs:

* ``"full"``: D/2 frequencies ``base ** (-2i / D)``; pair i is (x[i], x[i + D/2]) ("half split", as in
  GPT-NeoX and the early speedrun).
* ``"half_truncated"`` (record #17, speedrun-spec.md 2.3): D/4 frequencies ``(1/1024) ** linspace(0, 1, D/4)``,
  frequency i rotating the adjacent pair (x[2i], x[2i+1]); dims D/2..D-1 stay put (frequency 0). For D = 128:
  32 frequencies on dims 0-63.

YaRN (Peng et al. 2023; record #31, speedrun-spec.md 2.3): when the long window grows from ``old`` to ``new``
tokens, each frequency f becomes ``f · (s + w·(1 - s))`` with ``s = old/new`` and
``w = clamp((old·f/2π - alpha) / (beta - alpha), 0, 1)``, alpha 1, beta 32 (frequencies that turn fewer than
once inside the old window are interpolated, those that turn more than 32 times are kept), and the attention
scale is multiplied by ``1 + 0.2·ln(new/old)``.

Shape legend: T tokens, H heads, D head_dim (even), R rotated pairs (D/2 or D/4).
"""

from __future__ import annotations

import math

import torch

from speedrun.model.config import ROPE_MODES, RopeMode
YARN_ALPHA = 1.0
YARN_BETA = 32.0
YARN_SCALE_SLOPE = 0.2
TRUNCATED_MIN_FREQUENCY = 1.0 / 1024.0


def rotary_frequencies(head_dim: int, base: float, device: torch.device | None = None,
                       mode: RopeMode = "full") -> torch.Tensor:
    """(R,) float32 angular frequencies (radians per token) of ``mode``: R = D/2 frequencies
    ``base ** (-2i / D)`` for ``"full"``; R = D/4 frequencies ``(1/1024) ** (i / (R-1))`` for
    ``"half_truncated"`` (``base`` unused; head_dim must be a multiple of 4). Raises ``ValueError`` otherwise."""
    if mode == "full":
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
        return base ** (-exponents)
    if mode == "half_truncated":
        if head_dim % 4:
            raise ValueError(f"half-truncated RoPE needs head_dim % 4 == 0, got {head_dim}")
        steps = torch.linspace(0.0, 1.0, head_dim // 4, dtype=torch.float64, device=device)
        return (TRUNCATED_MIN_FREQUENCY ** steps).to(torch.float32)
    raise ValueError(f"unknown RoPE mode {mode!r}; expected one of {', '.join(ROPE_MODES)}")


def yarn_frequencies(frequencies: torch.Tensor, old_window: int, new_window: int,
                     alpha: float = YARN_ALPHA, beta: float = YARN_BETA) -> torch.Tensor:
    """The frequencies (R,) after the window grows from ``old_window`` to ``new_window`` tokens (YaRN, record
    #31): ``f · (s + w·(1 - s))``, s = old/new, w = clamp((old·f/2π - alpha)/(beta - alpha), 0, 1). Same
    dtype as ``frequencies`` (computed in float64). Unchanged when new == old."""
    if old_window < 1 or new_window < 1:
        raise ValueError(f"windows must be >= 1 token, got {old_window} -> {new_window}")
    f = frequencies.to(torch.float64)
    s = old_window / new_window
    w = ((old_window * f / (2 * math.pi) - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return (f * (s + w * (1.0 - s))).to(frequencies.dtype)


def yarn_attention_scale(scale: float, old_window: int, new_window: int,
                         slope: float = YARN_SCALE_SLOPE) -> float:
    """``scale · (1 + slope · ln(new/old))``: the attention scale after the window grows from
    ``old_window`` to ``new_window`` tokens (record #31, slope 0.2)."""
    return scale * (1.0 + slope * math.log(new_window / old_window))


def rotary_tables(positions: torch.Tensor, frequencies: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each (T, R) float32, of the angles ``positions[t] * frequencies[i]``.

    ``positions``: (T,) integer positions in the document.
    """
    angles = positions.to(torch.float32)[:, None] * frequencies[None, :]
    return angles.cos(), angles.sin()


def rotary_table(frequencies: torch.Tensor, positions_count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each (P, R), of the angles ``p * frequencies[i]`` for every position p = 0..P-1
    (P = ``positions_count``), on the device of ``frequencies``: float32 for float32 or 16-bit frequencies,
    float64 for float64 ones. Row p equals :func:`rotary_tables` of position p bit for bit (the same float32
    positions and products), so a forward pass gathers its (T, R) tables instead of evaluating cos and sin
    per layer (the records keep such tables as buffers, e.g. record #17's ``Rotary.cos``/``Rotary.sin``).
    Raises ``ValueError`` when ``positions_count`` < 1."""
    if positions_count < 1:
        raise ValueError(f"a rotary table needs at least one position, got {positions_count}")
    positions = torch.arange(positions_count, dtype=torch.float32, device=frequencies.device)     # (P,)
    angles = positions[:, None] * frequencies[None, :]                                               # (P, R)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mode: RopeMode = "full") -> torch.Tensor:
    """Rotate the pairs of ``x`` (T, H, D) by their angles; same shape and dtype.

    ``cos``, ``sin``: (T, R) from :func:`rotary_tables`, or (T, H, R) for an angle per head (the split
    paired-head layout, :mod:`speedrun.model.paired`). ``"full"``: pairs (x[i], x[i + D/2]), R = D/2.
    ``"half_truncated"``: adjacent pairs (x[2i], x[2i+1]) for i < R, dims 2R.. unchanged. The dot product of
    a rotated query at position m and a rotated key at position n depends on m - n only.
    """
    work = x.to(torch.promote_types(x.dtype, cos.dtype))                       # fp32 (fp64 for fp64 x)
    c, s = (cos, sin) if cos.dim() == 3 else (cos[:, None, :], sin[:, None, :])       # (T, H or 1, R)
    if mode == "full":
        x1, x2 = work.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).type_as(x)
    rotated = 2 * cos.size(-1)
    pairs = work[..., :rotated].unflatten(-1, (-1, 2))                          # (T, H, R, 2)
    x1, x2 = pairs[..., 0], pairs[..., 1]
    turned = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    return torch.cat((turned, work[..., rotated:]), dim=-1).type_as(x)
