"""XSA (records #82, #86; :func:`speedrun.model.xsa.xsa`) against a per-head loop written here: each head's
output minus tanh(alpha) times its orthogonal projection on the head's own value, in both forms, with a
per-head and a per-token alpha; alpha 0 changes nothing; the result is orthogonal to v at alpha -> inf;
gradients by finite differences; the attention layer applies it after the kernel and before the gate."""

from __future__ import annotations

import math

import pytest
import torch

from speedrun.model.attention import PackedDocuments
from speedrun.model.block import AttentionContext, CausalSelfAttention
from speedrun.model.config import GPTConfig
from speedrun.model.rotary import rotary_frequencies, rotary_table
from speedrun.model.xsa import xsa

GEN = torch.Generator().manual_seed(82)


def _loop_reference(y, v, alpha):
    """Token by token, head by head: y - tanh(a)·<y, v>/<v, v>·v (v never zero here)."""
    out = y.clone()
    for t in range(y.size(0)):
        for h in range(y.size(1)):
            a = float(alpha[h] if alpha.ndim == 1 else alpha[t, h])
            yv, vv = float(y[t, h] @ v[t, h]), float(v[t, h] @ v[t, h])
            out[t, h] = y[t, h] - math.tanh(a) * yv / vv * v[t, h]
    return out


@pytest.mark.parametrize("form", ["normalized", "projection"])
@pytest.mark.parametrize("per_token", [False, True])
def test_xsa_matches_the_per_head_loop(form, per_token):
    y = torch.randn(5, 3, 4, generator=GEN, dtype=torch.float64)
    v = torch.randn(5, 3, 4, generator=GEN, dtype=torch.float64)
    alpha = torch.randn(*((5, 3) if per_token else (3,)), generator=GEN, dtype=torch.float64)
    torch.testing.assert_close(xsa(y, v, alpha, form), _loop_reference(y, v, alpha), rtol=1e-12, atol=1e-12)


def test_alpha_zero_is_the_identity_and_a_large_alpha_removes_the_value_direction():
    y = torch.randn(6, 2, 8, generator=GEN, dtype=torch.float64)
    v = torch.randn(6, 2, 8, generator=GEN, dtype=torch.float64)
    for form in ("normalized", "projection"):
        assert torch.equal(xsa(y, v, torch.zeros(2, dtype=torch.float64), form), y)
        out = xsa(y, v, torch.full((2,), 40.0, dtype=torch.float64), form)          # tanh(40) = 1 in float64
        torch.testing.assert_close((out * v).sum(-1), torch.zeros(6, 2, dtype=torch.float64), atol=1e-12, rtol=0)


def test_a_zero_value_leaves_the_output_unchanged():
    """Both forms guard |v|: a zero value row subtracts nothing (no NaN)."""
    y = torch.randn(2, 1, 4, dtype=torch.float64)
    v = torch.zeros(2, 1, 4, dtype=torch.float64)
    for form in ("normalized", "projection"):
        assert torch.equal(xsa(y, v, torch.ones(1, dtype=torch.float64), form), y)


def test_xsa_gradients_match_finite_differences():
    y = torch.randn(3, 2, 4, generator=GEN, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, 2, 4, generator=GEN, dtype=torch.float64, requires_grad=True)
    alpha = torch.randn(3, 2, generator=GEN, dtype=torch.float64, requires_grad=True)
    for form in ("normalized", "projection"):
        assert torch.autograd.gradcheck(lambda a, b, c: xsa(a, b, c, form), (y, v, alpha))


def test_bad_shapes_and_forms_raise():
    y = torch.zeros(2, 1, 4)
    with pytest.raises(ValueError, match="one \\(T, H, Dh\\) shape"):
        xsa(y, torch.zeros(2, 1, 3), torch.zeros(1))
    with pytest.raises(ValueError, match="unknown xsa form"):
        xsa(y, y, torch.zeros(1), "exclusive")


def _layer(**overrides):
    config = GPTConfig(n_layer=2, model_dim=16, n_head=2, head_dim=8, attention_backend="reference", **overrides)
    torch.manual_seed(3)
    return CausalSelfAttention(config, 1).double(), config


def _context(tokens):
    cos, sin = rotary_table(rotary_frequencies(8, 10000.0).double(), tokens)
    return AttentionContext(PackedDocuments(torch.tensor([0, 3, tokens], dtype=torch.int32), tokens), cos, sin, 0.3)


def test_an_attention_layer_with_xsa_at_alpha_zero_equals_one_without():
    plain, _ = _layer()
    with_xsa, _ = _layer(xsa_layers=(1,))
    assert torch.equal(with_xsa.xsa_alpha, torch.zeros(2))
    x = torch.randn(7, 16, generator=GEN, dtype=torch.float64)
    torch.testing.assert_close(with_xsa(x, _context(7)), plain(x, _context(7)), rtol=0, atol=0)


def test_the_attention_layer_applies_xsa_before_its_output_gate(monkeypatch):
    """Capture the kernel's output and its v; the layer's result is o(gate · xsa(y, v, alpha))."""
    layer, _ = _layer(xsa_layers=(1,), attention_gate_layers=(1,), xsa_form="normalized")
    with torch.no_grad():
        layer.xsa_alpha.copy_(torch.tensor([0.7, -1.2]))
        layer.gate.weight.normal_(generator=GEN)
        layer.o.weight.normal_(generator=GEN)
    seen = {}
    import speedrun.model.block as block_module
    original = block_module.attention

    def spy(q, k, v, docs, scale, window, backend):
        seen["y"], seen["v"] = original(q, k, v, docs, scale, window, backend=backend), v
        return seen["y"]

    monkeypatch.setattr(block_module, "attention", spy)
    x = torch.randn(7, 16, generator=GEN, dtype=torch.float64)
    out = layer(x, _context(7))
    y = _loop_reference(seen["y"].detach(), seen["v"].detach(), layer.xsa_alpha.detach())
    gate = torch.sigmoid(x[:, :12] @ layer.gate.weight.T)[..., None]
    torch.testing.assert_close(out, (gate * y).reshape(7, -1) @ layer.o.weight.T, rtol=1e-12, atol=1e-12)
    per_token = torch.randn(7, 2, generator=GEN, dtype=torch.float64)          # the MUDD gates' form
    out = layer(x, _context(7), xsa_alpha=per_token, gate=torch.full((7, 2), 0.25, dtype=torch.float64))
    y = _loop_reference(seen["y"].detach(), seen["v"].detach(), per_token)
    torch.testing.assert_close(out, (0.25 * y).reshape(7, -1) @ layer.o.weight.T, rtol=1e-12, atol=1e-12)
