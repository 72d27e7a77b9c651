"""``speedrun train``'s settings (:mod:`speedrun.training.config`): building and validating a TrainConfig, the
settings derived from it (batch stages, optimizer and schedule configs), and the ``--config`` argument."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
import torch
import yaml

from speedrun.errors import SpeedrunError
from speedrun.training.config import TrainConfig, load_config_argument, resolve_dtype
from speedrun.workflow.planning import schema_error_message
from test_train import QUICK, SMALL

WINDOWED = {**QUICK, "model": {**SMALL, "window_pattern": "SL", "tie_embed_head": True}}   # 6 steps, 2 layers


def test_train_config_from_dict_and_derived_settings():
    cfg = TrainConfig.from_dict({"steps": 10, "adam_betas": [0.9, 0.99], "model": {"n_layer": 2}})
    assert cfg.steps == 10 and cfg.optimizer.adam_betas == (0.9, 0.99)
    assert cfg.micro_batch_tokens == 4096 // 4
    assert cfg.model_config().n_layer == 2
    assert cfg.optimizer.adam_betas == (0.9, 0.99)
    assert cfg.schedule_config().momentum_end == cfg.optimizer.muon_momentum
    again = TrainConfig.from_dict(json.loads(cfg.to_json()))
    assert again.model_config() == cfg.model_config() and again.to_json() == cfg.to_json()
    assert "\n" not in cfg.to_json()


@pytest.mark.parametrize("settings,match", [
    ({"stepz": 3}, "unknown training setting 'stepz' \\(did you mean 'steps'\\?\\); expected one of preset, model, "),
    ({"muon_lrr": 1}, "unknown training setting 'muon_lrr' \\(did you mean 'muon_lr'\\?\\)"),   # `speedrun train`
    ({"model": {"widht": 3}}, "unknown model setting 'widht' \\(model overrides accept "),          # nothing close
    ({"model": {"n_layr": 3}}, "unknown model setting 'n_layr' \\(did you mean 'n_layer'\\?\\) \\(model overrides"),
    ({"micro_batches": 3, "world_size": 2, "tokens_per_step": 3}, "not a multiple of train.world_size"),
    ({"tokens_per_step": 4095}, "tokens_per_step 4095 is not a multiple of train.micro_batches 4"),
    ({"val_tokens": 1000}, "val_tokens 1000 is not a multiple"),
    ({"steps": "60"}, "train.steps must be an integer"),
    ({"steps": True}, "train.steps must be an integer"),
    ({"compile": "yes"}, "train.compile must be true or false"),
    ({"compile_mode": "fast"}, "train.compile_mode must be one of"),
    ({"device": "tpu"}, "train.device must be one of cpu, cuda, auto"),
    ({"orthogonalizer": "svd"}, "train.orthogonalizer must be one of"),
    ({"cooldown_frac": 1.5}, "train.cooldown_frac must be a number in"),
    ({"muon_momentum": 1.0}, "train.muon_momentum"),
    ({"adam_betas": [0.9]}, "adam_betas must be a pair"),
    ({"val_every": -1}, "train.val_every must be an integer >= 0"),
])
def test_bad_settings_are_named(settings, match):
    with pytest.raises(SpeedrunError, match=match):
        TrainConfig.from_dict(settings)


def test_config_argument_is_json_or_a_file(tmp_path):
    assert load_config_argument('{"steps": 3, "muon_lr": 1e-05}') == {"steps": 3, "muon_lr": 1e-05}
    (tmp_path / "c.json").write_text('{"steps": 4}')
    (tmp_path / "c.yaml").write_text("steps: 5\nmodel:\n  n_layer: 2\n")
    assert load_config_argument(str(tmp_path / "c.json")) == {"steps": 4}
    assert load_config_argument(str(tmp_path / "c.yaml")) == {"steps": 5, "model": {"n_layer": 2}}
    with pytest.raises(SpeedrunError, match="neither a JSON object nor an existing file"):
        load_config_argument(str(tmp_path / "missing.json"))
    with pytest.raises(SpeedrunError, match="cannot parse"):
        load_config_argument('{"steps": 3')
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(SpeedrunError, match="mapping"):
        load_config_argument(str(tmp_path / "list.yaml"))
    (tmp_path / "workflow.yaml").write_text("data: {source: embedded}\ntrain: {steps: 3}\nvariants: {}\n")
    with pytest.raises(SpeedrunError, match="is a workflow config .* takes the training settings alone"):
        load_config_argument(str(tmp_path / "workflow.yaml"))


def test_batch_schedule_stages_and_totals():
    cfg = TrainConfig.from_dict({**QUICK, "steps": 9, "micro_batches": 2,
                                 "batch_schedule": [[256, 64], [512, 128], [1024, 128]]})
    assert cfg.batch_stages() == [(0, 256, 64), (3, 512, 128), (6, 1024, 128)]
    assert [cfg.batch_at(s) for s in (0, 2, 3, 5, 6, 8)] == [(256, 64), (256, 64), (512, 128), (512, 128),
                                                              (1024, 128), (1024, 128)]
    assert cfg.train_tokens() == 3 * 256 + 3 * 512 + 3 * 1024
    assert cfg.micro_batch_tokens == 128
    assert TrainConfig.from_dict(QUICK).train_tokens() == 6 * 512
    with pytest.raises(SpeedrunError, match="train.batch_schedule: tokens_per_step 255 is not a multiple"):
        TrainConfig.from_dict({**QUICK, "batch_schedule": [[255, 64]]})
    with pytest.raises(SpeedrunError, match="batch_schedule must be a list"):
        TrainConfig.from_dict({**QUICK, "batch_schedule": [[256]]})
    with pytest.raises(SpeedrunError, match="batch_schedule has 3 stages for 2 steps"):
        TrainConfig.from_dict({**QUICK, "steps": 2, "batch_schedule": [[256, 64]] * 3})


def test_rotary_tables_are_sized_to_the_largest_forward_pass():
    """Micro-batches of 128, 256, 512 tokens (1024 // 2) and validation chunks of 256: 512 rows, 1024 with
    paired heads; a value set in ``model`` is kept, and refused below what the run needs."""
    staged = {**QUICK, "steps": 9, "batch_schedule": [[256, 64], [512, 128], [1024, 128]]}
    assert TrainConfig.from_dict(staged).model_config().rotary_positions == 512
    paired = {**staged, "model": {**QUICK["model"], "paired_head_layers": [1]}}
    assert TrainConfig.from_dict(paired).model_config().rotary_positions == 1024
    val_bound = {**QUICK, "val_batch_tokens": 512}                    # 512 // 2 = 256 train tokens < 512
    assert TrainConfig.from_dict(val_bound).model_config().rotary_positions == 512
    assert TrainConfig.from_dict(QUICK).model_config().rotary_positions == 256
    explicit = {**paired, "model": {**paired["model"], "rotary_positions": 4096}}
    assert TrainConfig.from_dict(explicit).model_config().rotary_positions == 4096
    with pytest.raises(SpeedrunError, match="rotary_positions 1023 is below the 1024 positions"):
        TrainConfig.from_dict({**paired, "model": {**paired["model"], "rotary_positions": 1023}})


def test_schedule_settings_reach_the_schedule_config():
    cfg = TrainConfig.from_dict({"steps": 1270, "cooldown_frac": 0.6, "lr_floor": 0.15,
                                 "lr_stage_multipliers": [1.0, 1.52, 1.73], "momentum_cooldown_steps": 50})
    assert cfg.schedule.lr_stage_multipliers == (1.0, 1.52, 1.73)
    schedule = cfg.schedule_config()
    assert (schedule.steps, schedule.cooldown_frac, schedule.lr_floor) == (1270, 0.6, 0.15)
    assert (schedule.lr_stage_multipliers, schedule.momentum_cooldown_steps) == ((1.0, 1.52, 1.73), 50)
    again = TrainConfig.from_dict(json.loads(cfg.to_json()))
    assert again.schedule.lr_stage_multipliers == (1.0, 1.52, 1.73) and again.to_json() == cfg.to_json()
    default = TrainConfig().schedule_config()                  # off by default: existing configs unchanged
    assert (default.lr_stage_multipliers, default.momentum_cooldown_steps) == ((), 0)


def test_the_lr_and_momentum_settings_are_declared_once():
    """The schedule section takes its lr and momentum fields from the optimizers' LrMomentumSchedule, and a
    run's ScheduleConfig reads every one of them from it, none copied by hand; one set of defaults."""
    from speedrun.optim.config import LrMomentumSchedule, ScheduleConfig
    from speedrun.training.config import ScheduleSettings

    shared = [f.name for f in dataclasses.fields(LrMomentumSchedule)]
    assert issubclass(ScheduleSettings, LrMomentumSchedule) and issubclass(ScheduleConfig, LrMomentumSchedule)
    values = {"lr_stage_multipliers": [1.0, 2.0], "cooldown_frac": 0.3, "lr_floor": 0.2, "momentum_warmup_steps": 7,
              "momentum_cooldown_steps": 5}
    assert sorted(values) == sorted(shared)
    schedule = TrainConfig.from_dict({**values, "steps": 40, "muon_momentum": 0.9}).schedule_config()
    assert {name: getattr(schedule, name) for name in shared} == {**values, "lr_stage_multipliers": (1.0, 2.0)}
    assert (schedule.steps, schedule.momentum_start, schedule.momentum_end) == (40, 0.85, 0.9)
    assert ScheduleConfig.of(ScheduleSettings(), steps=10) == ScheduleConfig(steps=10)
    assert (ScheduleConfig(steps=10).cooldown_frac, ScheduleConfig(steps=10).momentum_warmup_steps) == (0.4, 300)


@pytest.mark.parametrize("settings,match", [
    ({"lr_stage_multipliers": [1.0, -1.52]}, r"train.lr_stage_multipliers must be a finite number >= 0.0"),
    ({"lr_stage_multipliers": [1.0, "1.5"]}, r"train.lr_stage_multipliers must be a finite number >= 0.0, got .1.5. \(text, not a number"),
    ({"lr_stage_multipliers": 1.5}, "train.lr_stage_multipliers must be a list of numbers"),
    ({"momentum_cooldown_steps": -1}, "train.momentum_cooldown_steps must be an integer >= 0"),
    ({"momentum_cooldown_steps": 2.5}, "train.momentum_cooldown_steps must be an integer >= 0"),
])
def test_bad_schedule_settings_are_named(settings, match):
    with pytest.raises(SpeedrunError, match=match):
        TrainConfig.from_dict(settings)


def test_cuda_only_attention_backends_are_refused_on_a_cpu():
    with pytest.raises(SpeedrunError, match="attention_backend 'flex' trains on CUDA only"):
        TrainConfig.from_dict({"preset": "record28"})
    with pytest.raises(SpeedrunError, match="'varlen' trains on CUDA only"):
        TrainConfig.from_dict({"model": {"attention_backend": "varlen"}})
    assert TrainConfig.from_dict({"preset": "gpt124m", "device": "cuda"}).compute.device == "cuda"
    cpu = TrainConfig.from_dict({"preset": "gpt124m", "model": {"attention_backend": "sdpa_docs"}})
    assert cpu.model_config().attention_backend == "sdpa_docs"


@pytest.mark.parametrize("key, text, written", [("adam_eps", "1e-10", "1.0e-10"), ("muon_lr", "5e-2", "0.05"),
                                                ("steps", "1e3", "1000")])
def test_a_number_yaml_reads_as_text_is_named_with_the_way_to_write_it(key, text, written):
    """PyYAML (YAML 1.1) reads 1e-10 as a string; the error says so and how to write the number."""
    settings = yaml.safe_load(f"{key}: {text}")
    assert settings == {key: text}
    with pytest.raises(SpeedrunError, match=rf"train\.{key} .* YAML reads {text} as a string; write it as {written}"):
        TrainConfig.from_dict({"preset": "tiny", "steps": 2, "tokens_per_step": 64, **settings})
    assert yaml.safe_load(f"{key}: {written}")[key] == float(text)
    TrainConfig.from_dict({"preset": "tiny", "steps": 2, "tokens_per_step": 64, key: yaml.safe_load(written)})


def test_a_quoted_whole_number_is_to_be_written_as_an_integer():
    """`steps: "10"`: the hint said `write 10.0 without quotes`, which steps (an integer) refuses."""
    with pytest.raises(SpeedrunError, match=r"train\.steps .*\(text, not a number: write 10 without quotes\)"):
        TrainConfig.from_dict({"preset": "tiny", "steps": "10", "tokens_per_step": 64})
    TrainConfig.from_dict({"preset": "tiny", "steps": 10, "tokens_per_step": 64})


def test_a_schema_error_is_one_line_naming_the_files_the_key_and_the_way_to_write_a_number():
    """workflow/rules/common.smk turns a config that fails the JSON schema into this line."""
    schema = yaml.safe_load((Path(__file__).resolve().parents[1] / "workflow/schemas/config.schema.yaml")
                            .read_text())
    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "config.yaml").read_text())
    cases = [({"stats": {**config["stats"], "target": "4.6e0"}},
              "a.yaml: stats.target: '4.6e0' is not of type 'number' (text, not a number: YAML reads 4.6e0 as "
              "a string; write it as 4.6)"),
             ({"train": {**config["train"], "preset": "gpt2"}},
              "a.yaml: train.preset: 'gpt2' is not one of ['tiny', 'gpt124m', 'record28', 'record88', "
              "'record89', 'record83', 'record87', 'record12', 'record31']"),
             ({"zoom": 1}, "a.yaml: (the top level): Additional properties are not allowed ('zoom' was unexpected); "
                           f"expected one of {', '.join(schema['properties'])}"),
             ({"statz": {}}, "a.yaml: (the top level): Additional properties are not allowed ('statz' was "
                             f"unexpected) (did you mean 'stats'?); expected one of {', '.join(schema['properties'])}")]
    for change, message in cases:
        with pytest.raises(jsonschema.ValidationError) as caught:
            jsonschema.validate({**config, **change}, schema)
        assert schema_error_message("a.yaml", caught.value) == message
        try:                                        # as snakemake.utils.validate raises it
            try:
                raise caught.value
            except jsonschema.ValidationError:
                raise RuntimeError("Error validating config file.")
        except RuntimeError as wrapped:
            assert schema_error_message("a.yaml", wrapped) == message
    assert schema_error_message("a.yaml", ValueError("other")) == "a.yaml: other"


