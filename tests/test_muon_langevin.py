"""Muon's annealed Langevin noise (record 2026-06-11): the σ_t schedule by hand, the noise's per-row size against
σ_t · rms_row(update) (a statistical test whose tolerance follows from the sample size), no noise at and after
the cooldown start, determinism of the draws; and the optimizer assembly's separate Adam weight decay."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from speedrun.optim.adam import CautiousAdam
from speedrun.optim.groups import OptimConfig, ScheduleConfig, build_optimizers
from speedrun.optim.langevin import langevin_sigma
from speedrun.optim.muon import Muon

F64 = torch.float64


def test_sigma_schedule_by_hand():
    # 100 steps, cooldown over the last 40%: cooldown starts at step 60
    assert langevin_sigma(0, 100, 0.4, 0.5) == 0.5
    assert langevin_sigma(30, 100, 0.4, 0.5) == pytest.approx(0.25)
    assert langevin_sigma(59, 100, 0.4, 0.5) == pytest.approx(0.5 / 60)
    assert langevin_sigma(60, 100, 0.4, 0.5) == 0.0
    assert langevin_sigma(100, 100, 0.4, 0.5) == 0.0
    assert langevin_sigma(50, 100, 0.0, 0.5) == pytest.approx(0.25)    # no cooldown: zero at the end
    assert langevin_sigma(0, 100, 1.0, 0.5) == 0.0                     # all cooldown: never any noise
    assert langevin_sigma(10, 100, 0.4, 0.0) == 0.0
    with pytest.raises(ValueError, match="scale"):
        langevin_sigma(0, 100, 0.4, -1.0)
    with pytest.raises(ValueError, match="outside"):
        langevin_sigma(101, 100, 0.4, 0.5)


def _one_step(shape, noise, seed=0, beta2=None, lr=0.01, row_dim=1):
    """Parameters after one Muon step (momentum 0, no decay) from zero, for a fixed gradient whose rows
    (columns for row_dim 0) are scaled from 0.1 to 10, so that the update's rows differ in RMS."""
    p = nn.Parameter(torch.zeros(shape, dtype=F64))
    scales = torch.logspace(-1, 1, shape[1 - row_dim], dtype=F64)
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(123), dtype=F64)
    p.grad = grad * (scales[:, None] if row_dim == 1 else scales[None, :])
    Muon([p], lr=lr, momentum=0.0, normuon_beta2=beta2, langevin_noise=noise, langevin_seed=seed).step()
    return p.detach()


@pytest.mark.parametrize("shape,row_dim", [((512, 256), 1), ((192, 768), 0)])
def test_noise_per_row_has_std_sigma_times_the_row_rms_of_the_update(shape, row_dim):
    """u_noisy - u_clean = σ · rms(u) · ξ; the per-row (per-column for a wide matrix, NorMuon's side)
    sample std of ξ estimates 1 with standard error 1/sqrt(2(n-1)), n the row length. The rows' RMS spans
    more than a factor 10 here, so noise scaled by any other RMS fails."""
    sigma, lr = 0.3, 0.01
    lr_eff = lr * math.sqrt(max(1.0, shape[0] / shape[1]))
    clean = -_one_step(shape, 0.0, lr=lr, row_dim=row_dim) / lr_eff
    noisy = -_one_step(shape, sigma, lr=lr, row_dim=row_dim) / lr_eff
    rms = clean.square().mean(dim=row_dim, keepdim=True).sqrt()
    xi = (noisy - clean) / (sigma * rms)
    n, rows = shape[row_dim], shape[1 - row_dim]
    std = xi.std(dim=row_dim)
    se = 1.0 / math.sqrt(2 * (n - 1))
    assert abs(std.mean().item() - 1.0) < 5 * se / math.sqrt(rows)
    assert (std - 1.0).abs().max().item() < 6 * se
    assert abs(xi.mean().item()) < 5 / math.sqrt(xi.numel())
    row_means = xi.mean(dim=row_dim)                       # each row's noise is centred too
    assert row_means.abs().max().item() < 6 / math.sqrt(n)


