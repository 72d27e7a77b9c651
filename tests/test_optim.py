"""Muon and the optimizer assembly: the orthogonalizers against a scalar float64 iteration of their
polynomials on diagonal matrices and against the SVD polar factor, their singular-value bands, the
Nesterov momentum and a full Muon step by hand, the shape multiplier, the parameter split."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from speedrun.optim.groups import OptimConfig, build_optimizers, split_parameters
from speedrun.optim.muon import Muon, muon_lr_multiplier, nesterov_momentum
from speedrun.optim.orthogonalize import orthogonalize

# The coefficient tables, typed in from speedrun-spec.md 3.1 (not imported from the code under test).
NS = [(3.4445, -4.7750, 2.0315)] * 5
PE = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
      (4.042929935166739, -2.808917465908714, 0.5000178451051316),
      (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
      (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
      (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]


def scalar_iteration(singular_values, table, factor, eps):
    """Singular values after the iteration: each s / (||s||_2 * factor + eps) mapped by a s + b s^3 + c s^5."""
    norm = math.sqrt(sum(s * s for s in singular_values))
    out = []
    for s in singular_values:
        x = s / (norm * factor + eps)
        for a, b, c in table:
            x = a * x + b * x ** 3 + c * x ** 5
        out.append(x)
    return out


@pytest.mark.parametrize("method,table,factor,eps", [("newton_schulz", NS, 1.0, 1e-7),
                                                     ("polar_express", PE, 1.02, 1e-6)])
def test_orthogonalizer_on_a_diagonal_matrix_follows_the_scalar_polynomials(method, table, factor, eps):
    s = [3.0, 1.0, 0.2]
    got = orthogonalize(torch.diag(torch.tensor(s, dtype=torch.float64)), method, dtype=torch.float64)
    expected = scalar_iteration(s, table, factor, eps)
    torch.testing.assert_close(got, torch.diag(torch.tensor(expected, dtype=torch.float64)),
                               rtol=1e-12, atol=1e-12)


def newton_schulz_band(low, high):
    """The range of 5 quintic iterations over normalized singular values in [low, high] (a fine grid)."""
    s = [low + (high - low) * i / 20000 for i in range(20001)]
    for a, b, c in NS:
        s = [a * x + b * x ** 3 + c * x ** 5 for x in s]
    return min(s), max(s)


@pytest.mark.parametrize("shape", [(64, 256), (256, 64), (96, 300)])
def test_newton_schulz_singular_values_land_in_its_band(shape):
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(*shape, generator=g)
    out = orthogonalize(grad, "newton_schulz")
    s = torch.linalg.svdvals(out.double())
    s_in = torch.linalg.svdvals(grad.double()) / torch.linalg.matrix_norm(grad.double())
    low, high = newton_schulz_band(s_in.min().item(), s_in.max().item())
    assert low - 2e-3 < s.min() and s.max() < high + 2e-3
    assert 0.68 < low and high < 1.135                       # the quoted band, about [0.68, 1.13]


@pytest.mark.parametrize("shape", [(64, 256), (256, 64), (96, 300), (128, 128)])
def test_polar_express_lands_near_the_polar_factor(shape):
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(*shape, generator=g)
    if shape[0] == shape[1]:                      # a square Gaussian matrix has near-zero singular values
        u, _, vh = torch.linalg.svd(grad)
        grad = u @ torch.diag(torch.linspace(1.0, 10.0, shape[0])) @ vh
    out = orthogonalize(grad, "polar_express").double()
    s = torch.linalg.svdvals(out)
    assert s.min() > 0.85 and s.max() < 1.15
    u, _, vh = torch.linalg.svd(grad.double(), full_matrices=False)
    assert torch.linalg.matrix_norm(out - u @ vh) / math.sqrt(min(shape)) < 0.1


def test_tall_matrices_map_like_their_transpose_keep_their_layout_and_zero_stays_zero():
    """A tall matrix multiplies its small Gram matrix XᵀX on the right (record #88): the same polynomial as its
    transpose's, in float64 to rounding, and the result is contiguous, a stack of them too."""
    g = torch.Generator().manual_seed(2)
    grad = torch.randn(3, 80, 20, generator=g, dtype=torch.float64)
    for method in ("newton_schulz", "polar_express"):
        tall = orthogonalize(grad, method, dtype=torch.float64)
        wide = orthogonalize(grad.mT, method, dtype=torch.float64)
        torch.testing.assert_close(tall, wide.mT, rtol=1e-10, atol=1e-12)
        assert tall.is_contiguous() and tall.shape == (3, 80, 20)
        assert torch.count_nonzero(orthogonalize(torch.zeros(4, 6), method)) == 0
        assert torch.count_nonzero(orthogonalize(torch.zeros(6, 4), method)) == 0


def test_nesterov_momentum_by_hand():
    buf = torch.zeros(2, 2)
    u1 = nesterov_momentum(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), buf, 0.9)
    # buf = 0.1 g1; u = 0.1 g1 + 0.9 buf = 0.19 g1
    torch.testing.assert_close(buf, torch.tensor([[0.1, 0.2], [0.3, 0.4]]))
    torch.testing.assert_close(u1, torch.tensor([[0.19, 0.38], [0.57, 0.76]]))
    u2 = nesterov_momentum(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), buf, 0.9)
    # buf = 0.9 [[.1,.2],[.3,.4]] + 0.1 [[0,1],[1,0]] = [[.09,.28],[.37,.36]]; u = 0.1 g2 + 0.9 buf
    torch.testing.assert_close(buf, torch.tensor([[0.09, 0.28], [0.37, 0.36]]))
    torch.testing.assert_close(u2, torch.tensor([[0.081, 0.352], [0.433, 0.324]]))
    plain = nesterov_momentum(torch.ones(2, 2), buf, 0.5, nesterov=False)
    torch.testing.assert_close(plain, torch.tensor([[0.545, 0.64], [0.685, 0.68]]))


