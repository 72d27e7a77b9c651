"""Document-causal attention over one packed sequence per rank, behind one interface with a registry.

:func:`attention` takes q, k, v of shape (T, H, D) (B = 1: the documents of a micro-batch back to back,
speedrun-spec.md 1.3) and the documents (:class:`PackedDocuments`, or a bare ``cu_seqlens`` (S,) int32),
and lets each query attend to the keys of its own document at or before it, optionally within a sliding
``window`` of tokens (records #12, #13). ``cu_seqlens`` may end in repeats of T (empty documents): the
loader pads it to a fixed length so that a compiled model sees one shape (record #29's ``max_num_docs``).
Backends:

* ``"reference"``: plain softmax(q kᵀ · scale + mask) v with the (T, T) mask built from ``cu_seqlens``.
  Any device and dtype; the ground truth of the tests.
* ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention`` with that boolean mask (memory-efficient
  kernel; costs T² whatever the document lengths).
* ``"sdpa_docs"``: one causal SDPA call per document (flash kernels; a band mask when a window is set).
  Costs sum(L_d²) instead of T²: the fastest backend on a CPU. It reads ``cu_seqlens`` on the host (one
  sync per layer on a GPU) and so cannot be compiled as one graph.
* ``"flex"``: ``torch.nn.attention.flex_attention`` with a block mask (128-token blocks) built from
  ``cu_seqlens`` and the window (records #12, #13: FlexAttention with document masking and sliding windows).
  The block mask of each (window, length) is built once per forward pass and shared by the layers that use
  it (:class:`PackedDocuments` caches it; a tensor window by identity, so equal short and long windows
  build two). On CUDA the fused kernel (compiled); on a CPU the eager, unfused
  implementation, forward only (torch has no CPU backward for it): a test and debugging path. It also takes
  the window as a 0-d integer tensor and the scale as a 0-d float tensor (applied as a ``score_mod``): then
  they are inputs of a compiled graph, not constants, and a growing window or a YaRN rescale of the scale
  compiles nothing new (:class:`speedrun.model.gpt.GPT` passes them so).
* ``"varlen"``: ``torch.nn.attention.varlen.varlen_attn`` (PyTorch's flash-attention varlen kernel, the
  kernel family of record #29) with ``window_size = (W-1, 0)``; CUDA and bf16/fp16 only. It takes the
  longest document as a host integer: :class:`PackedDocuments` ``max_seqlen`` (the loader's ``max_seq_len``)
  avoids reading it back from the GPU.
* ``"fa3"``, ``"fa4"``: FlashAttention 3 (``flash_attn_interface``, or the ``kernels`` hub's
  ``kernels-community/flash-attn3``: the records' kernel since #29) and FlashAttention 4 (PyPI
  ``flash-attn-4``, CuTe DSL), their ``flash_attn_varlen_func`` with ``causal=True`` and
  ``window_size = (W-1, 0)`` (:mod:`speedrun.model.flash`); CUDA and bf16/fp16 only, host-number scale and
  window, the longest document as ``varlen`` takes it. FA4 is not traceable by ``torch.compile`` (CuTe-DSL
  Python), so its call runs eagerly, one graph break per layer; FA3's are torch custom ops and compile.

``"auto"`` (:func:`resolve_backend`) is the fastest of these installed on the device: on CUDA fa3, fa4,
varlen, flex, in that order; on a CPU sdpa_docs.

Another backend is a function with the signature of :data:`Backend` registered under a name of
:data:`speedrun.model.config.AttentionBackend`.

Shape legend: T tokens, H heads, D head_dim, S cu_seqlens slots, L_d tokens of document d.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from speedrun.model import flash
from speedrun.model.packing import document_causal_mask, document_ids

# SDPA kernels allowed: not cuDNN, which builds an execution plan per new sequence length (seconds per
# step with documents of varying length on an H200, torch 2.11).
_SDPA_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class PackedDocuments:
    """The documents of one packed sequence, and what the attention backends build from them once per
    forward pass.

    Fields: ``cu_seqlens`` (S,) int32: 0, the document starts, then T (possibly repeated: empty padding
    documents); ``num_tokens`` T; ``max_seqlen``: an upper bound on a document's length in tokens, or None
    (then read from ``cu_seqlens`` when a backend needs it). ``cache``: per-forward memo of block masks and
    document ids (create one :class:`PackedDocuments` per forward pass; never reuse it across batches).
    """

    cu_seqlens: torch.Tensor
    num_tokens: int
    max_seqlen: int | None = None
    cache: dict[Any, Any] = field(default_factory=dict)

    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """``build()`` the first time ``key`` is asked for in this forward pass, the same object after."""
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]

    def doubled(self) -> "PackedDocuments":
        """The same documents with every token counted twice (2T tokens, lengths doubled): the sequence of
        paired-head attention (record #58), where token t becomes positions 2t and 2t+1. Cached."""
        return self.cached("doubled", lambda: PackedDocuments(
            self.cu_seqlens * 2, 2 * self.num_tokens,
            None if self.max_seqlen is None else 2 * self.max_seqlen))

    def document_ids(self) -> torch.Tensor:
        """(T,) int64 document index of each token (:func:`speedrun.model.packing.document_ids`), cached."""
        return self.cached("document_ids", lambda: document_ids(self.cu_seqlens, self.num_tokens))

    def longest(self) -> int:
        """``max_seqlen`` when given, else the longest document read from ``cu_seqlens`` (a host sync)."""
        if self.max_seqlen is not None:
            return min(self.max_seqlen, self.num_tokens)
        return int((self.cu_seqlens[1:] - self.cu_seqlens[:-1]).max())


Backend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PackedDocuments, float, "int | None"],
                   torch.Tensor]