def test_model_numbers_yaml_reads_as_text_get_the_same_hint():
    with pytest.raises(SpeedrunError, match=r"model\.value_embed_std .* YAML reads 1e-2 as a string; write it as 0\.01"):
        TrainConfig.from_dict({"preset": "tiny", "steps": 2, "tokens_per_step": 64,
                               "model": yaml.safe_load("value_embed_std: 1e-2")})


# ---- dtype auto --------------------------------------------------------------------------------------------


def test_dtype_auto_is_float32_on_a_cpu_and_bfloat16_on_cuda():
    """The default ``auto`` resolves by the device's type (a pure function: no GPU needed for a cuda device
    object); an explicit dtype is kept on either device; the resolved config is what the log header shows."""
    cfg = TrainConfig.from_dict(QUICK)
    assert cfg.compute.dtype == "auto"
    assert cfg.resolved_for(torch.device("cpu")).compute.dtype == "float32"
    assert cfg.resolved_for(torch.device("cuda", 1)).compute.dtype == "bfloat16"
    assert [resolve_dtype("auto", t) for t in ("cpu", "cuda")] == ["float32", "bfloat16"]
    for dtype in ("float32", "bfloat16"):
        explicit = TrainConfig.from_dict({**QUICK, "dtype": dtype})
        devices = (torch.device("cpu"), torch.device("cuda", 0))
        assert {explicit.resolved_for(d).compute.dtype for d in devices} == {dtype}
    assert json.loads(cfg.resolved_for("cpu").to_json())["dtype"] == "float32"
    with pytest.raises(SpeedrunError, match="train.dtype must be one of auto, float32, bfloat16; got 'fp16'"):
        TrainConfig.from_dict({**QUICK, "dtype": "fp16"})


