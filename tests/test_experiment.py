"""`speedrun.workflow.planning.resolve_experiment`: the experiment config.yaml describes, each variant's settings
merged, validated and resolved once, its processes placed and the runs ordered, as plain unit tests (the
Snakefile only prints what it raises)."""

from __future__ import annotations

import json

import pytest

import speedrun.workflow.planning as planning
from speedrun.errors import SpeedrunError
from speedrun.training.config import TrainConfig
from speedrun.workflow.planning import SHARED_TRAIN, Placement, resolve_experiment

TRAIN = {"preset": "tiny", "steps": 60, "tokens_per_step": 4096, "micro_batches": 4, "max_seq_len": 1024,
         "val_tokens": 32768, "val_batch_tokens": 1024, "val_every": 20, "world_size": 1, "device": "cpu",
         "head_lr": 0.03}


def config(variants=None, train=None, baseline="baseline"):
    """A config as Snakemake holds it after the schema (the default experiment unless told)."""
    return {"data": {"source": "embedded", "name": "shakespeare"}, "train": dict(TRAIN if train is None else train),
            "variants": variants or {"baseline": {"seeds": [0, 1, 2], "train": {}},
                                     "candidate": {"seeds": [0, 1, 2], "train": {"muon_lr": 0.04}}},
            "stats": {"baseline": baseline}}


def test_the_default_experiment_resolves_each_variant():
    experiment = resolve_experiment(config())
    assert experiment.names == ("baseline", "candidate")
    assert (experiment.baseline, experiment.candidates, experiment.dataset) == ("baseline", ("candidate",),
                                                                              "shakespeare")
    assert experiment.corpus_fixed
    candidate = experiment.variant("candidate")
    assert candidate.seeds == (0, 1, 2)
    assert candidate.train.optimizer.muon_lr == 0.04 and candidate.train.optimizer.head_lr == 0.03
    assert candidate.train.compute.dtype == "float32"                              # `auto` on a CPU
    params = json.loads(candidate.params)
    assert (params["muon_lr"], params["dtype"], params["model"]) == (0.04, "float32", {})
    assert "nodes" not in params and "steps" not in params                   # steps 60 is TrainConfig's default
    baseline = json.loads(experiment.variant("baseline").params)
    assert "muon_lr" not in baseline and baseline["preset"] == "tiny"           # muon_lr 0.05 is the default too
    assert TrainConfig.from_dict(baseline).optimizer.muon_lr == 0.05


def test_a_default_written_out_gives_the_same_params():
    plain = resolve_experiment(config())
    written = resolve_experiment(config(train={**TRAIN, "dtype": "auto", "muon_lr": 0.05, "nodes": 1,
                                               "model": {"n_layer": 4}}))
    assert written.variant("baseline").params == plain.variant("baseline").params


def test_runs_start_seed_by_seed_the_variants_alternating_baseline_first():
    experiment = resolve_experiment(config({"candidate": {"seeds": [7, 8], "train": {"muon_lr": 0.04}},
                                            "baseline": {"seeds": [0, 1, 2]}}))
    assert experiment.runs == [("candidate", 7), ("candidate", 8), ("baseline", 0), ("baseline", 1), ("baseline", 2)]
    assert experiment.run_order == [("baseline", 0), ("candidate", 7), ("baseline", 1), ("candidate", 8),
                                    ("baseline", 2)]
    assert [experiment.priority(*run) for run in experiment.run_order] == [5, 4, 3, 2, 1]


@pytest.mark.parametrize("train, placed", [
    ({"world_size": 1, "device": "cpu"}, (1, 0, None, None, None, None)),
    ({"world_size": 8, "micro_batches": 8, "device": "cuda"}, (8, 8, None, None, None, None)),
    ({"world_size": 16, "micro_batches": 16, "val_batch_tokens": 512, "device": "cuda", "nodes": 2},
     (8, 0, "gpu:8", "srun", 2, 0)),
    ({"world_size": 4, "device": "cpu", "nodes": 2}, (2, 0, None, "srun", 2, None)),
])
def test_placement_gives_the_scheduler_its_resources(train, placed):
    placement = resolve_experiment(config(train={**TRAIN, **train})).variant("baseline").placement
    assert (placement.procs_per_node, placement.gpus, placement.gres, placement.mpi, placement.tasks,
            placement.tasks_per_gpu) == placed
    assert Placement(world_size=train["world_size"], nodes=train.get("nodes", 1), device=train["device"]) == placement


