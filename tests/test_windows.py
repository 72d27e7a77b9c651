"""Sliding windows in 128-token blocks: the per-layer pattern, the schedule as a pure function of the step,
the model's receptive field under windows, and the training settings that drive them."""

from __future__ import annotations

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model.config import build_model_config
from speedrun.model.gpt import GPT
from speedrun.model.windows import check_window_pattern, layer_windows, window_tokens
from speedrun.optim.schedules import stage_index, window_blocks
from speedrun.training.config import TrainConfig


def test_layer_windows_by_hand():
    assert window_tokens(3, 128) == 384
    assert layer_windows("SLFS", 4, 1, 3, 128) == [128, 384, None, 128]
    assert layer_windows("", 3, 1, 3, 128) == [None, None, None]
    assert layer_windows("LL", 2, 5, 11, 4) == [44, 44]


@pytest.mark.parametrize("pattern,match", [("SLS", "3 characters for 4 layers"), ("SLXS", "'X'")])
def test_bad_window_patterns_are_refused(pattern, match):
    with pytest.raises(ValueError, match=match):
        check_window_pattern(pattern, 4)
    with pytest.raises(SpeedrunError, match=match):
        build_model_config("tiny", {"window_pattern": pattern})
    with pytest.raises(ValueError, match="blocks >= 1"):
        window_tokens(0, 128)


def test_stage_boundaries_are_the_rounded_thirds():
    """1270 steps in 3 stages: boundaries round(423.3) = 423 and round(846.7) = 847 (speedrun-spec 3.5)."""
    stages = [stage_index(s, 1270, 3) for s in (0, 422, 423, 846, 847, 1269, 1270)]
    assert stages == [0, 0, 1, 1, 2, 2, 2]
    assert [stage_index(s, 10, 4) for s in range(11)] == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 3]  # 3, 5, 8
    with pytest.raises(ValueError):
        stage_index(11, 10, 2)


def test_window_schedule_by_step_and_at_the_final_validation():
    schedule = ((1, 3), (3, 7), (5, 11))
    assert window_blocks(0, 1270, schedule) == (1, 3)
    assert window_blocks(500, 1270, schedule) == (3, 7)
    assert window_blocks(1269, 1270, schedule, 20) == (5, 11)
    assert window_blocks(1270, 1270, schedule) == (5, 11)
    assert window_blocks(1270, 1270, schedule, 20) == (5, 20)
    with pytest.raises(ValueError, match="at least one"):
        window_blocks(0, 10, ())


def _windowed_model(pattern: str, short: int, long: int) -> GPT:
    torch.manual_seed(0)
    cfg = build_model_config("tiny", dict(vocab_size=64, n_layer=len(pattern), model_dim=16, n_head=2,
                                          head_dim=8, attention_backend="reference", window_pattern=pattern,
                                          window_block_size=2, window_short_blocks=short,
                                          window_long_blocks=long))
    model = GPT(cfg).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o.weight", "proj.weight")):
                p.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("pattern,short,long,reach", [
    ("SS", 2, 9, 6),       # two layers of 4-token windows: each looks 3 tokens back, 6 in all
    ("SL", 1, 3, 1 + 5),   # 2 tokens then 6 tokens
    ("FS", 1, 1, 99),      # a full-document layer sees everything
])
def test_a_token_beyond_the_windows_receptive_field_changes_nothing(pattern, short, long, reach):
    model = _windowed_model(pattern, short, long)
    inputs = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    cu = torch.tensor([0, 16], dtype=torch.int32)
    changed = inputs.clone()
    changed[0] = (changed[0] + 1) % 64
    with torch.no_grad():
        diff = (model.hidden_states(inputs, cu) - model.hidden_states(changed, cu)).abs().amax(dim=1)
    assert (diff[:reach + 1] > 1e-9).all()
    assert (diff[reach + 1:] == 0).all()


def test_train_settings_for_windows():
    cfg = TrainConfig.from_dict({"steps": 9, "model": {"window_pattern": "SLSL"},
                                 "window_schedule": [[1, 2], [2, 4], [3, 6]], "final_window_long_blocks": 8})
    assert cfg.schedule.window_schedule == ((1, 2), (2, 4), (3, 6))
    assert [cfg.window_blocks_at(s) for s in (0, 2, 3, 6, 8, 9)] == [(1, 2), (1, 2), (2, 4), (3, 6), (3, 6),
                                                                     (3, 8)]
    only_final = TrainConfig.from_dict({"steps": 9, "model": {"window_pattern": "SLSL"},
                                        "final_window_long_blocks": 8})
    assert only_final.window_blocks_at(3) is None and only_final.window_blocks_at(9) == (1, 8)
    assert TrainConfig().window_blocks_at(0) is None
    with pytest.raises(SpeedrunError, match="need a model window_pattern"):
        TrainConfig.from_dict({"window_schedule": [[1, 2]]})
    with pytest.raises(SpeedrunError, match="window_schedule must be a list"):
        TrainConfig.from_dict({"model": {"window_pattern": "SLSL"}, "window_schedule": [[1, 0]]})
