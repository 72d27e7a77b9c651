"""The record experiment configs. configs/records/record12.yaml and record31.yaml: each, read on top of config.yaml
as Snakemake reads a --configfile (nested mappings merge), passes the workflow schema, and every variant builds a
TrainConfig and its GPTConfig; the key figures equal the records' own, read by hand from their train_gpt.py in
../shared/reference-logs (2024-11-19_FlexAttention, 2025-09-10_Yarn) and written here as numbers. The staged
record configs (configs/records/record8[789].yaml, configs/fineweb-8xh100.yaml) and the parity benchmark configs
validate against the schema and build their TrainConfig, with the records' figures (speedrun-spec.md 3.5)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from speedrun.errors import SpeedrunError
from speedrun.optim.schedules import lr_factor, muon_momentum
from speedrun.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def merge(base: dict, overrides: dict) -> dict:
    """``base`` updated with ``overrides``, nested mappings merged (Snakemake's update_config, the workflow's
    variant merge)."""
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


def experiment(name: str) -> dict:
    config = merge(yaml.safe_load((ROOT / "config.yaml").read_text()),
                   yaml.safe_load((ROOT / "configs/records" / f"{name}.yaml").read_text()))
    jsonschema.validate(config, yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text()))
    return config


def train_configs(config: dict) -> dict[str, TrainConfig]:
    return {name: TrainConfig.from_dict(merge(config["train"], variant.get("train", {})))
            for name, variant in config["variants"].items()}


@pytest.mark.parametrize("name,runs", [("record12", 10), ("record31", 7)])
def test_the_record_config_validates_and_every_variant_builds(name, runs):
    config = experiment(name)
    assert set(config["variants"]) == {"baseline", "candidate"}       # config.yaml's candidate is overridden
    assert config["variants"]["baseline"]["seeds"] == list(range(runs))
    assert (config["data"]["source"], config["stats"]["target"], config["stats"]["baseline"]) == (
        "fineweb-gpt2", 3.28, "baseline")
    for variant, cfg in train_configs(config).items():
        model = cfg.model_config()
        assert (cfg.preset, cfg.world_size, cfg.compute.device, cfg.micro_batches) == (name, 8, "cuda", 8), variant
        assert (model.n_layer, model.model_dim, model.n_head, model.head_dim, model.vocab_size) == (
            12, 768, 6, 128, 50304), variant
        assert (cfg.evaluation.val_tokens, cfg.evaluation.val_every) == (10485760, 125), variant
        assert cfg.evaluation.val_tokens % (cfg.evaluation.val_batch_tokens * cfg.world_size) == 0
        cfg.schedule_config()


def test_record12_settings_are_the_records():
    cfgs = train_configs(experiment("record12"))
    cfg = cfgs["baseline"]
    # Hyperparameters: num_iterations 1875, batch_size 8 x sequence_length 64*1024, val every 125 steps
    assert (cfg.steps, cfg.tokens_per_step, cfg.micro_batch_tokens) == (1875, 524288, 65536)
    # DistributedDataLoader.next_batch: contiguous slices of B x T + 1 tokens, documents never cut
    assert (cfg.train_batches, cfg.max_seq_len) == ("contiguous", 65536)
    assert cfg.evaluation.val_batch_tokens == 65536
    assert cfg.schedule.batch_schedule == () and cfg.schedule.window_schedule == ()
    # optimizer1-4: Adam wte 0.6, lm_head 0.008, scalars 0.04, betas (0.9, 0.95), eps 1e-8; Muon 0.04, 0.95
    optim = cfg.optimizer
    assert (optim.embed_lr, optim.head_lr, optim.scalar_lr, optim.muon_lr) == (0.6, 0.008, 0.04, 0.04)
    assert (optim.adam_betas, optim.adam_eps, optim.muon_momentum) == ((0.9, 0.95), 1e-8, 0.95)
    assert (optim.weight_decay, optim.adam_weight_decay, optim.orthogonalizer) == (0.0, 0.0, "newton_schulz")
    assert (optim.mlp_fc_lr_mul, optim.mlp_proj_lr_mul, optim.muon_attention_gates) == (1.0, 1.0, False)
    assert optim.muon_momentum_form == "sgd"                  # buf.mul_(momentum).add_(g); g.add(buf, momentum)
    # get_lr: 1 before 1875 - 562 = 1313, then (1875 - it) / 562; momentum 0.85 -> 0.95 over 500 steps
    s = cfg.schedule_config()
    for step, expected in ((0, 1.0), (1312, 1.0), (1313, 1.0), (1314, 561 / 562), (1600, 275 / 562), (1874, 1 / 562)):
        assert lr_factor(step, s.steps, s.cooldown_frac, s.lr_floor) == pytest.approx(expected, abs=1e-12), step
    assert muon_momentum(250, s.momentum_warmup_steps) == pytest.approx(0.90)
    assert muon_momentum(500, s.momentum_warmup_steps) == 0.95
    model = cfg.model_config()
    assert model.value_residual and model.window_long_blocks * model.window_block_size == 1024
    assert cfg.window_blocks_at(0) is None and cfg.window_blocks_at(1875) is None      # fixed 1024 tokens
    assert not cfgs["candidate"].model_config().value_residual and cfgs["candidate"].optimizer.muon_lr == 0.04


def test_record31_settings_are_the_records():
    cfgs = train_configs(experiment("record31"))
    cfg = cfgs["baseline"]
    # num_iterations 1670, train_batch_size 2048*24*8, train_max_seq_len 128*16, val_batch_size 4*64*1024*8
    assert (cfg.steps, cfg.tokens_per_step, cfg.max_seq_len, cfg.micro_batch_tokens) == (1670, 393216, 2048, 49152)
    assert cfg.evaluation.val_batch_tokens * cfg.world_size == 2097152
    # DistAdam lr 0.008 x lr_mul (embed and value embeds 75, head 1, scalars 5), betas (0.8, 0.95); Muon 0.05
    optim = cfg.optimizer
    assert (optim.embed_lr, optim.head_lr, optim.scalar_lr) == pytest.approx((0.008 * 75, 0.008, 0.008 * 5))
    assert (optim.muon_lr, optim.muon_momentum, optim.adam_betas) == (0.05, 0.95, (0.8, 0.95))
    assert optim.adam_eps == pytest.approx(1e-10 / 49152, rel=1e-12)       # its ε on a loss summed per GPU
    assert (optim.weight_decay, optim.adam_weight_decay, optim.orthogonalizer) == (0.0, 0.0, "newton_schulz")
    assert (optim.mlp_fc_lr_mul, optim.muon_attention_gates) == (0.5, True)   # its (768, 3072) c_fc; gates
    assert optim.muon_momentum_form == "ema"                  # momentum_buffer.lerp_(grad, 1 - momentum)
    # get_lr: x = step/1670, 1 before x = 0.5, then w + (1 - w)·0.1 with w = (1 - x)/0.5
    s = cfg.schedule_config()
    for step in (0, 834, 835, 1000, 1669):
        x = step / 1670
        expected = 1.0 if x < 0.5 else (1 - x) / 0.5 + (1 - (1 - x) / 0.5) * 0.1
        assert lr_factor(step, s.steps, s.cooldown_frac, s.lr_floor) == pytest.approx(expected, abs=1e-12), step
    assert muon_momentum(150, s.momentum_warmup_steps) == pytest.approx(0.90)
    # get_ws: ws_schedule (3, 7, 11) over thirds, ws_validate 13 at the final validation; short = ws // 2
    assert [cfg.window_blocks_at(step) for step in (0, 556, 557, 1113, 1114, 1669)] == [
        (1, 3), (1, 3), (3, 7), (3, 7), (5, 11), (5, 11)]               # int(3·step / 1671): 557, 1114
    ws = lambda step: (3, 7, 11)[int(3 * step / 1671)]                  # noqa: E731  its get_ws
    assert all(cfg.window_blocks_at(step)[1] == ws(step) for step in range(1670))
    assert cfg.window_blocks_at(1670) == (6, 13)                                 # 13 // 2 = 6
    model = cfg.model_config()
    assert (model.attention_scale, model.yarn, model.mlp_free_layers, model.attention_free_layers) == (
        0.1, True, (0,), (7,))
    assert not cfgs["candidate"].model_config().yarn and cfgs["candidate"].optimizer.muon_lr == 0.05


def test_final_window_short_blocks_sets_the_final_validations_short_window_only():
    base = {"preset": "tiny", "steps": 6, "tokens_per_step": 64, "model": {"window_pattern": "SLSL"},
            "window_schedule": [[1, 2], [2, 3]], "final_window_long_blocks": 4}
    cfg = TrainConfig.from_dict({**base, "final_window_short_blocks": 3})
    assert [cfg.window_blocks_at(s) for s in (0, 5, 6)] == [(1, 2), (2, 3), (3, 4)]
    assert TrainConfig.from_dict(base).window_blocks_at(6) == (2, 4)                   # null: the stage's
    fixed = TrainConfig.from_dict({"preset": "tiny", "steps": 6, "tokens_per_step": 64,
                                   "model": {"window_pattern": "SL", "n_layer": 2}, "final_window_short_blocks": 2})
    assert fixed.window_blocks_at(5) is None and fixed.window_blocks_at(6) == (2, 3)   # the model's long 3
    for value, match in ((5, r"train\.final_window_short_blocks 5 is longer than the final validation's long "
                              r"window of 4 blocks"),
                         (0, r"train\.final_window_short_blocks must be an integer >= 1")):
        with pytest.raises(SpeedrunError, match=match):
            TrainConfig.from_dict({**base, "final_window_short_blocks": value})
    with pytest.raises(SpeedrunError, match=r"train\.final_window_short_blocks needs a model window_pattern"):
        TrainConfig.from_dict({"preset": "tiny", "steps": 6, "tokens_per_step": 64, "final_window_short_blocks": 1})


def test_window_stage_span_steps_plus_one_moves_the_stage_boundaries_as_record31s_get_ws():
    base = {"preset": "tiny", "steps": 5, "tokens_per_step": 64, "model": {"window_pattern": "SLSL"},
            "window_schedule": [[1, 2], [2, 3]], "final_window_long_blocks": 4}
    plain = TrainConfig.from_dict(base)
    plus = TrainConfig.from_dict({**base, "window_stage_span": "steps_plus_one"})
    # 5 steps in halves: stage_index starts the second at round(2.5) = 3; int(2·s/6) at s = 3 too; at 6 steps
    # (round 3 against int(2·s/7): 4) they differ
    assert [plain.window_blocks_at(s) for s in range(6)] == [(1, 2)] * 3 + [(2, 3)] * 2 + [(2, 4)]
    assert [plus.window_blocks_at(s) for s in range(6)] == [(1, 2)] * 3 + [(2, 3)] * 2 + [(2, 4)]
    six = TrainConfig.from_dict({**base, "steps": 6, "window_stage_span": "steps_plus_one"})
    assert [six.window_blocks_at(s) for s in range(7)] == [(1, 2)] * 4 + [(2, 3)] * 2 + [(2, 4)]
    assert [TrainConfig.from_dict({**base, "steps": 6}).window_blocks_at(s) for s in range(7)] == [
        (1, 2)] * 3 + [(2, 3)] * 3 + [(2, 4)]
    with pytest.raises(SpeedrunError, match=r"train\.window_stage_span must be one of steps, steps_plus_one"):
        TrainConfig.from_dict({**base, "window_stage_span": "thirds"})


def test_the_warm_up_compiles_at_the_window_stage_starts_of_the_span():
    from speedrun.training.loop import warm_up_steps

    cfg = train_configs(experiment("record31"))["baseline"]
    assert cfg.window_stage_starts() == [0, 557, 1114]
    assert [cfg.window_blocks_at(s - 1) != cfg.window_blocks_at(s) for s in (557, 1114)] == [True, True]
    assert warm_up_steps(cfg) == [0, 557, 1114]
    plain = TrainConfig.from_dict({**experiment("record31")["train"], "window_stage_span": "steps"})
    assert plain.window_stage_starts() == [0, 557, 1113] and warm_up_steps(plain) == [0, 557, 1113]
    assert train_configs(experiment("record12"))["baseline"].window_stage_starts() == []


SCHEMA = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
# config -> (preset, steps, stage starts, untie step)
RECORDS = {"configs/records/record89.yaml": ("record89", 1285, [0, 423, 847, 1270], 848),
           "configs/records/record88.yaml": ("record88", 1375, [0, 455, 910, 1365], 912),
           "configs/fineweb-8xh100.yaml": ("record89", 1285, [0, 423, 847, 1270], 848),
           "configs/records/record87.yaml": ("record87", 1398, [0, 499, 943, 1387], None),
           "configs/records/record83.yaml": ("record83", 1385, [0, 458, 917, 1375], 918)}


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
    head_lr = 0.008 * 0.95 if preset == "record87" else 0.008               # record87 L1933: lm_head lr_mul 0.95
    assert opt.cautious_weight_decay and opt.head_lr == head_lr and opt.embed_lr == pytest.approx(0.008 * 75)
    # param_table wd_mul (record83 L1813-1826, record87 L1928-1941): lm_head and embed 150 (our head kind), value
    # and bigram tables 5 (embed), scalars 0 (scalar); the sublayer kinds' from RECORD_ADAM_KINDS
    assert dict(opt.adam_kind_wd_mul) == {"head": 150, "embed": 5, "scalar": 0}
    # the records' adam_defaults eps=1e-10 (one for every kind) on their objective, model(...).sum() *
    # grad_scale (record83 L2000, record87 L2160, record88 L2132): the loss summed over a micro-batch's tokens
    assert (opt.adam_eps, opt.adam_eps_units, opt.loss_units) == (1e-10, "micro_batch_sum", "micro_batch_sum")
    assert [train.adam_eps_at(s) for s in starts] == [1e-10] * 4
    assert [train.loss_scale_at(s) for s in starts] == [t / 8 for t in (131072, 262144, 393216, 393216)]
    assert config["stats"]["target"] == 3.28 and len(config["variants"]["baseline"]["seeds"]) == 10
    prefix = None if preset in ("record83", "record87") else 0.25        # record #88's prefix loss from #88 on
    assert train.loss_weights_at(0) == ((1.0, 0.5, 0.25), prefix)


@pytest.mark.parametrize("name", ["parity-record88", "parity-record89"])
def test_parity_configs_of_the_thirds(name):
    _, train = _train(f"benchmarks/configs/{name}.yaml")
    assert train.preset == name.removeprefix("parity-") and train.steps == 120
    assert train.model_config().attention_backend == "varlen" and train.micro_batches == 8
    assert [s for s, _, _ in train.batch_stages()] == [0, 35, 70, 105]       # thirds of 105, then 15
    ev = train.evaluation
    assert (ev.val_every, ev.val_tokens, ev.val_batch_tokens) == (20, 1048576, 131072)


def _reference_code() -> Path:
    found = [up / "shared" / "reference-code" for up in ROOT.parents[:2] if (up / "shared" / "reference-code").is_dir()]
    if not found:
        pytest.skip("../shared/reference-code is not here")
    return found[0]


def _parity_sched() -> dict[str, str]:
    """The environment benchmarks/parity.sh gives a record's patched script (its SCHED variable)."""
    import re

    text = (ROOT / "benchmarks" / "parity.sh").read_text()
    return dict(item.split("=", 1) for item in re.search(r'^SCHED="([^"]*)"', text, re.M).group(1).split())


