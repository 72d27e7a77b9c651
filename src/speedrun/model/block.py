"""The blocks of the speedrun GPT: document-causal self-attention (RoPE, QK-norm, optional sliding window,
value embedding and its gate, output gate, paired heads, FP8 projections) and the pre-norm transformer block
(optional x0 injection and bigram injection; optionally without attention).

Sources (speedrun-spec.md 2.2, 2.3, 2.6): QK-norm and zero-init projections record #5; x0 shortcut with
per-layer lambdas record #9; value embeddings records #14-#17, their gates records #55, #70; sliding
windows records #13, #20; a layer without attention record #17 (layer 7 of 12 in record #28); the sparse
attention gate record #28; paired-head attention record #58; bigram injection records #62, #83; FP8 QKV/O
projections the 2026-06-11 record; the partial key offset record #49.

Shape legend: T tokens, C model_dim, H n_head, Dh head_dim, R rotated pairs of RoPE.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.errors import SpeedrunError
from speedrun.kernels import optional_kernel
from speedrun.model import flash
from speedrun.model.attention import PackedDocuments, attention
from speedrun.model.config import GPTConfig
from speedrun.model.fp8 import UNIT_SCALES, FP8Linear, FP8WeightCache, fp8_linear, refresh_caches_
from speedrun.model.gates import AttentionGate, ValueEmbedGate
from speedrun.model.init import init_input_, init_output_
from speedrun.model.mlp import MLP
from speedrun.model.norm import rms_norm
from speedrun.model.paired import paired_attention
from speedrun.model.rotary import apply_rotary
from speedrun.model.value_residual import VALUE_RESIDUAL_INIT, mix_value_residual
from speedrun.model.xsa import xsa


@dataclass(frozen=True)
class AttentionContext:
    """What all attention layers of one forward pass share.

    Fields: ``docs`` the packed documents (one :class:`PackedDocuments` per forward pass); ``cos``, ``sin``
    (T, R) rotary tables of the document positions; ``scale`` of q·k; ``paired_cos``, ``paired_sin``
    (2T, R) rotary tables of the doubled sequence (:func:`speedrun.model.paired.paired_positions`), or None
    when no layer pairs its heads. ``scale`` is a float or (FlexAttention, YaRN) a 0-d tensor.
    """

    docs: PackedDocuments
    cos: torch.Tensor
    sin: torch.Tensor
    scale: float | torch.Tensor
    paired_cos: torch.Tensor | None = None
    paired_sin: torch.Tensor | None = None


class CausalSelfAttention(nn.Module):
    """Multi-head document-causal self-attention of layer ``layer``: (T, C) -> (T, C).

    q, k, v = x Wqᵀ, x Wkᵀ, x Wvᵀ as (T, H, Dh), computed as one product with the three weights stacked
    (record #28's merged QKV weight: a (C, 3·H·Dh) product runs near the tensor cores' peak where three
    (C, H·Dh) ones reach about half of it on an H200); q and k RMS-normalized over Dh (QK-norm, record #5) and
    rotated (RoPE, ``config.rope``); the scale and the sliding window come with each call (the model's
    schedule state); output projection Wo zero-initialized. The projections are :class:`FP8Linear`, FP8 in
    the training forward with ``config.fp8_attention``. In ``config.paired_head_layers`` the heads attend in
    pairs (:func:`speedrun.model.paired.paired_attention`); in ``config.attention_gate_layers`` each head's
    output is multiplied by its gate (:class:`speedrun.model.gates.AttentionGate`, parameter ``gate``)
    before Wo. A value embedding ve is added to v (records #14-#17); with ``config.value_embed_gates`` a
    layer of ``config.value_embed_layers`` first scales it per head by its gate in (0, 2) read from x and ve
    (:class:`speedrun.model.gates.ValueEmbedGate`, parameter ``ve_gate``; records #55, #70); with
    ``config.value_lambdas`` (record #28's "SA lambdas") the parameter ``value_lambdas`` (2,) (λ0, λ1), from
    (0.5, 0.5), weights them: ``v = λ0·v + λ1·ve``, or ``v = λ0·v`` when the layer has no value embedding
    (:meth:`mix_values`). With ``config.value_residual`` (record #12) every layer after 0 has the parameter
    ``value_residual_lambda`` (1,) from 0.5 and its ``value_embed`` is layer 0's values v_0:
    ``v = (1 - λ)·v + λ·v_0`` (:mod:`speedrun.model.value_residual`).
    Attention runs in the dtype of the projections (bf16 under autocast, so that flash kernels apply). With
    ``fp8_attention``, ``qkv_fp8`` caches the stacked QKV weight's FP8 operands (one dynamic scale for the
    three; :class:`speedrun.model.fp8.FP8WeightCache`, filled by :meth:`quantize_weight_`, used only while
    switched on) and ``o`` has its own cache; else ``qkv_fp8`` is None. With ``config.fp8_attention_scales``
    ``"unit"`` (record #87's form) both FP8 products instead cast their operands at scale 1 at every call, the
    weights first multiplied by ``sa_lambdas`` and cast to bf16 (:meth:`_unit_fp8`), and nothing is cached.

    Partial key offset (record #49): with ``config.key_offset`` on a long-window (``L``) layer that is not
    paired (attribute ``key_offset`` True), the keys' stationary dims move one position forward after
    QK-norm and RoPE, on the PyTorch and the fused-kernel path alike (:func:`offset_keys`).

    Records #47-#89 (speedrun-spec.md 2.3), after the attention kernel and before the output gate, in this
    order: on a layer of ``config.dc_layers``, lightweight DC (record #85) adds
    :func:`speedrun.model.dc.dc_attention`'s correction, read from the q, k, v the kernel saw, with the
    per-token weights ``dc_weights`` of the call; on a layer of ``config.xsa_layers``, XSA (records #82, #86,
    :func:`speedrun.model.xsa.xsa`) with the strengths ``xsa_alpha`` of the call (per token, from the MUDD
    gates) or else the parameter ``xsa_alpha`` (H,) from 0. A ``gate`` (T, H) of the call replaces the
    sigmoid output gate by a linear one (HEAD's MUDD gates, record #85). With ``config.sa_lambdas`` (record
    #47) the parameter ``sa_lambdas`` (2,) from (0.5, 1.0) multiplies the q/k/v weights and the output
    projection's as the records pre-multiply them (record #88 L1086, L1135); a product from an FP8 weight cache
    is multiplied instead.
    """

    def __init__(self, config: GPTConfig, layer: int = 0):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.backend, self.rope = config.attention_backend, config.rope
        if self.backend in flash.LIBRARIES:
            flash.unavailable_reason(self.backend)       # import FA3/FA4 now, before a compile traces a call
        self.paired = layer in config.paired_head_layers
        self.paired_layout = config.paired_head_layout
        self.key_offset = (config.key_offset and not self.paired
                           and config.window_pattern[layer:layer + 1] == "L")              # record #49
        fp8 = config.fp8_attention
        self.fp8_unit = fp8 and config.fp8_attention_scales == "unit"                       # record #87
        self.q = FP8Linear(config.model_dim, config.attn_dim, fp8=fp8, weight_cache=False)   # stacked in _qkv
        self.k = FP8Linear(config.model_dim, config.attn_dim, fp8=fp8, weight_cache=False)
        self.v = FP8Linear(config.model_dim, config.attn_dim, fp8=fp8, weight_cache=False)
        self.o = FP8Linear(config.attn_dim, config.model_dim, fp8=fp8, weight_cache=not self.fp8_unit)
        self.qkv_fp8 = FP8WeightCache() if fp8 and not self.fp8_unit else None
        for linear in (self.q, self.k, self.v):
            init_input_(linear.weight)
        (init_input_ if config.attention_output_init == "uniform" else init_output_)(self.o.weight)   # #83-#89
        self.gate = (AttentionGate(config.n_head)              # HEAD's MUDD gates (record #85) come with the call
                     if layer in config.attention_gate_layers and not config.mudd_gates else None)
        self.value_lambdas = nn.Parameter(torch.tensor([0.5, 0.5])) if config.value_lambdas else None
        mudd_layer = config.mudd and layer == config.mudd_layer           # MUDD gates its value embedding
        self.value_residual_lambda = (nn.Parameter(torch.tensor([VALUE_RESIDUAL_INIT]))        # record #12
                                      if config.value_residual and layer > 0 else None)
        self.ve_gate = (ValueEmbedGate(config.n_head)
                        if config.value_embed_gates and layer in config.value_embed_layers and not mudd_layer
                        else None)
        self.rotary_kernel = config.rotary_kernel
        self._qk_norm_rotary = (optional_kernel("qk_norm_rotary", "qk_norm_rotary")
                                if config.rotary_kernel == "triton" else None)
        self.sa_lambdas = nn.Parameter(torch.tensor([0.5, 1.0])) if config.sa_lambdas else None
        self.xsa = layer in config.xsa_layers
        self.xsa_form = config.xsa_form
        self.xsa_alpha = (nn.Parameter(torch.zeros(config.n_head))
                          if self.xsa and not config.mudd_gates else None)                   # record #82
        self.dc_window = config.dc_window
        self.dc = dc_function() if layer in config.dc_layers else None                      # record #85

    def own_parameter_roles(self) -> dict[str, list[nn.Parameter]]:
        """The roles of its parameters (:mod:`speedrun.model.roles`): the q and k weights ``attention_qk``, the
        v weight ``attention_value`` (the three read the residual stream), the output gate's weight
        ``attention_gate`` (none without a ``gate``; the value-embedding gate has no role)."""
        roles = {"attention_qk": [self.q.weight, self.k.weight], "attention_value": [self.v.weight]}
        return roles if self.gate is None else {**roles, "attention_gate": [self.gate.weight]}

    def forward(self, x: torch.Tensor, context: AttentionContext, window: int | torch.Tensor | None = None,
                value_embed: torch.Tensor | None = None, *, xsa_alpha: torch.Tensor | None = None,
                gate: torch.Tensor | None = None,
                dc_weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x: (T, C); context: the shared tables of this forward pass; window in tokens (in positions of the
        doubled sequence on a paired layer) or None; value_embed: None or (T, H*Dh) mixed into v
        (:meth:`mix_values`, gated with ``ve_gate``). Keyword-only, from HEAD's MUDD gates: xsa_alpha (T, H)
        XSA strengths (on an XSA layer), gate (T, H) a linear output gate, dc_weights (w1, w2) (T, H) each
        (on a DC layer, ``ValueError`` without them). Returns (T, C)."""
        unit = self.fp8_unit and self.training
        qkv = self._unit_fp8(x, self._qkv_weight(), 0) if unit else self._qkv(x)
        q, k, v = qkv.view(x.size(0), 3, self.n_head, self.head_dim).unbind(1)            # (T, H, Dh) each
        v = self.mix_values(v, value_embed, x)
        if self.paired:
            q, k = rms_norm(q), rms_norm(k)
            y = paired_attention(q, k, v, context.docs, context.paired_cos, context.paired_sin, context.scale,
                                 window, rope=self.rope, backend=self.backend, layout=self.paired_layout)
        else:
            q, k = self._norm_rotary(q, k, context)
            if self.key_offset:                                 # a per-layer constant: no graph break
                k = offset_keys(k, 2 * context.cos.size(-1))     # dims 2R.. are the ones RoPE leaves put
            y = attention(q, k, v, context.docs, context.scale, window, backend=self.backend)  # v's dtype
            y = self._after_kernel(y, q, k, v, context, xsa_alpha, dc_weights)
        if gate is not None:
            y = y * gate.type_as(y).unsqueeze(-1)                                        # (T, H, 1)
        elif self.gate is not None:
            y = y * self.gate(x).type_as(y)
        y = y.reshape(x.size(0), -1)                                                     # (T, H·Dh)
        if unit:
            return self._unit_fp8(y, self.o.weight, 1)
        if self.o.runs_fp8:                              # o's FP8 cache holds W: λ on the product
            return self._scaled_output(self.o(y), 1)
        return F.linear(y, self._scaled_weight(self.o.weight, 1))                         # (T, C)

    def _scaled_weight(self, weight: torch.Tensor, lam: int) -> torch.Tensor:
        """``sa_lambdas[lam] · weight`` in the weight's dtype (a 0-d fp32 λ does not promote a bf16 weight, as
        in the records' ``sa_lambdas[0] * qkvo_w``), or the weight alone without ``sa_lambdas``. On the weight,
        λ's gradient is a sum over the weight's elements, not over the (T, N) product's."""
        return weight if self.sa_lambdas is None else self.sa_lambdas[lam] * weight

    def _scaled_output(self, out: torch.Tensor, lam: int) -> torch.Tensor:
        """``sa_lambdas[lam] · out`` (T, N) for the products whose FP8 cache holds the unscaled weight."""
        return out if self.sa_lambdas is None else self.sa_lambdas[lam].type_as(out) * out

    def _unit_fp8(self, x: torch.Tensor, weight: torch.Tensor, lam: int) -> torch.Tensor:
        """Record #87's FP8 product (``config.fp8_attention_scales`` "unit"): x (T, K) and ``sa_lambdas[lam]
        · weight`` (N, K) (the weight alone without ``sa_lambdas``), each cast to bf16 and then to e4m3 at scale
        1, multiplied on the FP8 path; bf16 backward. Returns (T, N) bf16."""
        return fp8_linear(x.to(torch.bfloat16), self._scaled_weight(weight, lam).to(torch.bfloat16), UNIT_SCALES)

    def _after_kernel(self, y: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      context: AttentionContext, xsa_alpha: torch.Tensor | None,
                      dc_weights: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """DC then XSA on a non-paired layer's output y (T, H, Dh), from the q, k, v (T, H, Dh) the kernel
        read (switched per layer; see the class docstring)."""
        if self.dc is not None:
            if dc_weights is None:
                raise ValueError("a DC layer needs its per-token weights (w1, w2) from the MUDD gates")
            w1, w2 = dc_weights
            y = self.dc(y, q, k, v, w1, w2, context.docs.cu_seqlens, context.scale, window=self.dc_window)
        if self.xsa:
            alpha = xsa_alpha if xsa_alpha is not None else self.xsa_alpha
            if alpha is None:
                raise ValueError("an XSA layer under MUDD gates needs its per-token strengths")
            y = xsa(y, v, alpha, self.xsa_form)
        return y

    def mix_values(self, v: torch.Tensor, value_embed: torch.Tensor | None,
                   x: torch.Tensor | None = None) -> torch.Tensor:
        """The values attention reads, (T, H, Dh) in v's dtype: ``v + ve`` (records #14-#17; ``v`` when
        ``value_embed`` is None) or, with ``value_lambdas``, ``λ0·v + λ1·ve`` (``λ0·v`` when it is None) as in
        record #28 (its L625-627; q and k are normalized and rotated separately, v is not). value_embed:
        None or (T, H*Dh), cast to v's dtype. With a ``ve_gate`` (``config.value_embed_gates``), ve is first
        replaced by ``gate·ve``, gate = ``ve_gate(x, value_embed)`` (T, H, 1) in (0, 2) (records #55, #70;
        speedrun-spec.md 2.2 item 8, 2.3: ``v += VE·gate``): ``v + gate·ve`` or ``λ0·v + λ1·gate·ve``. x: the
        attention input (T, C), needed only then (``ValueError`` when it is None). The λ enter as 0-d fp32
        tensors, which do not promote a bf16 v (the record's arithmetic); the branches depend on None-ness
        only, not on tensor values."""
        if self.value_residual_lambda is not None:             # record #12: value_embed holds layer 0's v
            return v if value_embed is None else mix_value_residual(v, value_embed, self.value_residual_lambda)
        ve = None if value_embed is None else value_embed.view(v.shape).type_as(v)     # (T, H, Dh)
        if ve is not None and self.ve_gate is not None:
            if x is None:
                raise ValueError("mix_values of a layer with a value-embedding gate needs the attention input x")
            ve = self.ve_gate(x, value_embed).type_as(v) * ve                            # (T, H, 1) * (T, H, Dh)
        lambdas = self.value_lambdas
        if lambdas is None:
            return v if ve is None else v + ve
        return lambdas[0] * v if ve is None else lambdas[0] * v + lambdas[1] * ve

    def _norm_rotary(self, q: torch.Tensor, k: torch.Tensor, context: AttentionContext):
        """QK-norm and RoPE of a non-paired layer: q, k (T, H, Dh) -> (T, H, Dh) each in q's dtype. With
        ``rotary_kernel`` "triton" on CUDA: one fused kernel (:mod:`speedrun.kernels.qk_norm_rotary`; bf16 or
        fp16, else :class:`SpeedrunError`, as without the triton package); otherwise, and on a CPU,
        ``rms_norm`` then ``apply_rotary``."""
        if self.rotary_kernel == "triton" and q.is_cuda:
            if self._qk_norm_rotary is None:
                raise SpeedrunError("model.rotary_kernel 'triton' needs the triton package, which is not installed")
            if q.dtype not in (torch.bfloat16, torch.float16):
                raise SpeedrunError(f"model.rotary_kernel 'triton' computes in bfloat16 or float16 (train dtype "
                                    f"bfloat16 turns on autocast); got {q.dtype}")
            return self._qk_norm_rotary(q, k, context.cos, context.sin, self.rope)
        dtype = q.dtype                                               # v's dtype: q, k, v share the QKV product
        q, k = rms_norm(q), rms_norm(k)
        return (apply_rotary(q, context.cos, context.sin, self.rope).to(dtype),
                apply_rotary(k, context.cos, context.sin, self.rope).to(dtype))

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, C) -> [q | k | v] (T, 3·H·Dh) in one product with the stacked weights (3·H·Dh, C), times
        ``sa_lambdas[0]``; FP8 (one dynamic scale for the three) in the training forward with
        ``fp8_attention``."""
        weight = self._qkv_weight()
        if self.q.runs_fp8:
            return self._scaled_output(fp8_linear(x, weight, cache=self.qkv_fp8), 0)
        return F.linear(x, self._scaled_weight(weight, 0))

    @torch.no_grad()
    def quantize_weight_(self) -> None:
        """Refresh ``qkv_fp8`` from the current stacked QKV weight (nothing without ``fp8_attention``; ``o``
        refreshes its own cache)."""
        refresh_caches_(self.weight_cache_pairs())

    def weight_cache_pairs(self) -> list[tuple[FP8WeightCache, torch.Tensor]]:
        """``[(qkv_fp8, stacked QKV weight)]``, or none without ``fp8_attention``: what
        :func:`speedrun.model.fp8.refresh_caches_` refreshes."""
        return [] if self.qkv_fp8 is None else [(self.qkv_fp8, self._qkv_weight())]

    def _qkv_weight(self) -> torch.Tensor:
        """The stacked projection weights [Wq; Wk; Wv] (3·H·Dh, C), as one product (and its cache) uses them."""
        return torch.cat((self.q.weight, self.k.weight, self.v.weight))


class Block(nn.Module):
    """Pre-norm transformer block ``layer``: ``x += attn(norm(x)); x += mlp(norm(x))``. (T, C) -> (T, C).

    With ``config.x0_lambdas`` (record #9, the x0 shortcut), the block first mixes in the normalized input
    embedding x0: ``x = lambdas[0]·x + lambdas[1]·x0``, ``lambdas`` (2,) fp32 learned per layer from
    (``config.resid_lambda_init``, 0) (1.1 in the current record, #45).
    A layer in ``config.attention_free_layers`` has no attention (``attn`` None; record #17), one in
    ``config.mlp_free_layers`` no MLP (``mlp`` None; record #31's layer 0). A bigram
    injection (records #62, #83) is added after the attention sublayer.
    """

    def __init__(self, config: GPTConfig, layer: int = 0):
        super().__init__()
        self.attn = None if layer in config.attention_free_layers else CausalSelfAttention(config, layer)
        self.mlp = None if layer in config.mlp_free_layers else MLP(config)                  # record #31
        self.lambdas = nn.Parameter(torch.tensor([config.resid_lambda_init, 0.0])) if config.x0_lambdas else None

    def forward(self, x: torch.Tensor, x0: torch.Tensor, context: AttentionContext,
                window: int | torch.Tensor | None = None,
                value_embed: torch.Tensor | None = None, bigram: torch.Tensor | None = None) -> torch.Tensor:
        """x, x0: (T, C); bigram: None or (T, C), already gated; the rest as for
        :class:`CausalSelfAttention`. Returns (T, C)."""
        if self.lambdas is not None:
            lambdas = self.lambdas.type_as(x)
            x = lambdas[0] * x + lambdas[1] * x0
        if self.attn is not None:
            x = x + self.attn(rms_norm(x), context, window, value_embed)
        if bigram is not None:
            x = x + bigram.type_as(x)
        return x if self.mlp is None else x + self.mlp(rms_norm(x))


def dc_function() -> Callable[..., Any]:
    """:func:`speedrun.model.dc.dc_attention` (lightweight DC, record #85), imported when a DC layer is built;
    :class:`SpeedrunError` when that module is missing."""
    try:
        return importlib.import_module("speedrun.model.dc").dc_attention
    except ModuleNotFoundError as e:
        if e.name != "speedrun.model.dc":
            raise
        raise SpeedrunError("model.dc_layers need speedrun.model.dc (lightweight DC attention), which is not "
                            "installed") from None


def offset_keys(k: torch.Tensor, start: int) -> torch.Tensor:
    """Partial key offset (record #49; speedrun-spec.md 2.3): k (T, H, Dh) -> (T, H, Dh), same dtype, where
    dims ``start``..Dh-1 of row t are those of row t-1 for t >= 1 and row 0 keeps its own; dims 0..start-1
    are unchanged. Rows are positions of the flat packed sequence: the shift crosses document boundaries,
    as the record's does. Applied to rotated keys with ``start`` = 2R (the dims half-truncated RoPE leaves
    unrotated, Dh/2..Dh-1: :func:`speedrun.model.rotary.apply_rotary`), so that a query's stationary part
    matches the token before each key (one-layer induction). Out of place (the record writes into k)."""
    moving = k[..., start:]                                                          # (T, H, Dh - start)
    shifted = torch.cat((moving[:1], moving[:-1]), dim=0)
    return torch.cat((k[..., :start], shifted), dim=-1)
