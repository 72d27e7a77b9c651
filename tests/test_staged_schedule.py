"""The records' staged schedules (speedrun.optim.stages) against values worked out by hand from their own
train_gpt.py (TrainingSchedule, get_muon_momentum, the warm-up sample), and the schedule's validation."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import yaml

from speedrun.errors import SpeedrunError
from speedrun.optim import schedules
from speedrun.optim.stages import RECORD_SCHEDULES, Stage, StagedSchedule, record_schedule

HEAD = record_schedule("head")


def approx_list(values):
    return pytest.approx(values, abs=1e-12)


# ---- boundaries and stages --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, boundaries", [
    ("head", [0, 423, 847, 1270, 1285]),         # round(1270/3) = 423, round(2540/3) = 847
    ("record88", [0, 455, 910, 1365, 1375]),     # 1365/3 = 455 exactly
    ("record87", [0, 499, 943, 1387, 1398]),     # 0.36·1387 = 499.32, 0.68·1387 = 943.16
    ("record83", [0, 458, 917, 1375, 1385]),     # 458.33, 916.67
])
def test_record_boundaries(name, boundaries):
    schedule = record_schedule(name)
    assert schedule.boundaries() == boundaries
    assert schedule.total_steps == boundaries[-1]
    assert schedule.stage_ranges() == list(zip(boundaries[:-1], boundaries[1:]))
    assert schedule.transition_steps() == boundaries[1:-1]


def test_head_is_record89():
    assert record_schedule("head") is record_schedule("record89")
    assert set(RECORD_SCHEDULES) == {"head", "record89", "record88", "record87", "record83"}


@pytest.mark.parametrize("step, index", [(0, 0), (422, 0), (423, 1), (846, 1), (847, 2), (1269, 2), (1270, 3),
                                         (1284, 3), (1285, 3)])
def test_head_stage_index(step, index):
    assert HEAD.stage_index(step) == index


def test_head_batch_and_sequence_length():
    assert HEAD.batch_at(0) == (131072, 896)
    assert HEAD.batch_at(422) == (131072, 896)
    assert HEAD.batch_at(423) == (262144, 2048)
    assert HEAD.batch_at(847) == (393216, 2048)
    assert HEAD.batch_at(1284) == (393216, 2048)
    assert HEAD.batch_stages() == [(0, 131072, 896), (423, 262144, 2048), (847, 393216, 2048),
                                   (1270, 393216, 2048)]


@pytest.mark.parametrize("name, tokens", [
    ("head", 423 * 131072 + 424 * 262144 + (423 + 15) * 393216),      # 338,821,120
    ("record87", 499 * 131072 + 444 * 262144 + (444 + 11) * 393216),  # 360,710,144
])
def test_total_tokens(name, tokens):
    assert record_schedule(name).total_tokens() == tokens
    if name == "head":
        assert tokens == 338_821_120


# ---- windows and YaRN -------------------------------------------------------------------------------------

@pytest.mark.parametrize("step, blocks", [(0, (1, 3)), (422, (1, 3)), (423, (3, 7)), (846, (3, 7)), (847, (5, 11)),
                                          (1269, (5, 11)), (1270, (6, 13)), (1284, (6, 13)), (1285, (6, 20))])
def test_head_windows_and_final_extension(step, blocks):
    assert HEAD.window_blocks(step) == blocks


def test_yarn_and_window_change_steps():
    assert HEAD.final_window_blocks() == (6, 20)
    assert HEAD.yarn_steps() == [423, 847, 1270]
    assert HEAD.window_change_steps() == [423, 847, 1270]
    assert record_schedule("record87").yarn_steps() == [499, 943, 1387]
    # a short-window-only change is a window change but no YaRN step; equal windows are neither
    stages = (Stage(fraction=0.5, tokens_per_step=8, max_seq_len=4, window_blocks=(1, 3)),
              Stage(fraction=0.5, tokens_per_step=8, max_seq_len=4, window_blocks=(2, 3)),
              Stage(tokens_per_step=8, max_seq_len=4, window_blocks=(2, 3)))
    schedule = StagedSchedule(stages=stages, scheduled_steps=10, extension_steps=2)
    assert schedule.window_change_steps() == [5]
    assert schedule.yarn_steps() == []
    assert schedule.final_window_blocks() == (2, 3)


# ---- learning rate ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("step, factor", [
    (0, 1.0), (422, 1.0),                          # stage 1 before the cooldown start int(1270·0.4) = 508
    (423, 1.52), (507, 1.52), (508, 1.52),         # t = 0 at 508
    (846, (1.52 * 424 + 0.15 * 338) / 762),        # t = 338/762, stage 2's multiplier
    (847, (1.73 * 423 + 0.15 * 339) / 762),        # stage 3's multiplier, mid-cooldown
    (900, (1.73 * 370 + 0.15 * 392) / 762),
    (1269, (1.73 * 1 + 0.15 * 761) / 762),
    (1270, 0.15), (1284, 0.15), (1285, 0.15),      # the floor during the extension
])
def test_head_lr_factor(step, factor):
    assert HEAD.cooldown_start == 508
    assert HEAD.lr_factor(step) == pytest.approx(factor, abs=1e-12)


def test_record87_lr_factor():
    schedule = record_schedule("record87")
    assert schedule.cooldown_start == 554                    # int(1387 · 0.4) = int(554.8)
    assert schedule.lr_factor(498) == 1.0
    assert schedule.lr_factor(554) == pytest.approx(1.52)
    assert schedule.lr_factor(943) == pytest.approx((1.73 * 444 + 0.15 * 389) / 833, abs=1e-12)
    assert schedule.lr_factor(1387) == pytest.approx(0.15)


def test_lr_factor_with_thirds_agrees_with_the_equal_stage_schedule():
    for steps in (5, 30, 105, 1270):
        schedule = HEAD.with_steps(steps, 0)
        assert schedule.boundaries()[:-2] == schedules.stage_starts(steps, 3)
        for step in range(steps + 1):
            assert schedule.lr_factor(step) == pytest.approx(
                schedules.lr_factor(step, steps, 0.6, 0.15, (1.0, 1.52, 1.73)), abs=1e-12)


def test_no_cooldown_keeps_the_stage_multiplier_then_the_floor():
    schedule = dataclasses.replace(HEAD.with_steps(30, 3), cooldown_frac=0.0)
    assert [schedule.lr_factor(s) for s in (0, 9, 10, 20, 29, 30, 33)] == approx_list(
        [1.0, 1.0, 1.52, 1.73, 1.73, 0.15, 0.15])


# ---- momentum ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("step, momentum", [(0, 0.85), (150, 0.90), (299, 0.85 + 0.1 * 299 / 300), (300, 0.95),
                                            (1235, 0.95), (1236, 0.948), (1269, 0.95 - 0.1 * 34 / 50),
                                            (1284, 0.852), (1285, 0.85)])
def test_head_muon_momentum(step, momentum):
    # cooldown over the last 50 of all 1285 steps: from 1285 - 50 = 1235
    assert HEAD.muon_momentum(step) == pytest.approx(momentum, abs=1e-12)


# ---- multi-token and prefix weights -----------------------------------------------------------------------

@pytest.mark.parametrize("step, weights", [
    (0, [1.0, 0.5, 0.25]), (211, [1.0, 0.5, 0.25 * 212 / 423]), (422, [1.0, 0.5, 0.25 / 423]),  # stage 1: 423 steps
    (423, [1.0, 0.5]), (635, [1.0, 0.25]), (846, [1.0, 0.5 / 424]),                            # stage 2: 424 steps
    (847, [1.0]), (1058, [1.0]), (1270, [1.0]), (1285, [1.0]),
])
def test_head_mtp_weights(step, weights):
    assert HEAD.mtp_weights(step) == approx_list(weights)


@pytest.mark.parametrize("step, weight", [(0, 0.25), (211, 0.25), (422, 0.25), (423, 0.25), (635, 0.125),
                                          (846, 0.25 / 424), (847, 0.0), (1269, 0.0), (1284, 0.0), (1285, 0.0)])
def test_head_prefix_weight(step, weight):
    assert HEAD.prefix_weight(step) == pytest.approx(weight, abs=1e-12)


def test_records_without_prefix_loss_have_weight_zero():
    for name in ("record87", "record83"):
        schedule = record_schedule(name)
        assert {schedule.prefix_weight(s) for s in range(schedule.total_steps + 1)} == {0.0}
    assert record_schedule("record87").mtp_weights(499) == [1.0, 0.5]


# ---- untying and warm-up ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, split, untie", [("head", 847, 848), ("record88", 911, 912), ("record83", 917, 918),
                                                ("record87", None, None)])
def test_split_and_untie_steps(name, split, untie):
    # the record splits after the update of (start of stage 2) | 1; ours unties before the next step
    schedule = record_schedule(name)
    assert schedule.split_step() == split
    assert schedule.untie_step() == untie


def test_warm_up_steps():
    assert HEAD.warm_up_steps() == [0, 1, 421, 422, 423, 424, 845, 846, 847, 848, 1268, 1269, 1270, 1271]
    assert record_schedule("record87").warm_up_steps() == [0, 1, 497, 498, 499, 500, 941, 942, 943, 944, 1385,
                                                           1386, 1387, 1388]
    # without extension steps, the steps past the last training step are left out
    assert HEAD.with_steps(30, 1).warm_up_steps() == [0, 1, 8, 9, 10, 11, 18, 19, 20, 21, 28, 29, 30]


# ---- a compressed schedule (the parity benchmark's 105 + 15 steps) -----------------------------------------

def test_compressed_head_schedule():
    short = HEAD.with_steps(105, 15)
    assert short.boundaries() == [0, 35, 70, 105, 120]
    assert short.cooldown_start == 42                          # int(105 · 0.4)
    assert short.lr_factor(41) == pytest.approx(1.52)
    assert short.lr_factor(70) == pytest.approx((1.73 * 35 + 0.15 * 28) / 63, abs=1e-12)
    assert short.lr_factor(104) == pytest.approx((1.73 + 0.15 * 62) / 63, abs=1e-12)
    assert short.lr_factor(110) == pytest.approx(0.15)
    assert short.muon_momentum(119) == pytest.approx(0.85 + 0.1 * 119 / 300)   # the 300-step warm-up is absolute
    assert short.mtp_weights(17) == approx_list([1.0, 0.5, 0.25 * 18 / 35])
    assert short.split_step() == 71 and short.untie_step() == 72
    assert short.warm_up_steps() == [0, 1, 33, 34, 35, 36, 68, 69, 70, 71, 103, 104, 105, 106]
    assert short.total_tokens() == 35 * 131072 + 35 * 262144 + 50 * 393216
    assert short.window_blocks(120) == (6, 20)
    factors = [short.lr_factor(s) for s in range(121)]
    assert all(0.15 - 1e-12 <= f <= 1.73 + 1e-12 for f in factors)
    longs = [short.window_blocks(s)[1] for s in range(121)]
    assert longs == sorted(longs)


def test_more_stages_than_steps_skips_the_empty_ones():
    tiny = HEAD.with_steps(2, 0)           # round(2/3) = 1, round(4/3) = 1: stage 2 is empty
    assert tiny.boundaries() == [0, 1, 1, 2, 2]
    assert [tiny.stage_index(s) for s in (0, 1, 2)] == [0, 2, 3]
    assert [first for first, _, _ in tiny.batch_stages()] == [0, 1]
    assert tiny.lr_factor(1) == pytest.approx(1.73 * 0.5 + 0.15 * 0.5)    # cooldown from int(0.8) = 0
    assert tiny.yarn_steps() == [1, 2]


# ---- to_dict / from_dict ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["head", "record88", "record87", "record83"])
def test_round_trip_through_yaml_and_json(name):
    schedule = record_schedule(name)
    data = schedule.to_dict()
    assert isinstance(data["stages"], list) and isinstance(data["stages"][0]["window_blocks"], list)
    assert StagedSchedule.from_dict(yaml.safe_load(yaml.safe_dump(data))) == schedule
    assert StagedSchedule.from_dict(json.loads(json.dumps(data))) == schedule


def test_from_dict_defaults():
    data = {"scheduled_steps": 10, "stages": [
        {"fraction": 1.0, "tokens_per_step": 64, "max_seq_len": 16, "window_blocks": [1, 2],
         "mtp_weights_start": [1.0, 0.5], "prefix_weight_start": 0.25},
        {"tokens_per_step": 64, "max_seq_len": 16, "window_blocks": [2, 2]}]}
    schedule = StagedSchedule.from_dict(data)
    assert schedule.extension_steps == 0 and schedule.cooldown_frac == 0.6 and schedule.lr_floor == 0.15
    assert schedule.stages[0].mtp_weights_end == (1.0, 0.5)      # constant when no end is given
    assert schedule.mtp_weights(7) == [1.0, 0.5]
    assert schedule.prefix_weight(7) == 0.25
    assert schedule.untie_step() is None


# ---- errors -----------------------------------------------------------------------------------------------

def _edit(change):
    data = HEAD.to_dict()
    change(data)
    return data


@pytest.mark.parametrize("change, words", [
    (lambda d: d["stages"][2].update(lr_mul=-1.0), "train.staged_schedule.stages[2].lr_mul must be a finite number >= 0"),
    (lambda d: d["stages"][3].update(fraction=0.1), "train.staged_schedule.stages[3].fraction must be null"),
    (lambda d: d["stages"][1].update(fraction=None), "train.staged_schedule.stages[1].fraction must be a number in (0.0"),
    (lambda d: d["stages"][0].update(fraction=0.2), "fraction must add up to 1"),
    (lambda d: d["stages"][0].update(mtp_weights_end=[1.0, 0.5]), "train.staged_schedule.stages[0].mtp_weights_end must"),
    (lambda d: d["stages"][1].update(mtp_weights_start=[]), "train.staged_schedule.stages[1].mtp_weights_start must"),
    (lambda d: d["stages"][1].update(mtp_weights_start=[1.0, "0.5"]), "stages[1].mtp_weights_start[1] must"),
    (lambda d: d["stages"][1].update(window_blocks=[7, 3]), "train.staged_schedule.stages[1].window_blocks must"),
    (lambda d: d["stages"][1].update(window_blocks=3), "train.staged_schedule.stages[1].window_blocks must"),
    (lambda d: d["stages"][0].update(tokens_per_step="131072"), "stages[0].tokens_per_step must be an integer"),
    (lambda d: d["stages"][0].update(prefix_weight_end=math.nan), "stages[0].prefix_weight_end must"),
    (lambda d: d["stages"][0].update(lr=1.0), "train.staged_schedule.stages[0].lr is not a setting"),
    (lambda d: d["stages"][0].pop("max_seq_len"), "train.staged_schedule.stages[0] needs max_seq_len"),
    (lambda d: d.update(stages=d["stages"][-1:]), "train.staged_schedule.stages must be a list of at least two stages"),
    (lambda d: d.update(stages={"a": 1}), "train.staged_schedule.stages must be a list of stage mappings"),
    (lambda d: d.update(untie_stage=4), "train.staged_schedule.untie_stage must be the index of a stage"),
    (lambda d: d.update(final_window_long_blocks=5), "train.staged_schedule.final_window_long_blocks must be an integer >= 6"),
    (lambda d: d.update(scheduled_steps=True), "train.staged_schedule.scheduled_steps must be an integer >= 1"),
    (lambda d: d.update(extension_steps=-1), "train.staged_schedule.extension_steps must be an integer >= 0"),
    (lambda d: d.update(cooldown_frac=1.5), "train.staged_schedule.cooldown_frac must be a number in [0.0, 1.0]"),
    (lambda d: d.update(lr_floor="1e-3"), "train.staged_schedule.lr_floor must be a finite number >= 0.0, got '1e-3' (text"),
    (lambda d: d.update(momentum_max=1.0), "train.staged_schedule.momentum_max must be a number in [0.0, 1.0)"),
    (lambda d: d.update(warmup=3), "train.staged_schedule.warmup is not a setting"),
    (lambda d: d.pop("stages"), "train.staged_schedule needs scheduled_steps and stages"),
])
def test_errors_name_the_setting(change, words):
    with pytest.raises(SpeedrunError) as error:
        StagedSchedule.from_dict(_edit(change))
    assert words in str(error.value)


def test_errors_name_another_mount_point_and_non_mappings():
    with pytest.raises(SpeedrunError, match=r"^training\.schedule\.stages\[2\]\.lr_mul"):
        StagedSchedule.from_dict(_edit(lambda d: d["stages"][2].update(lr_mul=-1)), where="training.schedule")
    with pytest.raises(SpeedrunError, match="must be a mapping of schedule settings"):
        StagedSchedule.from_dict([1, 2])
    with pytest.raises(SpeedrunError, match=r"stages\[1\] must be a mapping of stage settings"):
        StagedSchedule.from_dict(_edit(lambda d: d["stages"].__setitem__(1, 3)))


def test_constructor_validates_and_unknown_records():
    with pytest.raises(SpeedrunError, match=r"train\.staged_schedule\.stages\[0\]\.max_seq_len"):
        StagedSchedule(stages=(Stage(fraction=1.0, tokens_per_step=8, max_seq_len=0, window_blocks=(1, 1)),
                               Stage(tokens_per_step=8, max_seq_len=4, window_blocks=(1, 1))), scheduled_steps=4)
    with pytest.raises(SpeedrunError, match="no record schedule 'record99'; the records are head, record89"):
        record_schedule("record99")


@pytest.mark.parametrize("step", [-1, 1286, 3.0])
def test_steps_outside_the_schedule(step):
    with pytest.raises(ValueError, match="outside 0..1285"):
        HEAD.lr_factor(step)