def _patched_schedule(record: str, tmp_path: Path, monkeypatch) -> dict:
    """The schedule objects of ../shared/reference-code/RECORD/train_gpt.py as parity.sh runs it on one GPU: the
    script copied through tools/patch_schedule.py, then its top-level definitions of the schedule (the
    Hyperparameters, TrainingStage and TrainingSchedule classes, TRAINING_STAGES, ``args``,
    ``training_schedule``, ``grad_accum_steps``, the momentum schedule and, where it has one (record #87), the
    noise schedule) executed with parity.sh's
    SCHED in the environment, WORLD_SIZE 1 and the CPU as ``device``; everything else of the script (CUDA, the
    model, the loaders) left out. Returns the executed namespace."""
    import subprocess
    import sys

    import torch

    from record_code import record_definitions

    code = _reference_code()
    patched = tmp_path / "train_gpt.py"
    subprocess.run([sys.executable, str(code / "tools" / "patch_schedule.py"), str(code / record / "train_gpt.py"),
                    str(patched)], check=True, capture_output=True)
    wanted = {"Hyperparameters", "TrainingStage", "TrainingSchedule", "TRAINING_STAGES", "args",
              "training_schedule", "grad_accum_steps", "get_muon_momentum"}
    noise = {"get_normuon_noise_scale", "NORMUON_NOISE_SIGMA0", "NORMUON_NOISE_END_FRAC", "NORMUON_NOISE_WARMUP"}
    for key, value in _parity_sched().items():
        monkeypatch.setenv(key, value)
    import dataclasses
    import itertools
    import os
    import uuid

    namespace = {"__name__": f"{record}_schedule", "os": os, "uuid": uuid, "torch": torch, "world_size": 1,
                 "device": torch.device("cpu"), "dataclass": dataclasses.dataclass,
                 "accumulate": itertools.accumulate, "pairwise": itertools.pairwise}
    record_definitions(patched, wanted, namespace, optional=frozenset(noise))
    assert noise & namespace.keys() == (noise if record == "record87" else set()), record   # record #87's noise
    return namespace


