"""Softcapped cross-entropy over (T, V) logits in one Triton kernel: the loss and its gradient together.

Source: the public speedrun's fused softcapped cross-entropy kernels (records #60, #75, #79; speedrun-spec.md
2.5), which compute dL/dz in the forward pass so that the (T, V) logits are read once more and never stored
in fp32. The pure-PyTorch reference is :func:`speedrun.model.loss.softcapped_cross_entropy` on a CPU (the
same function; it dispatches here on CUDA).

For row t with raw logits z (V,) and target j: y = softcap(z) (none, ``c·tanh(z/c)`` or the shifted
sigmoid ``c·sigmoid((z+5)/7.5)``, record #54), ``loss_t = logsumexp(y) - y_j`` (fp32), and with
``with_grad`` ``grad_t = (softmax(y) - onehot(j)) · dy/dz · grad_mul`` written in the logits' dtype or in
float8 e5m2.

Weighted targets (the records' training loss, records #53 and #88; speedrun-spec.md 2.5): with ``weights``
(T, J) and ``targets`` (T, J) (:func:`speedrun.model.loss.loss_terms`: the next K tokens and the prefix
token of each position, weight 0 for a dropped term), ``loss_t = Σ_j w_tj (lse - y_tj)`` and
``grad_t = (Σ_j w_tj · softmax(y) - Σ_j w_tj · onehot(target_tj)) · dy/dz · grad_mul / norm``, still in one
pass: as the records' CUDA kernel (record #88's ``ce_fwd_bwd_kernel``), the gradient sweep writes the dense
part ``Σ_j w_tj · softmax(y)`` and then, after a barrier, patches the J target columns of the row (J is a
compile-time constant, 1 to 4 in the records); until 2026-12-06 every column was compared with the J targets
in the sweep, 3·J more operations per element. The weights are read from memory, so a compiled graph serves every
value of the record's per-step weight schedule; ``norm`` (a 0-d tensor, the FP8 head's Σ_j |w_tj| bound)
keeps the e5m2 gradient in range.

One program per row, two sweeps over it in blocks of ``BLOCK`` columns (autotuned): the first sums
exp(y - m), the second writes the gradient (the row, 100 KB in bf16 at V = 50304, is still in L2 by then).
With a softcap the logits are bounded above by c, so m = c and the sum needs no running maximum; without one
the first sweep keeps a running maximum (online softmax, Milakov & Gimelshein 2018). Per row the HBM traffic
is one read of the logits and one write of the gradient.

The one-sweep variant (``one_sweep=True``; softcapped rows only, V <= 65536): record #88's
``ce_fwd_bwd_kernel`` keeps the row on chip (its capped values in shared memory, bf16) and runs its
exponential passes from there: one cap and two exponentials per column, one read of the logits. Ours keeps
in registers, per column, ``q = exp(y - c) · dy/dz`` (two bf16 per 32-bit register for an e5m2 gradient,
fp32 otherwise): one read, one cap and one exponential per column (the two-sweep kernel: two reads,
two caps, two exponentials), the exponent and the cap's slope folded into fused multiply-adds of the cap's
tanh or sigmoid (:func:`_exp_and_slope`). The row is split into fixed pieces of CHUNK columns, unrolled at
compile time (V is a compile-time constant there). Offline sm_90 compile (Triton 3.6, V = 50304, shifted
sigmoid, e5m2, four weighted terms): 128 registers with 8 warps and no spill, two programs per SM; see
``_ONE_SWEEP_CONFIGS``. The bf16 kept value adds at most 2⁻⁸ relative before the e5m2 rounding (2 mantissa
bits, half a step 2⁻³): at most one e5m2 step from the two-sweep kernel's value.

The exponentials and divisions of the softcap and the softmax, not memory, bound it: constants are folded
into multiplies and the sigmoid's division is the fast one. With an e5m2 gradient (the FP8 head, whose
logits come from e4m3 operands with 2⁻⁴ relative precision) both caps come from the special-function
unit's ``tanh.approx.f32`` (relative error about 2⁻¹¹; the sigmoid as (1 + tanh(u/2)) / 2): one operation
instead of an exponential and a division (on the H200, tanh cap: the losses moved by at most 1e-4 nats,
0.004% of the e5m2 gradient's elements by one step); the bf16 and fp32 gradients keep the exact form.

Speed (H200, torch 2.11, Triton 3.6, T = 49,152, V = 50,304, bf16 logits, tanh cap;
``benchmarks/softcapped_ce.py``, docs/benchmarks.md, seventh session): the loss alone 2.15 ms; with a bf16
gradient 4.9 ms (about 15 ms for the three kernels Inductor made of the compiled softcap, log-softmax and
their backward); with an e5m2 gradient and the transposed copy the FP8 head's backward needs 5.2 ms (the
copy 2.0 ms; 6.7 ms with the exact tanh). A tile kernel that wrote both layouts of the e5m2 gradient at once
(logsumexp first, then 64 x 64 tiles with a transposed store) took 6.1 ms, so it was not kept.

torch.compile: the kernel is the operator ``speedrun::softcapped_cross_entropy`` made with
``torch.library.triton_op`` + ``wrap_triton``, so Dynamo and Inductor trace through it; its one-sweep path
calls the opaque operator ``speedrun::softcapped_cross_entropy_one_sweep``, which Inductor runs as it is
(so that the configs' register cap, ``maxnreg``, reaches the compiler). On a CPU it runs
only under Triton's interpreter (``TRITON_INTERPRET=1``), which the tests use (there the approximate tanh
is the exact one, and bf16 pairs are packed with integer operations: the interpreter cannot run PTX).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from speedrun.kernels import require

SOFTCAP_KINDS = {None: 0, "tanh": 1, "shifted_sigmoid": 2}
# Columns per block and warps per row: autotuned per (V, kind, gradient) on the GPU. On the H200 (V = 50304,
# T = 49152, bf16, tanh cap) BLOCK 4096 with 8 warps took 5.6 ms per call (2026-11-30, before autotuning).
_CONFIGS = [triton.Config({"BLOCK": block}, num_warps=warps)
            for block, warps in ((2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16))]


@triton.constexpr_function
def _interpreting():
    """Whether kernels run in Triton's interpreter (``TRITON_INTERPRET=1``), which cannot run inline PTX."""
    return bool(triton.knobs.runtime.interpret)


