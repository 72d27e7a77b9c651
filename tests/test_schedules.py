"""The step schedules at every boundary, by hand, and their application to the optimizer groups."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from speedrun.optim.groups import OptimConfig, ScheduleConfig, build_optimizers
from speedrun.optim.schedules import lr_factor, muon_momentum


def test_lr_factor_is_constant_then_linear_down_to_the_floor():
    # steps 100, cooldown 0.4: warm-down starts at step 60 and reaches 0.1 at step 100
    assert lr_factor(0, 100, 0.4, 0.1) == 1.0
    assert lr_factor(59, 100, 0.4, 0.1) == 1.0
    assert lr_factor(60, 100, 0.4, 0.1) == 1.0
    assert lr_factor(70, 100, 0.4, 0.1) == pytest.approx(0.75 + 0.25 * 0.1)
    assert lr_factor(80, 100, 0.4, 0.1) == pytest.approx(0.55)
    assert lr_factor(99, 100, 0.4, 0.1) == pytest.approx(0.025 + 0.975 * 0.1)
    assert lr_factor(100, 100, 0.4, 0.1) == pytest.approx(0.1)


def test_lr_factor_edge_fractions_and_rounding():
    assert [lr_factor(s, 10, 0.0, 0.0) for s in (0, 9, 10)] == [1.0, 1.0, 1.0]
    assert [lr_factor(s, 10, 1.0, 0.0) for s in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])
    # steps 10, cooldown 0.25: start = int(7.5) = 7, so step 8 is 1/3 of the way down
    assert lr_factor(7, 10, 0.25, 0.0) == 1.0
    assert lr_factor(8, 10, 0.25, 0.0) == pytest.approx(2 / 3)


@pytest.mark.parametrize("args", [(0, 10, 1.5, 0.0), (0, 10, 0.5, -0.1), (11, 10, 0.5, 0.0), (-1, 10, 0.5, 0.0)])
def test_lr_factor_rejects_bad_arguments(args):
    with pytest.raises(ValueError):
        lr_factor(*args)


def test_muon_momentum_warms_up_linearly_then_stays():
    assert muon_momentum(0, 300) == pytest.approx(0.85)
    assert muon_momentum(150, 300) == pytest.approx(0.90)
    assert muon_momentum(299, 300) == pytest.approx(0.85 + 0.1 * 299 / 300)
    assert muon_momentum(300, 300) == pytest.approx(0.95)
    assert muon_momentum(1000, 300) == pytest.approx(0.95)
    assert muon_momentum(0, 0) == pytest.approx(0.95)
    assert muon_momentum(5, 10, start=0.5, end=0.9) == pytest.approx(0.7)
    with pytest.raises(ValueError):
        muon_momentum(0, -1)


def test_apply_schedule_sets_every_group_lr_and_only_muon_momentum():
    model = nn.ModuleDict({"embed": nn.Embedding(5, 2), "blocks": nn.Linear(2, 2, bias=False)})
    kinds = {"embed.weight": "embed", "blocks.weight": "matrix"}
    opts = build_optimizers(model, kinds, OptimConfig(embed_lr=0.6, muon_lr=0.05))
    schedule = ScheduleConfig(steps=100, cooldown_frac=0.4, lr_floor=0.1, momentum_warmup_steps=50)
    opts.apply_schedule(80, schedule)
    groups = {g["kind"]: g for g in opts.groups()}
    assert groups["embed"]["lr"] == pytest.approx(0.6 * 0.55)
    assert groups["matrix"]["lr"] == pytest.approx(0.05 * 0.55)
    assert groups["matrix"]["momentum"] == pytest.approx(0.95)
    assert "momentum" not in groups["embed"]
    opts.apply_schedule(25, schedule)
    assert groups["embed"]["lr"] == pytest.approx(0.6)
    assert groups["matrix"]["momentum"] == pytest.approx(0.90)
    # an optimizer step after the schedule moves the parameters
    before = model["blocks"].weight.detach().clone()
    model["blocks"].weight.grad = torch.ones(2, 2)
    opts.step()
    assert not torch.equal(before, model["blocks"].weight.detach())
