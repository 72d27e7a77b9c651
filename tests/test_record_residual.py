"""The records' residual form (``GPTConfig.residual_form: sublayer``, records #81-#88 and HEAD) against a plain
float64 forward pass written here line by line after record #88's and HEAD's own ``GPT.forward``
(shared/reference-code/{record88,head}/train_gpt.py), on the presets' layer indices at a tiny width
(11 layers, 6 heads of 4): per-sublayer lambdas, x0/bigram injection, the skip 3 -> 6 and its gate, the single
saved activation, sa lambdas, XSA, MUDD, HEAD's MUDD gates and DC (through a stand-in of
``speedrun.model.dc.dc_attention``); forward and gradients of every parameter. Then the presets, the
parameter kinds and their Adam groups, validation, and a CPU forward+backward of tiny record88/record89."""

from __future__ import annotations

import dataclasses
import importlib
import math

import pytest
import torch
import torch.nn.functional as F

from speedrun.errors import SpeedrunError
from speedrun.model.attention import PackedDocuments
from speedrun.model.config import PRESETS, GPTConfig, build_model_config
from speedrun.model.gpt import GPT
from speedrun.model.paired import paired_attention
from speedrun.model.rotary import apply_rotary
from speedrun.optim.config import OptimConfig
from speedrun.optim.groups import build_optimizers

TINY = dict(vocab_size=40, model_dim=24, n_head=6, head_dim=4, bigram_vocab_size=30, window_block_size=2,
            rotary_positions=128, attention_backend="reference", cross_entropy="full", rotary_kernel="torch",
            mlp_kernel="torch", fp8_head=False, fp8_mlp=False, fp8_attention=False, prefix_token_loss=False)
INPUTS = torch.tensor([3, 7, 1, 0, 9, 12, 3, 7, 5, 33, 2, 8, 8, 1, 39, 4, 6, 20, 11, 3])
CU = torch.tensor([0, 7, 15, 20, 20], dtype=torch.int32)                # three documents and a padding slot


def dc_stand_in(y, q, k, v, w1, w2, cu_seqlens, scale, window=112):
    """A float64-exact stand-in of ``speedrun.model.dc.dc_attention`` (lightweight DC, record #85) for these
    tests: per query t, each head's softmax over the keys of its document in the last ``window`` positions,
    mixed over heads by the RMS-normalized w1 (T, H); head h adds w2[t, h] times that mixture applied to v_h."""
    tokens = y.size(0)
    pos = torch.arange(tokens)
    doc = torch.bucketize(pos, cu_seqlens[1:].long(), right=True)
    offset = pos[:, None] - pos[None, :]
    mask = (doc[:, None] == doc[None, :]) & (offset >= 0) & (offset < window)          # (T, T)
    scores = torch.einsum("thd,shd->hts", q, k) * scale
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)                         # (H, T, T)
    w1n = w1 / torch.sqrt(w1.pow(2).mean(-1, keepdim=True) + 1e-6)                       # (T, H)
    mixed = torch.einsum("th,hts->ts", w1n, probs)                                       # (T, T)
    return y + w2[..., None] * torch.einsum("ts,shd->thd", mixed, v)


@pytest.fixture
def dc_module():
    """The real ``speedrun.model.dc``: the model calls it, while the forward written out in this file calls
    :func:`dc_stand_in`, an independent float64 implementation, so the comparisons check the module's weight
    convention (w1 RMS-normalized over the heads inside it) as well."""
    return importlib.import_module("speedrun.model.dc")


def tiny(preset: str, **overrides) -> GPTConfig:
    narrow = {"bigram_dim": 12} if PRESETS[preset].bigram_dim else {}        # record88's 192 of 768: half here
    return dataclasses.replace(PRESETS[preset], **{**TINY, **narrow, **overrides})


def randomized(config: GPTConfig, seed: int = 0) -> GPT:
    """A float64 model with every parameter moved off its initialization (zero inits included)."""
    torch.manual_seed(seed)
    model = GPT(config).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


# ---- the reference: record #88's and HEAD's forward, written out -------------------------------------------


def _norm(z):
    return F.rms_norm(z, (z.size(-1),))


def _attention(q, k, v, window, scale):
    tokens = q.size(0)
    pos = torch.arange(tokens)
    doc = torch.bucketize(pos, CU[1:].long(), right=True)
    offset = pos[:, None] - pos[None, :]
    mask = (doc[:, None] == doc[None, :]) & (offset >= 0)
    if window is not None:
        mask &= offset < window
    scores = torch.einsum("thd,shd->hts", q, k) * scale
    return torch.einsum("hts,shd->thd", scores.masked_fill(~mask, float("-inf")).softmax(-1), v)