@triton.jit
def _sigmoid(x):
    """1 / (1 + exp(-x)) with the fast division (``div.full.f32``, 2 ulp): two special-function operations
    where ``tl.sigmoid``'s IEEE division costs several more (the kernel is bound by them, not by memory)."""
    return tl.fdiv(1.0, 1.0 + tl.exp(-x))


@triton.jit
def _tanh_approx(x):
    """tanh(x) in one special-function operation (PTX ``tanh.approx.f32``, sm_75 and later; relative error
    about 2⁻¹¹). Triton's interpreter cannot run inline PTX: there the exact 2·sigmoid(2x) - 1, so that the
    e5m2 path's arithmetic runs on a CPU too."""
    if _interpreting():
        result = 2.0 * _sigmoid(2.0 * x) - 1.0
    else:
        result = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                           is_pure=True, pack=1)
    return result


@triton.jit
def _capped(z, cap: tl.constexpr, KIND: tl.constexpr, FAST: tl.constexpr):
    """softcap(z) in fp32 (KIND 0: none, 1: tanh, 2: shifted sigmoid); constants folded into multiplies.
    ``FAST``: both caps through :func:`_tanh_approx`."""
    if KIND == 1:
        if FAST:
            return cap * _tanh_approx(z * (1.0 / cap))
        return cap * (2.0 * _sigmoid(z * (2.0 / cap)) - 1.0)          # c·tanh(z/c)
    elif KIND == 2:
        if FAST:
            return cap * (0.5 + 0.5 * _tanh_approx((z + 5.0) * (0.5 / 7.5)))   # sigmoid(u) = (1 + tanh(u/2)) / 2
        return cap * _sigmoid((z + 5.0) * (1.0 / 7.5))
    else:
        return z


@triton.jit
def _cap_derivative(y, cap: tl.constexpr, KIND: tl.constexpr):
    """dy/dz from the capped value y: 1 - (y/c)² (tanh), y (c - y) / (7.5 c) (shifted sigmoid), 1 (none)."""
    if KIND == 1:
        r = y * (1.0 / cap)
        return 1.0 - r * r
    elif KIND == 2:
        return y * (cap - y) * (1.0 / (7.5 * cap))
    else:
        return tl.full(y.shape, 1.0, tl.float32)


