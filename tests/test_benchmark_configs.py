"""Every config under benchmarks/configs/ loads as the train stage would load it (a misspelt key or a bad
value there would otherwise surface only on the GPU machine, after the data preparation)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from speedrun.train_config import TrainConfig

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "configs").glob("*.yaml"))


def test_there_are_benchmark_configs():
    assert len(CONFIGS) >= 5, CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_benchmark_config_loads(path: Path):
    config = TrainConfig.from_dict(yaml.safe_load(path.read_text())["train"])
    model = config.model_config()
    assert config.device == "cuda" and config.compile
    assert config.tokens_per_step % config.micro_batches == 0
    assert model.model_dim == 768 and model.n_layer == 12


def test_race_configs_share_the_race():
    """The races compare at the same steps, tokens per step and validation tokens (gpu-notes.md's race)."""
    races = [p for p in CONFIGS if p.stem.startswith("h200-race")]
    assert len(races) >= 4
    for path in races:
        config = TrainConfig.from_dict(yaml.safe_load(path.read_text())["train"])
        assert (config.steps, config.tokens_per_step, config.val_tokens, config.val_every) == (120, 393216, 983040, 20), path
