"""MUDD (record #81) and HEAD's MUDD gates (record #85), :mod:`speedrun.model.mudd`: the coefficient network
against its formula (values, gradients), its initialization, the dense connections at the MUDD layer and
after the loop against the record's arithmetic written here, the bias-only mix when W2 is zero (backout
-0.5 absorbed, the static lambdas reproduced), and the gate layouts against HEAD's hard-coded offsets."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from speedrun.model.config import PRESETS
from speedrun.model.mudd import CoefficientNet, DenseConnections, MuddGates, gate_layout

GEN = torch.Generator().manual_seed(81)


def _plain(net, x, scale):
    hidden = 0.5 * (x @ net.w1.T) * (1 + torch.erf((x @ net.w1.T) / math.sqrt(2)))     # exact GELU
    return (hidden @ net.w2.T + net.b2) * scale


def _randomize(module):
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=GEN, dtype=p.dtype))
    return module


def test_coefficient_net_matches_its_formula_and_gradients():
    net = _randomize(CoefficientNet(6, [0.1, -0.2, 0.3]).double())
    x = torch.randn(4, 6, generator=GEN, dtype=torch.float64)
    torch.testing.assert_close(net(x, 0.1), _plain(net, x, 0.1), rtol=1e-12, atol=1e-12)
    scale = torch.tensor(0.37, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z, s: net(z, s), (x.requires_grad_(), scale))


def test_coefficient_net_initialization():
    torch.manual_seed(0)
    net = CoefficientNet(100, [2.0, -0.5, 0.0])
    assert net.w1.shape == (64, 100) and net.w1.abs().max() <= 1 / math.sqrt(100)    # Kaiming, a = sqrt(5)
    assert net.w1.std() > 0.5 / math.sqrt(3 * 100)                                    # uniform, not zero
    assert torch.equal(net.w2, torch.zeros(3, 64))
    torch.testing.assert_close(net.b2, torch.tensor([20.0, -5.0, 0.0]))              # pre-scaled by 1/0.1
    x = torch.randn(5, 100)
    torch.testing.assert_close(net(x), torch.tensor([[2.0, -0.5, 0.0]]).expand(5, 3))  # zero W2: the biases


def _states(tokens=5, dim=8):
    return [torch.randn(tokens, dim, generator=GEN, dtype=torch.float64) for _ in range(6)]


def test_enter_layer_is_the_records_arithmetic():
    mudd = _randomize(DenseConnections(8, 4, 1.1).double())
    x, s0, mid, ve, _, _ = _states()
    mix = mudd.enter_layer(x, s0, mid, ve)
    mu = _plain(mudd.layer, x, 0.1)                                                   # (T, 14)
    c = [mu[:, j:j + 1] for j in range(14)]
    values = (c[0] * s0 + c[1] * mid + c[2] * x).view(5, 4, 2)
    lanes = torch.stack((c[6][:, 0], c[6][:, 0], c[7][:, 0], c[7][:, 0]), dim=-1)[..., None]   # heads 0,1 | 2,3
    torch.testing.assert_close(mix.value_add, (lanes * ve.view(5, 4, 2) + values).view(5, 8))
    torch.testing.assert_close(mix.x, (1 + c[5]) * x + c[3] * s0 + c[4] * mid)
    for got, j in zip((mix.resid_attn, mix.post_attn, mix.x0, mix.bigram, mix.resid_mlp, mix.post_mlp),
                      range(8, 14)):
        torch.testing.assert_close(got, c[j])


def test_with_zero_w2_the_mudd_layer_reproduces_the_static_lambdas_and_a_doubled_value_embedding():
    mudd = DenseConnections(8, 4, 1.1).double()
    x, s0, mid, ve, _, _ = _states()
    mix = mudd.enter_layer(x, s0, mid, ve)
    torch.testing.assert_close(mix.x, x)                                              # mu3 = mu4 = mu5 = 0
    torch.testing.assert_close(mix.value_add, 2 * ve)                                 # lanes at 2, no states
    expected = (math.sqrt(1.1), 1.0, 0.0, 0.05, math.sqrt(1.1), 1.0)
    got = (mix.resid_attn, mix.post_attn, mix.x0, mix.bigram, mix.resid_mlp, mix.post_mlp)
    for value, tensor in zip(expected, got):
        torch.testing.assert_close(tensor, torch.full((5, 1), value, dtype=torch.float64))


def test_final_mix_formula_and_its_bias_only_form_is_backout():
    mudd = DenseConnections(8, 4, 1.1).double()
    x, s0, mid, before, ve0, early = _states()
    torch.testing.assert_close(mudd.final_mix(x, s0, mid, before, ve0, early), x - 0.5 * mid)   # record #40
    _randomize(mudd)
    mu = _plain(mudd.final, x, 0.1)
    expected = x + mu[:, :1] * s0 + mu[:, 1:2] * mid + mu[:, 2:3] * before + mu[:, 3:4] * ve0 + mu[:, 4:5] * early
    torch.testing.assert_close(mudd.final_mix(x, s0, mid, before, ve0, early), expected)


def test_gate_layouts_are_heads_offsets():
    """HEAD's unpack_pre_mudd_gate / unpack_post_mudd_gate and init_mudd_gate, for its 11 layers and 6 heads."""
    pre, post = gate_layout(PRESETS["record89"])
    spans = lambda layout: {(s.kind, s.layer): (s.start, s.start + s.width) for s in layout}  # noqa: E731
    expected_pre = {("xsa", 1): (0, 6), ("xsa", 3): (6, 12), ("attn_gate", 3): (12, 18)}
    for layer, offset in zip((0, 1, 2, 3), range(18, 26, 2)):
        expected_pre[("x0", layer)], expected_pre[("bigram", layer)] = (offset, offset + 1), (offset + 1, offset + 2)
    expected_post = {("xsa", 4): (0, 6), ("xsa", 7): (6, 12), ("attn_gate", 10): (12, 18), ("skip", 6): (28, 29),
                     ("dc_w1", 10): (29, 35), ("dc_w2", 10): (35, 41)}
    for layer, offset in zip((4, 5, 7, 8, 9), range(18, 28, 2)):
        expected_post[("x0", layer)], expected_post[("bigram", layer)] = (offset, offset + 1), (offset + 1, offset + 2)
    assert spans(pre) == expected_pre and spans(post) == expected_post