@triton.jit
def _row_logsumexp_online(row_ptr, V, BLOCK: tl.constexpr):
    """logsumexp of the raw logits of one row, with a running maximum per lane (online softmax)."""
    offsets = tl.arange(0, BLOCK)
    m_lane = tl.full((BLOCK,), -float("inf"), tl.float32)
    sum_lane = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + offsets
        z = tl.load(row_ptr + cols, mask=cols < V, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m_lane, z)
        base = tl.where(m_new == -float("inf"), 0.0, m_new)          # lanes past V stay at -inf
        sum_lane = sum_lane * tl.exp(m_lane - base) + tl.exp(z - base)
        m_lane = m_new
    m = tl.max(m_lane, axis=0)
    return m + tl.log(tl.sum(sum_lane * tl.exp(m_lane - m), axis=0))


@triton.jit
def _row_logsumexp_capped(row_ptr, V, cap: tl.constexpr, KIND: tl.constexpr, FAST: tl.constexpr,
                          BLOCK: tl.constexpr):
    """logsumexp of the capped logits of one row; they are at most ``cap``, which serves as the maximum."""
    offsets = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + offsets
        z = tl.load(row_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)
        acc += tl.where(cols < V, tl.exp(_capped(z, cap, KIND, FAST) - cap), 0.0)
    return cap + tl.log(tl.sum(acc, axis=0))


@triton.autotune(configs=_CONFIGS, key=["V", "KIND", "WITH_GRAD", "E5M2", "FAST", "TERMS", "WEIGHTED", "NORMED"])
@triton.jit
def _softcapped_ce_kernel(logits_ptr, targets_ptr, weights_ptr, norm_ptr, losses_ptr, grad_ptr, V, stride_row,
                          grad_stride_row, cap: tl.constexpr, grad_mul: tl.constexpr, KIND: tl.constexpr,
                          WITH_GRAD: tl.constexpr, E5M2: tl.constexpr, FAST: tl.constexpr, TERMS: tl.constexpr,
                          WEIGHTED: tl.constexpr, NORMED: tl.constexpr, BLOCK: tl.constexpr):
    """Row ``program_id``: loss into losses_ptr[row], and (WITH_GRAD) the gradient row into grad_ptr. ``cap``
    and ``grad_mul`` are compile-time constants (fixed for a run; a runtime float would reach the kernel as
    fp64 under Inductor). ``FAST``: the approximate tanh (set with an e5m2 gradient). ``WEIGHTED``: TERMS
    targets per row (targets_ptr, weights_ptr: (T, TERMS) row-major), else one target per row and weight 1.
    ``NORMED``: the gradient divided by norm_ptr[0] as well."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    offsets = tl.arange(0, BLOCK)
    if KIND == 0:
        lse = _row_logsumexp_online(row_ptr, V, BLOCK)
    else:
        lse = _row_logsumexp_capped(row_ptr, V, cap, KIND, FAST, BLOCK)
    if WEIGHTED:
        total = _store_weighted_loss(row, row_ptr, targets_ptr, weights_ptr, losses_ptr, lse, cap, KIND, FAST,
                                     TERMS)                            # Σ_j w_j: the softmax's weight
    else:
        target = tl.load(targets_ptr + row)
        y_target = _capped(tl.load(row_ptr + target).to(tl.float32), cap, KIND, FAST)
        tl.store(losses_ptr + row, lse - y_target)
    if WITH_GRAD:
        mul = grad_mul
        if NORMED:
            mul = grad_mul / tl.load(norm_ptr)
        grad_row = grad_ptr + row * grad_stride_row
        for start in range(0, V, BLOCK):
            cols = start + offsets
            z = tl.load(row_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)
            y = _capped(z, cap, KIND, FAST)
            if WEIGHTED:
                d = total * tl.exp(y - lse)                            # the target columns patched below
            else:
                d = tl.exp(y - lse) - tl.where(cols == target, 1.0, 0.0)
            _store_grad(grad_row + cols, d * _cap_derivative(y, cap, KIND) * mul, cols < V, E5M2)
        if WEIGHTED:
            _patch_target_columns(row, row_ptr, grad_row, targets_ptr, weights_ptr, lse, total, mul, cap, KIND,
                                  FAST, TERMS, True, E5M2)


@triton.jit
def _store_weighted_loss(row, row_ptr, targets_ptr, weights_ptr, losses_ptr, lse, cap: tl.constexpr,
                         KIND: tl.constexpr, FAST: tl.constexpr, TERMS: tl.constexpr):
    """losses_ptr[row] = Σ_j w_j (lse - y_{target_j}) over the row's TERMS targets and weights (row-major
    (T, TERMS) at targets_ptr, weights_ptr), the capped target logits read again from the row; returns
    Σ_j w_j, the weight of the row's softmax in its gradient."""
    loss = 0.0
    total = 0.0
    for j in tl.static_range(TERMS):
        target_j = tl.load(targets_ptr + row * TERMS + j)
        weight_j = tl.load(weights_ptr + row * TERMS + j)
        loss += weight_j * (lse - _capped(tl.load(row_ptr + target_j).to(tl.float32), cap, KIND, FAST))
        total += weight_j
    tl.store(losses_ptr + row, loss)
    return total