# ---- settings that would never take effect --------------------------------------------------------------


def test_a_smoke_run_of_fewer_steps_than_window_stages_or_untie_step_is_accepted():
    """A few steps of a full config (a smoke run, a compile benchmark) skip the later window stages and never
    untie: accepted, unlike a batch_schedule stage without a step (the log's tokens_per_step is the last
    stage's)."""
    stages = [[1, 1], [1, 2], [2, 2], [2, 3]]
    short = TrainConfig.from_dict({**WINDOWED, "steps": 3, "window_schedule": stages, "untie_step": 3})
    assert short.steps == 3 and len(short.schedule.window_schedule) == 4 and short.schedule.untie_step == 3


def test_a_window_schedule_stage_with_short_longer_than_long_is_refused():
    TrainConfig.from_dict({**WINDOWED, "window_schedule": [[1, 2], [2, 2]]})          # short == long is fine
    with pytest.raises(SpeedrunError, match=r"^train\.window_schedule stage 2 of 2 is \[3, 2\]: its short "
                                            r"window is longer than its long one"):
        TrainConfig.from_dict({**WINDOWED, "window_schedule": [[1, 2], [3, 2]]})


def test_a_final_long_window_below_the_short_window_is_refused():
    """The final validation's short window is the last step's window_schedule stage (6 steps in 3 stages:
    stage 3, [3, 4]) or, without a schedule, the model's window_short_blocks; a final long window equal to it
    is fine, one block less is refused with the key and both values."""
    stages = [[1, 2], [2, 3], [3, 4]]
    cfg = TrainConfig.from_dict({**WINDOWED, "window_schedule": stages, "final_window_long_blocks": 3})
    assert cfg.window_blocks_at(cfg.steps) == (3, 3)
    with pytest.raises(SpeedrunError, match=r"^train\.final_window_long_blocks 2 is below the short window of 3 "
                                            r"blocks at the final validation \(train\.window_schedule stage 3 of "
                                            r"3, \[3, 4\], the stage of the last step\); expected a long window "
                                            r">= the short one$"):
        TrainConfig.from_dict({**WINDOWED, "window_schedule": stages, "final_window_long_blocks": 2})
    model = {**WINDOWED["model"], "window_short_blocks": 2, "window_long_blocks": 3}
    assert TrainConfig.from_dict({**WINDOWED, "model": model, "final_window_long_blocks": 2}
                                 ).window_blocks_at(QUICK["steps"]) == (2, 2)
    with pytest.raises(SpeedrunError, match=r"^train\.final_window_long_blocks 1 is below the short window of 2 "
                                            r"blocks at the final validation \(model\.window_short_blocks 2\); "):
        TrainConfig.from_dict({**WINDOWED, "model": model, "final_window_long_blocks": 1})


