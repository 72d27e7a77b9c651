"""Muon's SGD momentum form (record #12, 2024-11-19 FlexAttention: ``buf.mul_(momentum).add_(g)``, Nesterov
``g.add(buf, alpha=momentum)``) by hand and against a float64 re-write of that record's Muon step with its
momentum warm-up; the EMA form stays the default."""

from __future__ import annotations

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model.gpt import GPT
from speedrun.optim.groups import build_optimizers
from speedrun.optim.config import OptimConfig
from speedrun.optim.muon import Muon, sgd_momentum
from speedrun.optim.schedules import muon_momentum
from speedrun.training.config import TrainConfig


def test_sgd_momentum_by_hand():
    buf = torch.zeros(2, 2)
    u1 = sgd_momentum(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), buf, 0.9)
    torch.testing.assert_close(buf, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    torch.testing.assert_close(u1, torch.tensor([[1.9, 3.8], [5.7, 7.6]]))            # g + 0.9·buf
    u2 = sgd_momentum(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), buf, 0.9)
    torch.testing.assert_close(buf, torch.tensor([[0.9, 2.8], [3.7, 3.6]]))            # 0.9·buf + g
    torch.testing.assert_close(u2, torch.tensor([[0.81, 3.52], [4.33, 3.24]]))
    plain = sgd_momentum(torch.ones(2, 2), buf, 0.5, nesterov=False)
    torch.testing.assert_close(buf, torch.tensor([[1.45, 2.4], [2.85, 2.8]]))         # 0.5·buf + 1
    torch.testing.assert_close(plain, buf)


def record12_zeropower(g: torch.Tensor) -> torch.Tensor:
    """Its zeropower_via_newtonschulz5, 5 steps, in float64."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    x = g / (g.norm() + 1e-7)
    tall = g.size(0) > g.size(1)
    x = x.T if tall else x
    for _ in range(5):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


@pytest.mark.parametrize("shape", [(6, 4), (4, 6)])
def test_sgd_form_muon_equals_record12s_step_through_the_momentum_warm_up(shape):
    torch.manual_seed(0)
    start = torch.randn(*shape, dtype=torch.float64)
    grads = [torch.randn(*shape, dtype=torch.float64) for _ in range(4)]
    p = torch.nn.Parameter(start.clone())
    opt = Muon([p], lr=0.04, momentum=0.95, orthogonalizer="newton_schulz", shard=False, momentum_form="sgd")
    expected, buf = start.clone(), torch.zeros(*shape, dtype=torch.float64)
    for step, g in enumerate(grads):
        momentum = muon_momentum(step, 2)                                    # 0.85, 0.90, 0.95, 0.95
        opt.param_groups[0]["momentum"] = momentum
        p.grad = g.clone()
        opt.step()
        buf = momentum * buf + g
        update = record12_zeropower(g + momentum * buf) * max(1, shape[0] / shape[1]) ** 0.5
        expected = expected - 0.04 * update
        torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-10)
    ema = torch.nn.Parameter(start.clone())
    other = Muon([ema], lr=0.04, orthogonalizer="newton_schulz", shard=False)         # the default form
    for step, g in enumerate(grads):
        other.param_groups[0]["momentum"] = muon_momentum(step, 2)
        ema.grad = g.clone()
        other.step()
    assert (ema.detach() - p.detach()).abs().max() > 1e-4                 # the warm-up tells them apart


def test_the_setting_reaches_muon_and_bad_values_are_named():
    assert OptimConfig().muon_momentum_form == "ema" and TrainConfig().optimizer.muon_momentum_form == "ema"
    cfg = TrainConfig.from_dict({"preset": "tiny", "steps": 2, "tokens_per_step": 64, "muon_momentum_form": "sgd"})
    assert cfg.optimizer.muon_momentum_form == "sgd"
    model = GPT(cfg.model_config())
    muon = build_optimizers(model, model.parameter_kinds(), cfg.optimizer).optimizers[-1]
    assert isinstance(muon, Muon) and {g["momentum_form"] for g in muon.param_groups} == {"sgd"}
    with pytest.raises(SpeedrunError, match=r"train\.muon_momentum_form must be one of ema, sgd; got 'adam'"):
        TrainConfig.from_dict({"preset": "tiny", "steps": 2, "tokens_per_step": 64, "muon_momentum_form": "adam"})
    with pytest.raises(ValueError, match="unknown momentum_form 'heavy'"):
        Muon([torch.nn.Parameter(torch.zeros(2, 2))], momentum_form="heavy")