_BACKENDS: dict[str, Backend] = {}


def register_backend(name: str) -> Callable[[Backend], Backend]:
    """Decorator: register ``fn(q, k, v, docs, scale, window) -> (T, H, D)`` as backend ``name``."""
    def register(fn: Backend) -> Backend:
        _BACKENDS[name] = fn
        return fn
    return register


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: PackedDocuments | torch.Tensor,
              scale: float | torch.Tensor, window: int | torch.Tensor | None = None, *,
              backend: str = "reference") -> torch.Tensor:
    """Document-causal attention. q, k, v: (T, H, D), same dtype; docs: :class:`PackedDocuments` or
    ``cu_seqlens`` (S,) int32 from 0 to T; scale: multiplies q·k (e.g. D**-0.5); window: None or W >= 1
    tokens (query i sees keys i-W+1..i). ``"flex"`` and ``"reference"`` also take a 0-d tensor scale and a
    0-d integer tensor window (not checked here: the caller keeps it >= 1). Returns (T, H, D) in the dtype
    of q. ``backend="auto"``: :func:`resolve_backend` for q's device. Raises ``ValueError`` for an unknown
    backend, bad shapes, or a backend that cannot run on these inputs (``varlen``, ``fa3``, ``fa4`` off CUDA
    or a library not installed)."""
    if backend == "auto":
        backend = resolve_backend(backend, q.device)
    if backend not in _BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; registered: {', '.join(_BACKENDS)}")
    if q.ndim != 3 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must share one (T, H, D) shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if isinstance(window, int) and window < 1:
        raise ValueError(f"window must be None or >= 1 token, got {window}")
    if isinstance(docs, torch.Tensor):
        docs = PackedDocuments(docs, q.size(0))
    if docs.num_tokens != q.size(0):
        raise ValueError(f"the documents hold {docs.num_tokens} tokens, q holds {q.size(0)}")
    return _BACKENDS[backend](q, k, v, docs, scale, window)


@register_backend("reference")
def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: PackedDocuments, scale: float,
               window: int | None) -> torch.Tensor:
    mask = document_causal_mask(docs.cu_seqlens, q.size(0), window)      # (T, T)
    scores = torch.einsum("thd,shd->hts", q, k) * scale                  # (H, T, T)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(dim=-1), v)      # (T, H, D)


