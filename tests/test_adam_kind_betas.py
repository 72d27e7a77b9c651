"""``adam_kind_betas``: Adam's (β1, β2) per parameter kind, as the current record's per-parameter table has
them (speedrun-spec.md 3.3: lm_head and embedding 0.5, 0.95; value and bigram tables 0.75, 0.95; scalars
0.9, 0.99). The TrainConfig round trip and its errors, the betas of each Adam group of a small model, two
Adam steps (torch's AdamW and CautiousAdam) against a float64 Adam written here, the empty default, and the
workflow schema's entry."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest
import torch
import yaml

from speedrun.errors import SpeedrunError
from speedrun.model.config import build_model_config
from speedrun.model.gpt import GPT
from speedrun.optim.adam import CautiousAdam
from speedrun.optim.config import ALL_ADAM_KINDS, RECORD_ADAM_KINDS
from speedrun.optim.groups import ADAM_KINDS, OptimConfig, adam_group, build_optimizers
from speedrun.training.config import TrainConfig
from speedrun.workflow.planning import schema_error_message

ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64
RECORD = {"head": (0.5, 0.95), "embed": (0.75, 0.95), "scalar": (0.9, 0.99)}
# a small model with every Adam kind: value and bigram tables (embed), gates, value lambdas and smear (scalar)
MODEL = {"n_layer": 2, "vocab_size": 64, "attention_gate_layers": (0, 1), "value_embed_layers": (0, 1),
         "value_embed_tables": 1, "bigram_vocab_size": 32, "smear": True, "value_lambdas": True}


def small_gpt(tie: bool = False) -> GPT:
    """The model above in float64 with every parameter drawn from N(0, 1) (so that cautious decay's mask is
    neither all on nor all off)."""
    torch.manual_seed(0)
    model = GPT(build_model_config("tiny", {**MODEL, "tie_embed_head": tie})).to(F64)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=F64))
    return model


def names_of(model, params) -> set[str]:
    return {n for n, p in model.named_parameters() if any(p is q for q in params)}


def adam_groups(model, config: OptimConfig) -> tuple[torch.optim.Optimizer, dict[str, dict]]:
    adam = build_optimizers(model, model.parameter_kinds(), config).optimizers[0]
    return adam, {g["kind"]: g for g in adam.param_groups}


# ---- TrainConfig ---------------------------------------------------------------------------------------


def test_the_setting_travels_from_yaml_to_the_optim_config_and_back_through_json():
    settings = yaml.safe_load("adam_kind_betas: {head: [0.5, 0.95], embed: [0.75, 0.95], scalar: [0.9, 0.99]}")
    cfg = TrainConfig.from_dict({"model": {"n_layer": 2}, "adam_betas": [0.8, 0.9], **settings})
    assert cfg.optimizer.adam_kind_betas == RECORD and cfg.optimizer.adam_betas == (0.8, 0.9)
    assert all(type(pair) is tuple for pair in cfg.optimizer.adam_kind_betas.values())
    optim = cfg.optimizer
    assert optim.adam_kind_betas == RECORD and optim.adam_betas == (0.8, 0.9)
    written = json.loads(cfg.to_json())["adam_kind_betas"]
    assert written == {"head": [0.5, 0.95], "embed": [0.75, 0.95], "scalar": [0.9, 0.99]}
    again = TrainConfig.from_dict({"model": {"n_layer": 2}, "adam_betas": [0.8, 0.9], "adam_kind_betas": written})
    assert again == cfg
    partial = TrainConfig.from_dict({"adam_kind_betas": {"scalar": [0.9, 0.99]}}).optimizer
    assert partial.adam_kind_betas == {"scalar": (0.9, 0.99)}


def test_the_default_is_an_empty_mapping():
    assert TrainConfig().optimizer.adam_kind_betas == {} and OptimConfig().adam_kind_betas == {}
    assert TrainConfig.from_dict({}).optimizer.adam_kind_betas == {}
    assert json.loads(TrainConfig().to_json())["adam_kind_betas"] == {}


@pytest.mark.parametrize("value, message", [
    ([0.5, 0.95], r"train\.adam_kind_betas must be a mapping from Adam kind \(embed, head, scalar, gate, smear_gate, lambda, resid_lambda, skip_gate, mudd, mudd_bias, mudd_gate, mudd_gate_bias\) to a pair "
                  r"\[beta1, beta2\], got \[0\.5, 0\.95\]$"),
    ({"heads": [0.5, 0.95]}, r"train\.adam_kind_betas has an unknown Adam kind 'heads'; expected one of "
                             r"embed, head, scalar, gate, smear_gate, lambda, resid_lambda, skip_gate, mudd, mudd_bias, mudd_gate, mudd_gate_bias$"),
    ({"matrix": [0.9, 0.95]}, r"unknown Adam kind 'matrix'; expected one of embed, head, scalar, gate, smear_gate, lambda, resid_lambda, skip_gate, mudd, mudd_bias, mudd_gate, mudd_gate_bias$"),
    ({"head": [0.5]}, r"train\.adam_kind_betas\.head must be a pair \[beta1, beta2\], got \[0\.5\]$"),
    ({"scalar": [0.9, 0.95, 0.99]}, r"train\.adam_kind_betas\.scalar must be a pair \[beta1, beta2\], "
                                    r"got \[0\.9, 0\.95, 0\.99\]$"),
    ({"head": 0.5}, r"train\.adam_kind_betas\.head must be a pair \[beta1, beta2\], got 0\.5$"),
    ({"embed": [0.75, 1.0]}, r"train\.adam_kind_betas\.embed must be a number in \[0\.0, 1\.0\), got 1\.0$"),
    ({"scalar": [-0.1, 0.99]}, r"train\.adam_kind_betas\.scalar must be a number in \[0\.0, 1\.0\), got -0\.1$"),
    ({"scalar": [0.9, float("nan")]}, r"train\.adam_kind_betas\.scalar must be a number in \[0\.0, 1\.0\), got nan"),
    ({"head": [True, 0.95]}, r"train\.adam_kind_betas\.head must be a number in \[0\.0, 1\.0\), got True"),
    ({"head": ["5e-1", 0.95]}, r"train\.adam_kind_betas\.head must be a number .* got '5e-1' .* YAML reads 5e-1 "
                               r"as a string; write it as 0\.5"),
])
def test_a_wrong_value_names_the_setting_the_kind_and_the_value(value, message):
    with pytest.raises(SpeedrunError, match=message):
        TrainConfig.from_dict({"adam_kind_betas": value})


def test_a_pair_given_directly_must_be_a_tuple_as_adam_betas():
    """Only from_dict turns YAML's lists into tuples; a list given to the constructor is refused, not kept."""
    with pytest.raises(SpeedrunError, match=r"adam_kind_betas\.head must be a pair \[beta1, beta2\], got \[0\.5"):
        TrainConfig(optimizer=OptimConfig(adam_kind_betas={"head": [0.5, 0.95]}))
    paired = TrainConfig(optimizer=OptimConfig(adam_kind_betas={"head": (0.5, 0.95)}))
    assert paired.optimizer.adam_kind_betas == {"head": (0.5, 0.95)}