def _reference_attention(model, i, x, aux_v, xsa_alpha, linear_gate, dc_w, head):
    """One attention layer as the records' CausalSelfAttention.forward computes it."""
    cfg, attn = model.config, model.blocks[i].attn
    T, H, Dh = x.size(0), cfg.n_head, cfg.head_dim
    context = model.attention_context(PackedDocuments(CU, T))
    window, scale = model.layer_windows()[i], model.attention_scale
    weight = torch.cat((attn.q.weight, attn.k.weight, attn.v.weight))
    q, k, v = F.linear(x, attn.sa_lambdas[0] * weight).view(T, 3, H, Dh).unbind(1)
    q, k = _norm(q), _norm(k)
    if aux_v is not None:
        v = v + aux_v.view(T, H, Dh)
    if i in (0, 2, 5, 9):
        y = paired_attention(q, k, v, PackedDocuments(CU, T), context.paired_cos, context.paired_sin, scale,
                             window, rope="half_truncated", backend="reference", layout="split")  # heads p, p+3
    else:
        q = apply_rotary(q, context.cos, context.sin, "half_truncated")
        k = apply_rotary(k, context.cos, context.sin, "half_truncated")
        if i in (3, 10):                                            # the long-window layers: key offset
            k = torch.cat((k[:, :, :Dh // 2], torch.cat((k[:1, :, Dh // 2:], k[:-1, :, Dh // 2:]))), dim=-1)
        y = _attention(q, k, v, window, scale)
        if dc_w is not None:
            y = dc_stand_in(y, q, k, v, dc_w[0], dc_w[1], CU, scale, window=112)
        if xsa_alpha is not None:
            if head:
                dot = (y * v).sum(-1, keepdim=True)
                denom = v.square().sum(-1, keepdim=True).clamp_min(1e-8)
                y = y - torch.tanh(xsa_alpha)[..., None] * (dot / denom) * v
            else:
                vn = F.normalize(v, dim=-1, eps=1e-4)
                y = y - torch.tanh(xsa_alpha)[..., None] * (y * vn).sum(-1, keepdim=True) * vn
    if linear_gate is not None:
        y = y * linear_gate[..., None]
    elif not head:
        y = y * torch.sigmoid(F.linear(x[:, :12], attn.gate.weight))[..., None]
    return F.linear(y.reshape(T, -1), attn.sa_lambdas[1] * attn.o.weight)


def _mlp(model, i, x):
    mlp = model.blocks[i].mlp
    return F.linear(torch.relu(F.linear(x, mlp.fc.weight)).square(), mlp.proj.weight)


def _coefficients(net, x, scale):
    return (F.linear(F.gelu(F.linear(x, net.w1)), net.w2) + net.b2) * scale


def reference_hidden(model: GPT) -> torch.Tensor:
    """The final normed hidden states (T, C) of INPUTS, as record #88 (head False) or HEAD computes them."""
    cfg = model.config
    head = cfg.mudd_gates
    T, H = INPUTS.numel(), cfg.n_head
    x = model.embed.weight[INPUTS]
    gate = model.smear.lambda_ * torch.sigmoid(F.linear(x[1:, :12], model.smear.gate))
    x = torch.cat((x[:1], x[1:] + gate * x[:-1]))
    x0 = _norm(x)
    bigram = model.bigram(INPUTS)
    ve = [None] * cfg.n_layer
    for j, layer in enumerate((1, 2, 8, 9, 10)):
        ve[layer] = model.value_embeds.tables[j].weight[INPUTS]
    resid, post = model.residual.resid_lambdas, model.residual.post_lambdas
    xsa_alphas, attn_gates, dc_weights = [None] * 11, [None] * 11, [None] * 11
    if head:
        x0_gates, bigram_gates = [None] * 11, [None] * 11
        pre = _coefficients(model.mudd_gates.pre, x0, model.mudd_gates.scale)
        xsa_alphas[1], xsa_alphas[3], attn_gates[3] = pre[:, 0:6], pre[:, 6:12], pre[:, 12:18]
        for layer, offset in zip((0, 1, 2, 3), range(18, 26, 2)):
            x0_gates[layer], bigram_gates[layer] = pre[:, offset:offset + 1], pre[:, offset + 1:offset + 2]
        x = x0 + bigram * bigram_gates[0]
    else:
        x0_gates, bigram_gates = model.residual.x0_lambdas, model.bigram.gates
        for layer in (1, 3, 4, 7, 8, 10):
            xsa_alphas[layer] = model.blocks[layer].attn.xsa_alpha
        x = x0 + bigram * bigram_gates[0]
        x0 = x                                       # record #88: x0 is the stream, updated in place
        skip_gate = (torch.sigmoid(model.skips.lambda_)
                     * 2 * torch.sigmoid(F.linear(x0[:, :12], model.skips.gate)))
    cache = {0: x}
    for i in range(11):
        mu = None
        if head and i == 4:
            post_gate = _coefficients(model.mudd_gates.post, x, model.mudd_gates.scale)
            xsa_alphas[4], xsa_alphas[7], attn_gates[10] = post_gate[:, 0:6], post_gate[:, 6:12], post_gate[:, 12:18]
            for layer, offset in zip((4, 5, 7, 8, 9), range(18, 28, 2)):
                x0_gates[layer] = post_gate[:, offset:offset + 1]
                bigram_gates[layer] = post_gate[:, offset + 1:offset + 2]
            skip_gate = torch.sigmoid(model.skips.lambda_) * post_gate[:, 28:29]
            dc_weights[10] = (post_gate[:, 29:35], post_gate[:, 35:41])
        if i == 6:
            x = x + skip_gate * cache[3]
        else:
            attn_in = _norm(cache.get(7, x))
            if i == 10:
                cache[9] = x
                mu = list(_coefficients(model.mudd.layer, x, 0.1).split(1, dim=-1))
                v_mudd = (mu[0] * cache[0] + mu[1] * cache[7] + mu[2] * x).view(T, H, -1)
                x = (1 + mu[5]) * x + mu[3] * cache[0] + mu[4] * cache[7]
                lanes = torch.cat((mu[6], mu[7]), dim=-1).repeat_interleave(H // 2, dim=-1)[..., None]
                aux_v = (lanes * ve[i].view(T, H, -1) + v_mudd).view(T, -1)
            elif ve[i] is not None:
                gate_in = torch.cat((attn_in[:, :6], ve[i][:, :6]), dim=-1)
                ve_gate = 2 * torch.sigmoid(F.linear(gate_in, model.blocks[i].attn.ve_gate.weight))
                aux_v = (ve_gate[..., None] * ve[i].view(T, H, -1)).view(T, -1)
            else:
                aux_v = None
            out = _reference_attention(model, i, attn_in, aux_v, xsa_alphas[i], attn_gates[i], dc_weights[i], head)
            if mu is not None:
                x = mu[8] * x + mu[9] * out + mu[10] * cache[0] + mu[11] * bigram
            else:
                x = resid[i, 0] * x + post[i, 0] * out + x0 * x0_gates[i]
                if i != 0:
                    x = x + bigram * bigram_gates[i]
        out = _mlp(model, i, _norm(x))
        x = mu[12] * x + mu[13] * out if mu is not None else resid[i, 1] * x + post[i, 1] * out
        if i in (3, 7):
            cache[i] = x
    mu = _coefficients(model.mudd.final, x, 0.1).split(1, dim=-1)
    x = x + mu[0] * cache[0] + mu[1] * cache[7] + mu[2] * cache[9] + mu[3] * ve[1] + mu[4] * cache[3]
    return _norm(x)


def _compare_forward_and_gradients(model: GPT) -> None:
    weights = torch.randn(INPUTS.numel(), model.config.model_dim, generator=torch.Generator().manual_seed(5),
                          dtype=torch.float64)
    params = [p for _, p in model.named_parameters()]
    ours = model.hidden_states(INPUTS, CU)
    grads = torch.autograd.grad((ours * weights).sum(), params, allow_unused=True)
    ref = reference_hidden(model)
    ref_grads = torch.autograd.grad((ref * weights).sum(), params, allow_unused=True)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    for (name, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        g = torch.zeros(1, dtype=torch.float64) if g is None else g
        r = torch.zeros(1, dtype=torch.float64) if r is None else r
        torch.testing.assert_close(g.expand_as(r) if g.numel() == 1 else g, r, rtol=1e-8, atol=1e-10,
                                   msg=lambda m: f"{name}: {m}")


def test_record88_form_matches_the_records_forward_and_gradients():
    _compare_forward_and_gradients(randomized(tiny("record88")))


def test_head_form_matches_heads_forward_and_gradients(dc_module):
    _compare_forward_and_gradients(randomized(tiny("record89")))


def test_every_parameter_of_the_record_forms_gets_a_gradient(dc_module):
    for preset in ("record88", "record89"):
        model = randomized(tiny(preset))
        model.hidden_states(INPUTS, CU).pow(2).sum().backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
        assert missing == ["lm_head.weight"], (preset, missing)                    # the head is after the states


# ---- initialization ---------------------------------------------------------------------------------------


def test_sublayer_lambdas_start_as_the_record():
    model = GPT(tiny("record88"))
    torch.testing.assert_close(model.residual.resid_lambdas, torch.full((11, 2), math.sqrt(1.1)))
    assert torch.equal(model.residual.post_lambdas, torch.ones(11, 2))
    assert torch.equal(model.residual.x0_lambdas, torch.zeros(11))
    assert torch.equal(model.bigram.gates, torch.full((11,), 0.05))
    assert torch.equal(model.skips.gate, torch.zeros(1, 12)) and model.skips.lambda_.item() == -1.5
    assert torch.equal(model.blocks[0].attn.sa_lambdas, torch.tensor([0.5, 1.0]))


def test_without_bigram_and_with_plain_lambdas_the_sublayer_form_is_a_prenorm_stack():
    """resid = post = 1, no x0, no gates: x += attn(norm x); x += mlp(norm x), the block form's arithmetic."""
    common = dict(vocab_size=40, n_layer=3, model_dim=16, n_head=2, head_dim=8, attention_backend="reference",
                  cross_entropy="full")
    torch.manual_seed(1)
    block = GPT(GPTConfig(**common)).double()
    sublayer = GPT(GPTConfig(**common, residual_form="sublayer")).double()
    state = {k: v for k, v in sublayer.state_dict().items() if not k.startswith("residual.")}
    block.load_state_dict(state)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.2 * torch.randn_like(p))
        sublayer.load_state_dict({**block.state_dict(), "residual.resid_lambdas": torch.ones(3, 2).double(),
                                  "residual.post_lambdas": torch.ones(3, 2).double(),
                                  "residual.x0_lambdas": torch.zeros(3).double()})
    torch.testing.assert_close(sublayer.hidden_states(INPUTS, CU), block.hidden_states(INPUTS, CU))


# ---- presets ----------------------------------------------------------------------------------------------


def test_record88_and_record89_presets_hold_the_records_switches():
    r88, r89 = PRESETS["record88"], PRESETS["record89"]
    for c in (r88, r89):
        assert (c.n_layer, c.model_dim, c.n_head, c.head_dim, c.residual_form) == (11, 768, 6, 128, "sublayer")
        assert (c.saved_activation_layer, c.mudd, c.mudd_layer, c.mudd_mid_layer, c.mudd_early_layer) == (
            7, True, 10, 7, 3)
        assert c.sa_lambdas and c.backout_layer is None and not c.x0_lambdas and c.attention_free_layers == (6,)
    assert r88.xsa_layers == (1, 3, 4, 7, 8, 10) and r88.xsa_form == "normalized" and r88.skip_gate
    assert r88.x0_with_bigram and not r88.mudd_gates and r88.attention_gate_layers == (0, 1, 2, 3, 4, 5, 7, 8, 9, 10)
    assert r89.xsa_layers == (1, 3, 4, 7) and r89.xsa_form == "projection" and not r89.skip_gate
    assert not r89.x0_with_bigram and r89.mudd_gates and r89.mudd_gate_layer == 4
    assert r89.attention_gate_layers == (3, 10) and r89.dc_layers == (10,) and r89.dc_window == 112
    assert build_model_config("gpt124m").residual_form == "block"                        # unchanged


def test_record88_parameter_count_by_hand():
    """Full width: record #88's own parameters less its padding (banks padded to 8 GPUs, the unused 10th VE
    gate slice; its x0_lambdas/bigram_lambdas/xsa_alphas hold rows of layers that never use them)."""
    with torch.device("meta"):
        model = GPT(build_model_config("record88", {"attention_backend": "reference"}))
    C, V, H = 768, 50304, 6
    attention = 10 * (4 * C * C + 2 + H * 12) + 4 * H * 12 + 6 * H           # qkvo, sa λ, gates, VE gates, XSA
    mlp = 11 * 2 * 4 * C * C
    embeddings = 2 * V * C + 5 * V * C + 50304 * 15 * 192                    # embed, head, VE, bigram (L1746-7)
    misc = 12 + 1 + 11 + 1 + 12 + 11 * 2 * 2 + 11                            # smear, bigram λ, skip λ+gate, res
    mudd = 2 * 64 * C + 64 * (14 + 5) + 14 + 5
    assert sum(p.numel() for p in model.parameters()) == attention + mlp + embeddings + misc + mudd


def test_tiny_record88_and_record89_train_one_step_on_the_cpu(dc_module):
    for preset in ("record88", "record89"):
        model = GPT(tiny(preset))
        optimizers = build_optimizers(model, model.parameter_kinds(), OptimConfig())
        targets = torch.roll(INPUTS, -1)
        loss = model(INPUTS, targets, CU)
        loss.backward()
        model.fold_tied_gradients()
        optimizers.step()
        model.after_optimizer_step()
        assert torch.isfinite(loss) and torch.isfinite(model(INPUTS, targets, CU))


# ---- parameter kinds and their Adam groups ------------------------------------------------------------------


def test_parameter_kinds_of_the_record_parameters(dc_module):
    kinds = GPT(tiny("record88")).parameter_kinds()
    assert kinds["residual.resid_lambdas"] == "resid_lambda"
    assert kinds["residual.post_lambdas"] == kinds["residual.x0_lambdas"] == kinds["bigram.gates"] == "lambda"
    assert kinds["blocks.1.attn.xsa_alpha"] == "lambda" and kinds["blocks.1.attn.sa_lambdas"] == "scalar"
    assert kinds["skips.gate"] == "skip_gate" and kinds["skips.lambda_"] == "scalar"
    assert kinds["blocks.0.attn.gate.weight"] == kinds["blocks.1.attn.ve_gate.weight"] == "gate"
    assert kinds["smear.gate"] == "smear_gate" and kinds["smear.lambda_"] == "scalar"
    assert {kinds[f"mudd.{n}.{w}"] for n in ("layer", "final") for w in ("w1", "w2")} == {"mudd"}
    assert kinds["mudd.layer.b2"] == kinds["mudd.final.b2"] == "mudd_bias"
    head = GPT(tiny("record89")).parameter_kinds()
    assert {head[f"mudd_gates.{n}.{w}"] for n in ("pre", "post") for w in ("w1", "w2")} == {"mudd_gate"}
    assert head["mudd_gates.pre.b2"] == head["mudd_gates.post.b2"] == head["mudd_gates.scale"] == "mudd_gate_bias"
    assert "blocks.1.attn.xsa_alpha" not in head and "blocks.3.attn.gate.weight" not in head
    block_form = GPT(tiny("gpt124m")).parameter_kinds()                                   # unchanged
    assert block_form["bigram.gates"] == block_form["smear.gate"] == block_form["blocks.0.attn.gate.weight"] == "scalar"


def test_record_kinds_get_the_records_adam_settings(dc_module):
    model = GPT(tiny("record89"))
    optimizers = build_optimizers(model, model.parameter_kinds(), OptimConfig(adam_weight_decay=0.005))
    groups = {g["kind"]: g for g in optimizers.optimizers[0].param_groups}
    # record #88 / HEAD param_table: base lr 0.008 times lr_mul; wd 0.005 times wd_mul
    expected = {"lambda": (0.008, (0.9, 0.95), 0.0), "resid_lambda": (0.04, (0.9, 0.95), 0.0),
                "mudd": (0.002, (0.9, 0.99), 0.005), "mudd_bias": (0.002, (0.9, 0.99), 0.0),
                "mudd_gate": (0.0008, (0.9, 0.99), 0.005), "mudd_gate_bias": (0.0008, (0.9, 0.99), 0.0)}
    for kind, (lr, betas, wd) in expected.items():
        group = groups[kind]
        assert (group["lr"], group["initial_lr"], group["betas"]) == (lr, lr, betas), kind
        assert group["weight_decay"] == pytest.approx(wd), kind
    assert groups["scalar"]["weight_decay"] == 0.005 and "skip_gate" not in groups
    r88 = GPT(tiny("record88"))
    skip = {g["kind"]: g for g in build_optimizers(r88, r88.parameter_kinds(), OptimConfig()).optimizers[0]
            .param_groups}["skip_gate"]
    assert (skip["lr"], skip["betas"], skip["weight_decay"]) == (0.0004, (0.9, 0.99), 0.0)
    assert (groups["gate"]["lr"], groups["gate"]["betas"], groups["gate"]["weight_decay"]) == (
        0.008, (0.9, 0.99), 0.005)
    assert (groups["smear_gate"]["lr"], groups["smear_gate"]["weight_decay"]) == (0.00008, 0.0)
    custom = OptimConfig(adam_kind_lrs={"mudd": 0.01}, adam_kind_betas={"mudd": (0.8, 0.9)})
    mudd = [g for g in build_optimizers(r88, r88.parameter_kinds(), custom).optimizers[0].param_groups
            if g["kind"] == "mudd"][0]
    assert (mudd["lr"], mudd["betas"]) == (0.01, (0.8, 0.9))


# ---- validation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, message", [
    (dict(residual_form="sublayer", x0_lambdas=True), "excludes model.x0_lambdas"),
    (dict(residual_form="sublayer", skip_connections="unet"), "takes no U-net skips"),
    (dict(mudd=True), "model.mudd belongs to the records' sublayer form"),
    (dict(residual_form="sublayer", skip_gate=True), "model.skip_gate gates the gated skip"),
    (dict(residual_form="sublayer", saved_activation_layer=3), "saved_activation_layer must be null or"),
    (dict(saved_activation_layer=1), "saved_activation_layer needs model.residual_form sublayer"),
    (dict(paired_head_layers=(1,), xsa_layers=(1,)), "model.xsa_layers names layer 1, which is paired"),
    (dict(dc_layers=(1,)), "model.dc_layers take their weights from the MUDD gates"),
    (dict(residual_form="sublayer", mudd=True, mudd_layer=3, value_embed_layers=(2,)),
     "mudd_layer must be a layer index in 1..2, got 3"),
    (dict(residual_form="sublayer", mudd=True, mudd_layer=2, mudd_mid_layer=2, value_embed_layers=(2,)),
     "model.mudd_mid_layer must be a layer index before model.mudd_layer 2"),
    (dict(residual_form="sublayer", mudd=True, mudd_layer=2, mudd_mid_layer=1, mudd_early_layer=0),
     "must be one of model.value_embed_layers"),
    (dict(residual_form="sublayer", mudd_gates=True, mudd_gate_layer=0), "mudd_gate_layer must be a layer"),
    (dict(xsa_form="tanh"), "model.xsa_form must be one of normalized, projection"),
    (dict(residual_form="residual"), "model.residual_form must be one of block, sublayer"),
])
def test_record_switches_are_validated(overrides, message):
    with pytest.raises(SpeedrunError, match=message):
        GPTConfig(**{**dict(n_layer=3, model_dim=16, n_head=2, head_dim=8), **overrides})


@pytest.mark.parametrize("preset, backend", [("record89", "reference")])     # each case takes 30-50 s here
def test_the_record_forms_compile_as_one_graph(dc_module, preset, backend):
    """fullgraph, static shapes: layer indices, MUDD and the gates are Python constants (no data-dependent
    branch); with flex the windows and the YaRN scale are graph inputs (record88 and record89 with flex and
    reference all passed once, 2026-12-01; one case kept for time). Flex on a CPU has no backward."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = randomized(tiny(preset, attention_backend=backend)).float()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, dynamic=False, fullgraph=True)
    targets = torch.roll(INPUTS, -1)
    with torch.set_grad_enabled(backend != "flex"):
        loss = compiled(INPUTS, targets, CU)
        if backend != "flex":
            loss.backward()
    torch._dynamo.reset()
    assert counter.frame_count == 1
    eager = randomized(tiny(preset)).float().requires_grad_(False)                     # reference backend
    torch.testing.assert_close(loss.detach(), eager(INPUTS, targets, CU), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("preset, zero", [("record88", False), ("record89", False), ("record83", False),
                                          ("record87", False), ("gpt124m", True), ("record31", True)])
def test_the_attention_output_starts_as_each_record_starts_it(preset, zero):
    """Records #83-#89 and HEAD start O uniform like v (their vo_bank, record #88 L1251: std 0.5/sqrt(fan_in)),
    older ones at zero; the MLP's output projection starts at zero in all of them."""
    torch.manual_seed(0)
    extra = {"fp8_attention_scales": "dynamic"} if preset == "record87" else {}
    model = GPT(tiny(preset, **extra))
    block = next(b for b in model.blocks if b.attn is not None and b.mlp is not None)
    o = block.attn.o.weight
    assert torch.count_nonzero(block.mlp.proj.weight) == 0
    if zero:
        assert torch.count_nonzero(o) == 0
    else:
        bound = 3 ** 0.5 * 0.5 / o.size(1) ** 0.5
        assert o.abs().max().item() <= bound and o.abs().max().item() > 0.9 * bound
