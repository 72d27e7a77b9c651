"""The fused ReLU² MLP ``out = relu(x W1ᵀ)² W2ᵀ``: two Triton matrix products with fused epilogues.

Source: the public speedrun's fused ReLU² kernel, records #59 and #87 (speedrun-spec.md 2.4); ReLU² itself
is from So et al. 2021, "Primer" (record #5). The pure-PyTorch reference is :class:`speedrun.model.mlp.MLP`.

Shape legend: T tokens, C model_dim, F hidden width (4·C).

* Forward: ``post = relu(x W1ᵀ)²`` (T, F) in one Triton product whose epilogue rectifies and squares the
  fp32 accumulator and writes only ``post``: the pre-activation ``pre = x W1ᵀ`` is never stored. Then
  ``out = post W2ᵀ`` (T, C) with torch.
* Backward: since ``d relu(p)²/dp = 2·relu(p)`` and ``relu(pre) = sqrt(post)``, ``g_pre = (g_out W2) ·
  2·sqrt(post)`` (T, F) in one Triton product whose epilogue rebuilds ``relu(pre)`` from the saved ``post``,
  the only activation kept for the backward pass. Then ``g_W2 = g_outᵀ post``, ``g_W1 = g_preᵀ x`` and
  ``g_x = g_pre W1`` with torch.

* FP8 (``relu_square_mlp_fp8``, records #84, #89; the scales are :mod:`speedrun.model.fp8_mlp`'s): the
  forward product takes e4m3 x and W1 (fp32 accumulation, then the dequantization scale) and its epilogue
  writes post twice, in bf16 for the backward and in e4m3 divided by the layer's delayed scale (saturating
  at 448) for the down projection, which runs in ``torch._scaled_mm``; each tile also writes its max of
  post, so the next scale costs no extra pass over post. Records #84-#88 multiply the down projection in
  bf16: then the epilogue writes post alone (``relu_square_matmul_fp8_up``). The backward is the bf16 one
  above.
  Why the up projection is a Triton FP8 product rather than ``_scaled_mm`` and a separate ReLU² +
  quantize kernel: the epilogue then reads nothing, whereas the split would write and read ``pre`` (T, F)
  in bf16 once more (about 0.6 GB at T=49152).

* Persistent TMA variants (record #88's ``linear_relu_square_kernel``; Triton's persistent matmul tutorial),
  not the default: ``relu_square_matmul_fp8_up_persistent`` and ``relu_square_grad_persistent``, chosen by
  ``relu_square_mlp_fp8(..., down_fp8=False, persistent=True)``. One program per SM loops over the output
  tiles (``tl.range(..., flatten=True)``), reads its operands through host-side TMA descriptors
  (``TensorDescriptor.from_tensor``; zeros past the tensors' ends instead of masks) and writes each tile in
  two column halves (each TMA store stages half a tile in shared memory). Same epilogue formulas as the
  one-program-per-tile kernels and, at equal BLOCK_K, the K blocks summed in the same order: bit for bit
  the same results in Triton's interpreter (tests/test_relu_square_persistent.py). On a GPU the autotuner
  may give the two different BLOCK_K or tile shapes (theirs are 128 x 256 x 128 for e4m3, x 64 for bf16),
  which reorders the fp32 sums: there they agree to the bf16 rounding of the output. Their descriptors need
  rows of a multiple of 16 bytes (C and F multiples of 16 for e4m3, of 8 for bf16).

Both Triton products are (T, C) x (C, F) -> (T, F) with fp32 accumulation, tiles of 128-256 x 128-256 x 64
grouped by 8 tile rows for L2 reuse (Triton's matmul tutorial), a handful of autotune configs for Hopper
(H200; T=49152, C=768, F=3072). The inputs may have any strides; rows and columns of a partial tile wrap
around inside the tensor and are never stored, so any T, C and F work.

Precision: inputs and outputs in one 16-bit float dtype (bf16 in training), products accumulated in fp32.
``post`` is rounded to 16 bits (relative error at most u = 2⁻⁹ in bf16) before its square root, so the
rebuilt ``relu(pre)`` is off by at most u/2 relative, less than the rounding of ``g_pre`` itself.

Speed (H200, torch 2.11, Triton 3.6, T=49152, C=768, F=3072, bf16; benchmarks/mlp_kernel.py, 2026-11-29):
forward + backward 2.38 ms compiled (torch.compile of the reference: 2.35 ms) and 2.63 ms eager (reference
3.07 ms); 360 MiB held from forward to backward against the reference's 648 MiB. Each Triton product runs
at about 75% of cuBLAS's rate on the same shape (0.47-0.49 ms against 0.36 ms).

torch.compile(fullgraph=True): the products are operators (``speedrun::relu_square_matmul``,
``speedrun::relu_square_grad`` and their FP8 variants) made with ``torch.library.triton_op`` +
``wrap_triton``, so Dynamo and Inductor trace into them; the persistent variants are plain functions that
build their host-side TMA descriptors and launch the kernel, as record #88's ``linear_relu_square`` does:
Dynamo traces them (it captures ``TensorDescriptor.from_tensor`` and the launch; a ``triton_op`` body, traced
outside Dynamo, would not capture the descriptors), so that Inductor launches them from its own code, as it
does the per-tile kernels (as opaque ``custom_op``s, launched from Python through the autotuner at every call,
a compiled MLP call was 0.6-0.7 ms slower than with the per-tile kernels for products no slower:
docs/benchmarks.md, 2026-12-07). Under torch.compile the persistent launches do not check their operands'
start addresses (:func:`_tma_operand`). The gradient is a ``torch.autograd.Function``, which Dynamo traces
too. On a CPU the kernels run only under Triton's
interpreter (``TRITON_INTERPRET=1`` set before this module is imported, and one autotune config at a time:
the interpreter cannot benchmark), which the tests use.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton
from triton.tools.tensor_descriptor import TensorDescriptor

from speedrun.kernels import require
from speedrun.model.fp8 import E4M3, quantize, scaled_mm

# Measured on an H200 at T=49152, C=768, F=3072 (bf16, 2026-11-29; cuBLAS does either product in 0.36 ms):
# the forward product takes 0.47 ms with 256x128 tiles, 8 warps, 4 stages; the backward 0.49 ms with 128x128
# tiles, 4 warps, 3 stages; the other two are within 10-20% on one or the other.
_CONFIGS = [
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
]
# The FP8 up projection (record #84): e4m3 operands, twice the bytes per K step of bf16's tiles at BLOCK_K 128.
# The amax partials are one per program: at most cdiv(M, 128) * cdiv(N, 128) (every tile is at least 128x128).
_FP8_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=4),
]
_MIN_TILE = 128
# K is a multiple of every config's BLOCK_K exactly when it is a multiple of this: then no K mask is needed.
_K_QUANTUM = math.lcm(*(config.kwargs["BLOCK_K"] for config in _CONFIGS + _FP8_CONFIGS))
_DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of tile number ``tile`` of a num_pid_m x num_pid_n grid of tiles: tiles walked GROUP_M
    tile rows at a time, column by column, so that tiles computed at the same time share rows of A and
    columns of B in L2 (Triton's matmul tutorial). GROUP_M = 1 walks the tiles row by row."""
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (tile // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile % num_pid_in_group) % group_size_m)
    pid_n = (tile % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of this program, one program per tile (:func:`_grouped_tile`'s order)."""
    return _grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)


@triton.jit
def _matmul_tile(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m, pid_n,
                 EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tile (pid_m, pid_n) of A B as fp32 (BLOCK_M, BLOCK_N), A (M, K), B (K, N). Rows and columns past M
    and N wrap around (valid reads; the caller masks them out of its store); K is masked unless EVEN_K."""
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=ks[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc=acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _tile_offsets(pid_m, pid_n, M, N, stride_m, stride_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Element offsets (int64) of tile (pid_m, pid_n) in an (M, N) tensor, and the mask of its valid part."""
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offsets = rows.to(tl.int64)[:, None] * stride_m + cols.to(tl.int64)[None, :] * stride_n
    return offsets, (rows[:, None] < M) & (cols[None, :] < N)


@triton.autotune(configs=_CONFIGS, key=["M", "N", "K"])
@triton.jit
def _relu_square_kernel(x_ptr, w_ptr, post_ptr, M, N, K,
                        stride_xm, stride_xk, stride_wk, stride_wn, stride_pm, stride_pn,
                        EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """post = relu(X W)², X (M, K), W (K, N), post (M, N); ``pre`` lives only in registers."""
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = _matmul_tile(x_ptr, w_ptr, M, N, K, stride_xm, stride_xk, stride_wk, stride_wn, pid_m, pid_n,
                       EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
    relu = tl.maximum(acc, 0.0)
    offsets, mask = _tile_offsets(pid_m, pid_n, M, N, stride_pm, stride_pn, BLOCK_M, BLOCK_N)
    tl.store(post_ptr + offsets, (relu * relu).to(post_ptr.dtype.element_ty), mask=mask)


@triton.autotune(configs=_CONFIGS, key=["M", "N", "K"])
@triton.jit
def _relu_square_grad_kernel(g_ptr, w_ptr, post_ptr, g_pre_ptr, M, N, K,
                             stride_gm, stride_gk, stride_wk, stride_wn, stride_pm, stride_pn,
                             stride_om, stride_on,
                             EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """g_pre = (G W) · 2·sqrt(post), G (M, K), W (K, N), post and g_pre (M, N)."""
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = _matmul_tile(g_ptr, w_ptr, M, N, K, stride_gm, stride_gk, stride_wk, stride_wn, pid_m, pid_n,
                       EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
    post_offsets, mask = _tile_offsets(pid_m, pid_n, M, N, stride_pm, stride_pn, BLOCK_M, BLOCK_N)
    post = tl.load(post_ptr + post_offsets, mask=mask, other=0.0).to(tl.float32)
    g_pre = acc * (2.0 * tl.sqrt(post))
    out_offsets, _ = _tile_offsets(pid_m, pid_n, M, N, stride_om, stride_on, BLOCK_M, BLOCK_N)
    tl.store(g_pre_ptr + out_offsets, g_pre.to(g_pre_ptr.dtype.element_ty), mask=mask)


@triton.autotune(configs=_FP8_CONFIGS, key=["M", "N", "K"])
@triton.jit
def _relu_square_fp8_kernel(x_ptr, w_ptr, dequant_ptr, post_scale_ptr, post_ptr, post8_ptr, amax_ptr, M, N, K,
                            stride_xm, stride_xk, stride_wk, stride_wn, stride_pm, stride_pn,
                            DOWN_FP8: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """From e4m3 X (M, K) and W (K, N): post = relu(dequant · X W)² (M, N) in post's 16-bit dtype; with
    DOWN_FP8 also post8 = min(post / post_scale, 448) (M, N) e4m3 and this program's max of post into
    amax[program] (without it, post_scale_ptr, post8_ptr and amax_ptr are never read or written)."""
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = _matmul_tile(x_ptr, w_ptr, M, N, K, stride_xm, stride_xk, stride_wk, stride_wn, pid_m, pid_n,
                       EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
    relu = tl.maximum(acc * tl.load(dequant_ptr), 0.0)
    post = relu * relu                                                    # fp32
    offsets, mask = _tile_offsets(pid_m, pid_n, M, N, stride_pm, stride_pn, BLOCK_M, BLOCK_N)
    tl.store(post_ptr + offsets, post.to(post_ptr.dtype.element_ty), mask=mask)
    if DOWN_FP8:
        post8 = tl.minimum(post * (1.0 / tl.load(post_scale_ptr)), 448.0)
        tl.store(post8_ptr + offsets, post8.to(post8_ptr.dtype.element_ty), mask=mask)
        tl.store(amax_ptr + tl.program_id(0), tl.max(tl.max(tl.where(mask, post, 0.0), axis=1), axis=0))


# ------------------------------------------------------------------ persistent TMA variants (record #88)
#
# One program per SM, each looping over the output tiles p, p + P, p + 2P, ... (P programs launched), its
# operands read and its results written through host-side TMA descriptors
# (``triton.tools.tensor_descriptor.TensorDescriptor``). A descriptor carries its block shape, fixed when
# the wrapper builds it, so all configs of one kernel share one block shape (:func:`_config_blocks`) and
# differ only in stages, warps and tile order: descriptors per config would need a config pre_hook, which
# torch.compile refuses in user-defined kernels.

# Record #88's tiles on an H100: 128 x 256 outputs, BLOCK_K 128 for e4m3 (it runs 4 stages, 8 warps), 64 for
# bf16 (3 stages, 8 warps). Shared memory: 48 KiB per stage either way, plus 32 KiB per half tile staged by
# the epilogue's TMA store (and as much again for the backward's TMA load of post).
_FP8_PERSISTENT_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=8, num_stages=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 1}, num_warps=8, num_stages=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=8, num_stages=3),
]
_GRAD_PERSISTENT_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 1}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=2),
]
# Programs launched off CUDA (Triton's interpreter): few, so that each one loops over several tiles.
_INTERPRETER_PROGRAMS = 4


@triton.jit
def _tma_matmul_tile(a_desc, b_desc, off_m, off_n, K, B_BY_ROWS_OF_N: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 (BLOCK_M, BLOCK_N) tile of A B at element (off_m, off_n). A (M, K) is read in (BLOCK_M, BLOCK_K)
    blocks; B through Bᵀ (N, K) in (BLOCK_N, BLOCK_K) blocks when B_BY_ROWS_OF_N, else through B (K, N) in
    (BLOCK_K, BLOCK_N) blocks. TMA reads zeros past a tensor's end, so any M, N and K work without masks;
    the K blocks are summed in the order of :func:`_matmul_tile`."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        off_k = k * BLOCK_K
        a = a_desc.load([off_m, off_k])                                  # (BLOCK_M, BLOCK_K)
        if B_BY_ROWS_OF_N:
            b = b_desc.load([off_n, off_k]).T                            # (BLOCK_K, BLOCK_N)
        else:
            b = b_desc.load([off_k, off_n])                              # (BLOCK_K, BLOCK_N)
        acc = tl.dot(a, b, acc=acc)
    return acc


@triton.jit
def _column_halves(tile, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The left and right (BLOCK_M, BLOCK_N // 2) halves of ``tile`` (BLOCK_M, BLOCK_N)."""
    pairs = tl.permute(tl.reshape(tile, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))   # [m, j, half]
    return tl.split(pairs)


@triton.jit
def _store_relu_square(acc, dequant, post_desc, off_m, off_n):
    """post = relu(dequant · acc)² of an fp32 block, stored in post's dtype at (off_m, off_n)."""
    relu = tl.maximum(acc * dequant, 0.0)
    post_desc.store([off_m, off_n], (relu * relu).to(post_desc.dtype))


@triton.jit
def _store_relu_square_grad(acc, post_desc, g_pre_desc, off_m, off_n):
    """g_pre = acc · 2·sqrt(post) of an fp32 block of g_out W2, with post loaded at (off_m, off_n) and g_pre
    stored there."""
    post = post_desc.load([off_m, off_n]).to(tl.float32)
    g_pre_desc.store([off_m, off_n], (acc * (2.0 * tl.sqrt(post))).to(g_pre_desc.dtype))


@triton.autotune(configs=_FP8_PERSISTENT_CONFIGS, key=["M", "N", "K"])
@triton.jit
def _relu_square_fp8_persistent_kernel(x_desc, w_desc, dequant_ptr, post_desc, M, N, K,
                                       NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr,
                                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """post = relu(dequant · X Wᵀ)² (M, N) from e4m3 X (M, K) and W (N, K), persistent: NUM_PROGRAMS programs
    walk the tiles in :func:`_grouped_tile`'s order, each storing its tile in two column halves."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    dequant = tl.load(dequant_ptr)
    # The epilogue finds its tile from a counter of its own rather than the loop's: once Triton flattens the
    # tile and K loops into one pipelined loop, the next tile's loads then need nothing from this epilogue.
    epilogue_tile = tl.program_id(0) - NUM_PROGRAMS
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = _tma_matmul_tile(x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, True,
                               BLOCK_M, BLOCK_N, BLOCK_K)                # (BLOCK_M, BLOCK_N) fp32
        epilogue_tile += NUM_PROGRAMS
        pid_m, pid_n = _grouped_tile(epilogue_tile, num_pid_m, num_pid_n, GROUP_M)
        left, right = _column_halves(acc, BLOCK_M, BLOCK_N)
        _store_relu_square(left, dequant, post_desc, pid_m * BLOCK_M, pid_n * BLOCK_N)
        _store_relu_square(right, dequant, post_desc, pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2)


@triton.autotune(configs=_GRAD_PERSISTENT_CONFIGS, key=["M", "N", "K"])
@triton.jit
def _relu_square_grad_persistent_kernel(g_desc, w_desc, post_desc, g_pre_desc, M, N, K,
                                        NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr,
                                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """g_pre = (G W) · 2·sqrt(post), G (M, K), W (K, N), post and g_pre (M, N), persistent as
    :func:`_relu_square_fp8_persistent_kernel`: each tile's epilogue loads post and stores g_pre by halves."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    epilogue_tile = tl.program_id(0) - NUM_PROGRAMS               # see _relu_square_fp8_persistent_kernel
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = _tma_matmul_tile(g_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, False,
                               BLOCK_M, BLOCK_N, BLOCK_K)                # (BLOCK_M, BLOCK_N) fp32
        epilogue_tile += NUM_PROGRAMS
        pid_m, pid_n = _grouped_tile(epilogue_tile, num_pid_m, num_pid_n, GROUP_M)
        left, right = _column_halves(acc, BLOCK_M, BLOCK_N)
        _store_relu_square_grad(left, post_desc, g_pre_desc, pid_m * BLOCK_M, pid_n * BLOCK_N)
        _store_relu_square_grad(right, post_desc, g_pre_desc, pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2)


def _check_operands(name: str, *tensors: torch.Tensor) -> None:
    first = tensors[0]
    require(all(t.dim() == 2 for t in tensors), f"{name}: operands must be 2-D, got shapes "
                                                f"{[tuple(t.shape) for t in tensors]}")
    require(first.dtype in _DTYPES and all(t.dtype == first.dtype for t in tensors),
           f"{name}: operands must share one dtype of bfloat16 or float16, got {[t.dtype for t in tensors]}")
    require(all(t.device == first.device for t in tensors),
           f"{name}: operands must be on one device, got {[str(t.device) for t in tensors]}")


def _check_grad_operands(name: str, g_out: torch.Tensor, w2: torch.Tensor, post: torch.Tensor):
    """(M, N, K) = (T, F, C) of the backward product's operands g_out (T, C), w2 (C, F) and post (T, F);
    raises :class:`SpeedrunError` as :func:`relu_square_grad`."""
    _check_operands(name, g_out, w2, post)
    (M, K), N = g_out.shape, w2.size(1)
    require(w2.size(0) == K and tuple(post.shape) == (M, N),
           f"{name}: g_out {tuple(g_out.shape)} (T, C), w2 {tuple(w2.shape)} (C, F) and post "
           f"{tuple(post.shape)} (T, F) do not chain")
    return M, N, K


def _grid(M: int, N: int):
    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    return grid


@triton_op("speedrun::relu_square_matmul", mutates_args={})
def relu_square_matmul(x: torch.Tensor, w1: torch.Tensor) -> torch.Tensor:
    """post = relu(x W1ᵀ)²: x (T, C), w1 (F, C), both bf16 (or both fp16) -> post (T, F) in that dtype,
    accumulated in fp32; the pre-activation is not stored (records #59, #87).

    Raises :class:`SpeedrunError` on shapes that do not chain, mixed or non-16-bit dtypes, mixed devices.
    """
    _check_operands("relu_square_matmul", x, w1)
    require(x.size(1) == w1.size(1), f"relu_square_matmul: x is {tuple(x.shape)} (T, C) but w1 is "
                                    f"{tuple(w1.shape)}, expected (F, {x.size(1)})")
    (M, K), N = x.shape, w1.size(0)
    post = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if post.numel() == 0:
        return post
    wrap_triton(_relu_square_kernel)[_grid(M, N)](
        x, w1, post, M, N, K, x.stride(0), x.stride(1), w1.stride(1), w1.stride(0),
        post.stride(0), post.stride(1), EVEN_K=K % _K_QUANTUM == 0)
    return post


@triton_op("speedrun::relu_square_grad", mutates_args={})
def relu_square_grad(g_out: torch.Tensor, w2: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """g_pre = (g_out W2) · 2·sqrt(post): g_out (T, C), w2 (C, F), post = relu(pre)² (T, F), all bf16 (or
    all fp16) -> g_pre (T, F), the gradient of the MLP's pre-activation, accumulated in fp32 (record #87:
    relu(pre) rebuilt from post).

    Raises :class:`SpeedrunError` on shapes that do not chain, mixed or non-16-bit dtypes, mixed devices.
    """
    M, N, K = _check_grad_operands("relu_square_grad", g_out, w2, post)
    g_pre = torch.empty((M, N), dtype=g_out.dtype, device=g_out.device)
    if g_pre.numel() == 0:
        return g_pre
    wrap_triton(_relu_square_grad_kernel)[_grid(M, N)](
        g_out, w2, post, g_pre, M, N, K, g_out.stride(0), g_out.stride(1), w2.stride(0), w2.stride(1),
        post.stride(0), post.stride(1), g_pre.stride(0), g_pre.stride(1), EVEN_K=K % _K_QUANTUM == 0)
    return g_pre


@triton_op("speedrun::relu_square_matmul_fp8", mutates_args={})
def relu_square_matmul_fp8(x8: torch.Tensor, w1_8: torch.Tensor, dequant_scale: torch.Tensor,
                           post_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The FP8 up projection with the ReLU² epilogue (records #84, #89): x8 (T, C) and w1_8 (F, C) e4m3,
    ``dequant_scale`` () fp32 = x's scale · W1's scale, ``post_scale`` () fp32 the delayed scale of post
    -> ``(post, post8, partial_amax)``: post = relu(dequant_scale · x8 w1_8ᵀ)² (T, F) bf16 (for the bf16
    backward), post8 = min(post / post_scale, 448) (T, F) e4m3 (the down projection's operand; values past
    the delayed scale's range saturate) and partial_amax (P,) fp32 (P >= 1), the max of post over each
    tile (zeros past the tiles launched): max(partial_amax) = max(post). Products accumulate in fp32;
    post8 is rounded from the fp32 post, not from its bf16 copy.

    Raises :class:`SpeedrunError` on shapes that do not chain, operands not e4m3, scales not () fp32, mixed
    devices.
    """
    _check_fp8_operands(x8, w1_8, dequant_scale, post_scale)
    (M, K), N = x8.shape, w1_8.size(0)
    post = torch.empty((M, N), dtype=torch.bfloat16, device=x8.device)
    post8 = torch.empty((M, N), dtype=E4M3, device=x8.device)
    partial_amax = torch.zeros(max(1, triton.cdiv(M, _MIN_TILE) * triton.cdiv(N, _MIN_TILE)),
                               dtype=torch.float32, device=x8.device)
    if post.numel() == 0:
        return post, post8, partial_amax
    wrap_triton(_relu_square_fp8_kernel)[_grid(M, N)](
        x8, w1_8, dequant_scale, post_scale, post, post8, partial_amax, M, N, K,
        x8.stride(0), x8.stride(1), w1_8.stride(1), w1_8.stride(0), post.stride(0), post.stride(1),
        DOWN_FP8=True, EVEN_K=K % _K_QUANTUM == 0)
    return post, post8, partial_amax


@triton_op("speedrun::relu_square_matmul_fp8_up", mutates_args={})
def relu_square_matmul_fp8_up(x8: torch.Tensor, w1_8: torch.Tensor, dequant_scale: torch.Tensor) -> torch.Tensor:
    """The FP8 up projection alone (records #84-#88, whose down product is bf16): post = relu(dequant_scale ·
    x8 w1_8ᵀ)² (T, F) bf16 from x8 (T, C) and w1_8 (F, C) e4m3 and ``dequant_scale`` () fp32, accumulated in
    fp32. The kernel of :func:`relu_square_matmul_fp8` without its e4m3 copy of post and its tile amaxes,
    which only an FP8 down product reads: a byte per element of post less to write.

    Raises :class:`SpeedrunError` as :func:`relu_square_matmul_fp8`.
    """
    _check_fp8_operands(x8, w1_8, dequant_scale, dequant_scale)
    (M, K), N = x8.shape, w1_8.size(0)
    post = torch.empty((M, N), dtype=torch.bfloat16, device=x8.device)
    if post.numel() == 0:
        return post
    unused = torch.empty(1, dtype=torch.float32, device=x8.device)   # the post8, amax and scale pointers
    wrap_triton(_relu_square_fp8_kernel)[_grid(M, N)](
        x8, w1_8, dequant_scale, unused, post, unused, unused, M, N, K,
        x8.stride(0), x8.stride(1), w1_8.stride(1), w1_8.stride(0), post.stride(0), post.stride(1),
        DOWN_FP8=False, EVEN_K=K % _K_QUANTUM == 0)
    return post


def _config_blocks(kernel) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) shared by all autotune configs of a persistent kernel: the block shape of
    the host-side descriptors that its wrapper builds before the launch."""
    shapes = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) for c in kernel.configs}
    require(len(shapes) == 1, f"{kernel.fn.__name__}: its autotune configs must share one block shape "
                              f"(BLOCK_M, BLOCK_N, BLOCK_K), got {sorted(shapes)}")
    return shapes.pop()


@torch._dynamo.assume_constant_result        # a constant of a traced launch, read when Dynamo traces it
def _persistent_blocks(kernel_name: str) -> tuple[int, int, int]:
    """:func:`_config_blocks` of the persistent kernel ``"fp8_up"`` or ``"grad"`` (by name: Dynamo calls this
    at trace time with constant arguments)."""
    kernels = {"fp8_up": _relu_square_fp8_persistent_kernel, "grad": _relu_square_grad_persistent_kernel}
    return _config_blocks(kernels[kernel_name])


@torch._dynamo.assume_constant_result        # read once when Dynamo traces the launch, a constant of its graph
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _num_programs(device: torch.device, tiles: int) -> int:
    """Programs of a persistent kernel over ``tiles`` output tiles: one per SM on CUDA, else
    _INTERPRETER_PROGRAMS; never more than the tiles."""
    slots = _sm_count(device.index) if device.type == "cuda" else _INTERPRETER_PROGRAMS  # (a CUDA tensor has one)
    return min(slots, tiles)


def _require_tma_rows(op: str, name: str, t: torch.Tensor) -> None:
    """Raise :class:`SpeedrunError` unless a row of ``t`` (R, S) is a multiple of 16 bytes, the alignment TMA
    needs of a row-major tensor's row stride."""
    require(t.size(1) * t.element_size() % 16 == 0,
           f"{op}: TMA needs rows of a multiple of 16 bytes; {name} is {tuple(t.shape)} {t.dtype}")


def _tma_operand(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` (R, S) in a layout a TMA descriptor reads: ``t`` itself when contiguous along S with its start
    and row stride 16-byte aligned, else a row-major copy. Raises as :func:`_require_tma_rows`.

    Under torch.compile the start is not checked: Dynamo cannot trace ``storage_offset()``, and the MLP's
    operands are whole tensors of Inductor's aligned buffers (the quantized input, the weight caches, post,
    the incoming gradient), as record #88's kernel assumes of its own."""
    _require_tma_rows(op, name, t)
    size = t.element_size()
    rows = t.stride(1) == 1 and t.stride(0) * size % 16 == 0
    if rows and (torch.compiler.is_compiling() or t.storage_offset() * size % 16 == 0):
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


# The persistent launches are plain functions that Dynamo traces (see the module docstring), not operators.
def relu_square_matmul_fp8_up_persistent(x8: torch.Tensor, w1_8: torch.Tensor,
                                         dequant_scale: torch.Tensor) -> torch.Tensor:
    """:func:`relu_square_matmul_fp8_up` in a persistent kernel: post = relu(dequant_scale · x8 w1_8ᵀ)² (T, F)
    bf16 from x8 (T, C) and w1_8 (F, C) e4m3 and ``dequant_scale`` () fp32, accumulated in fp32. One
    program per SM loops over the 128 x 256 output tiles, reads x8 and w1_8 through host-side TMA
    descriptors and stores each tile in two column halves (record #88's persistent ``linear_relu_square``
    kernel; Triton's persistent matmul tutorial). The K blocks are summed in the same order as
    :func:`relu_square_matmul_fp8_up` with the same BLOCK_K. Operands whose layout TMA cannot read are copied
    to row-major first.

    Raises :class:`SpeedrunError` as :func:`relu_square_matmul_fp8`, and when C or F is not a multiple of 16
    (TMA's 16-byte row alignment for e4m3 x8 and w1_8, bf16 post).
    """
    op = "relu_square_matmul_fp8_up_persistent"
    _check_fp8_operands(x8, w1_8, dequant_scale, dequant_scale)
    (M, K), N = x8.shape, w1_8.size(0)
    post = torch.empty((M, N), dtype=torch.bfloat16, device=x8.device)
    if post.numel() == 0 or K == 0:
        return post.zero_()
    x8, w1_8 = _tma_operand(op, "x8", x8), _tma_operand(op, "w1_8", w1_8)
    _require_tma_rows(op, "post", post)
    BM, BN, BK = _persistent_blocks("fp8_up")
    programs = _num_programs(x8.device, triton.cdiv(M, BM) * triton.cdiv(N, BN))
    _relu_square_fp8_persistent_kernel[(programs,)](
        TensorDescriptor.from_tensor(x8, [BM, BK]), TensorDescriptor.from_tensor(w1_8, [BN, BK]),
        dequant_scale, TensorDescriptor.from_tensor(post, [BM, BN // 2]), M, N, K, NUM_PROGRAMS=programs)
    return post


def relu_square_grad_persistent(g_out: torch.Tensor, w2: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """:func:`relu_square_grad` in a persistent kernel: g_pre = (g_out W2) · 2·sqrt(post) (T, F) from g_out
    (T, C), w2 (C, F) and post (T, F), all bf16 (or all fp16), accumulated in fp32. One program per SM loops
    over the 128 x 256 output tiles, reads g_out, w2 and post through host-side TMA descriptors and stores
    each tile in two column halves (record #88's persistent ``linear_relu_square`` kernel; Triton's
    persistent matmul tutorial). The same formula and, with the same BLOCK_K, the same order of the K blocks
    as :func:`relu_square_grad`. Operands whose layout TMA cannot read are copied to row-major first.

    Raises :class:`SpeedrunError` as :func:`relu_square_grad`, and when C or F is not a multiple of 8 (TMA's
    16-byte row alignment).
    """
    op = "relu_square_grad_persistent"
    M, N, K = _check_grad_operands(op, g_out, w2, post)
    g_pre = torch.empty((M, N), dtype=g_out.dtype, device=g_out.device)
    if g_pre.numel() == 0 or K == 0:
        return g_pre.zero_()
    g_out, w2, post = (_tma_operand(op, name, t) for name, t in (("g_out", g_out), ("w2", w2), ("post", post)))
    _require_tma_rows(op, "g_pre", g_pre)
    BM, BN, BK = _persistent_blocks("grad")
    programs = _num_programs(g_out.device, triton.cdiv(M, BM) * triton.cdiv(N, BN))
    _relu_square_grad_persistent_kernel[(programs,)](
        TensorDescriptor.from_tensor(g_out, [BM, BK]), TensorDescriptor.from_tensor(w2, [BK, BN]),
        TensorDescriptor.from_tensor(post, [BM, BN // 2]), TensorDescriptor.from_tensor(g_pre, [BM, BN // 2]),
        M, N, K, NUM_PROGRAMS=programs)
    return g_pre


def _check_fp8_operands(x8, w1_8, dequant_scale, post_scale) -> None:
    name = "relu_square_matmul_fp8"
    require(x8.dim() == 2 and w1_8.dim() == 2 and x8.size(1) == w1_8.size(1),
           f"{name}: x8 {tuple(x8.shape)} (T, C) and w1_8 {tuple(w1_8.shape)} (F, C) do not chain")
    require(x8.dtype == E4M3 and w1_8.dtype == E4M3,
           f"{name}: x8 and w1_8 must be float8_e4m3fn, got {x8.dtype} and {w1_8.dtype}")
    require(all(s.shape == () and s.dtype == torch.float32 for s in (dequant_scale, post_scale)),
           f"{name}: the scales must be () float32 tensors, got {tuple(dequant_scale.shape)} "
           f"{dequant_scale.dtype} and {tuple(post_scale.shape)} {post_scale.dtype}")
    devices = {t.device for t in (x8, w1_8, dequant_scale, post_scale)}
    require(len(devices) == 1, f"{name}: operands must be on one device, got {sorted(map(str, devices))}")


class _ReluSquareMLP(torch.autograd.Function):
    """Autograd of ``relu(x W1ᵀ)² W2ᵀ`` for 2-D x, saving only x, the weights and ``post``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        post = relu_square_matmul(x, w1)                     # (T, F)
        ctx.save_for_backward(x, w1, w2, post)
        return torch.mm(post, w2.t())                        # (T, C)

    @staticmethod
    def backward(ctx, g_out: torch.Tensor):
        x, w1, w2, post = ctx.saved_tensors
        g_pre = relu_square_grad(g_out, w2, post)            # (T, F)
        g_x = torch.mm(g_pre, w1) if ctx.needs_input_grad[0] else None          # (T, C)
        g_w1 = torch.mm(g_pre.t(), x) if ctx.needs_input_grad[1] else None      # (F, C)
        g_w2 = torch.mm(g_out.t(), post) if ctx.needs_input_grad[2] else None   # (C, F)
        return g_x, g_w1, g_w2


def relu_square_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """``relu(x W1ᵀ)² W2ᵀ`` with the fused Triton forward and backward (records #59, #87).

    x (..., C), w1 (F, C) (the MLP's ``fc.weight``), w2 (C, F) (``proj.weight``), all bf16 (or all fp16)
    on one CUDA device (a CPU only under ``TRITON_INTERPRET=1``) -> (..., C) in that dtype. Differentiable
    in x, w1 and w2; the backward keeps ``post`` (T, F) and no other activation.

    Raises :class:`SpeedrunError` on shapes that do not chain, mixed or non-16-bit dtypes, mixed devices.
    """
    chained = w1.dim() == 2 and w2.dim() == 2 and x.size(-1) == w1.size(1) and w2.shape == w1.shape[::-1]
    require(chained,
           f"relu_square_mlp: x {tuple(x.shape)} (..., C), w1 {tuple(w1.shape)} (F, C) and w2 "
           f"{tuple(w2.shape)} (C, F) do not chain")
    out = _ReluSquareMLP.apply(x.reshape(-1, x.size(-1)), w1, w2)
    return out.reshape(*x.shape[:-1], w2.size(0))


FP8Operands = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class _ReluSquareMLPFP8(torch.autograd.Function):
    """FP8 forward of ``relu(x W1ᵀ)² W2ᵀ`` (records #84, #89), bf16 backward from x, post and the weights'
    bf16 copies; returns (out, amax of post), the amax not differentiable, or with ``down_fp8`` False (records
    #84-#88: w2_8, w2_scale and post_scale None) out alone. ``persistent`` (only without ``down_fp8``): the
    up projection and g_pre from the persistent TMA kernels."""

    @staticmethod
    def forward(ctx, x, w1, w2, w1_8, w1_scale, w1_back, w2_8, w2_scale, w2_back, post_scale, down_fp8=True,
                persistent=False):
        x8, x_scale = quantize(x)                                           # (T, C) e4m3, amax / 448
        ctx.dtypes = (x.dtype, w1.dtype, w2.dtype)
        ctx.persistent = persistent
        if not down_fp8:                                        # records #84-#88: the down product in bf16
            up = relu_square_matmul_fp8_up_persistent if persistent else relu_square_matmul_fp8_up
            post = up(x8, w1_8, x_scale * w1_scale)                         # (T, F) bf16
            ctx.save_for_backward(x.to(torch.bfloat16), w1_back, w2_back, post)
            return torch.mm(post, w2_back.t())                              # (T, C) bf16
        post, post8, partial_amax = relu_square_matmul_fp8(x8, w1_8, x_scale * w1_scale, post_scale)
        out = scaled_mm(post8, post_scale, w2_8, w2_scale)                  # (T, C) bf16
        amax = partial_amax.amax()
        ctx.mark_non_differentiable(amax)
        ctx.save_for_backward(x.to(torch.bfloat16), w1_back, w2_back, post)
        return out, amax

    @staticmethod
    def backward(ctx, g_out, *_g_amax):
        x, w1, w2, post = ctx.saved_tensors                     # bf16: (T, C), (F, C), (C, F), (T, F)
        x_dtype, w1_dtype, w2_dtype = ctx.dtypes
        g_out = g_out.to(torch.bfloat16)
        grad = relu_square_grad_persistent if ctx.persistent else relu_square_grad
        g_pre = grad(g_out, w2, post)                                                     # (T, F)
        g_x = torch.mm(g_pre, w1).to(x_dtype) if ctx.needs_input_grad[0] else None          # (T, C)
        g_w1 = torch.mm(g_pre.t(), x).to(w1_dtype) if ctx.needs_input_grad[1] else None     # (F, C)
        g_w2 = torch.mm(g_out.t(), post).to(w2_dtype) if ctx.needs_input_grad[2] else None  # (C, F)
        return g_x, g_w1, g_w2, None, None, None, None, None, None, None, None, None


def relu_square_mlp_fp8(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w1_fp8: FP8Operands,
                        w2_fp8: FP8Operands | None, post_scale: torch.Tensor | None,
                        down_fp8: bool = True,
                        persistent: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``relu(x W1ᵀ)² W2ᵀ`` with both products in FP8 and a bf16 backward (records #84, #89); the
    reference, the same quantization in plain PyTorch, is :func:`speedrun.model.fp8_mlp.fp8_mlp_reference`.

    x (..., C) float (bf16 in training), quantized per tensor with amax/448 at every call; w1 (F, C) and
    w2 (C, F) the parameters (only their gradients and dtypes are used, and w2 itself without ``w2_fp8``);
    ``w1_fp8`` = (w1 (F, C) e4m3, its scale () fp32, w1 (F, C) bf16) and ``w2_fp8`` = (w2 (C, F) e4m3, scale,
    w2 (C, F) bf16), the FP8 weight caches' operands (:class:`speedrun.model.fp8.FP8WeightCache`);
    ``post_scale`` () fp32, the delayed scale of post = relu(pre)² (speedrun.model.fp8_mlp). The up projection
    runs in the Triton kernel (:func:`relu_square_matmul_fp8`, e4m3 tensor-core products, fp32
    accumulation), which writes post in bf16 for the backward and in e4m3 for the down projection
    ``torch._scaled_mm(post8, w2_8ᵀ)`` (row-major post8, column-major w2_8ᵀ of the row-major (C, F) cache:
    the layout cuBLAS accepts on Hopper, fast accumulation). With ``down_fp8`` False (records #84-#88) the
    kernel writes post alone (:func:`relu_square_matmul_fp8_up`) and the down product is ``post W2ᵀ`` in
    bf16 from ``w2_fp8[2]``, or from w2 cast to bf16 when ``w2_fp8`` is None; ``post_scale`` is unused (may be
    None). Backward as :func:`relu_square_mlp` in bf16 from x, post and the bf16 weights. ``persistent``
    (default False; only with ``down_fp8`` False) runs the up projection and the backward's g_pre in the
    persistent TMA kernels (:func:`relu_square_matmul_fp8_up_persistent`, :func:`relu_square_grad_persistent`)
    instead of one program per tile: the same values (see the module docstring).

    Returns (out (..., C) bf16, amax () fp32 = max(post)): the caller derives the next post_scale from it;
    with ``down_fp8`` False (out, None). On CUDA, C and F must be multiples of 16. Raises
    :class:`SpeedrunError` as :func:`relu_square_matmul_fp8`, when ``down_fp8`` lacks ``w2_fp8`` or
    ``post_scale``, and when ``persistent`` comes with ``down_fp8`` (no persistent kernel writes post8).
    """
    require(x.size(-1) == w1.size(1) and w2.shape == w1.shape[::-1],
           f"relu_square_mlp_fp8: x {tuple(x.shape)} (..., C), w1 {tuple(w1.shape)} (F, C) and w2 "
           f"{tuple(w2.shape)} (C, F) do not chain")
    require(not down_fp8 or (w2_fp8 is not None and post_scale is not None),
           "relu_square_mlp_fp8: the FP8 down product (down_fp8) needs w2_fp8 and post_scale")
    require(not (persistent and down_fp8),
           "relu_square_mlp_fp8: the persistent kernels (persistent) serve the bf16 down product only "
           "(down_fp8 False)")
    x2d = x.reshape(-1, x.size(-1))
    if not down_fp8:
        w2_back = w2.to(torch.bfloat16) if w2_fp8 is None else w2_fp8[2]
        out = _ReluSquareMLPFP8.apply(x2d, w1, w2, *w1_fp8, None, None, w2_back, None, False, persistent)
        return out.reshape(*x.shape[:-1], w2.size(0)), None
    out, amax = _ReluSquareMLPFP8.apply(x2d, w1, w2, *w1_fp8, *w2_fp8, post_scale, True)
    return out.reshape(*x.shape[:-1], w2.size(0)), amax