@triton.jit
def _patch_target_columns(row, row_ptr, grad_row, targets_ptr, weights_ptr, lse, total, mul, cap: tl.constexpr,
                          KIND: tl.constexpr, FAST: tl.constexpr, TERMS: tl.constexpr, WEIGHTED: tl.constexpr,
                          E5M2: tl.constexpr):
    """The gradient at the row's target columns, after every thread's dense store of ``total · softmax``
    (bar.sync orders the CTA's global stores): ``(total · softmax - Σ_{k: target_k = column} w_k) · dy/dz ·
    mul`` there; a column that several terms name gets the same value from each. ``WEIGHTED``: TERMS targets
    and weights per row, else the row's one target (targets_ptr[row]) with weight 1."""
    tl.debug_barrier()
    for j in tl.static_range(TERMS):
        if WEIGHTED:
            target_j = tl.load(targets_ptr + row * TERMS + j)
            hits = 0.0
            for k in tl.static_range(TERMS):
                hits += tl.where(tl.load(targets_ptr + row * TERMS + k) == target_j,
                                 tl.load(weights_ptr + row * TERMS + k), 0.0)
        else:
            target_j = tl.load(targets_ptr + row)
            hits = 1.0
        y_j = _capped(tl.load(row_ptr + target_j).to(tl.float32), cap, KIND, FAST)
        d_j = (total * tl.exp(y_j - lse) - hits) * _cap_derivative(y_j, cap, KIND) * mul
        _store_grad(grad_row + target_j, d_j, True, E5M2)


@triton.jit
def _store_grad(ptrs, d, mask, E5M2: tl.constexpr):
    """Store the fp32 gradient ``d`` at ``ptrs`` in their dtype: float8 e5m2 rounded to nearest even, else a
    plain cast."""
    if E5M2:
        tl.store(ptrs, d.to(tl.float8e5, fp_downcast_rounding="rtne"), mask=mask)
    else:
        tl.store(ptrs, d.to(ptrs.dtype.element_ty), mask=mask)


# The one-sweep variant (softcapped kinds): the row's columns in pieces of CHUNK held in registers, the last
# piece the next power of two of what is left (masked when that is more). Autotuned per (V, kind, gradient,
# ...) among the configs of its kept dtype. Offline sm_90 compile (Triton 3.6 and the ptxas of its wheel,
# V = 50304, bf16 logits; 1 KB of shared memory each, the reductions'), registers / spilled bytes / programs
# per SM, for the shifted sigmoid with four weighted terms and the tanh with one target:
#   bf16 kept (e5m2 gradient, approximate tanh):
#     CHUNK 2048, 8 warps, maxnreg 128: 128 / 0 / 2      CHUNK 1024, 8 warps, maxnreg 128: 128 / 0 / 2
#     CHUNK 1024, 16 warps, maxnreg 64: 64 / 24 and 0 / 2    CHUNK 2048, 16 warps: 127 and 117 / 0 / 1
#     CHUNK 4096, 32 warps: 57 and 52 / 0 / 1
#   fp32 kept (bf16 gradient, exact caps):
#     CHUNK 2048, 32 warps: 64 / 24 and 0 / 1            CHUNK 8192, 32 warps: 64 / 40 and 0 / 1
#     CHUNK 4096, 16 warps: 128 / 160 / 1
# (without maxnreg ptxas gives CHUNK 2048 with 8 warps 254 registers: one program per SM). maxnreg reaches
# the compiler because the kernel is launched by Triton's autotuner inside an opaque operator
# (:func:`_one_sweep`); Inductor's launcher of a user kernel drops it. ONE_SWEEP_MAX_VOCAB: the longest row
# taken (checked at 50304 only: a longer row needs more registers per thread and may spill).
_ONE_SWEEP_CONFIGS = {
    True: [triton.Config({"CHUNK": chunk}, num_warps=warps, maxnreg=maxnreg)
           for chunk, warps, maxnreg in ((2048, 8, 128), (1024, 8, 128), (1024, 16, 64), (2048, 16, None),
                                         (4096, 32, None))],
    False: [triton.Config({"CHUNK": chunk}, num_warps=warps) for chunk, warps in ((2048, 32), (8192, 32), (4096, 16))],
}
ONE_SWEEP_MAX_VOCAB = 65536
_LOG2E = 1.4426950408889634