@register_backend("sdpa")
def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: PackedDocuments, scale: float,
          window: int | None) -> torch.Tensor:
    mask = docs.cached(("dense_mask", window), lambda: document_causal_mask(docs.cu_seqlens, q.size(0),
                                                                             window))   # (T, T)
    with sdpa_kernel(_SDPA_KERNELS):
        out = F.scaled_dot_product_attention(*_heads_first(q, k, v), attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1)                                        # (T, H, D)


@register_backend("sdpa_docs")
@torch.compiler.disable   # a Python loop over this batch's documents: compiled, each layout would recompile
def _sdpa_docs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: PackedDocuments, scale: float,
               window: int | None) -> torch.Tensor:
    bounds = docs.cached("bounds", docs.cu_seqlens.tolist)
    outs = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        if stop == start:                                                        # padding slot
            continue
        qd, kd, vd = _heads_first(q[start:stop], k[start:stop], v[start:stop])  # (1, H, L_d, D)
        with sdpa_kernel(_SDPA_KERNELS):
            if window is None or window >= stop - start:
                out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale)
            else:
                band = document_causal_mask(docs.cu_seqlens.new_tensor([0, stop - start]), stop - start,
                                            window)
                out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=band, scale=scale)
        outs.append(out[0].transpose(0, 1))                                      # (L_d, H, D)
    return torch.cat(outs, dim=0)


@register_backend("flex")
def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: PackedDocuments, scale: float | torch.Tensor,
          window: int | torch.Tensor | None) -> torch.Tensor:
    block_mask = docs.cached(("flex_block_mask", window), lambda: _flex_block_mask(docs, window, q.device))
    if isinstance(scale, torch.Tensor):                  # a graph input: scores times it, not a constant
        score_mod, scale = _scaled_scores(scale), 1.0
    else:
        score_mod = None
    out = _flex_function("flex_attention", q.is_cuda)(*_heads_first(q, k, v), score_mod=score_mod,
                                                      block_mask=block_mask, scale=scale)
    return out[0].transpose(0, 1)                                                # (T, H, D)


def _scaled_scores(scale: torch.Tensor) -> Callable[..., torch.Tensor]:
    """FlexAttention score_mod multiplying each q·k score by the 0-d tensor ``scale`` (a captured buffer of
    the fused kernel, read at run time)."""
    def scaled(score, b, h, q_idx, kv_idx):
        return score * scale
    return scaled


def _flex_block_mask(docs: PackedDocuments, window: int | torch.Tensor | None, device: torch.device) -> Any:
    """The FlexAttention block mask (128-token blocks) of document-causal attention within ``window``:
    :func:`document_block_mask` when the sequence is a whole number of blocks, else FlexAttention's own
    ``create_block_mask`` (which evaluates the mask on all T² pairs)."""
    ids = docs.document_ids()                                                    # (T,)
    mask_mod = _document_causal_mod(ids, window)
    if docs.num_tokens % FLEX_BLOCK_SIZE == 0:
        return document_block_mask(ids, window, mask_mod)
    create = _flex_function("create_block_mask", device.type == "cuda")
    return create(mask_mod, None, None, docs.num_tokens, docs.num_tokens, device=device)


FLEX_BLOCK_SIZE = 128


def _document_causal_mod(ids: torch.Tensor, window: int | torch.Tensor | None) -> Callable[..., torch.Tensor]:
    """FlexAttention mask_mod: query q_idx sees key kv_idx of its own document, at or before it, and
    (with ``window``, an int or a 0-d integer tensor) fewer than ``window`` tokens back. ``ids``: (T,)
    document index of each token."""
    def document_causal(b, h, q_idx, kv_idx):
        keep = (ids[q_idx] == ids[kv_idx]) & (q_idx >= kv_idx)
        return keep if window is None else keep & (q_idx - kv_idx < window)
    return document_causal