def test_two_muon_steps_on_a_diagonal_2x2_by_hand():
    p = nn.Parameter(torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64))
    opt = Muon([p], lr=0.1, momentum=0.9, weight_decay=0.5, orthogonalizer="polar_express")
    expected = [[1.0, 0.0], [0.0, 1.0]]
    buf = [0.0, 0.0]
    for grad in ([3.0, 1.0], [-1.0, 2.0]):
        p.grad = torch.diag(torch.tensor(grad, dtype=torch.float64))
        opt.step()
        buf = [0.9 * b + 0.1 * g for b, g in zip(buf, grad)]
        direction = [0.1 * g + 0.9 * b for b, g in zip(buf, grad)]
        magnitude = scalar_iteration([abs(d) for d in direction], PE, 1.02, 1e-6)
        update = [math.copysign(m, d) for m, d in zip(magnitude, direction)]
        diag = [expected[i][i] * (1 - 0.1 * 0.5) - 0.1 * update[i] for i in range(2)]
        expected = [[diag[0], 0.0], [0.0, diag[1]]]
        torch.testing.assert_close(p.detach(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-6)


def test_muon_lr_multiplier_and_its_use_for_tall_matrices():
    assert muon_lr_multiplier((3072, 768)) == 2.0
    assert muon_lr_multiplier((768, 3072)) == 1.0
    assert muon_lr_multiplier((64, 64)) == 1.0
    g = torch.Generator().manual_seed(3)
    grad = torch.randn(16, 4, generator=g, dtype=torch.float64)
    p = nn.Parameter(torch.zeros(16, 4, dtype=torch.float64))
    p.grad = grad.clone()
    Muon([p], lr=0.01, momentum=0.0, orthogonalizer="newton_schulz").step()
    # momentum 0: the direction is the gradient; a (16, 4) matrix moves twice as far as lr says
    ortho = orthogonalize(grad, "newton_schulz", dtype=torch.float64)
    torch.testing.assert_close(p.detach(), -0.01 * 2.0 * ortho)


def test_muon_rejects_vectors_and_bad_settings():
    with pytest.raises(ValueError, match="2-D"):
        Muon([nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="momentum"):
        Muon([nn.Parameter(torch.zeros(3, 3))], momentum=1.0)
    with pytest.raises(ValueError, match="orthogonalizer"):
        Muon([nn.Parameter(torch.zeros(3, 3))], orthogonalizer="svd")


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([nn.Linear(4, 4, bias=True)])
        self.lm_head = nn.Linear(4, 10, bias=False)

    def kinds(self):
        return {"embed.weight": "embed", "blocks.0.weight": "matrix", "blocks.0.bias": "scalar",
                "lm_head.weight": "head"}


def test_every_parameter_lands_in_exactly_one_optimizer_group_with_its_lr():
    model = Toy()
    opts = build_optimizers(model, model.kinds(), OptimConfig(embed_lr=0.6, head_lr=0.008, scalar_lr=0.04,
                                                              muon_lr=0.05))
    adam, muon = opts.optimizers
    assert isinstance(adam, torch.optim.AdamW) and isinstance(muon, Muon)
    by_kind = {g["kind"]: g for g in opts.groups()}
    assert {k: g["lr"] for k, g in by_kind.items()} == {"embed": 0.6, "head": 0.008, "scalar": 0.04,
                                                       "matrix": 0.05}
    assert by_kind["matrix"]["params"] == [model.blocks[0].weight]
    assert by_kind["scalar"]["params"] == [model.blocks[0].bias]
    ids = [id(p) for g in opts.groups() for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())


def test_a_parameter_without_a_kind_or_with_an_unknown_kind_is_refused():
    model = Toy()
    kinds = model.kinds()
    del kinds["blocks.0.bias"]
    with pytest.raises(ValueError, match="blocks.0.bias"):
        split_parameters(model, kinds)
    with pytest.raises(ValueError, match="unknown kind 'other'"):
        split_parameters(model, {**model.kinds(), "blocks.0.bias": "other"})
    with pytest.raises(ValueError, match="2-D"):
        build_optimizers(model, {**model.kinds(), "blocks.0.bias": "matrix"}, OptimConfig())


def test_mlp_output_matrices_get_their_own_muon_lr():
    from speedrun.model.config import build_model_config
    from speedrun.model.gpt import GPT

    torch.manual_seed(0)
    model = GPT(build_model_config("tiny", {"n_layer": 2, "vocab_size": 64}))
    opts = build_optimizers(model, model.parameter_kinds(), OptimConfig(muon_lr=0.02, mlp_proj_lr_mul=4.0))
    muon = opts.optimizers[-1]
    by_lr = {g["initial_lr"]: {n for n, p in model.named_parameters() if any(p is q for q in g["params"])}
             for g in muon.param_groups}
    assert by_lr[0.08] == {"blocks.0.mlp.proj.weight", "blocks.1.mlp.proj.weight"}
    assert "blocks.0.mlp.fc.weight" in by_lr[0.02] and len(by_lr[0.02]) == 10
    single = build_optimizers(model, model.parameter_kinds(), OptimConfig(muon_lr=0.02))
    assert [g["initial_lr"] for g in single.optimizers[-1].param_groups] == [0.02]