def test_noise_after_normuon_is_added_to_the_normalized_update():
    """With NorMuon, the noisy step minus the clean one is still σ · rms_row · ξ of the normalized update."""
    shape, sigma, lr = (256, 128), 0.2, 0.01
    lr_eff = lr * math.sqrt(2.0)
    clean = -_one_step(shape, 0.0, beta2=0.9, lr=lr) / lr_eff
    noisy = -_one_step(shape, sigma, beta2=0.9, lr=lr) / lr_eff
    xi = (noisy - clean) / (sigma * clean.square().mean(dim=1, keepdim=True).sqrt())
    assert abs(xi.std().item() - 1.0) < 5 / math.sqrt(2 * xi.numel())


def test_noise_is_deterministic_per_seed_and_differs_between_seeds():
    a, b, c = _one_step((64, 32), 0.2, seed=1), _one_step((64, 32), 0.2, seed=1), _one_step((64, 32), 0.2, seed=2)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)


def _toy():
    model = nn.ModuleDict({"embed": nn.Embedding(10, 4),
                           "blocks": nn.ModuleList([nn.Linear(4, 4, bias=False) for _ in range(2)])})
    kinds = {"embed.weight": "embed", "blocks.0.weight": "matrix", "blocks.1.weight": "matrix"}
    return model, kinds


def _muon_after_scheduled_step(step, noise):
    torch.manual_seed(0)
    model, kinds = _toy()
    opts = build_optimizers(model, kinds, OptimConfig(langevin_noise=noise, normuon_beta2=0.9))
    opts.apply_schedule(step, ScheduleConfig(steps=100, cooldown_frac=0.4, lr_floor=0.1,
                                             momentum_warmup_steps=0))
    for i, block in enumerate(model["blocks"]):
        block.weight.grad = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
    opts.step()
    muon = opts.optimizers[-1]
    return [b.weight.detach().clone() for b in model["blocks"]], muon.param_groups[0]["langevin_sigma"]


@pytest.mark.parametrize("step", [60, 61, 99])
def test_no_noise_at_and_after_the_cooldown_start(step):
    noisy, sigma = _muon_after_scheduled_step(step, 0.5)
    clean, _ = _muon_after_scheduled_step(step, 0.0)
    assert sigma == 0.0
    for a, b in zip(noisy, clean):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_noise_before_the_cooldown_start_follows_the_schedule():
    noisy, sigma = _muon_after_scheduled_step(30, 0.5)
    clean, _ = _muon_after_scheduled_step(30, 0.0)
    assert sigma == pytest.approx(0.25)
    assert all(not torch.equal(a, b) for a, b in zip(noisy, clean))


def test_muon_rejects_negative_noise():
    with pytest.raises(ValueError, match="langevin_noise"):
        Muon([nn.Parameter(torch.zeros(2, 2))], langevin_noise=-0.1)


@pytest.mark.parametrize("cautious", [False, True])
def test_adam_and_muon_get_their_own_weight_decay(cautious):
    model, kinds = _toy()
    assert OptimConfig().adam_weight_decay == 0.0
    adam, muon = build_optimizers(model, kinds, OptimConfig(weight_decay=1.2, adam_weight_decay=0.005,
                                                            cautious_weight_decay=cautious)).optimizers
    assert isinstance(adam, CautiousAdam if cautious else torch.optim.AdamW)
    assert [g["weight_decay"] for g in adam.param_groups] == [0.005]
    assert [g["weight_decay"] for g in muon.param_groups] == [1.2]


def test_nothing_is_self_reduced_in_a_single_process():
    model, kinds = _toy()
    assert build_optimizers(model, kinds, OptimConfig()).self_reduced_parameters() == frozenset()