def test_a_model_short_window_longer_than_the_long_one_is_refused():
    model = {**WINDOWED["model"], "window_short_blocks": 3, "window_long_blocks": 3}
    assert TrainConfig.from_dict({**WINDOWED, "model": model}).model_config().window_short_blocks == 3
    with pytest.raises(SpeedrunError, match=r"^model\.window_short_blocks 4 is longer than "
                                            r"model\.window_long_blocks 3; expected short <= long$"):
        TrainConfig.from_dict({**WINDOWED, "model": {**model, "window_short_blocks": 4}})


# ---- messages ----------------------------------------------------------------------------------------------


def test_an_unknown_preset_names_the_key_preset():
    with pytest.raises(SpeedrunError, match=r"^train\.preset must be one of tiny, gpt124m, record28, record88, "
                                            r"record89, record83, record87, record12, record31; got 'tinny'$"):
        TrainConfig.from_dict({"preset": "tinny"})


@pytest.mark.parametrize("settings, key, value", [
    ({"model": {"window_pattern": "SLSL"}, "window_schedule": [[1, 2, 3]]}, "window_schedule", "[[1, 2, 3]]"),
    ({"batch_schedule": [[256]]}, "batch_schedule", "[[256]]"),
    ({"adam_betas": [0.9]}, "adam_betas", "[0.9]"),
])
def test_list_settings_are_quoted_as_written_not_as_python_tuples(settings, key, value):
    """from_dict turns the lists into tuples; the message shows the JSON list the user wrote."""
    with pytest.raises(SpeedrunError) as caught:
        TrainConfig.from_dict(settings)
    assert str(caught.value).startswith(f"train.{key} must be ") and str(caught.value).endswith(f", got {value}")


