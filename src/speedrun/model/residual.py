"""The residual form of records #81-#88 and HEAD (``GPTConfig.residual_form: sublayer``; speedrun-spec.md
2.2 items 7-9): per-sublayer lambdas, x0 and bigram injected after the attention sublayer, the gated skip,
the single saved activation (record #77), MUDD (record #81) and HEAD's MUDD gates (record #85).

Layer i of the loop (:func:`run_sublayers`), x the residual stream (T, C):

* a layer without attention: ``x += w_skip · out[skip_from]`` at ``skip_to`` (the gated skip; elsewhere
  nothing), then the MLP sublayer. No lambdas, no injections.
* an attention layer reads ``a = norm(out[k])`` for i > k = ``saved_activation_layer``, else ``norm(x)``,
  and updates ``x = resid[i, 0]·x + post[i, 0]·attn(a) + x0·x0_lambda[i]`` plus, for i >= 1,
  ``bigram_lambda[i]·bigram`` (layer 0's enters before the loop: ``x = x0 + bigram_lambda[0]·bigram``).
* then the MLP: ``x = resid[i, 1]·x + post[i, 1]·mlp(norm(x))``.

``resid_lambdas`` (n_layer, 2) start at sqrt(resid_lambda_init) (√1.1: 1.1 per layer, record #45),
``post_lambdas`` (n_layer, 2) at 1, ``x0_lambdas`` (n_layer,) at 0; the bigram lambdas are the bigram
module's ``gates`` (from 0.05). ``out[k]`` is the stream after layer k. With MUDD, the MUDD layer takes its
lambdas, its value-embedding gate and extra values from :class:`speedrun.model.mudd.DenseConnections`, and
a last mix follows the loop; with HEAD's MUDD gates the x0/bigram lambdas, the skip gate, the XSA strengths,
the attention output gates and the DC weights are per token, from :class:`speedrun.model.mudd.MuddGates`.

Shape legend: T tokens, C model_dim, H n_head.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from speedrun.model.norm import rms_norm


class SublayerResidual(nn.Module):
    """The per-sublayer lambdas: ``resid_lambdas`` (n_layer, 2) [attention, MLP] from
    sqrt(``resid_lambda_init``), ``post_lambdas`` (n_layer, 2) from 1, ``x0_lambdas`` (n_layer,) from 0
    (records #81-#88; Adam, speedrun-spec.md 3.3: betas 0.9/0.95, resid lr x5, no weight decay). Without
    ``x0_lambdas`` (HEAD, whose MUDD gates give them per token) that parameter is None."""

    def __init__(self, n_layer: int, resid_lambda_init: float = 1.1, x0_lambdas: bool = True):
        super().__init__()
        self.resid_lambdas = nn.Parameter(torch.full((n_layer, 2), math.sqrt(resid_lambda_init)))
        self.post_lambdas = nn.Parameter(torch.ones(n_layer, 2))
        self.x0_lambdas = nn.Parameter(torch.zeros(n_layer)) if x0_lambdas else None


def run_sublayers(model: Any, x0: torch.Tensor, context: Any, windows: list, value_embeds: list,
                  bigram: torch.Tensor | None) -> torch.Tensor:
    """The residual stream (T, C) after the last layer (and MUDD's final mix, and backout when set) of
    :class:`speedrun.model.gpt.GPT` ``model`` in the sublayer form, from x0 (T, C) the normalized embedding,
    the attention ``context``, per-layer ``windows`` and value embeddings (T, H*Dh) or None, and ``bigram``
    (T, C) the ungated bigram rows or None. Layer indices are Python constants: one compiled graph."""
    cfg = model.config
    resid = model.residual.resid_lambdas.type_as(x0).unbind(0)                     # n_layer x (2,)
    post = model.residual.post_lambdas.type_as(x0).unbind(0)
    gates = model.mudd_gates.gates("pre", x0) if cfg.mudd_gates else {}
    x0_lambdas = None if cfg.mudd_gates else model.residual.x0_lambdas.type_as(x0).unbind(0)
    bigram_lambdas = None if cfg.mudd_gates or bigram is None else model.bigram.gates.type_as(x0).unbind(0)

    def x0_coef(i: int) -> torch.Tensor:
        return gates[("x0", i)] if cfg.mudd_gates else x0_lambdas[i]

    def bigram_coef(i: int) -> torch.Tensor:
        return gates[("bigram", i)] if cfg.mudd_gates else bigram_lambdas[i]

    x = x0 if bigram is None else x0 + bigram_coef(0) * bigram.type_as(x0)
    stream0 = x                                                                      # the input of layer 0
    inject = stream0 if cfg.x0_with_bigram else x0
    skips = model.skips if cfg.skip_connections == "gated" else None
    skip_weight = skips.weight(inject) if skips is not None and not cfg.mudd_gates else None
    saved = cfg.saved_activation_layer
    keep = {cfg.backout_layer, saved} | ({skips.skip_from} if skips is not None else set())
    if cfg.mudd:
        keep |= {cfg.mudd_mid_layer, cfg.mudd_early_layer}
    outputs: dict[int, torch.Tensor] = {}
    mudd_input = None
    for i, (block, window, ve) in enumerate(zip(model.blocks, windows, value_embeds)):
        if cfg.mudd_gates and i == cfg.mudd_gate_layer:
            gates.update(model.mudd_gates.gates("post", x))
        if skips is not None and i == skips.skip_to:
            weight = skips.weight(mudd_gate=gates[("skip", i)]) if cfg.mudd_gates else skip_weight
            x = x + weight * outputs[skips.skip_from]
        mix = None
        if block.attn is not None:
            attn_in = rms_norm(outputs[saved] if saved is not None and i > saved else x)
            if cfg.mudd and i == cfg.mudd_layer:
                mudd_input = x
                mix = model.mudd.enter_layer(x, stream0, outputs[cfg.mudd_mid_layer], ve)
                x, ve = mix.x, mix.value_add
            dc = (gates[("dc_w1", i)], gates[("dc_w2", i)]) if i in cfg.dc_layers else None
            attn_out = block.attn(attn_in, context, window, ve, xsa_alpha=gates.get(("xsa", i)),
                                  gate=gates.get(("attn_gate", i)), dc_weights=dc).type_as(x)
            if mix is not None:
                x = mix.resid_attn * x + mix.post_attn * attn_out + mix.x0 * stream0
                if bigram is not None:
                    x = x + mix.bigram * bigram.type_as(x)
            else:
                x = resid[i][0] * x + post[i][0] * attn_out + inject * x0_coef(i)
                if bigram is not None and i > 0:
                    x = x + bigram_coef(i) * bigram.type_as(x)
        out = block.mlp(rms_norm(x)).type_as(x)
        x = mix.resid_mlp * x + mix.post_mlp * out if mix is not None else resid[i][1] * x + post[i][1] * out
        if i in keep:
            outputs[i] = x
    if cfg.mudd:
        ve0 = value_embeds[cfg.value_embed_layers[0]]
        x = model.mudd.final_mix(x, stream0, outputs[cfg.mudd_mid_layer], mudd_input, ve0,
                                 outputs[cfg.mudd_early_layer])
    if cfg.backout_layer is not None:
        x = x - model.backout_lambda.type_as(x) * outputs[cfg.backout_layer]
    return x