def _step_settings_agree(train, ref: dict, step: int) -> float | None:
    """Assert that our config ``train`` has the batch, windows, lr factor, Muon momentum and MTP weights of the
    patched script's schedule (``ref``, :func:`_patched_schedule`) at ``step``; return our prefix weight."""
    schedule, staged = ref["training_schedule"], train.schedule.staged_schedule
    stage, _ = schedule.lookup(step)
    assert train.batch_at(step) == (stage.batch_size, stage.train_max_seq_len), step
    assert train.window_blocks_at(step) == tuple(stage.window_sizes), step
    assert staged.lr_factor(step) == pytest.approx(schedule.get_lr(step), abs=1e-12), step
    assert staged.muon_momentum(step) == pytest.approx(ref["get_muon_momentum"](step), abs=1e-12), step
    mtp, prefix = train.loss_weights_at(step)
    assert mtp == pytest.approx(schedule.mtp_weights[step].tolist(), abs=1e-6), step
    return prefix


def test_parity_record87_is_the_patched_scripts_compressed_schedule(tmp_path, monkeypatch):
    """benchmarks/configs/parity-record87.yaml against record #87's script as parity.sh runs it (patch_schedule.py
    and SCHED, executed: :func:`_patched_schedule`): the same steps, stage boundaries, batch, windows, lr factor,
    momentum, MTP weights and Langevin σ at every step, no untie, the same evaluations; and record87.yaml's
    optimizer settings."""
    from speedrun.optim.langevin import langevin_sigma
    from speedrun.training.loop import validation_steps

    ref = _patched_schedule("record87", tmp_path, monkeypatch)
    args, schedule = ref["args"], ref["training_schedule"]
    config, train = _train("benchmarks/configs/parity-record87.yaml")
    staged = train.schedule.staged_schedule
    assert (train.preset, train.steps, staged.scheduled_steps) == ("record87", schedule.total_steps,
                                                                   schedule.scheduled_iterations)
    assert (schedule.scheduled_iterations, schedule.total_steps) == (105, 120)     # SCHED reached the script
    assert staged.boundaries() == [start for start, _ in schedule.boundaries] + [schedule.total_steps]
    assert staged.boundaries() == [0, 38, 71, 105, 120]                            # round(0.36 / 0.68 x 105)
    assert train.model_config().attention_backend == "varlen"
    assert train.micro_batches == ref["grad_accum_steps"] == 8
    sched = train.schedule_config()
    for step in range(schedule.total_steps):
        assert _step_settings_agree(train, ref, step) is None, step                  # no prefix loss in #87
        sigma = langevin_sigma(step, sched.steps, sched.cooldown_frac, train.optimizer.langevin_noise,
                               warmup_steps=sched.langevin_warmup_steps, end_step=sched.langevin_end_step)
        assert sigma == pytest.approx(ref["get_normuon_noise_scale"](step), abs=1e-12), step
    # the final validation: the extension stage's short window, the long one ws_post_yarn_ext (its
    # apply_final_ws_ext at the last step)
    assert train.window_blocks_at(120) == (schedule.stages[-1].window_sizes[0], schedule.ws_post_yarn_ext)
    assert schedule.split_step > schedule.total_steps and train.untie_step() is None          # never split
    # Validation: the script evaluates where `last_step or step % val_loss_every == 0` (its training loop) on
    # grad_accum_steps x val_tokens // val_batch_size passes of val_batch_size // grad_accum_steps // world_size
    # tokens (distributed_data_generator's num_tokens_local); one GPU: world_size 1
    ev = train.evaluation
    assert validation_steps(train) == [s for s in range(schedule.total_steps + 1)
                                       if s == schedule.total_steps or s % args.val_loss_every == 0]
    passes = ref["grad_accum_steps"] * args.val_tokens // args.val_batch_size
    assert ev.val_batch_tokens == args.val_batch_size // ref["grad_accum_steps"]
    assert ev.val_tokens == passes * ev.val_batch_tokens == args.val_tokens == 1048576
    # the optimizer is record87.yaml's, setting by setting
    assert train.optimizer == _train("configs/records/record87.yaml")[1].optimizer