def document_block_mask(ids: torch.Tensor, window: int | torch.Tensor | None, mask_mod: Callable[..., torch.Tensor],
                        block_size: int = FLEX_BLOCK_SIZE) -> Any:
    """The FlexAttention ``BlockMask`` of document-causal attention within ``window`` tokens, built from
    each block's first and last document id in O((T / block_size)²) instead of evaluating ``mask_mod`` on
    all T² token pairs as ``create_block_mask`` does (record #28's hand-built block masks, there with
    block-granular windows; here exact to the token).

    ``ids``: (T,) int document index of each token, non-decreasing (the packing order), T a multiple of
    ``block_size``; ``mask_mod``: the token-level rule (:func:`_document_causal_mod`), applied inside the
    partial blocks. A (query block i, key block j) pair is *full* when every token pair in it is allowed
    (j < i, both blocks inside one document, the farthest pair within the window), *partial* when some
    are, and skipped otherwise. Returns the same blocks as ``create_block_mask`` (tests compare them).
    Raises ``ValueError`` when T is not a multiple of ``block_size``."""
    from torch.nn.attention.flex_attention import BlockMask

    if ids.numel() % block_size:
        raise ValueError(f"document_block_mask: {ids.numel()} tokens is not a multiple of {block_size}")
    blocks = ids.view(-1, block_size)                                            # (N, block_size)
    first, last = blocks[:, 0], blocks[:, -1]                                    # (N,) each
    n = blocks.size(0)
    q_block = torch.arange(n, device=ids.device)[:, None]                       # (N, 1)
    kv_block = torch.arange(n, device=ids.device)[None, :]                      # (1, N)
    some = (kv_block <= q_block) & (last[None, :] >= first[:, None])             # (N, N): shares a document
    single = first == last                                                       # block within one document
    every = (kv_block < q_block) & single[:, None] & single[None, :] & (first[:, None] == first[None, :])
    if window is not None:
        behind = q_block - kv_block                                              # blocks between them
        some = some & ((behind - 1) * block_size + 1 < window)                   # nearest token pair
        every = every & ((behind + 1) * block_size - 1 < window)                 # farthest token pair
    partial_num, partial_idx = _ordered(some & ~every)
    full_num, full_idx = _ordered(every)
    return BlockMask.from_kv_blocks(partial_num, partial_idx, full_num, full_idx, BLOCK_SIZE=block_size,
                                    mask_mod=mask_mod)


def _ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, N) bool block grid -> ((1, 1, N) int32 blocks per row, (1, 1, N, N) int32 column indices with
    each row's True columns first, in ascending order): the layout of ``BlockMask.from_kv_blocks``."""
    dense = dense.to(torch.int32)
    count = dense.sum(dim=-1, dtype=torch.int32)
    order = torch.argsort(dense, dim=-1, descending=True, stable=True).to(torch.int32)
    return count[None, None].contiguous(), order[None, None].contiguous()


@register_backend("varlen")
def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: PackedDocuments, scale: float,
            window: int | None) -> torch.Tensor:
    if not q.is_cuda or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"attention backend 'varlen' needs CUDA bf16/fp16 tensors, got {q.device} "
                         f"{q.dtype}")
    from torch.nn.attention.varlen import varlen_attn

    longest = docs.longest()
    cu = docs.cu_seqlens.to(torch.int32)
    left = -1 if window is None else window - 1
    return varlen_attn(q, k, v, cu, cu, longest, longest, scale=scale, window_size=(left, 0))


@register_backend("fa3")
def _fa3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: PackedDocuments, scale: float,
         window: int | None) -> torch.Tensor:
    _check_flash("fa3", q)
    return flash.varlen_attention("fa3", q, k, v, docs.cu_seqlens, docs.longest(), scale, window)


@register_backend("fa4")
@torch.compiler.disable   # CuTe-DSL Python: dynamo cannot trace it; an eager call, one graph break per layer
def _fa4(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: PackedDocuments, scale: float,
         window: int | None) -> torch.Tensor:
    _check_flash("fa4", q)
    return flash.varlen_attention("fa4", q, k, v, docs.cu_seqlens, docs.longest(), scale, window)