@triton.constexpr_function
def _piece_count(V, CHUNK):
    """Pieces the one-sweep kernel splits a row of V columns into: the full chunks, and one for the rest."""
    return -(-V // CHUNK)


@triton.constexpr_function
def _piece_size(V, CHUNK, i):
    """Columns of piece ``i``: CHUNK, or for the last piece the next power of two of the columns left (at
    least 16: bf16 pairs need an even count)."""
    left = V - i * CHUNK
    return CHUNK if left >= CHUNK else max(triton.next_power_of_2(left), 16)


@triton.constexpr_function
def _exp_scale(cap, KIND, FAST):
    """A with e = exp(y - cap) = 2^(A·(s - 1)) for the s of :func:`_exp_and_slope`: y - cap = c·(t - 1)
    (tanh), c·(t - 1)/2 (shifted sigmoid through tanh), 2c·(σ - 1) (tanh through σ), c·(σ - 1) (shifted
    sigmoid)."""
    factor = {(1, True): 1.0, (2, True): 0.5, (1, False): 2.0, (2, False): 1.0}[(KIND, bool(FAST))]
    return factor * cap * _LOG2E


@triton.constexpr_function
def _slope_scale(cap, KIND, FAST):
    """dy/dz over the w of :func:`_exp_and_slope`: 1 - t² (tanh), c/30 · (1 - t²) (shifted sigmoid through
    tanh: σ(u)(1 - σ(u)) = (1 - tanh²(u/2)) / 4), 4 σ(1 - σ) (tanh through σ), c/7.5 · σ(1 - σ) (shifted
    sigmoid)."""
    return {(1, True): 1.0, (2, True): cap / 30.0, (1, False): 4.0, (2, False): cap / 7.5}[(KIND, bool(FAST))]


@triton.constexpr_function
def _normal_exponentials(cap, KIND):
    """Whether every exp(y - cap) is a normal fp32 number: y - cap >= -2c (tanh) or -c (shifted sigmoid), so
    for c up to 43 (tanh) or 87 (shifted sigmoid)."""
    return (2.0 if KIND == 1 else 1.0) * cap * _LOG2E < 126.0


@triton.jit
def _exp2(x, FTZ: tl.constexpr):
    """2^x: with ``FTZ`` PTX ``ex2.approx.ftz.f32`` (one special-function operation; ``tl.exp2`` adds three
    operations for subnormal results, needless where none can occur: :func:`_normal_exponentials`), else and
    in the interpreter ``tl.exp2``."""
    if FTZ and not _interpreting():
        result = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                           is_pure=True, pack=1)
    else:
        result = tl.exp2(x)
    return result


@triton.jit
def _exp_and_slope(z, cap: tl.constexpr, KIND: tl.constexpr, FAST: tl.constexpr):
    """From raw logits z (fp32), the softcap (KIND 1 tanh, 2 shifted sigmoid) folded for the one-sweep
    kernel: ``(e, w)`` with e = exp(y - cap) (y = softcap(z)) and w = dy/dz / :func:`_slope_scale`. Through
    s = tanh of the cap's argument (FAST, :func:`_tanh_approx`: the cap as in :func:`_capped`) or σ of it
    (exact): e = 2^(A·s - A) and w = 1 - s² or s - s², a fused multiply-add each instead of :func:`_capped`,
    ``y - cap``, ``tl.exp`` and :func:`_cap_derivative`'s several operations."""
    if FAST:
        if KIND == 1:
            s = _tanh_approx(z * (1.0 / cap))
        else:
            s = _tanh_approx(z * (0.5 / 7.5) + (2.5 / 7.5))
        w = 1.0 - s * s
    else:
        if KIND == 1:
            s = _sigmoid(z * (2.0 / cap))
        else:
            s = _sigmoid(z * (1.0 / 7.5) + (5.0 / 7.5))
        w = s - s * s
    scale: tl.constexpr = _exp_scale(cap, KIND, FAST)
    return _exp2(s * scale - scale, _normal_exponentials(cap, KIND)), w


