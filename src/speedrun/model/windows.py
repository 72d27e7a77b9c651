"""Sliding attention windows measured in blocks of 128 tokens, long or short per layer (records #13, #20,
#31; speedrun-spec.md 2.3).

A layer's window is declared as data: one character per layer in a pattern string, ``"S"`` (the short
window), ``"L"`` (the long window) or ``"F"`` (no window: the whole document so far). The window sizes
themselves are counted in blocks of ``block_size`` tokens (128 in the speedrun) and grow over training
(:func:`speedrun.optim.schedules.window_blocks`). A window of b blocks lets a query attend to the
``b * block_size`` most recent tokens of its own document, itself included (flash attention's
``window_size = (b*block_size - 1, 0)``; the speedrun's FA3 call also sees one older key).
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")
WINDOW_KINDS = ("S", "L", "F")


def check_window_pattern(pattern: str, n_layer: int) -> None:
    """Raise ``ValueError`` unless ``pattern`` is empty (no layer windowed) or holds exactly ``n_layer``
    characters, each one of ``S``, ``L``, ``F``."""
    if pattern == "":
        return
    if len(pattern) != n_layer:
        raise ValueError(f"window_pattern {pattern!r} has {len(pattern)} characters for {n_layer} layers")
    bad = sorted(set(pattern) - set(WINDOW_KINDS))
    if bad:
        raise ValueError(f"window_pattern {pattern!r} holds {bad[0]!r}; expected only S (short), L (long), "
                         "F (full document)")


def window_tokens(blocks: int, block_size: int) -> int:
    """Tokens of a window of ``blocks`` blocks: blocks * block_size (both >= 1; ``ValueError`` otherwise)."""
    if blocks < 1 or block_size < 1:
        raise ValueError(f"windows need blocks >= 1 and block_size >= 1, got {blocks}, {block_size}")
    return blocks * block_size


def layer_windows(pattern: str, n_layer: int, short_blocks: int, long_blocks: int,
                  block_size: int) -> list[int | None]:
    """Per layer, the window in tokens (None: the whole document) for the current ``short_blocks`` and
    ``long_blocks``. An empty ``pattern`` gives None for every layer."""
    return per_layer(pattern, n_layer, window_tokens(short_blocks, block_size),
                     window_tokens(long_blocks, block_size))


def per_layer(pattern: str, n_layer: int, short: T, long: T) -> list[T | None]:
    """Per layer, ``short`` for an ``S``, ``long`` for an ``L`` and None for an ``F`` of ``pattern`` (None for
    every layer when it is empty): the same object for every layer of a kind, whatever it is (tokens as ints,
    or 0-d tensors that a compiled graph reads). Raises ``ValueError`` as :func:`check_window_pattern`."""
    check_window_pattern(pattern, n_layer)
    by_kind = {"S": short, "L": long, "F": None}
    return [by_kind[kind] for kind in pattern] if pattern else [None] * n_layer
