"""Document-causal attention over one packed sequence per rank, behind one interface with a registry.

:func:`attention` takes q, k, v of shape (T, H, D) (B = 1: the documents of a micro-batch back to back,
speedrun-spec.md 1.3) and ``cu_seqlens`` (D+1,) int32, and lets each query attend to the keys of its own
document at or before it, optionally within a sliding ``window`` of tokens (records #12, #13). Backends:

* ``"reference"``: plain softmax(q kᵀ · scale + mask) v with the (T, T) mask built from ``cu_seqlens``.
  Any device and dtype; the ground truth of the tests.
* ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention`` with that boolean mask (memory-efficient
  kernel; costs T² whatever the document lengths).
* ``"sdpa_docs"`` (default): one causal SDPA call per document (flash kernels; a band mask when a window is
  set). Costs sum(L_d²) instead of T²: the fastest backend here on CPU and on an H200 until a varlen
  kernel lands. It reads ``cu_seqlens`` on the host (one sync per layer on a GPU).
* ``"flex"``: ``torch.nn.attention.flex_attention`` with a block mask (128-token blocks) built from
  ``cu_seqlens`` and the window (records #12, #13: FlexAttention with document masking and sliding windows).
  On CUDA it runs ``torch.compile(flex_attention)`` (the fused kernel); on a CPU the eager, unfused
  implementation, forward only (torch has no CPU backward for it): a test and debugging path.

Another backend (varlen flash attention) is a function with the signature of :data:`Backend` registered
under a name of :data:`speedrun.model.config.AttentionBackend`.

Shape legend: T tokens, H heads, D head_dim, L_d tokens of document d.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from speedrun.model.packing import document_causal_mask, document_ids

# SDPA kernels allowed: not cuDNN, which builds an execution plan per new sequence length (seconds per
# step with documents of varying length on an H200, torch 2.11).
_SDPA_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
Backend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, "int | None"],
                   torch.Tensor]
_BACKENDS: dict[str, Backend] = {}


def register_backend(name: str) -> Callable[[Backend], Backend]:
    """Decorator: register ``fn(q, k, v, cu_seqlens, scale, window) -> (T, H, D)`` as backend ``name``."""
    def register(fn: Backend) -> Backend:
        _BACKENDS[name] = fn
        return fn
    return register


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
              window: int | None = None, *, backend: str = "reference") -> torch.Tensor:
    """Document-causal attention. q, k, v: (T, H, D), same dtype; cu_seqlens: (D+1,) int32 from 0 to T;
    scale: multiplies q·k (e.g. D**-0.5); window: None or W >= 1 tokens (query i sees keys i-W+1..i).
    Returns (T, H, D) in the dtype of q. Raises ``ValueError`` for an unknown backend or bad shapes."""
    if backend not in _BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; registered: {', '.join(_BACKENDS)}")
    if q.ndim != 3 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must share one (T, H, D) shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if window is not None and window < 1:
        raise ValueError(f"window must be None or >= 1 token, got {window}")
    return _BACKENDS[backend](q, k, v, cu_seqlens, scale, window)


@register_backend("reference")
def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
               window: int | None) -> torch.Tensor:
    mask = document_causal_mask(cu_seqlens, q.size(0), window)          # (T, T)
    scores = torch.einsum("thd,shd->hts", q, k) * scale                  # (H, T, T)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(dim=-1), v)      # (T, H, D)


@register_backend("sdpa")
def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
          window: int | None) -> torch.Tensor:
    mask = document_causal_mask(cu_seqlens, q.size(0), window)          # (T, T)
    with sdpa_kernel(_SDPA_KERNELS):
        out = F.scaled_dot_product_attention(*_heads_first(q, k, v), attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1)                                        # (T, H, D)


@register_backend("sdpa_docs")
def _sdpa_docs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
               window: int | None) -> torch.Tensor:
    bounds = cu_seqlens.tolist()
    outs = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        qd, kd, vd = _heads_first(q[start:stop], k[start:stop], v[start:stop])  # (1, H, L_d, D)
        with sdpa_kernel(_SDPA_KERNELS):
            if window is None or window >= stop - start:
                out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale)
            else:
                band = document_causal_mask(cu_seqlens.new_tensor([0, stop - start]), stop - start, window)
                out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=band, scale=scale)
        outs.append(out[0].transpose(0, 1))                                      # (L_d, H, D)
    return torch.cat(outs, dim=0)


@register_backend("flex")
def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
          window: int | None) -> torch.Tensor:
    from torch.nn.attention.flex_attention import create_block_mask

    num_tokens = q.size(0)
    docs = document_ids(cu_seqlens, num_tokens)                                  # (T,)

    def document_causal(b, h, q_idx, kv_idx):
        keep = (docs[q_idx] == docs[kv_idx]) & (q_idx >= kv_idx)
        return keep if window is None else keep & (q_idx - kv_idx < window)

    block_mask = create_block_mask(document_causal, None, None, num_tokens, num_tokens, device=q.device)
    out = _flex_attention(q.is_cuda)(*_heads_first(q, k, v), block_mask=block_mask, scale=scale)
    return out[0].transpose(0, 1)                                                # (T, H, D)


@functools.cache
def _flex_attention(cuda: bool) -> Callable[..., torch.Tensor]:
    """``flex_attention``, compiled for CUDA (built on first use: nothing is compiled at import)."""
    from torch.nn.attention.flex_attention import flex_attention

    if cuda:
        return torch.compile(flex_attention, dynamic=False)

    def eager(*args, **kwargs):
        with warnings.catch_warnings():        # the eager path warns that it is unfused: known and intended
            warnings.simplefilter("ignore", UserWarning)
            return flex_attention(*args, **kwargs)
    return eager


def _heads_first(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """(T, H, D) -> (1, H, T, D) views: SDPA's flash and memory-efficient kernels need 4-D inputs (3-D ones
    fall back to the slow math kernel)."""
    return [t.transpose(0, 1).unsqueeze(0) for t in tensors]