def test_record83_config_is_its_scripts_settings():
    """configs/records/record83.yaml against ../shared/reference-code/record83/train_gpt.py (line numbers of it)."""
    config, train = _train("configs/records/record83.yaml")
    staged = train.schedule.staged_schedule
    # L1678-1679: num_scheduled_iterations 1375, num_extension_iterations 10; L1775: cooldown_frac 0.60, untie at
    # split_embed_stage 2 (default), made odd: 917 | 1 = 917, the first untied step 918
    assert (staged.scheduled_steps, staged.extension_steps, staged.cooldown_frac) == (1375, 10, 0.6)
    assert (staged.untie_stage, train.untie_step()) == (2, 918)
    # L1763-1770: thirds; 896 -> 2048; 8, 16, 24 x 2048 x 8 tokens; windows (1, 3) (3, 7) (5, 11) (6, 13); lr_mul
    # 1.0, 1.52, 1.73; MTP [1, .5, .25 -> 0], [1, .5 -> 0], [1]; no prefix weights (record #88 adds them)
    assert [st.fraction for st in staged.stages] == [1 / 3, 1 / 3, 1 / 3, None]
    assert [train.batch_at(s) for s in (0, 458, 917)] == [(131072, 896), (262144, 2048), (393216, 2048)]
    assert [train.window_blocks_at(s) for s in (0, 458, 917, 1375, 1385)] == [(1, 3), (3, 7), (5, 11), (6, 13),
                                                                              (6, 20)]
    assert [st.lr_mul for st in staged.stages[:3]] == [1.0, 1.52, 1.73]
    mtp, prefix = train.loss_weights_at(457)
    assert mtp == pytest.approx((1.0, 0.5, 0.0), abs=1e-3) and prefix is None
    assert train.loss_weights_at(917) == ((1.0,), None)
    # L1758: the cooldown's floor 0.15 during the extension
    assert staged.lr_factor(1380) == pytest.approx(0.15)
    # L1850-1852 adam_defaults lr 0.008, eps 1e-10, wd 0.005; L1856-1859 normuon lr 0.023, momentum 0.95, beta2 0.9,
    # wd 1.2; L1813/L1818/L1819/L1825: scalars lr x 5, lm_head x 1, bigram and value tables x 75
    opt = train.optimizer
    assert (opt.muon_lr, opt.muon_momentum, opt.normuon_beta2, opt.weight_decay) == (0.023, 0.95, 0.9, 1.2)
    assert (opt.head_lr, opt.embed_lr, opt.scalar_lr) == pytest.approx((0.008, 0.008 * 75, 0.008 * 5))
    assert (opt.adam_eps, opt.adam_weight_decay, opt.cautious_weight_decay) == (1e-10, 0.005, True)
    assert dict(opt.adam_kind_betas) == {"head": (0.5, 0.95), "embed": (0.75, 0.95), "scalar": (0.9, 0.99)}
    assert opt.langevin_noise == 0 and dict(opt.adam_kind_coptim) == {}            # both arrive with record #87
    # L1674, L1676, L1686: val_tokens 10,485,760 in batches of 4 x 64 x 1024 x 8, every 250 steps
    ev = train.evaluation
    assert (ev.val_tokens, ev.val_batch_tokens * train.world_size, ev.val_every) == (10485760, 2097152, 250)
    model = train.model_config()
    assert model.paired_head_layers == (0, 2, 5, 9) and not (model.fp8_attention or model.fp8_mlp)
    assert (model.bigram_vocab_size, model.bigram_dim) == (50304 * 15, 192)         # L1690-1691