# ---- the optimizer groups ------------------------------------------------------------------------------


@pytest.mark.parametrize("cautious", [False, True])
@pytest.mark.parametrize("tie", [False, True])
def test_each_adam_group_gets_its_kinds_betas(tie, cautious):
    model = small_gpt(tie)
    config = OptimConfig(adam_betas=(0.8, 0.95), adam_kind_betas=RECORD, cautious_weight_decay=cautious)
    adam, groups = adam_groups(model, config)
    assert isinstance(adam, CautiousAdam) == cautious and list(groups) == list(ADAM_KINDS)
    assert {kind: g["betas"] for kind, g in groups.items()} == RECORD
    tables = {"value_embeds.tables.0.weight", "bigram.table"}
    assert names_of(model, groups["embed"]["params"]) == (tables if tie else tables | {"embed.weight"})
    assert names_of(model, groups["head"]["params"]) == ({"lm_head.weight", "embed.weight"} if tie
                                                         else {"lm_head.weight"})
    assert {"blocks.0.attn.gate.weight", "smear.gate", "bigram.gates"} <= names_of(model, groups["scalar"]["params"])


@pytest.mark.parametrize("given", [{}, {"head": (0.5, 0.95)}])
def test_without_an_override_a_group_keeps_adam_betas(given):
    model = small_gpt()
    _, groups = adam_groups(model, OptimConfig(adam_betas=(0.85, 0.97), adam_kind_betas=given))
    expected = {kind: given.get(kind, (0.85, 0.97)) for kind in ADAM_KINDS}
    assert {kind: g["betas"] for kind, g in groups.items()} == expected
    _, defaults = adam_groups(model, OptimConfig())
    assert [g["betas"] for g in defaults.values()] == [(0.8, 0.95)] * 3


def reference_adam(p0, grads, lr, betas, eps, wd, cautious):
    """p after len(grads) Adam steps in float64 from zero moments, typed in from the formulas. AdamW
    (torch.optim.AdamW): p <- p·(1 - lr·wd) - lr·m̂/(sqrt(v̂) + eps), m̂ = m/(1-β1^t), v̂ = v/(1-β2^t).
    Cautious (record #50, speedrun-spec.md 3.3): u = m/(sqrt(v) + eps); p <- p - lr²·wd·p·[u·p > 0]
    - lr·sqrt(1-β2^t)/(1-β1^t)·u."""
    b1, b2 = betas
    p, m, v = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        if cautious:
            u = m / (v.sqrt() + eps)
            p = p - lr * lr * wd * p * (u * p > 0) - lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t) * u
        else:
            p = p * (1 - lr * wd) - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
    return p