@triton.jit
def _pack_bf16_pairs(x):
    """(N,) fp32 -> (N/2,) uint32: neighbouring values rounded to bf16 (to nearest even) and packed two per
    32-bit word (the even column in the low half), so that a kept value takes half a register. One PTX
    ``cvt.rn.bf16x2.f32`` per pair, opaque to LLVM: from a bf16 tensor, or pairs packed with integer
    operations, LLVM makes one 32-bit register per value again (the row then spills). The interpreter rounds
    with integer operations instead (finite values)."""
    low, high = tl.split(tl.reshape(x, (x.shape[0] // 2, 2)))
    if _interpreting():
        low = low.to(tl.uint32, bitcast=True)
        high = high.to(tl.uint32, bitcast=True)
        low = (low + 0x7FFF + ((low >> 16) & 1)) >> 16
        high = (high + 0x7FFF + ((high >> 16) & 1)) >> 16
        packed = low | (high << 16)
    else:
        packed = tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", [low, high],
                                           dtype=tl.uint32, is_pure=True, pack=1)
    return packed


@triton.jit
def _kept_values(kept, KEEP_BF16: tl.constexpr):
    """The fp32 values of a kept piece: unpacked (:func:`_pack_bf16_pairs`) with ``KEEP_BF16``, else itself."""
    values = kept
    if KEEP_BF16:
        low = (kept << 16).to(tl.float32, bitcast=True)
        high = ((kept >> 16) << 16).to(tl.float32, bitcast=True)
        values = tl.reshape(tl.join(low, high), (kept.shape[0] * 2,))
    return values


@triton.jit
def _softcapped_ce_one_sweep_kernel(logits_ptr, targets_ptr, weights_ptr, norm_ptr, losses_ptr, grad_ptr,
                                    stride_row, grad_stride_row, V: tl.constexpr, cap: tl.constexpr,
                                    grad_mul: tl.constexpr, KIND: tl.constexpr, WITH_GRAD: tl.constexpr,
                                    E5M2: tl.constexpr, FAST: tl.constexpr, TERMS: tl.constexpr,
                                    WEIGHTED: tl.constexpr, NORMED: tl.constexpr, KEEP_BF16: tl.constexpr,
                                    CHUNK: tl.constexpr):
    """:func:`_softcapped_ce_kernel` for a softcapped row (KIND 1 or 2) in one sweep over its logits, with
    the row kept on chip as record #88's ``ce_fwd_bwd_kernel`` keeps it (there: the capped values in shared
    memory, read by two exponential passes). Per column, once: ``e = exp(y - cap)`` (the softcap bounds y
    by cap, the sum's maximum) and ``q = e · dy/dz`` (:func:`_exp_and_slope`); q stays in registers (two bf16
    per 32-bit word with ``KEEP_BF16``, else fp32) while Σ e completes. Then ``lse = cap + log Σ e``, the
    losses as in the two-sweep kernel, the dense gradient ``q · total · mul / Σ e`` (softmax · dy/dz;
    total = Σ_j w_j, or 1) from the registers, and the target columns patched
    (:func:`_patch_target_columns`, also for one unweighted target). V (the row's length) is a compile-time
    constant: it fixes the pieces. One read of the logits, one cap and one exponential per column."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    acc = tl.zeros((CHUNK,), dtype=tl.float32)                      # Σ e per lane over the full pieces
    rest = 0.0                                                       # Σ e of a last piece shorter than CHUNK
    kept = ()
    for i in tl.static_range(_piece_count(V, CHUNK)):
        cols = i * CHUNK + tl.arange(0, _piece_size(V, CHUNK, i))
        if i * CHUNK + _piece_size(V, CHUNK, i) <= V:                 # no column past V
            e, w = _exp_and_slope(tl.load(row_ptr + cols).to(tl.float32), cap, KIND, FAST)
        else:
            e, w = _exp_and_slope(tl.load(row_ptr + cols, mask=cols < V, other=0.0).to(tl.float32), cap, KIND,
                                  FAST)
            e = tl.where(cols < V, e, 0.0)
        if _piece_size(V, CHUNK, i) == CHUNK:
            acc += e
        else:
            rest = tl.sum(e, axis=0)
        if WITH_GRAD:
            q = e * w
            if KEEP_BF16:
                q = _pack_bf16_pairs(q)
            kept = kept + (q,)
    total_exp = tl.sum(acc, axis=0) + rest
    lse = cap + tl.log(total_exp)
    if WEIGHTED:
        total = _store_weighted_loss(row, row_ptr, targets_ptr, weights_ptr, losses_ptr, lse, cap, KIND, FAST,
                                     TERMS)
    else:
        total = 1.0
        y_target = _capped(tl.load(row_ptr + tl.load(targets_ptr + row)).to(tl.float32), cap, KIND, FAST)
        tl.store(losses_ptr + row, lse - y_target)
    if WITH_GRAD:
        mul = grad_mul
        if NORMED:
            mul = grad_mul / tl.load(norm_ptr)
        slope: tl.constexpr = _slope_scale(cap, KIND, FAST)
        scale = total * (mul * slope) / total_exp                      # softmax = e / Σ e
        grad_row = grad_ptr + row * grad_stride_row
        for i in tl.static_range(_piece_count(V, CHUNK)):
            cols = i * CHUNK + tl.arange(0, _piece_size(V, CHUNK, i))
            if i * CHUNK + _piece_size(V, CHUNK, i) <= V:
                _store_grad(grad_row + cols, _kept_values(kept[i], KEEP_BF16) * scale, None, E5M2)
            else:
                _store_grad(grad_row + cols, _kept_values(kept[i], KEEP_BF16) * scale, cols < V, E5M2)
        _patch_target_columns(row, row_ptr, grad_row, targets_ptr, weights_ptr, lse, total, mul, cap, KIND, FAST,
                              TERMS, WEIGHTED, E5M2)


# The one-sweep kernel autotuned among the configs of each kept dtype: KEEP_BF16 -> autotuner.
_ONE_SWEEP_KEY = ["V", "KIND", "WITH_GRAD", "E5M2", "FAST", "TERMS", "WEIGHTED", "NORMED", "KEEP_BF16"]
_one_sweep_kernels = {keep: triton.autotune(configs=configs, key=_ONE_SWEEP_KEY)(_softcapped_ce_one_sweep_kernel)
                      for keep, configs in _ONE_SWEEP_CONFIGS.items()}


@torch.library.custom_op("speedrun::softcapped_cross_entropy_one_sweep", mutates_args=())
def _one_sweep(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None,
               norm: torch.Tensor | None, cap: float, kind: int, with_grad: bool, grad_mul: float,
               e5m2_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(losses, grad)`` of :func:`softcapped_cross_entropy_kernel` with ``one_sweep`` from its checked
    inputs: logits (T, V), T >= 1, V <= ONE_SWEEP_MAX_VOCAB, unit stride along V; targets (T,) or (T, J)
    int64 and weights None or (T, J) fp32, both contiguous; norm None or (1,) fp32; kind 1 or 2. An opaque
    operator, not a triton_op: Inductor would launch the kernel itself and drop the configs' ``maxnreg``
    (torch 2.11), which keeps 8 warps at 128 registers, two programs per SM. The kept values are bf16 with
    an e5m2 gradient, fp32 otherwise."""
    rows, vocab = logits.shape
    losses, grad = _outputs(logits, with_grad, e5m2_grad)
    keep_bf16 = with_grad and e5m2_grad
    _one_sweep_kernels[keep_bf16][(rows,)](
        logits, targets, losses if weights is None else weights, losses if norm is None else norm, losses, grad,
        logits.stride(0), grad.stride(0) if with_grad else 0, vocab, cap, grad_mul, KIND=kind, WITH_GRAD=with_grad,
        E5M2=e5m2_grad, FAST=e5m2_grad and with_grad, TERMS=1 if weights is None else weights.size(1),
        WEIGHTED=weights is not None, NORMED=norm is not None, KEEP_BF16=keep_bf16)
    return losses, grad


@_one_sweep.register_fake
def _(logits, targets, weights, norm, cap, kind, with_grad, grad_mul, e5m2_grad):
    return _outputs(logits, with_grad, e5m2_grad)


def _outputs(logits: torch.Tensor, with_grad: bool, e5m2_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty ``(losses (T,) fp32, grad)`` for logits (T, V): grad (T, V) in e5m2 or the logits' dtype, or (0,)
    without ``with_grad`` (the kernels' outputs, as :func:`softcapped_cross_entropy_kernel` gives them)."""
    grad_dtype = torch.float8_e5m2 if e5m2_grad else logits.dtype
    return (logits.new_empty(logits.size(0), dtype=torch.float32),
            logits.new_empty(tuple(logits.shape) if with_grad else (0,), dtype=grad_dtype))


@triton_op("speedrun::softcapped_cross_entropy", mutates_args={})
def softcapped_cross_entropy_kernel(logits: torch.Tensor, targets: torch.Tensor, cap: float, kind: int,
                                    with_grad: bool, grad_mul: float, e5m2_grad: bool = False,
                                    weights: torch.Tensor | None = None, grad_norm: torch.Tensor | None = None,
                                    one_sweep: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(losses (T,) fp32, grad)`` of the softcapped cross-entropy of ``logits`` (T, V) (bf16, fp16 or
    fp32, unit stride along V) against ``targets`` (T,) int64 in 0..V-1. ``kind``: 0 none (``cap``
    unused), 1 tanh, 2 shifted sigmoid (:data:`SOFTCAP_KINDS`); ``grad``: (T, V), dL_t/dz_t · grad_mul, in
    the logits' dtype, or in float8 e5m2 with ``e5m2_grad`` (CUDA; for the FP8 head's backward products:
    ``grad_mul`` must then keep |grad| within e5m2's range, 57344; the tanh cap and so the losses of that
    call are then approximate, see the module docstring), or an empty (0,) tensor without ``with_grad``.
    ``weights``: None, or (T, J) float (J >= 1) with ``targets`` (T, J): the weighted loss of the module
    docstring (records #53, #88). ``grad_norm``: None or a 0-d float tensor the gradient is divided by.
    ``one_sweep``: with a softcap (kind 1 or 2) the one-sweep kernel, which reads each row once and computes
    one cap and one exponential per column, keeping the row in registers (record #88's ``ce_fwd_bwd_kernel``
    keeps it on chip, in shared memory): V at most :data:`ONE_SWEEP_MAX_VOCAB`; the same losses (fp32) and
    gradient to fp32 rounding as the two-sweep kernel's, except that with ``e5m2_grad`` the kept values are
    bf16 (2⁻⁸ relative before the e5m2 rounding: at most one e5m2 step from the two-sweep kernel's). Without
    a softcap (kind 0) the two-sweep kernel runs either way.

    Raises :class:`SpeedrunError` on a bad shape, stride or kind, inputs on different devices, or with
    ``one_sweep`` and a softcap a vocabulary above :data:`ONE_SWEEP_MAX_VOCAB`."""
    require(logits.dim() == 2 and logits.stride(1) == 1,
           f"softcapped_cross_entropy: logits must be (T, V) with unit stride along V, got shape "
           f"{tuple(logits.shape)}, strides {logits.stride()}")
    rows, vocab = logits.shape
    want = (rows,) if weights is None else (rows, weights.size(-1))
    require(targets.shape == want and targets.device == logits.device,
           f"softcapped_cross_entropy: targets must be {want} on {logits.device}, got "
           f"{tuple(targets.shape)} on {targets.device}")
    require(weights is None or (weights.dim() == 2 and weights.size(1) >= 1 and weights.device == logits.device),
           f"softcapped_cross_entropy: weights must be (T, J), J >= 1, on {logits.device}, got "
           f"{None if weights is None else (tuple(weights.shape), weights.device)}")
    require(grad_norm is None or (grad_norm.numel() == 1 and grad_norm.device == logits.device),
           "softcapped_cross_entropy: grad_norm must be one number on the logits' device")
    require(kind in (0, 1, 2), f"softcapped_cross_entropy: kind must be 0, 1 or 2, got {kind}")
    one_sweep = one_sweep and kind != 0
    require(not one_sweep or vocab <= ONE_SWEEP_MAX_VOCAB,
            lambda: f"softcapped_cross_entropy: the one-sweep kernel keeps a row on chip, at most "
                    f"{ONE_SWEEP_MAX_VOCAB} columns; got V = {vocab}")
    targets = targets.contiguous()                                   # the kernels index it as row-major
    if weights is not None:
        weights = weights.to(torch.float32).contiguous()
    norm = None if grad_norm is None else grad_norm.reshape(1).to(torch.float32)
    if one_sweep and rows > 0:
        return _one_sweep(logits, targets, weights, norm, float(cap), kind, with_grad, float(grad_mul), e5m2_grad)
    losses, grad = _outputs(logits, with_grad, e5m2_grad)
    if rows == 0:
        return losses, grad
    terms = 1 if weights is None else weights.size(1)
    norm = losses if norm is None else norm                                             # losses: unused
    wrap_triton(_softcapped_ce_kernel)[(rows,)](
        logits, targets, losses if weights is None else weights, norm, losses, grad, vocab, logits.stride(0),
        grad.stride(0) if with_grad else 0, float(cap), float(grad_mul), KIND=kind, WITH_GRAD=with_grad,
        E5M2=e5m2_grad, FAST=e5m2_grad and with_grad, TERMS=terms, WEIGHTED=weights is not None,
        NORMED=grad_norm is not None)
    return losses, grad