def test_record87_config_is_its_scripts_settings():
    """configs/records/record87.yaml against ../shared/reference-code/record87/train_gpt.py (line numbers of it)."""
    from speedrun.optim.langevin import langevin_sigma

    config, train = _train("configs/records/record87.yaml")
    staged = train.schedule.staged_schedule
    # L1771-1772: 1387 + 11 steps; L1868: cooldown 0.60, split_embed_stage None (never untied)
    assert (staged.scheduled_steps, staged.extension_steps, staged.cooldown_frac) == (1387, 11, 0.6)
    assert staged.untie_stage is None and train.untie_step() is None
    # L1856-1863: stages of 0.36 / 0.32 / 0.32: round(0.36 x 1387) = 499, round(0.68 x 1387) = 943
    assert [st.fraction for st in staged.stages] == [0.36, 0.32, 0.32, None]
    assert [train.batch_at(s) for s in (498, 499, 942, 943)] == [(131072, 896), (262144, 2048), (262144, 2048),
                                                                 (393216, 2048)]
    assert [train.window_blocks_at(s) for s in (0, 499, 943, 1387, 1398)] == [(1, 3), (3, 7), (5, 11), (6, 13),
                                                                              (6, 20)]
    assert train.loss_weights_at(0) == ((1.0, 0.5, 0.25), None)
    # L1965-1967 adam lr 0.008, eps 1e-10, wd 0.005; L1971-1974 normuon 0.023, 0.95, 0.9, 1.2
    opt = train.optimizer
    assert (opt.muon_lr, opt.muon_momentum, opt.normuon_beta2, opt.weight_decay) == (0.023, 0.95, 0.9, 1.2)
    assert (opt.adam_eps, opt.adam_eps_units, opt.adam_weight_decay) == (1e-10, "micro_batch_sum", 0.005)
    assert opt.loss_units == "micro_batch_sum"                                 # L2132: .sum() * grad_scale
    # L1933: lm_head lr_mul 0.95 (the embedding is tied to it throughout); L1934, L1940: the bigram and value
    # tables x 75 with adam_coptim 0.5; L1928: scalars x 5
    assert (opt.head_lr, opt.embed_lr, opt.scalar_lr) == pytest.approx((0.008 * 0.95, 0.008 * 75, 0.008 * 5))
    assert dict(opt.adam_kind_coptim) == {"embed": 0.5} and opt.cautious_weight_decay
    # L1890-1892: noise 0.10, warm-up 50 steps, zero from int(0.25 x 1387) = 346 on; its get_normuon_noise_scale
    assert (opt.langevin_noise, opt.langevin_warmup_steps, opt.langevin_end_frac) == (0.1, 50, 0.25)
    sched = train.schedule_config()
    assert sched.langevin_end_step == 346

    def record(step):                                                     # its get_normuon_noise_scale, L1894-1905
        end = int(1387 * 0.25)
        if step >= end:
            return 0.0
        sigma = 0.10 * (step / 50 if step < 50 else 1.0)
        return sigma * max(0.0, (end - step) / end)

    for step in (0, 1, 25, 49, 50, 51, 200, 345, 346, 347, 1000, 1398):
        ours = langevin_sigma(step, sched.steps, sched.cooldown_frac, opt.langevin_noise,
                              warmup_steps=sched.langevin_warmup_steps, end_step=sched.langevin_end_step)
        assert ours == pytest.approx(record(step), abs=1e-15), step
    model = train.model_config()
    assert (model.paired_head_layers, model.fp8_attention, model.fp8_attention_scales) == ((0, 5), True, "unit")
    assert (model.bigram_vocab_size, model.bigram_dim, model.prefix_token_loss) == (50304 * 15, 192, False)


