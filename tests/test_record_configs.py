"""The record experiment configs (configs/records/*.yaml, configs/fineweb-8xh100.yaml) and the parity benchmark
configs validate against the workflow's schema and build their TrainConfig, with the records' figures."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from speedrun.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
# config -> (preset, steps, stage starts, untie step, seeds of the baseline)
RECORDS = {"configs/records/record89.yaml": ("record89", 1285, [0, 423, 847, 1270], 848),
           "configs/records/record88.yaml": ("record88", 1375, [0, 455, 910, 1365], 912),
           "configs/fineweb-8xh100.yaml": ("record89", 1285, [0, 423, 847, 1270], 848),
           "configs/records/record87.yaml": ("record88", 1398, [0, 499, 943, 1387], None)}


def _train(path: str) -> TrainConfig:
    config = yaml.safe_load((ROOT / path).read_text())
    return config, TrainConfig.from_dict(config["train"])


@pytest.mark.parametrize("path", sorted(RECORDS))
def test_record_config_validates_and_resolves(path):
    config, train = _train(path)
    jsonschema.validate(config, SCHEMA)
    preset, steps, starts, untie = RECORDS[path]
    assert train.preset == preset and train.steps == steps and train.world_size == 8
    assert [s for s, _, _ in train.batch_stages()] == starts
    assert [t for _, t, _ in train.batch_stages()] == [131072, 262144, 393216, 393216]
    assert train.untie_step() == untie and train.window_blocks_at(steps) == (6, 20)
    assert train.evaluation.val_tokens == 10_485_760 and train.evaluation.val_every == 250
    assert 10_485_760 % (train.evaluation.val_batch_tokens * 8) == 0
    opt = train.optimizer
    assert (opt.muon_lr, opt.muon_momentum, opt.normuon_beta2, opt.weight_decay) == (0.023, 0.95, 0.9, 1.2)
    assert opt.cautious_weight_decay and opt.head_lr == 0.008 and opt.embed_lr == pytest.approx(0.008 * 75)
    assert opt.adam_eps == pytest.approx(1e-10 * 8 / 393216, rel=1e-2)
    assert config["stats"]["target"] == 3.28 and len(config["variants"]["baseline"]["seeds"]) == 10
    prefix = None if "record87" in path else 0.25                        # record #88's prefix loss from #88 on
    assert train.loss_weights_at(0) == ((1.0, 0.5, 0.25), prefix)


@pytest.mark.parametrize("name", ["parity-record88", "parity-record89"])
def test_parity_configs(name):
    _, train = _train(f"benchmarks/configs/{name}.yaml")
    assert train.preset == name.removeprefix("parity-") and train.steps == 120
    assert train.model_config().attention_backend == "varlen" and train.micro_batches == 8
    assert [s for s, _, _ in train.batch_stages()] == [0, 35, 70, 105]       # thirds of 105, then 15
    ev = train.evaluation
    assert (ev.val_every, ev.val_tokens, ev.val_batch_tokens) == (20, 1048576, 131072)
