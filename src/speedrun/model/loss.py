"""The LM head and the next-token cross-entropy, fused and computed in chunks of tokens.

``loss = mean_t CE(softcap(x_t Wᵀ), target_t)`` for hidden states x (T, C), head weight W (V, C). The softcap
is ``c * tanh(z / c)`` (``"tanh"``, records #9, #18) or ``c * sigmoid((z + 5) / 7.5)`` (``"shifted_sigmoid"``,
record #54 with c = 23: logits in (0, c), an asymmetric cap).

* ``"full"``: materializes the (T, V) logits and lets autograd differentiate ``F.cross_entropy``. Simple,
  the reference of the tests; on a CPU it pays for several passes over a (T, 50304) fp32 array.
* ``"fused"``: materializes the (T, V) logits in the compute dtype (bf16 in training) and computes the
  loss and dL/dz in one pass over them (:func:`softcapped_cross_entropy`: a Triton kernel on CUDA,
  :mod:`speedrun.kernels.softcapped_cross_entropy`; the same computation in PyTorch elsewhere), then the
  head's two gradient products in the backward pass; with ``fp8`` the gradient goes to e5m2 with a fixed
  scale from its known bound (records #60, #75, #79; the FP8 head of records #19, #51, #67). No fp32 logits.
* ``"fused_one_sweep"``: ``"fused"`` with the one-sweep Triton kernel on CUDA (``one_sweep`` of
  :func:`softcapped_cross_entropy`: with a softcap, each row of logits read once and kept on chip, one cap and
  one exponential per logit, as record #88's kernel keeps the row in shared memory); the same computation as
  ``"fused"`` elsewhere.
* ``"chunked"``: processes ``chunk_tokens`` tokens at a time in buffers that stay in cache, and computes the
  gradients with respect to x and W in the same pass (the public speedrun's fused CE kernels compute the
  gradient in the forward pass too, records #60, #75, #79). dL/dz = softmax(z) - onehot(target), times
  the softcap's derivative: 1 - (y/c)² for tanh, y (c - y) / (7.5 c) for the shifted sigmoid (y the capped
  logit). The matrix products run in ``compute_dtype`` (bf16 under autocast), the
  softmax and the sums in fp32 (fp64 when the products are fp64).

The per-token loss is -log softmax(z)_target; where that probability underflows (a loss above ~69 nats) it
is recomputed exactly with ``logsumexp``, so a diverging run still reports its true, finite loss.

Auxiliary targets (the records' training loss, speedrun-spec.md 2.5): every impl also takes the per-position
loss ``L_t = Σ_k w_k · CE(z_t, target_{t+k}) + w_p · CE(z_t, prefix_t)``, multi-token prediction with the
shared head (record #53, k = 0..K-1) plus prefix-token prediction (record #88, :mod:`speedrun.model.prefix`),
as J = K + 1 weighted targets per position (:func:`loss_terms`). The gradient is then
``dL_t/dy_t = (Σ_j w_tj) · softmax(y_t) - Σ_j w_tj · onehot(target_tj)``, computed in the same single pass
as the plain loss (the records' fused kernel does the same). One difference from the record's kernel: it
gives the softmax the weight of all K terms also at the last K-1 positions of a micro-batch, whose terms
past the end it drops from the loss, so its gradient there is not that of its loss; ours is (2 of >= 16,384
positions per micro-batch in HEAD's schedule).

Shape legend: T tokens, C model_dim, V vocab_size, c tokens per chunk.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from speedrun.model.config import SoftcapKind
from speedrun.model.fp8 import E5M2, E5M2_MAX, HEAD_SCALES, fp8_linear, quantize, scaled_mm, transposed

# The head's weight quantized once per optimizer step: (w8 (V, C) e4m3, w_scale () fp32, w8ᵀ (C, V) e4m3).
FP8Weight = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
# The weighted targets of every position (see loss_terms): (targets (T, J) int64, weights (T, J) float).
LossTerms = tuple[torch.Tensor, torch.Tensor]
_NO_WEIGHT = (None, None, None)
_TINY_PROB = 1e-30
SIGMOID_SHIFT = 5.0
SIGMOID_TEMPERATURE = 7.5


def softcap_logits(z: torch.Tensor, softcap: float | None, kind: SoftcapKind = "tanh") -> torch.Tensor:
    """The capped logits (same shape and dtype as ``z``): z itself for None, ``c * tanh(z / c)`` for
    ``"tanh"``, ``c * sigmoid((z + 5) / 7.5)`` for ``"shifted_sigmoid"`` (record #54, c = 23)."""
    if softcap is None:
        return z
    if kind == "tanh":
        return softcap * torch.tanh(z / softcap)
    if kind == "shifted_sigmoid":
        return softcap * torch.sigmoid((z + SIGMOID_SHIFT) / SIGMOID_TEMPERATURE)
    raise ValueError(f"unknown softcap kind {kind!r}; expected 'tanh' or 'shifted_sigmoid'")


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                         softcap: float | None = None, softcap_kind: SoftcapKind = "tanh",
                         impl: Literal["full", "chunked", "fused", "fused_one_sweep"] = "chunked",
                         chunk_tokens: int = 64, compute_dtype: torch.dtype | None = None,
                         fp8: bool = False, fp8_weight: FP8Weight | None = None,
                         mtp_weights: torch.Tensor | None = None, prefix_targets: torch.Tensor | None = None,
                         prefix_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy (nats per token; an fp32 scalar, fp64 for fp64 products) of the logits
    ``softcap(x @ weight.T)``.

    x: (T, C) float; weight: (V, C) float; targets: (T,) int64 in 0..V-1; softcap: None or c > 0, applied as
    ``softcap_kind`` (:func:`softcap_logits`); compute_dtype: dtype of the matrix products (default: x's dtype).
    fp8: the logits' product in FP8 with the head's fixed scales (:data:`speedrun.model.fp8.HEAD_SCALES`,
    records #19, #51, #67); the gradients' products in FP8 too with ``"full"``, in bf16 with ``"chunked"``
    (which computes them inside its own pass), in FP8 with ``"fused"`` (and ``"fused_one_sweep"``, the same
    with the one-sweep kernel on CUDA: ``one_sweep`` of :func:`softcapped_cross_entropy`). Differentiable in
    x and weight for every ``impl``. fp8_weight: None (``weight`` is quantized in this call) or, with ``fp8``,
    the head's weight already quantized with its fixed scale, ``(w8 (V, C) e4m3, w_scale () fp32, w8ᵀ (C, V)
    e4m3)`` (a fresh :class:`speedrun.model.fp8.FP8WeightCache` of ``weight`` with ``HEAD_SCALES``: once per
    optimizer step, issue 6); same values as without it.

    The records' training loss (speedrun-spec.md 2.5): with any of the last three arguments the loss is
    ``mean_t L_t``, ``L_t = Σ_k mtp_weights[k] · CE(z_t, targets[t+k]) + prefix_weight · CE(z_t,
    prefix_targets[t])`` over the T positions: multi-token prediction with the shared head (record #53;
    k = 0..K-1; a term whose t+k >= T, past the end of this micro-batch, is dropped; document boundaries
    are not looked at, as in the record) and prefix-token prediction (record #88; a position whose
    ``prefix_targets`` is -1 has no prefix term). mtp_weights: (K,) float tensor, K >= 1, or None (= [1.]);
    prefix_targets: (T,) int64 in -1..V-1 (:func:`speedrun.model.prefix.prefix_token_table` of
    ``targets``) and prefix_weight a 0-d (or (1,)) float tensor, both or neither. Tensors, not Python
    numbers, because the record's weights change every step: a compiled graph reads them as inputs. With
    K = 1, mtp_weights [1.] and prefix_weight 0 the value equals the plain mean next-token loss (bit for bit
    with ``"chunked"`` and ``"fused"``). Normalisation: the record's objective is ``grad_scale · Σ_t L_t``
    (a sum over the rank's tokens, grad_scale = 1 / accumulation steps); ours is the mean over the T
    positions, T times smaller; the gradient's direction is the same.

    Raises ``ValueError`` for an unknown ``impl``, a bad shape of the auxiliary inputs, or only one of
    prefix_targets and prefix_weight.
    """
    dtype = compute_dtype or x.dtype
    terms = None
    if mtp_weights is not None or prefix_targets is not None or prefix_weight is not None:
        terms = loss_terms(targets, mtp_weights, prefix_targets, prefix_weight, _accumulation_dtype(dtype))
    with torch.autocast(x.device.type, enabled=False):
        if impl == "full":
            logits = (fp8_linear(x, weight, HEAD_SCALES, operands=fp8_weight) if fp8
                      else F.linear(x.to(dtype), weight.to(dtype)))                             # (T, V)
            logits = softcap_logits(logits.to(_accumulation_dtype(dtype)), softcap, softcap_kind)
            if terms is None:
                return F.cross_entropy(logits, targets)
            ce = -torch.log_softmax(logits, dim=1).gather(1, terms[0])                          # (T, J)
            return (ce * terms[1]).sum(1).mean()
        cap = None if softcap is None else (softcap, softcap_kind)
        if impl in ("fused", "fused_one_sweep"):
            one_sweep = impl == "fused_one_sweep"
            if not torch.is_grad_enabled():
                logits = _head_logits(x, weight, dtype, fp8, fp8_weight)[0]
                return _softcapped_terms(logits, targets, cap, terms, one_sweep=one_sweep)[0].mean()
            return _FusedLinearCrossEntropy.apply(x, weight, targets, cap, dtype, fp8, *(fp8_weight or _NO_WEIGHT),
                                                  *(terms or (None, None)), one_sweep)
        if impl != "chunked":
            raise ValueError(f"unknown cross-entropy impl {impl!r}; expected 'full', 'chunked', 'fused' or "
                             f"'fused_one_sweep'")
        if not torch.is_grad_enabled():      # evaluation: the loss alone (needs_input_grad ignores no_grad)
            return chunked_cross_entropy(x, weight, targets, cap, chunk_tokens, dtype, False, False, fp8,
                                         fp8_weight, terms)[0]
        return _ChunkedLinearCrossEntropy.apply(x, weight, targets, cap, chunk_tokens, dtype, fp8,
                                                *(fp8_weight or _NO_WEIGHT), *(terms or (None, None)))


def loss_terms(targets: torch.Tensor, mtp_weights: torch.Tensor | None = None,
               prefix_targets: torch.Tensor | None = None, prefix_weight: torch.Tensor | None = None,
               dtype: torch.dtype = torch.float32) -> LossTerms:
    """The weighted targets of every position: ``(terms (T, J) int64, weights (T, J) dtype)``, J = K (+ 1 with
    a prefix), such that ``L_t = Σ_j weights[t, j] · CE(z_t, terms[t, j])`` is the loss of
    :func:`linear_cross_entropy`. Columns 0..K-1: ``targets[t+k]`` with weight ``mtp_weights[k]`` (record
    #53), and where t+k >= T target 0 with weight 0 (the term dropped); column K (with ``prefix_targets``):
    the prefix token with weight ``prefix_weight`` (record #88), target 0 with weight 0 where it is -1.
    targets (T,) int64; mtp_weights (K,) float or None (= [1.]); prefix_targets (T,) int64 and
    prefix_weight 0-d or (1,) float, both or neither. Raises ``ValueError`` on other shapes."""
    num_tokens = targets.size(0)
    if mtp_weights is None:
        mtp_weights = torch.ones(1, dtype=dtype, device=targets.device)
    if mtp_weights.dim() != 1 or mtp_weights.numel() < 1:
        raise ValueError(f"mtp_weights must be a (K,) tensor with K >= 1, got shape {tuple(mtp_weights.shape)}")
    if (prefix_targets is None) != (prefix_weight is None):
        raise ValueError("prefix_targets and prefix_weight go together: give both or neither")
    horizon = mtp_weights.numel()
    ahead = F.pad(targets, (0, horizon - 1)).unfold(0, horizon, 1)                              # (T, K)
    inside = torch.arange(num_tokens, device=targets.device)[:, None] + torch.arange(horizon, device=targets.device)
    weights = mtp_weights.to(dtype) * (inside < num_tokens)                                     # (T, K)
    if prefix_targets is None:
        return ahead, weights
    if prefix_targets.shape != targets.shape or prefix_weight.numel() != 1:
        raise ValueError(f"prefix_targets must be ({num_tokens},) and prefix_weight one number, got shapes "
                         f"{tuple(prefix_targets.shape)} and {tuple(prefix_weight.shape)}")
    has_prefix = prefix_targets >= 0
    prefix_terms = torch.where(has_prefix, prefix_targets, 0)
    prefix_weights = prefix_weight.reshape(()).to(dtype) * has_prefix                          # (T,)
    return torch.cat([ahead, prefix_terms[:, None]], 1), torch.cat([weights, prefix_weights[:, None]], 1)


def _softcapped_terms(logits: torch.Tensor, targets: torch.Tensor, softcap: tuple[float, SoftcapKind] | None,
                      terms: LossTerms | None, **grad_options) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`softcapped_cross_entropy` of the plain targets, or of the weighted ``terms`` when given."""
    if terms is None:
        return softcapped_cross_entropy(logits, targets, softcap, **grad_options)
    return softcapped_cross_entropy(logits, terms[0], softcap, weights=terms[1], **grad_options)


def softcapped_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                             softcap: tuple[float, SoftcapKind] | None, with_grad: bool = False,
                             grad_mul: float = 1.0, e5m2: bool = False, *, weights: torch.Tensor | None = None,
                             grad_norm: torch.Tensor | None = None, one_sweep: bool = False
                             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(losses, grad)`` of the cross-entropy of ``softcap(logits)``, per token, in one pass.

    logits: (T, V) float (bf16 in training); targets: (T,) int64 in 0..V-1; softcap: None or (c, kind).
    Returns losses (T,) fp32 (fp64 for fp64 logits) and, with ``with_grad``, grad (T, V) in the logits'
    dtype (float8 e5m2 with ``e5m2``: then ``grad_mul`` must keep it below 57344, see
    :func:`gradient_bound`): ``dloss_t/dlogits_t · grad_mul`` = (softmax(y) - onehot) · dy/dz · grad_mul
    (else None). On CUDA the Triton kernel (:mod:`speedrun.kernels.softcapped_cross_entropy`, records #60,
    #75, #79); elsewhere the same computation in PyTorch (fp32, or fp64 for fp64 logits), the reference of
    the tests.

    weights: None, or (T, J) float with ``targets`` (T, J) (:func:`loss_terms`): then ``losses[t] = Σ_j
    weights[t, j] · CE(y_t, targets[t, j])`` and its gradient (records #53, #88). grad_norm: None or a 0-d
    fp32 tensor n > 0: the gradient is divided by it too (the FP8 head passes the largest Σ_j |w_tj|, which
    bounds the weighted gradient by that many times :func:`gradient_bound`). one_sweep: on CUDA with a softcap,
    the one-sweep kernel (``one_sweep`` of
    :func:`speedrun.kernels.softcapped_cross_entropy.softcapped_cross_entropy_kernel`: each row read once and
    kept on chip; an e5m2 gradient within one e5m2 step of the two-sweep kernel's); elsewhere ignored."""
    if logits.is_cuda:
        from speedrun.kernels.softcapped_cross_entropy import SOFTCAP_KINDS, softcapped_cross_entropy_kernel

        cap, kind = (0.0, None) if softcap is None else softcap
        losses, grad = softcapped_cross_entropy_kernel(logits, targets, float(cap), SOFTCAP_KINDS[kind],
                                                       with_grad, float(grad_mul), e5m2, weights, grad_norm,
                                                       one_sweep)
        return losses, grad if with_grad else None
    z = logits.to(_accumulation_dtype(logits.dtype), copy=True)
    losses = torch.empty(z.size(0), dtype=z.dtype, device=z.device)
    p = _loss_and_grad(z, torch.empty_like(z), targets, softcap, losses, with_grad, weights)
    if not with_grad:
        return losses, None
    p.mul_(grad_mul if grad_norm is None else grad_mul / grad_norm.to(p.dtype))
    return losses, p.to(E5M2 if e5m2 else logits.dtype)


def gradient_bound(softcap: tuple[float, SoftcapKind] | None) -> float:
    """The largest |dloss_t/dz| a token's softcapped cross-entropy can have: |softmax - onehot| <= 1 times
    the softcap's largest slope (1 for none and tanh; c / (4 · 7.5) for the shifted sigmoid, at y = c/2)."""
    if softcap is None or softcap[1] == "tanh":
        return 1.0
    return softcap[0] / (4.0 * SIGMOID_TEMPERATURE)


# The FP8 gradient: dL/dz scaled so that its bound maps to half of e5m2's largest value (no overflow after
# rounding, and the smallest probabilities that matter, about 1e-9 of the bound, stay representable).
_E5M2_TARGET = E5M2_MAX / 2


def _fp8_head_weight(weight: torch.Tensor, fp8_weight: FP8Weight | None) -> FP8Weight | tuple:
    """``(w8, w_scale, w8ᵀ or None)``: ``fp8_weight`` (the cached operands), else ``weight`` (V, C) quantized
    with the head's fixed scale (records #19, #51) and no transposed copy (the backward makes it)."""
    return fp8_weight if fp8_weight is not None else (*quantize(weight, HEAD_SCALES.weight), None)


def _head_logits(x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype, fp8: bool,
                 fp8_weight: FP8Weight | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor | None, ...]]:
    """The logits x Wᵀ (T, V) (bf16 from FP8 operands with the head's fixed scales, else in ``dtype``) and
    what the backward products need: (x8, x_scale, w8, w_scale, w8ᵀ or None) or (x, W) in ``dtype``.
    ``fp8_weight``: the head's cached FP8 operands (see :func:`linear_cross_entropy`), or None."""
    if fp8:
        x8, x_scale = quantize(x, HEAD_SCALES.x)
        w8, w_scale, w8_t = _fp8_head_weight(weight, fp8_weight)
        return scaled_mm(x8, x_scale, w8, w_scale), (x8, x_scale, w8, w_scale, w8_t)
    xs, ws = x.to(dtype), weight.to(dtype)
    return xs @ ws.t(), (xs, ws)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """The head's logits, then loss and dL/dz in one pass (:func:`softcapped_cross_entropy`); the backward
    runs the two gradient products from the saved dL/dz, scaled by the incoming gradient there. ``w8``,
    ``w_scale``, ``w8_t``: the head's cached FP8 operands, or None (see :func:`linear_cross_entropy`);
    ``terms``, ``term_weights``: the weighted targets (:func:`loss_terms`), or None for the plain loss;
    ``one_sweep``: the one-sweep kernel on CUDA (:func:`softcapped_cross_entropy`). With
    FP8 and weighted targets the e5m2 gradient is divided by the largest Σ_j |w_tj| too (its bound grows
    with the weights), and the backward multiplies it back."""

    @staticmethod
    def forward(ctx, x, weight, targets, softcap, dtype, fp8, w8=None, w_scale=None, w8_t=None,  # noqa: D102
                terms=None, term_weights=None, one_sweep=False):
        fp8_weight = None if w8 is None else (w8, w_scale, w8_t)
        logits, operands = _head_logits(x, weight, dtype, fp8, fp8_weight)      # (T, V)
        grad_mul = _E5M2_TARGET / gradient_bound(softcap) if fp8 else 1.0
        norm = _weight_norm(term_weights) if fp8 and terms is not None else None
        losses, grad = _softcapped_terms(logits, targets, softcap, None if terms is None else (terms, term_weights),
                                         with_grad=True, grad_mul=grad_mul, e5m2=fp8, grad_norm=norm,
                                         one_sweep=one_sweep)                                     # (T,), (T, V)
        del logits
        ctx.save_for_backward(grad, *operands, *(() if norm is None else (norm,)))
        ctx.fp8, ctx.dtypes, ctx.unscale = fp8, (x.dtype, weight.dtype), 1.0 / (x.size(0) * grad_mul)
        ctx.normed = norm is not None
        return losses.mean()

    @staticmethod
    def backward(ctx, grad_loss):  # noqa: D102 (autograd API)
        grad, *operands = ctx.saved_tensors
        norm = operands.pop() if ctx.normed else None
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        acc = torch.float32 if ctx.fp8 else _accumulation_dtype(grad.dtype)
        scale = (grad_loss.to(acc) * ctx.unscale).reshape(())                    # dL/dz = grad · scale
        if norm is not None:
            scale = scale * norm
        if ctx.fp8:
            x8, x_scale, w8, w_scale, w8_t = operands                           # grad: (T, V) e5m2
            w8_t = transposed(w8) if w8_t is None else w8_t                         # (C, V)
            dx = scaled_mm(grad, scale, w8_t, w_scale, fast_accum=False) if need_x else None     # the records':
            dw = (scaled_mm(transposed(grad), scale, transposed(x8), x_scale, out_dtype=torch.float32,  # exact
                            fast_accum=False) if need_w else None)                    # sums, dW in fp32
        else:
            xs, ws = operands
            dx = (grad @ ws).to(acc) * scale if need_x else None
            dw = (grad.t() @ xs).to(acc) * scale if need_w else None
        x_dtype, w_dtype = ctx.dtypes
        return (None if dx is None else dx.to(x_dtype), None if dw is None else dw.to(w_dtype),
                None, None, None, None, None, None, None, None, None, None)


def _weight_norm(term_weights: torch.Tensor) -> torch.Tensor:
    """The largest Σ_j |w_tj| over the positions (0-d fp32), 1 where that is 0 (no gradient to scale). With
    non-negative weights (the records') it bounds |Σ_j w_tj (softmax - onehot_j)|; mixed signs can reach
    twice it, which e5m2's headroom (the bound maps to half its largest value) still holds."""
    norm = term_weights.abs().sum(1).amax().float()
    return torch.where(norm > 0, norm, torch.ones_like(norm))


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Loss in the forward pass, with dL/dx and dL/dW computed alongside and saved for the backward."""

    @staticmethod
    def forward(ctx, x, weight, targets, softcap, chunk_tokens, dtype, fp8, w8=None, w_scale=None,  # noqa: D102
                w8_t=None, terms=None, term_weights=None):
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        fp8_weight = None if w8 is None else (w8, w_scale, w8_t)
        loss, grad_x, grad_w = chunked_cross_entropy(x, weight, targets, softcap, chunk_tokens, dtype,
                                                     need_x, need_w, fp8, fp8_weight,
                                                     None if terms is None else (terms, term_weights))
        ctx.save_for_backward(grad_x, grad_w)
        ctx.dtypes = (x.dtype, weight.dtype)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):  # noqa: D102 (autograd API)
        grad_x, grad_w = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        dx = (grad_x * grad_loss).to(x_dtype) if ctx.needs_input_grad[0] else None
        dw = (grad_w * grad_loss).to(w_dtype) if ctx.needs_input_grad[1] else None
        return dx, dw, None, None, None, None, None, None, None, None, None, None


@torch.no_grad()
def chunked_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          softcap: tuple[float, SoftcapKind] | None, chunk_tokens: int, dtype: torch.dtype,
                          need_x: bool = True, need_w: bool = True, fp8: bool = False,
                          fp8_weight: FP8Weight | None = None, terms: LossTerms | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, dloss/dx, dloss/dW)``: fp32 scalar mean loss, (T, C) and (V, C) gradients in fp32 (fp64 when
    ``dtype`` is fp64; empty tensors when not ``need_x`` / ``need_w``). ``softcap``: None or (c, kind).
    ``fp8``: the logits of each chunk in FP8 with the head's fixed scales: x's chunk in ``dtype`` quantized,
    times ``weight`` quantized once per call (as the other impls quantize it), or ``fp8_weight``'s cached
    copy of it; the gradient products stay in ``dtype``. ``terms``: the weighted targets of every position
    (:func:`loss_terms`) in place of ``targets``, or None. Other inputs as for :func:`linear_cross_entropy`."""
    num_tokens, vocab, dim = x.size(0), weight.size(0), weight.size(1)
    xs, w = x.to(dtype), weight.to(dtype)
    acc = _accumulation_dtype(dtype)
    chunk = min(chunk_tokens, num_tokens)
    logits = torch.empty(chunk, vocab, dtype=acc, device=x.device)                  # z
    probs = torch.empty(chunk, vocab, dtype=acc, device=x.device)                   # softmax(z)
    low = logits if dtype == acc else torch.empty(chunk, vocab, dtype=dtype, device=x.device)
    partial = torch.empty(vocab, dim, dtype=dtype, device=x.device) if need_w and low is not logits else None
    w8, w_scale, _ = _fp8_head_weight(weight, fp8_weight) if fp8 else _NO_WEIGHT      # (V, C) e4m3, ()
    losses = torch.empty(num_tokens, dtype=acc, device=x.device)
    grad_x = torch.empty((num_tokens, dim) if need_x else 0, dtype=acc, device=x.device)
    grad_w = torch.zeros((vocab, dim) if need_w else 0, dtype=acc, device=x.device)
    for start in range(0, num_tokens, chunk):
        rows, n = slice(start, start + chunk), min(chunk, num_tokens - start)
        if fp8:
            x8, x_scale = quantize(xs[rows], HEAD_SCALES.x)                          # (c, C) e4m3
            low[:n].copy_(scaled_mm(x8, x_scale, w8, w_scale))
        else:
            torch.mm(xs[rows], w.t(), out=low[:n])
        if low is not logits:
            logits[:n].copy_(low[:n])
        chunk_targets, chunk_weights = (targets[rows], None) if terms is None else (terms[0][rows], terms[1][rows])
        dz = _loss_and_grad(logits[:n], probs[:n], chunk_targets, softcap, losses[rows], need_x or need_w,
                            chunk_weights)
        if need_x or need_w:
            grads = dz if low is logits else low[:n].copy_(dz)                # (c, V) in dtype
            if need_x:
                grad_x[rows] = torch.mm(grads, w)                             # (c, C)
            if need_w:
                _accumulate(grad_w, grads.t(), xs[rows], partial)            # (V, C)
    scale = 1.0 / num_tokens
    return losses.mean(), grad_x.mul_(scale), grad_w.mul_(scale)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for bf16/fp16/fp32 products, fp64 for fp64 (the tests' references)."""
    return torch.promote_types(dtype, torch.float32)


def _loss_and_grad(z: torch.Tensor, p: torch.Tensor, targets: torch.Tensor,
                   softcap: tuple[float, SoftcapKind] | None, losses: torch.Tensor, need_grad: bool,
                   weights: torch.Tensor | None = None) -> torch.Tensor:
    """From the raw logits ``z`` (c, V) fp32: per-token losses into ``losses`` (c,) and, in ``p`` (c, V),
    dL_t/dz_t = (softmax - onehot) · softcap' (with ``need_grad``; else p holds the softmax). Overwrites
    ``z``. With ``weights`` (c, J) and ``targets`` (c, J) (:func:`loss_terms`): L_t = Σ_j w_tj · CE_tj and
    dL_t/dz_t = (Σ_j w_tj · softmax - Σ_j w_tj · onehot(targets_tj)) · softcap'."""
    if softcap is not None:
        _cap_(z, *softcap)
    torch.softmax(z, dim=1, out=p)
    if weights is None:
        rows = torch.arange(z.size(0), device=z.device)
        losses.copy_(_target_losses(z, p, rows, targets))
        if not need_grad:
            return p
        p[rows, targets] -= 1.0
    else:
        rows = torch.arange(z.size(0), device=z.device)[:, None].expand_as(targets)          # (c, J)
        losses.copy_((_target_losses(z, p, rows, targets) * weights).sum(1))
        if not need_grad:
            return p
        p.mul_(weights.sum(1, keepdim=True)).scatter_add_(1, targets, -weights)
    if softcap is not None:
        _times_cap_derivative_(p, z, *softcap)
    return p


def _target_losses(y: torch.Tensor, p: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-log p[rows, targets] (the shape of ``targets``) from the capped logits y and their softmax p (c, V);
    where p underflows, logsumexp(y_row) - y[row, target] instead (exact and finite)."""
    p_target = p[rows, targets]
    losses = -torch.log(p_target)
    tiny = p_target < _TINY_PROB
    if tiny.any():
        losses[tiny] = torch.logsumexp(y[rows[tiny]], dim=1) - y[rows[tiny], targets[tiny]]
    return losses


def _cap_(z: torch.Tensor, cap: float, kind: SoftcapKind) -> None:
    """In place: z <- softcap_logits(z)."""
    if kind == "tanh":
        z.div_(cap).tanh_().mul_(cap)
    else:
        z.add_(SIGMOID_SHIFT).div_(SIGMOID_TEMPERATURE).sigmoid_().mul_(cap)


def _times_cap_derivative_(p: torch.Tensor, y: torch.Tensor, cap: float, kind: SoftcapKind) -> None:
    """In place: p <- p · dy/dz, from the capped logits y (overwritten)."""
    if kind == "tanh":
        p.mul_(y.div_(cap).square_().neg_().add_(1.0))
    else:
        p.mul_(y).div_(SIGMOID_TEMPERATURE)
        p.mul_(y.div_(-cap).add_(1.0))


def _accumulate(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor, partial: torch.Tensor | None) -> None:
    """``total += a @ b`` in fp32, via ``partial`` in the compute dtype when that is not fp32."""
    if partial is None:
        total.addmm_(a, b)
    else:
        torch.mm(a, b, out=partial)
        total.add_(partial)