def _check_flash(library: str, q: torch.Tensor) -> None:
    """``ValueError`` unless q is a CUDA bf16/fp16 tensor and ``library`` is installed."""
    if not q.is_cuda or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"attention backend {library!r} needs CUDA bf16/fp16 tensors, got {q.device} {q.dtype}")
    reason = flash.unavailable_reason(library)
    if reason is not None:
        raise ValueError(f"attention backend {library!r} is not installed: {reason}")


AUTO_CUDA_ORDER = ("fa3", "fa4", "varlen", "flex")
# Compute capabilities (major) where "auto" takes a FlashAttention library: FA3 is a Hopper kernel
# (wgmma, TMA); FA4's tuned paths are Hopper's and Blackwell's (sm90, sm100/sm110). Elsewhere the
# library may run when asked for by name, but auto goes on to varlen.
_AUTO_MAJORS = {"fa3": (9,), "fa4": (9, 10, 11)}


def resolve_backend(name: str, device: torch.device | str) -> str:
    """``name`` itself unless it is ``"auto"``; ``"auto"``: on a CUDA device the first of
    :data:`AUTO_CUDA_ORDER` that runs there (fa3 and fa4 when their library loads and the GPU's compute
    capability is one of theirs; varlen when this torch has ``torch.nn.attention.varlen``; flex always),
    on any other device ``"sdpa_docs"`` (the fastest on a CPU). Resolved once per (device type, GPU
    capability): the first call may import FA3/FA4, or download FA3 through the ``kernels`` hub.

    Why this order: FA3 is the kernel of the records since #29 (speedrun-spec.md 2.3; its paper reports
    1.5-2x FlashAttention-2 on an H100) and FA4 its CuTe-DSL successor; both are untimed here so far
    (benchmarks/attention_backends.py on a GPU). FlexAttention and ``varlen_attn`` (FA2-class) measured
    the same on one H200 (1.35/1.68/1.87 ms for windows of 384/896/1792 tokens, forward + backward, 49,152
    tokens; ../shared/docs/gpu-notes.md); varlen goes first as it builds no block mask per forward pass,
    at the price of one compiled graph per window setting (flex takes the windows as graph inputs)."""
    if name != "auto":
        return name
    device = torch.device(device)
    if device.type != "cuda":
        return "sdpa_docs"
    return _resolve_cuda(torch.cuda.get_device_capability(device))


@functools.cache
def _resolve_cuda(capability: tuple[int, int]) -> str:
    for backend in AUTO_CUDA_ORDER[:2]:
        if capability[0] in _AUTO_MAJORS[backend] and flash.unavailable_reason(backend) is None:
            return backend
    try:
        import torch.nn.attention.varlen  # noqa: F401
        return "varlen"
    except ImportError:
        return "flex"


def _flex_function(name: str, cuda: bool) -> Callable[..., Any]:
    """``flex_attention`` or ``create_block_mask`` as the caller's context needs it: the plain function
    inside a graph being compiled (traced with the model), else on CUDA its own ``torch.compile`` (the fused
    kernel; the eager mask construction evaluates all T² pairs at once), else the eager CPU path."""
    from torch.nn.attention import flex_attention as flex

    if torch.compiler.is_compiling():
        return getattr(flex, name)
    return _compiled_flex(name) if cuda else _eager_flex(name)


@functools.cache
def _compiled_flex(name: str) -> Callable[..., Any]:
    from torch.nn.attention import flex_attention as flex

    return torch.compile(getattr(flex, name), dynamic=False)


def _eager_flex(name: str) -> Callable[..., Any]:
    from torch.nn.attention import flex_attention as flex

    function = getattr(flex, name)

    def eager(*args, **kwargs):
        with warnings.catch_warnings():        # the eager path warns that it is unfused: known and intended
            warnings.simplefilter("ignore", UserWarning)
            return function(*args, **kwargs)
    return eager


def _heads_first(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """(T, H, D) -> (1, H, T, D) views: SDPA's flash and memory-efficient kernels need 4-D inputs (3-D ones
    fall back to the slow math kernel)."""
    return [t.transpose(0, 1).unsqueeze(0) for t in tensors]