def test_every_record_script_has_one_adam_eps():
    """The records' Adam ε is one value for every parameter kind and stage (their adam_defaults; no per-entry
    eps in any param_table), so one adam_eps setting maps it (with adam_eps_units for the stages' batches)."""
    import re

    found = [up / "shared" / "reference-code" for up in ROOT.parents[:2] if (up / "shared" / "reference-code").is_dir()]
    if not found:
        pytest.skip("../shared/reference-code is not here")
    scripts = found[0]
    for record in ("record83", "record87", "record88", "head"):
        text = (scripts / record / "train_gpt.py").read_text()
        table = text[text.index("self.param_table = {"):text.index("self.work_order")]
        assert '"eps"' not in table and "eps=" not in table, record
        assert re.findall(r"adam_defaults = dict\(\s*lr=0\.008,\s*eps=([0-9e.-]+),", text) == ["1e-10"], record
        assert text.count('eps=self.adam_defaults["eps"]') == 1, record


@pytest.mark.parametrize("record, config", [("record88", "parity-record88"), ("head", "parity-record89")])
def test_parity_record88_and_head_are_the_patched_scripts_compressed_schedule(record, config, tmp_path,
                                                                              monkeypatch):
    """benchmarks/configs/parity-record88.yaml (and parity-record89.yaml, HEAD's) against the record's script as
    parity.sh runs it (:func:`_patched_schedule`): the same stage boundaries, batch, windows, lr factor, Muon
    momentum, MTP and prefix weights at every step, the same untie step and final validation windows."""
    ref = _patched_schedule(record, tmp_path, monkeypatch)
    schedule = ref["training_schedule"]
    _, train = _train(f"benchmarks/configs/{config}.yaml")
    staged = train.schedule.staged_schedule
    assert (schedule.scheduled_iterations, schedule.total_steps) == (105, 120) == (staged.scheduled_steps,
                                                                                   train.steps)
    assert staged.boundaries() == [start for start, _ in schedule.boundaries] + [schedule.total_steps]
    for step in range(schedule.total_steps):
        prefix = _step_settings_agree(train, ref, step)
        assert prefix == pytest.approx(schedule.prefix_weights[step].item(), abs=1e-6), step
    assert train.window_blocks_at(120) == (schedule.stages[-1].window_sizes[0], schedule.ws_post_yarn_ext)
    # the script's split_step is the last tied update (copy_lm_state_to_embed after its step); ours unties
    # before the next step's forward
    assert staged.split_step() == schedule.split_step and train.untie_step() == schedule.split_step + 1