def test_gate_biases_are_heads_and_the_scale_is_shared():
    torch.manual_seed(0)
    gates = MuddGates(PRESETS["record89"])
    pre, post = torch.zeros(26), torch.zeros(41)
    pre[12:18], pre[19:26:2] = 0.25, 0.05                                             # HEAD's bs_init / 0.1
    post[12:18], post[19:28:2], post[28], post[29:35] = 0.25, 0.05, 0.5, 1.0
    torch.testing.assert_close(gates.pre.b2 * 0.1, pre)
    torch.testing.assert_close(gates.post.b2 * 0.1, post)
    assert gates.scale.ndim == 0 and gates.scale.item() == torch.tensor(0.1).item()
    x = torch.randn(3, 768)
    out = gates.gates("post", x)
    torch.testing.assert_close(out[("dc_w1", 10)], torch.ones(3, 6))                  # zero W2: the biases
    torch.testing.assert_close(out[("skip", 6)], torch.full((3, 1), 0.5))
    with torch.no_grad():
        gates.scale.fill_(0.2)                                                          # one scale for both
    torch.testing.assert_close(gates.gates("pre", x)[("attn_gate", 3)], torch.full((3, 6), 0.5))
    torch.testing.assert_close(gates.gates("post", x)[("skip", 6)], torch.full((3, 1), 1.0))


def test_gelu_is_the_exact_one():
    """The records call F.gelu without approximation: our network does the same."""
    net = _randomize(CoefficientNet(4, [0.0]).double())
    x = torch.randn(3, 4, generator=GEN, dtype=torch.float64)
    hidden = F.gelu(x @ net.w1.T, approximate="none")
    torch.testing.assert_close(net(x, 1.0), hidden @ net.w2.T + net.b2)


def test_the_layer_indices_are_fields_not_constants(monkeypatch):
    """4 layers with every MUDD switch moved to other indices: the layouts follow (counted by hand: pre = XSA 1
    (2) + attention gate 1 (2) + injections 0, 1 (4); post = XSA 3 (2) + attention gate 3 (2) + injection 2 (2,
    3 is the MUDD layer) + skip at 2 (1) + DC 3 (2 + 2)), and a forward/backward reaches every parameter."""
    import sys
    import types

    from speedrun.model.config import GPTConfig
    from speedrun.model.gpt import GPT
    from test_record_residual import dc_stand_in

    module = types.ModuleType("speedrun.model.dc")
    module.dc_attention = dc_stand_in
    monkeypatch.setitem(sys.modules, "speedrun.model.dc", module)
    config = GPTConfig(vocab_size=30, n_layer=4, model_dim=16, n_head=2, head_dim=8, bigram_vocab_size=20,
                       value_embed_layers=(1, 3), skip_connections="gated", skip_from=0, skip_to=2,
                       attention_gate_layers=(1, 3), residual_form="sublayer", saved_activation_layer=1,
                       xsa_layers=(1, 3), mudd=True, mudd_layer=3, mudd_mid_layer=1, mudd_early_layer=0,
                       mudd_gates=True, mudd_gate_layer=2, dc_layers=(3,), dc_window=3,
                       attention_backend="reference", cross_entropy="full")
    pre, post = gate_layout(config)
    assert [(s.kind, s.layer, s.width) for s in pre] == [("xsa", 1, 2), ("attn_gate", 1, 2), ("x0", 0, 1),
                                                         ("bigram", 0, 1), ("x0", 1, 1), ("bigram", 1, 1)]
    assert [(s.kind, s.layer, s.width) for s in post] == [("xsa", 3, 2), ("attn_gate", 3, 2), ("x0", 2, 1),
                                                          ("bigram", 2, 1), ("skip", 2, 1), ("dc_w1", 3, 2),
                                                          ("dc_w2", 3, 2)]
    model = _randomize(GPT(config).double())
    inputs = torch.tensor([1, 5, 2, 9, 9, 3, 0, 7, 4, 4, 2, 8])
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    model.hidden_states(inputs, cu).pow(2).sum().backward()
    silent = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert silent == ["lm_head.weight"]
