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


# The record's schedule, typed in from speedrun-spec.md 3.5: 1270 scheduled steps in thirds ending at 423 and
# 847, lr multipliers 1.0, 1.52, 1.73, cooldown_frac 0.6 (cooldown start int(1270 * 0.4) = 508), floor 0.15.
RECORD = dict(steps=1270, cooldown_frac=0.6, lr_floor=0.15, stage_multipliers=(1.0, 1.52, 1.73))


@pytest.mark.parametrize("step,expected", [
    (0, 1.0), (422, 1.0),                              # first third, before the cooldown
    (423, 1.52), (507, 1.52),                          # second third, still before the cooldown
    (508, 1.52),                                       # cooldown start: t = 0
    (846, 1.52 * 424 / 762 + 0.15 * 338 / 762),        # t = 338/762, last step of the second third
    (847, 1.73 * 423 / 762 + 0.15 * 339 / 762),        # the third third's multiplier inside the cooldown
    (889, 1.73 * 0.5 + 0.15 * 0.5),                    # t = 381/762 = 1/2: 0.94
    (1270, 0.15),                                      # t = 1: the absolute floor
])
def test_lr_factor_with_the_records_stage_multipliers(step, expected):
    assert lr_factor(step, RECORD["steps"], RECORD["cooldown_frac"], RECORD["lr_floor"],
                     RECORD["stage_multipliers"]) == pytest.approx(expected, rel=1e-12)


def test_lr_factor_stage_multipliers_edges():
    assert lr_factor(889, 1270, 0.6, 0.15, RECORD["stage_multipliers"]) == pytest.approx(0.94)
    # one multiplier of 1.0 is the schedule without multipliers
    assert [lr_factor(s, 100, 0.4, 0.1, (1.0,)) for s in (0, 60, 80, 100)] == \
        pytest.approx([1.0, 1.0, 0.55, 0.1])
    # no cooldown: each third keeps its multiplier, up to and including the last step (steps 9: thirds at 3, 6)
    assert [lr_factor(s, 9, 0.0, 0.15, (1.0, 2.0, 3.0)) for s in (0, 2, 3, 5, 6, 9)] == \
        [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    with pytest.raises(ValueError, match="stage multipliers"):
        lr_factor(0, 10, 0.5, 0.0, (1.0, -0.5))


def test_muon_momentum_cooldown_over_the_records_last_50_steps():
    # the record: 1285 steps in all, warm-up 0.85 -> 0.95 over 300 steps, back to 0.85 from step 1235 on
    momentum = [muon_momentum(s, 300, steps=1285, cooldown_steps=50) for s in (0, 150, 300, 1235, 1236, 1260,
                                                                               1284, 1285)]
    assert momentum == pytest.approx([0.85, 0.90, 0.95, 0.95, 0.948, 0.90, 0.852, 0.85])
    # no cooldown: 0.95 up to the last step
    assert muon_momentum(1284, 300, steps=1285) == pytest.approx(0.95)
    # overlapping warm-up (8 steps) and cooldown (from step 10 - 5 = 5): the warm-up wins, as in the record
    assert muon_momentum(6, 8, steps=10, cooldown_steps=5) == pytest.approx(0.85 + 0.1 * 6 / 8)
    assert muon_momentum(8, 8, steps=10, cooldown_steps=5) == pytest.approx(0.95 - 0.1 * 3 / 5)
    assert muon_momentum(10, 0, 0.5, 0.9, steps=10, cooldown_steps=4) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        muon_momentum(0, 10, steps=10, cooldown_steps=-1)
    with pytest.raises(ValueError, match="beyond"):
        muon_momentum(11, 0, steps=10, cooldown_steps=2)


def test_apply_schedule_uses_the_stage_multipliers_and_the_momentum_cooldown():
    model = nn.ModuleDict({"embed": nn.Embedding(5, 2), "blocks": nn.Linear(2, 2, bias=False)})
    opts = build_optimizers(model, {"embed.weight": "embed", "blocks.weight": "matrix"},
                            OptimConfig(embed_lr=0.6, muon_lr=0.05))
    schedule = ScheduleConfig(steps=1270, cooldown_frac=0.6, lr_floor=0.15, momentum_warmup_steps=300,
                              lr_stage_multipliers=(1.0, 1.52, 1.73), momentum_cooldown_steps=50)
    groups = {g["kind"]: g for g in opts.groups()}
    opts.apply_schedule(423, schedule)
    assert (groups["embed"]["lr"], groups["matrix"]["lr"]) == pytest.approx((0.6 * 1.52, 0.05 * 1.52))
    assert groups["matrix"]["momentum"] == pytest.approx(0.95)
    opts.apply_schedule(1260, schedule)              # t = 752/762; momentum cooldown from 1220: 40/50 down
    factor = 1.73 * 10 / 762 + 0.15 * 752 / 762
    assert (groups["embed"]["lr"], groups["matrix"]["lr"]) == pytest.approx((0.6 * factor, 0.05 * factor))
    assert groups["matrix"]["momentum"] == pytest.approx(0.95 - 0.1 * 40 / 50)
    assert "momentum" not in groups["embed"]