@pytest.mark.parametrize("cfg, message", [
    (config(baseline="nope"), "config.yaml: stats.baseline is 'nope', which is not a variant; expected one of the "
                              "keys of `variants`: baseline, candidate"),
    (config({"baseline": {"seeds": [0]}, "compare": {"seeds": [0], "train": {"muon_lr": 0.04}}}),
     "config.yaml: variants.compare: 'compare' is reserved (results/stats/compare/ holds the comparisons); choose "
     "another variant name"),
    (config({"baseline": {"seeds": [1.0]}}), "config.yaml: variants.baseline.seeds: 1.0 is not an integer; write 1"),
    (config({"baseline": {"seeds": [0]}, "b": {"seeds": [0], "train": {"muon_rl": 0.04}}}),
     "config.yaml: variants.b.train.muon_rl: unknown training setting (did you mean 'muon_lr'?); expected one "
     "of adam_betas, "),
    (config(train={**TRAIN, "stesp": 60}),
     "config.yaml: train.stesp: unknown training setting (did you mean 'steps'?); expected one of adam_betas, "),
    (config({"baseline": {"seeds": [0]}, "b": {"seeds": [0], "train": {"model": {"n_layr": 2}}}}),
     "config.yaml: variants.b.train.model.n_layr: unknown model setting (did you mean 'n_layer'?); expected a "
     "field of GPTConfig (speedrun.model.config): vocab_size, n_layer, "),
    (config(train={**TRAIN, "model": {"zzz": 1}}),
     "config.yaml: train.model.zzz: unknown model setting; expected a field of GPTConfig"),
    (config(train={**TRAIN, "steps": 10.0}), f"config.yaml: {SHARED_TRAIN}: train.steps must be an integer >= 1, "
                                             "got 10.0"),
    (config({"baseline": {"seeds": [0]}, "b": {"seeds": [0], "train": {"steps": 0}}}),
     "config.yaml: variant 'b': train.steps must be an integer >= 1, got 0"),
    (config({"baseline": {"seeds": [0]}, "b": {"seeds": [0], "train": {"world_size": 4, "nodes": 3}}}),
     "config.yaml: variant 'b': train.world_size 4 is not a multiple of train.nodes 3; expected world_size = "
     "nodes x processes per node (every node runs the same number)"),
    (config(train={**TRAIN, "nodes": 0}), f"config.yaml: {SHARED_TRAIN}: train.nodes must be an integer >= 1, got 0"),
    (config({"baseline": {"seeds": [0]}, "b": {"seeds": [0], "train": {"muon_lr": 0.05}}}),
     'config.yaml: variants b and baseline resolve to the same train settings: variants.b.train {"muon_lr": 0.05} '
     "changes nothing (each value is that of `train` or TrainConfig's default); a candidate must differ from the "
     "baseline"),
])
def test_a_refused_config_is_one_line_naming_the_key(cfg, message):
    with pytest.raises(SpeedrunError) as refused:
        resolve_experiment(cfg)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


def test_messages_name_the_config_files_given():
    with pytest.raises(SpeedrunError, match=r"^config.yaml \+ --config: stats.baseline"):
        resolve_experiment(config(baseline="nope"), "config.yaml + --config")


def test_an_unknown_variant_or_seed_is_named():
    experiment = resolve_experiment(config())
    with pytest.raises(SpeedrunError, match=r"^unknown variant 'x': config.yaml `variants` has baseline, candidate$"):
        experiment.variant("x")
    with pytest.raises(SpeedrunError, match=r"seed 5 is not a seed of variant 'baseline' in config.yaml \(its seeds: "
                                            r"\[0, 1, 2\]\)"):
        experiment.check_seed("baseline", 5)
    experiment.check_seed("baseline", 2)


def test_each_variants_settings_are_built_once(monkeypatch):
    """4 variants x 10 seeds of the FineWeb config: one TrainConfig per variant (it was 1 + 4V while the rules
    parsed, and more per job)."""
    built = []
    original = TrainConfig.__post_init__

    def counting(self):
        built.append(self.optimizer.muon_lr)
        original(self)

    monkeypatch.setattr(TrainConfig, "__post_init__", counting)
    lrs = {"baseline": {}, "lr040": {"muon_lr": 0.04}, "lr045": {"muon_lr": 0.045}, "lr055": {"muon_lr": 0.055}}
    fineweb = {**TRAIN, "preset": "gpt124m", "device": "cuda", "world_size": 8, "micro_batches": 8,
               "val_batch_tokens": 4096, "tokens_per_step": 393216, "max_seq_len": 2048, "steps": 1600}
    experiment = resolve_experiment(config({name: {"seeds": list(range(10)), "train": train}
                                            for name, train in lrs.items()}, train=fineweb))
    assert sorted(built) == [0.04, 0.045, 0.05, 0.055]
    assert len(experiment.run_order) == 40
    for run in experiment.run_order:
        experiment.priority(*run)
        experiment.variant(run[0]).placement.gpus
    assert len(built) == 4


def test_the_data_check_runs_once_per_data_shape(monkeypatch):
    checked = []
    monkeypatch.setattr(planning, "check_training_data", lambda settings, shards, bos, what, corpus_fixed:
                        checked.append((settings["steps"], what, corpus_fixed)))
    experiment = resolve_experiment(config({"baseline": {"seeds": [0, 1]},
                                            "b": {"seeds": [0], "train": {"muon_lr": 0.04}},
                                            "c": {"seeds": [0], "train": {"steps": 30}}}))
    for variant, _ in experiment.run_order:
        experiment.check_data(variant, "shards", "bos")
    assert checked == [(60, f"config.yaml: {SHARED_TRAIN}", True), (30, "config.yaml: variant 'c'", True)]