def test_the_schema_and_the_dataclasses_list_the_same_training_settings():
    """One source of defaults: TrainConfig's sections default every setting; the workflow's schema documents
    and checks the same keys (plus `nodes`, which places the processes), each with a description, none with a
    default of its own."""
    import yaml

    from speedrun.training.config import SECTIONS

    schema = yaml.safe_load((Path(__file__).resolve().parents[1] / "workflow" / "schemas" /
                             "config.schema.yaml").read_text())
    documented = schema["properties"]["train"]["properties"]
    assert sorted(documented) == sorted([*TrainConfig.setting_names(), "nodes"])
    assert [key for key, entry in documented.items() if "default" in entry] == []
    assert [key for key, entry in documented.items() if not entry.get("description")] == []
    sections = [f.name for f in dataclasses.fields(TrainConfig) if f.name in SECTIONS]
    assert sections == ["optimizer", "schedule", "evaluation", "compute"]
    flat = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in SECTIONS]
    flat += [g.name for s in sections for g in dataclasses.fields(SECTIONS[s]) if g.name != "langevin_seed"]
    assert sorted(flat) == sorted(TrainConfig.setting_names())            # no name in two places


def test_every_field_of_the_settings_has_its_own_docstring():
    """Each field of TrainConfig and of its sections is followed by its docstring where it is declared: in
    the class, or in the dataclass it extends (ScheduleSettings the optimizers' LrMomentumSchedule)."""
    import ast
    import inspect

    from speedrun.training.config import SECTIONS

    for cls in [TrainConfig, *SECTIONS.values()]:
        declared = []
        for owner in [c for c in reversed(cls.__mro__) if dataclasses.is_dataclass(c)]:
            body = ast.parse(inspect.getsource(owner)).body[0].body
            fields = [node.target.id for node in body if isinstance(node, ast.AnnAssign)]
            documented = [node.target.id for node, after in zip(body, body[1:]) if isinstance(node, ast.AnnAssign)
                          and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                          and isinstance(after.value.value, str)]
            assert fields == documented, owner.__name__
            declared += fields
        assert declared == [f.name for f in dataclasses.fields(cls)], cls.__name__


def test_the_flat_settings_round_trip_through_the_sections():
    settings = {"muon_lr": 0.03, "val_every": 5, "compile_mode": "reduce-overhead", "cooldown_frac": 0.5,
                "steps": 30}
    cfg = TrainConfig.from_dict(settings)
    assert (cfg.optimizer.muon_lr, cfg.evaluation.val_every, cfg.compute.compile_mode, cfg.schedule.cooldown_frac,
            cfg.steps) == (0.03, 5, "reduce-overhead", 0.5, 30)
    assert {k: cfg.settings()[k] for k in settings} == settings
    assert TrainConfig.from_dict(cfg.settings()) == cfg
    assert TrainConfig.setting_names()["muon_lr"] == "optimizer" and TrainConfig.setting_names()["steps"] is None
