"""FlashAttention 3 and 4 varlen kernels behind the (T, H, D) + ``cu_seqlens`` + window interface of
:mod:`speedrun.model.attention`: finding the installed library, and translating our arguments to its call.

* ``"fa3"``: FlashAttention-3 (Shah et al. 2024, "FlashAttention-3: Fast and Accurate Attention with
  Asynchrony and Low-precision"; the kernel of the records since #29, speedrun-spec.md 2.3), the
  ``flash_attn_varlen_func`` of the ``flash_attn_interface`` module (flash-attention's ``hopper/`` build) or,
  when that is not installed, of the HF ``kernels`` package's ``kernels-community/flash-attn3`` (version 1),
  as the records fetch it on an H100.
* ``"fa4"``: FlashAttention-4 (PyPI ``flash-attn-4``, written in CUTLASS's CuTe DSL; module
  ``flash_attn.cute``), its ``flash_attn_varlen_func``. Its fourth positional parameter is ``qv``, so every
  argument after q, k, v goes by keyword.

Both take the packed sequence as (T, H, D) with ``cu_seqlens`` int32 and host-integer ``max_seqlen``, and
count a sliding window as the keys *left of* the query: our window of W tokens (query i sees keys
i-W+1..i) is ``window_size = (W - 1, 0)`` with ``causal=True``; no window is each library's "unbounded"
(FA3 ``(-1, -1)``, FA4 ``(None, None)``). FA3 returns the output, or ``(out, softmax_lse)`` in older
builds; FA4 returns ``(out, lse)``; :func:`varlen_attention` returns the output alone.

Shape legend: T tokens, H heads, D head_dim, S cu_seqlens slots.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

FA3_HUB_REPO = "kernels-community/flash-attn3"
FA3_HUB_VERSION = 1
LIBRARIES = ("fa3", "fa4")
_UNBOUNDED = {"fa3": (-1, -1), "fa4": (None, None)}


class FlashUnavailable(ImportError):
    """The FlashAttention library of a backend is not installed (or cannot be loaded); the message says why."""


def load(library: str) -> Callable[..., Any]:
    """The ``flash_attn_varlen_func`` of ``library`` (``"fa3"`` or ``"fa4"``), imported once (cached).
    Raises :class:`FlashUnavailable` naming what is missing, ``ValueError`` for another name."""
    function, reason = _load(library)
    if function is None:
        raise FlashUnavailable(reason)
    return function


def unavailable_reason(library: str) -> str | None:
    """None when :func:`load` gives ``library``'s function, else why not (the import error, one line)."""
    return _load(library)[1]


def clear_cache() -> None:
    """Forget what :func:`load` found (tests inject a fake module, then load again)."""
    _LOADED.clear()


# library -> (function, None) or (None, reason). A plain dict, not functools.cache: torch.compile traces a
# dict lookup as a guarded constant, but traces *through* an lru_cache wrapper into the imports (a graph
# break). speedrun.model.block loads the library when a block is built, before anything is compiled.
_LOADED: dict[str, tuple[Callable[..., Any] | None, str | None]] = {}


def _load(library: str) -> tuple[Callable[..., Any] | None, str | None]:
    if library not in _LOADED:
        _LOADED[library] = _find(library)
    return _LOADED[library]


def _find(library: str) -> tuple[Callable[..., Any] | None, str | None]:
    if library == "fa3":
        return _load_fa3()
    if library == "fa4":
        return _import_function("flash_attn.cute", "flash-attn-4 (PyPI) / flash_attn.cute")
    raise ValueError(f"unknown FlashAttention library {library!r}; expected one of {', '.join(LIBRARIES)}")


def _load_fa3() -> tuple[Callable[..., Any] | None, str | None]:
    """``flash_attn_interface`` first (a local build), else the ``kernels`` hub kernel (which may download)."""
    function, local_reason = _import_function("flash_attn_interface", "flash_attn_interface")
    if function is not None:
        return function, None
    try:
        kernels = importlib.import_module("kernels")
    except ImportError as e:
        return None, f"{local_reason}; and the `kernels` package is not installed ({_one_line(e)})"
    try:
        hub = kernels.get_kernel(FA3_HUB_REPO, version=FA3_HUB_VERSION)
        return hub.flash_attn_interface.flash_attn_varlen_func, None
    except Exception as e:          # no network and no cache, or no build for this machine: a reason, not a crash
        return None, (f"{local_reason}; and kernels.get_kernel({FA3_HUB_REPO!r}, version={FA3_HUB_VERSION}) "
                      f"failed: {type(e).__name__}: {_one_line(e)}")


def _import_function(module: str, what: str) -> tuple[Callable[..., Any] | None, str | None]:
    try:
        return importlib.import_module(module).flash_attn_varlen_func, None
    except Exception as e:          # ImportError, or a CUDA library that fails to load (OSError, RuntimeError)
        return None, f"{what} is not importable: {type(e).__name__}: {_one_line(e)}"


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def window_size(library: str, window: int | None) -> tuple[int | None, int | None]:
    """``library``'s ``window_size`` (left, right) for our ``window`` of W tokens: (W - 1, 0); None (the
    whole document): the library's unbounded value, FA3 (-1, -1), FA4 (None, None)."""
    return _UNBOUNDED[library] if window is None else (window - 1, 0)


def varlen_attention(library: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int, scale: float, window: int | None) -> torch.Tensor:
    """Document-causal attention through ``library``'s ``flash_attn_varlen_func`` (:func:`load`).

    q, k, v: (T, H, D) bf16/fp16 on CUDA (the library's requirement, not checked here); cu_seqlens: (S,)
    integer, passed as int32 for both queries and keys; max_seqlen: the longest document in tokens (host
    int, for both); scale: the softmax scale (a Python number); window: None or W >= 1 tokens. Returns
    (T, H, D). Raises :class:`FlashUnavailable` when the library is missing, ``ValueError`` for a tensor
    scale or window (these kernels take host numbers: the model passes them so for every backend but
    ``flex``), ``RuntimeError`` when the library returns another shape."""
    if isinstance(scale, torch.Tensor) or isinstance(window, torch.Tensor):
        raise ValueError(f"attention backend {library!r} takes the scale and window as Python numbers, got "
                         f"{type(scale).__name__} and {type(window).__name__}")
    function = load(library)
    cu = cu_seqlens.to(torch.int32)
    result = function(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=int(max_seqlen),
                      max_seqlen_k=int(max_seqlen), softmax_scale=float(scale), causal=True,
                      window_size=window_size(library, window))
    out = result[0] if isinstance(result, (tuple, list)) else result       # (out, lse) or out
    if tuple(out.shape) != tuple(q.shape):
        raise RuntimeError(f"{library} flash_attn_varlen_func returned shape {tuple(out.shape)}, expected "
                           f"{tuple(q.shape)}")
    return out
