"""A tiled transposed copy of a 2-D tensor in one Triton kernel: ``src`` (M, N) -> ``dst`` (N, M), both row-major.

Why: the FP8 head's weight gradient (:mod:`speedrun.model.loss`, records #19 on) is a ``torch._scaled_mm`` of
the (T, V) e5m2 logit gradient, which cuBLAS takes only with T as the contiguous dimension (an FP8 product on
Hopper reads A row-major and B column-major), so the gradient is copied transposed once per micro-batch. The
records do that copy inside a ``torch.compile``-d backward (record #88's ``mm_t_backward``: the cast and
``.T.contiguous()`` fused by Inductor). Ours ran it as ATen's generic element-wise float8 copy: 5.1 ms per call
at T = 16,384, V = 50,304 on the H200, 41 ms of a 330 ms step of 131,072 tokens (profile of 2026-12-04,
docs/benchmarks.md). The reference is ``src.t().contiguous()``; :func:`speedrun.model.fp8.transposed`
dispatches here on CUDA.

One program per (BLOCK_M, BLOCK_N) tile (autotuned): a coalesced load of the tile's rows, ``tl.trans`` in
registers and shared memory, a coalesced store of its columns as rows of ``dst``; each byte is read once and
written once. Elements are moved as unsigned integers of their width (float8 as uint8, bf16 as int16, fp32 as
int32), so every dtype of 1, 2 or 4 bytes takes the same kernel and no value is converted. Offsets are int64:
T·V exceeds 2^31 at the records' micro-batch of 49,152 tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from speedrun.kernels import require

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
_CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w)
            for m, n, w in ((64, 64, 4), (128, 64, 4), (64, 128, 4), (128, 128, 8))]


@triton.autotune(configs=_CONFIGS, key=["M", "N"])
@triton.jit
def _transpose_kernel(src_ptr, dst_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)   # (BLOCK_M,) of src
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)   # (BLOCK_N,)
    inside = (rows[:, None] < M) & (cols[None, :] < N)                                    # (BLOCK_M, BLOCK_N)
    tile = tl.load(src_ptr + rows[:, None] * N + cols[None, :], mask=inside)
    tl.store(dst_ptr + cols[:, None] * M + rows[None, :], tl.trans(tile), mask=tl.trans(inside))


@triton_op("speedrun::transpose_copy", mutates_args={})
def transpose_copy(src: torch.Tensor) -> torch.Tensor:
    """``src.t().contiguous()``: a new row-major (N, M) tensor of ``src``'s dtype and device from a row-major
    (M, N) ``src`` whose elements are 1, 2 or 4 bytes wide (float8 e4m3/e5m2, bf16, fp16, fp32, integers).

    Raises :class:`SpeedrunError` when ``src`` is not 2-D and contiguous or its element width is another."""
    require(src.dim() == 2 and src.is_contiguous(),
            f"transpose_copy: src must be a contiguous (M, N) tensor, got shape {tuple(src.shape)}, "
            f"strides {src.stride()}")
    require(src.element_size() in _BITS,
            f"transpose_copy: elements of 1, 2 or 4 bytes, got {src.dtype} ({src.element_size()} bytes)")
    rows, cols = src.shape
    dst = torch.empty((cols, rows), dtype=src.dtype, device=src.device)
    if src.numel() == 0:
        return dst
    bits = _BITS[src.element_size()]
    grid = lambda meta: (triton.cdiv(rows, meta["BLOCK_M"]), triton.cdiv(cols, meta["BLOCK_N"]))  # noqa: E731
    wrap_triton(_transpose_kernel)[grid](src.view(bits), dst.view(bits), rows, cols)
    return dst