@pytest.mark.parametrize("cautious", [False, True])
def test_two_adam_steps_follow_adam_with_each_groups_betas(cautious):
    """The first step of Adam does not depend on the betas (m̂ = g, v̂ = g²): the second one does."""
    model = small_gpt()
    wd, eps = 0.3, 1e-8
    config = OptimConfig(adam_betas=(0.8, 0.95), adam_kind_betas=RECORD, adam_eps=eps, adam_weight_decay=wd,
                         cautious_weight_decay=cautious)
    adam, groups = adam_groups(model, config)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(7)
    grads = [{n: torch.randn(p.shape, generator=g, dtype=F64) for n, p in model.named_parameters()}
             for _ in range(2)]
    for step in grads:
        for n, p in model.named_parameters():
            p.grad = step[n].clone()
        adam.step()
    tol = dict(rtol=1e-6, atol=1e-6) if cautious else dict(rtol=1e-12, atol=1e-12)   # CautiousAdam: fp32 state
    for kind, group in groups.items():
        for name in names_of(model, group["params"]):
            p = dict(model.named_parameters())[name]
            history = [step[name] for step in grads]
            expected = reference_adam(start[name], history, group["lr"], RECORD[kind], eps, wd, cautious)
            torch.testing.assert_close(p.detach(), expected, **tol)
            plain = reference_adam(start[name], history, group["lr"], (0.8, 0.95), eps, wd, cautious)
            assert (expected - plain).abs().max() > 1e-3 * group["lr"], (kind, name)   # the betas mattered


# ---- the workflow schema -------------------------------------------------------------------------------


def test_the_schema_entry_checks_kinds_and_pairs_and_adds_no_default():
    """No default: snakemake fills defaults into `train`, whose JSON is the train rule's params, so a default
    would rerun every existing run."""
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    entry = schema["properties"]["train"]["properties"]["adam_kind_betas"]
    assert tuple(entry["propertyNames"]["enum"]) == ALL_ADAM_KINDS and "default" not in entry
    lrs = schema["properties"]["train"]["properties"]["adam_kind_lrs"]
    assert tuple(lrs["propertyNames"]["enum"]) == tuple(RECORD_ADAM_KINDS) and "default" not in lrs
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    ok = {**config, "train": {**config["train"], "adam_kind_betas": {k: list(v) for k, v in RECORD.items()}}}
    jsonschema.validate(ok, schema)
    cases = [({"heads": [0.5, 0.95]}, "a.yaml: train.adam_kind_betas: 'heads' is not one of "
                                      "['embed', 'head', 'scalar', 'gate', 'smear_gate', 'lambda', "
                                      "'resid_lambda', 'skip_gate', 'mudd', 'mudd_bias', 'mudd_gate', "
                                      "'mudd_gate_bias']"),
             ({"head": [0.5, 1.0]}, "a.yaml: train.adam_kind_betas.head.1: 1.0 is greater than or equal to the "
                                    "maximum of 1"),
             ({"head": [0.5]}, "a.yaml: train.adam_kind_betas.head: [0.5] is too short")]
    for value, message in cases:
        bad = {**config, "train": {**config["train"], "adam_kind_betas": value}}
        with pytest.raises(jsonschema.ValidationError) as caught:
            jsonschema.validate(bad, schema)
        assert schema_error_message("a.yaml", caught.value) == message


@pytest.mark.parametrize("value, message", [
    ({"embed": 0.1}, r"train\.adam_kind_lrs has an unknown Adam kind 'embed'; expected one of gate, smear_gate, "
                     r"lambda, resid_lambda, skip_gate, mudd, mudd_bias, mudd_gate, mudd_gate_bias \(embed, head "
                     r"and scalar take embed_lr, head_lr and scalar_lr\)$"),
    ({"mudd": -0.1}, r"train\.adam_kind_lrs\.mudd must be a finite number >= 0\.0, got -0\.1$"),
    ([0.1], r"train\.adam_kind_lrs must be a mapping from Adam kind \(gate, .*\) to a learning rate, got \[0\.1\]$"),
])
def test_a_wrong_adam_kind_lr_names_the_setting_the_kind_and_the_value(value, message):
    with pytest.raises(SpeedrunError, match=message):
        TrainConfig.from_dict({"adam_kind_lrs": value})


def test_an_adam_kind_lr_sets_that_kinds_group_lr():
    """adam_kind_lrs overrides the records' table (MUDD's 0.002 there) for its kind's group only."""
    config = TrainConfig.from_dict({"preset": "record88", "adam_kind_lrs": {"mudd": 0.003}})
    assert config.optimizer.adam_kind_lrs == {"mudd": 0.003}
    assert adam_group("mudd", [], config.optimizer)["lr"] == 0.003
    assert adam_group("mudd_bias", [], config.optimizer)["lr"] == 0.002
