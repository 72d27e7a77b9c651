"""MUDD: multiway dynamic dense connections (Xiao et al. 2025, arXiv 2502.12170; record #81) and the
MUDD-generated gates of HEAD (record #85); speedrun-spec.md 2.2 items 6, 8, 9.

A small network reads the residual stream and returns per-token coefficients:
``(gelu(x W1ᵀ) W2ᵀ + b) · scale``, W1 (64, C) Kaiming-uniform, W2 (n, 64) zero, so that every coefficient
starts at its bias times the scale (:class:`CoefficientNet`). The biases are stored divided by the initial
scale 0.1 ("pre-scaled"), as in the records, so that their effective values are the ones named below.

Dense connections (:class:`DenseConnections`, record #81), trimmed to two places as the records run them:

* at the start of the MUDD layer m (HEAD: the last, 10), 14 coefficients of x: values
  ``v += mu0·s0 + mu1·s_mid + mu2·x`` (the residual states as heads); the stream
  ``x <- (1 + mu5)·x + mu3·s0 + mu4·s_mid``; the layer's value-embedding gate, mu6 for the first half of the
  heads and mu7 for the second (bias 2); and the layer's dynamic residual lambdas mu8..mu13 in place of its
  resid/post/x0/bigram/resid/post lambdas (biases sqrt(resid_lambda_init), 1, 0, 0.05, sqrt(...), 1).
  s0 is the stream entering layer 0 (x0 plus layer 0's bigram injection), s_mid the output of layer
  ``mudd_mid_layer`` (7).
* after the last layer, 5 coefficients of x: ``x += mu0·s0 + mu1·s_mid + mu2·s_in + mu3·ve0 + mu4·s_early``,
  s_in the input of the MUDD layer, ve0 the first value-embedding table's row of each token, s_early the
  output of ``mudd_early_layer`` (3). mu1's bias is -0.5: backout (record #40) absorbed.

The scale of both is the constant 0.1.

MUDD gates (:class:`MuddGates`, record #85): two such networks sharing one learnable scale (from 0.1). The
"pre" gate reads x0 and serves the layers before ``mudd_gate_layer`` (4), the "post" gate reads the stream
entering that layer and serves it and the layers after. Their coefficients (:func:`gate_layout`): per head,
the XSA strengths (:mod:`speedrun.model.xsa`) and the linear attention output gates (bias 0.25); per layer,
the x0 and bigram injection gates (bias 0 and 0.05) in place of the lambdas; the 3->6 skip's gate (bias 0.5);
per head, the DC weights w1 (bias 1) and w2 (bias 0) of each DC layer (:mod:`speedrun.model.dc`). HEAD's
layout for 11 layers: pre 26 (XSA 1, 3; attention gate 3; injections 0-3), post 41 (XSA 4, 7; attention gate
10; injections 4, 5, 7, 8, 9; skip; DC 10).

Shape legend: T tokens, C model_dim, H n_head, Dh head_dim, n coefficients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.model.config import GPTConfig

MUDD_HIDDEN = 64
MUDD_SCALE = 0.1
LAYER_COEFFICIENTS = 14
FINAL_COEFFICIENTS = 5
VE_GATE_BIAS = 2.0
BACKOUT_BIAS = -0.5
BIGRAM_GATE_BIAS = 0.05
ATTENTION_GATE_BIAS = 0.25
SKIP_GATE_BIAS = 0.5
DC_W1_BIAS = 1.0


class CoefficientNet(nn.Module):
    """``forward(x, scale)`` (T, C) -> (T, n): ``(gelu(x W1ᵀ) W2ᵀ + b) · scale`` in x's dtype.

    Parameters: ``w1`` (64, C) Kaiming-uniform (bound 1/sqrt(C), ``nn.Linear``'s default); ``w2`` (n, 64)
    zero; ``b2`` (n,) = ``bias / MUDD_SCALE`` (``bias`` the effective initial coefficients)."""

    def __init__(self, model_dim: int, bias: list[float], hidden: int = MUDD_HIDDEN):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(hidden, model_dim))
        nn.init.kaiming_uniform_(self.w1, a=math.sqrt(5))
        self.w2 = nn.Parameter(torch.zeros(len(bias), hidden))
        self.b2 = nn.Parameter(torch.tensor(bias, dtype=torch.float32) / MUDD_SCALE)

    def forward(self, x: torch.Tensor, scale: float | torch.Tensor = MUDD_SCALE) -> torch.Tensor:
        hidden = F.gelu(F.linear(x, self.w1.type_as(x)))                                # (T, 64)
        coefficients = F.linear(hidden, self.w2.type_as(x), self.b2.type_as(x))        # (T, n)
        return coefficients * (scale.type_as(x) if isinstance(scale, torch.Tensor) else scale)


def layer_bias(resid_lambda_init: float) -> list[float]:
    """The 14 effective initial coefficients at the MUDD layer (record #81): 0 but the VE gate lanes (2) and
    the dynamic lambdas, which start at the static ones (sqrt(resid_lambda_init), 1, 0, 0.05, sqrt, 1)."""
    resid = math.sqrt(resid_lambda_init)
    return [0.0] * 6 + [VE_GATE_BIAS, VE_GATE_BIAS, resid, 1.0, 0.0, BIGRAM_GATE_BIAS, resid, 1.0]


@dataclass(frozen=True)
class LayerMix:
    """What the MUDD layer's coefficients give (tensors (T, C) or (T, 1)): ``x`` the recombined stream,
    ``value_add`` (T, H*Dh) added to the layer's values, and its dynamic lambdas."""

    x: torch.Tensor
    value_add: torch.Tensor
    resid_attn: torch.Tensor
    post_attn: torch.Tensor
    x0: torch.Tensor
    bigram: torch.Tensor
    resid_mlp: torch.Tensor
    post_mlp: torch.Tensor


class DenseConnections(nn.Module):
    """The dense connections of record #81 (module docstring): ``layer`` (14 coefficients) and ``final``
    (5), each a :class:`CoefficientNet`; Adam parameters (speedrun-spec.md 3.3: lr x0.25, betas 0.9/0.99,
    weight decay on w1, w2 but not b2). ``n_head`` even: the two VE gate lanes cover half the heads each."""

    def __init__(self, model_dim: int, n_head: int, resid_lambda_init: float):
        super().__init__()
        if n_head % 2:
            raise ValueError(f"MUDD's two value-embedding gate lanes need an even n_head, got {n_head}")
        self.n_head = n_head
        self.layer = CoefficientNet(model_dim, layer_bias(resid_lambda_init))
        final_bias = [0.0] * FINAL_COEFFICIENTS
        final_bias[1] = BACKOUT_BIAS
        self.final = CoefficientNet(model_dim, final_bias)

    def enter_layer(self, x: torch.Tensor, stream0: torch.Tensor, mid: torch.Tensor,
                    value_embed: torch.Tensor) -> LayerMix:
        """At the start of the MUDD layer: x, stream0, mid (T, C) (C = H*Dh), value_embed (T, H*Dh) the layer's
        value embedding. Returns the :class:`LayerMix` of the 14 coefficients of x."""
        mu = self.layer(x).unbind(-1)                                                   # 14 x (T,)
        mu = [m.unsqueeze(-1) for m in mu]                                              # (T, 1) each
        tokens = x.size(0)
        values = (mu[0] * stream0 + mu[1] * mid + mu[2] * x).view(tokens, self.n_head, -1)      # (T, H, Dh)
        lanes = torch.cat((mu[6], mu[7]), dim=-1).repeat_interleave(self.n_head // 2, dim=-1)   # (T, H)
        ve = value_embed.view(tokens, self.n_head, -1).type_as(values)
        value_add = (lanes.unsqueeze(-1) * ve + values).view(tokens, -1)               # (T, H*Dh)
        mixed = (1 + mu[5]) * x + mu[3] * stream0 + mu[4] * mid
        return LayerMix(mixed, value_add, *mu[8:14])

    def final_mix(self, x: torch.Tensor, stream0: torch.Tensor, mid: torch.Tensor, layer_input: torch.Tensor,
                  ve0: torch.Tensor, early: torch.Tensor) -> torch.Tensor:
        """After the last layer: x (T, C) plus the 5 coefficients' mix of stream0, mid, layer_input (the MUDD
        layer's input), ve0 (T, C) and early. Returns (T, C)."""
        mu = [m.unsqueeze(-1) for m in self.final(x).unbind(-1)]                         # 5 x (T, 1)
        return (x + mu[0] * stream0 + mu[1] * mid + mu[2] * layer_input + mu[3] * ve0.type_as(x)
                + mu[4] * early)


@dataclass(frozen=True)
class GateSlot:
    """One item of a MUDD gate's output: ``kind`` (``xsa``, ``attn_gate``, ``x0``, ``bigram``, ``skip``,
    ``dc_w1``, ``dc_w2``) of layer ``layer``, columns ``start`` .. ``start + width - 1``, initial value
    ``bias``."""

    kind: str
    layer: int
    start: int
    width: int
    bias: float


def gate_layout(config: GPTConfig) -> tuple[tuple[GateSlot, ...], tuple[GateSlot, ...]]:
    """The (pre, post) layouts of HEAD's MUDD gates (record #85) for ``config``: an item of layer L goes to
    the pre gate when L < ``mudd_gate_layer``, else to the post gate; within a gate, in order: XSA strengths
    (n_head each, ``xsa_layers``), attention gates (n_head each, ``attention_gate_layers``), the (x0, bigram)
    injection pair of every layer with attention other than the MUDD layer, the skip gate (at ``skip_to``,
    with a gated skip), the DC weights w1 then w2 (n_head each) of each of ``dc_layers``."""
    heads = config.n_head
    free = set(config.attention_free_layers)
    inject = [i for i in range(config.n_layer) if i not in free and not (config.mudd and i == config.mudd_layer)]
    items = ([("xsa", i, heads, 0.0) for i in config.xsa_layers]
             + [("attn_gate", i, heads, ATTENTION_GATE_BIAS) for i in config.attention_gate_layers]
             + [item for i in inject for item in (("x0", i, 1, 0.0), ("bigram", i, 1, BIGRAM_GATE_BIAS))]
             + ([("skip", config.skip_to, 1, SKIP_GATE_BIAS)] if config.skip_connections == "gated" else [])
             + [item for i in config.dc_layers for item in (("dc_w1", i, heads, DC_W1_BIAS),
                                                           ("dc_w2", i, heads, 0.0))])
    split = config.mudd_gate_layer
    return _slots([it for it in items if it[1] < split]), _slots([it for it in items if it[1] >= split])


def _slots(items: list[tuple[str, int, int, float]]) -> tuple[GateSlot, ...]:
    slots, start = [], 0
    for kind, layer, width, bias in items:
        slots.append(GateSlot(kind, layer, start, width, bias))
        start += width
    return tuple(slots)


class MuddGates(nn.Module):
    """HEAD's MUDD gates (record #85): ``pre`` and ``post`` :class:`CoefficientNet` over the layouts of
    :func:`gate_layout`, and ``scale`` (0-d, learnable from 0.1) multiplying both. :meth:`gates` returns a
    dict (kind, layer) -> (T, width) tensor; the attention and skip gates are linear (no sigmoid)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.pre_layout, self.post_layout = gate_layout(config)
        self.pre = CoefficientNet(config.model_dim, [s.bias for s in self.pre_layout for _ in range(s.width)])
        self.post = CoefficientNet(config.model_dim, [s.bias for s in self.post_layout for _ in range(s.width)])
        self.scale = nn.Parameter(torch.tensor(MUDD_SCALE))

    def gates(self, which: str, x: torch.Tensor) -> dict[tuple[str, int], torch.Tensor]:
        """``which`` "pre" (x = x0) or "post" (x = the stream entering ``mudd_gate_layer``): (T, C) ->
        {(kind, layer): (T, width)}."""
        net, layout = (self.pre, self.pre_layout) if which == "pre" else (self.post, self.post_layout)
        out = net(x, self.scale)                                                        # (T, n)
        return {(s.kind, s.layer): out[:, s.start:s.start + s.width] for s in layout}
