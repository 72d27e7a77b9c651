"""Parameter roles (speedrun.model.roles): the modules declare which of their parameters the optimizers and the
initialization treat apart (the MLP its fc and proj weights, the attention its q, k, v weights and its output
gate's), GPT.parameter_roles counts them against the config, and the optimizer groups and record #12's
re-initialized matrices follow the roles, not the parameters' names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from speedrun.model.block import CausalSelfAttention
from speedrun.model.config import PRESETS, build_model_config
from speedrun.model.gpt import GPT
from speedrun.model.init import init_torch_linear_inputs_
from speedrun.model.mlp import MLP
from speedrun.model.roles import PARAM_ROLES, check_role_layers, declared_roles
from speedrun.optim.groups import OptimConfig, build_optimizers, check_roles, muon_param_groups


def meta_gpt(preset: str, **overrides) -> GPT:
    with torch.device("meta"):
        return GPT(build_model_config(preset, overrides))


def small_gpt(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(build_model_config("tiny", {"n_layer": 3, "vocab_size": 64, **overrides}))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_declares_one_mlp_pair_per_mlp_and_one_gate_per_gated_attention(preset):
    model = meta_gpt(preset)
    roles = model.parameter_roles()
    params = dict(model.named_parameters())
    mlps = [b.mlp for b in model.blocks if b.mlp is not None]
    attns = [b.attn for b in model.blocks if b.attn is not None]
    gates = [a.gate for a in attns if a.gate is not None]
    assert sorted(roles) == sorted(PARAM_ROLES)
    assert [params[n] for n in roles["attention_qk"]] == [w for a in attns for w in (a.q.weight, a.k.weight)]
    assert [params[n] for n in roles["attention_value"]] == [a.v.weight for a in attns]
    assert [params[n] for n in roles["mlp_fc"]] == [m.fc.weight for m in mlps]
    assert [params[n] for n in roles["mlp_proj"]] == [m.proj.weight for m in mlps]
    assert [params[n] for n in roles["attention_gate"]] == [g.weight for g in gates]
    config = model.config
    assert len(mlps) == config.n_layer - len(config.mlp_free_layers)
    assert len(attns) == config.n_layer - len(config.attention_free_layers)
    assert len(gates) == (0 if config.mudd_gates else len(config.attention_gate_layers))


def test_the_roles_of_a_small_model_by_name():
    model = small_gpt(attention_gate_layers=(0, 2), mlp_free_layers=(1,))
    assert model.parameter_roles() == {
        "mlp_fc": ["blocks.0.mlp.fc.weight", "blocks.2.mlp.fc.weight"],
        "mlp_proj": ["blocks.0.mlp.proj.weight", "blocks.2.mlp.proj.weight"],
        "attention_gate": ["blocks.0.attn.gate.weight", "blocks.2.attn.gate.weight"],
        "attention_qk": [f"blocks.{i}.attn.{m}.weight" for i in (0, 1, 2) for m in "qk"],
        "attention_value": [f"blocks.{i}.attn.v.weight" for i in (0, 1, 2)]}
    model = small_gpt(attention_free_layers=(1,))
    assert model.parameter_roles()["attention_qk"] == [f"blocks.{i}.attn.{m}.weight" for i in (0, 2) for m in "qk"]
    assert model.parameter_roles()["attention_value"] == ["blocks.0.attn.v.weight", "blocks.2.attn.v.weight"]


def test_an_mlp_that_declares_nothing_is_counted_missing():
    model = small_gpt()
    model.blocks[1].mlp.own_parameter_roles = lambda: {}
    with pytest.raises(ValueError, match=r"role 'mlp_fc': the model config gives one on each of layers \[0, 1, 2\] "
                                         r"\(3\), the modules declare 2: missing on layers \[1\]"):
        model.parameter_roles()


def test_an_attention_that_declares_one_of_its_q_and_k_is_counted_missing():
    model = small_gpt()
    attn = model.blocks[2].attn
    attn.own_parameter_roles = lambda: {"attention_qk": [attn.q.weight], "attention_value": [attn.v.weight]}
    with pytest.raises(ValueError, match=r"role 'attention_qk': the model config gives 2 on each of layers "
                                         r"\[0, 1, 2\] \(6\), the modules declare 5: missing on layers \[2\]"):
        model.parameter_roles()


def test_a_role_declared_outside_the_blocks_or_twice_on_a_layer_is_counted_extra():
    model = small_gpt()
    model.extra = MLP(model.config)
    with pytest.raises(ValueError, match=r"role 'mlp_fc'.*declare 4: missing on layers \[\], extra on layers \[\], "
                                         r"outside the blocks \['extra.fc.weight'\]"):
        model.parameter_roles()
    del model.extra
    model.blocks[0].attn.second = MLP(model.config)
    with pytest.raises(ValueError, match=r"role 'mlp_fc'.*extra on layers \[0\]"):
        model.parameter_roles()


def test_check_role_layers_passes_the_counts_the_config_gives():
    check_role_layers({"mlp_fc": [0, 1]}, {"mlp_fc": [1, 0]}, {"mlp_fc": ["a", "b"]})
    with pytest.raises(ValueError, match=r"role 'attention_gate'.*missing on layers \[3\]"):
        check_role_layers({"attention_gate": [1]}, {"attention_gate": [1, 3]}, {"attention_gate": ["g1"]})
    check_role_layers({"attention_qk": [0, 0, 1, 1]}, {"attention_qk": [1, 0, 1, 0]}, {})
    with pytest.raises(ValueError, match=r"gives per layer \{0: 2, 1: 1\} \(3\), the modules declare 3: missing "
                                         r"on layers \[1\], extra on layers \[0\]"):
        check_role_layers({"mlp_fc": [0, 0, 0]}, {"mlp_fc": [0, 0, 1]}, {"mlp_fc": ["a", "b", "c"]})


class Holder(nn.Module):
    """A module with two weights, declaring roles as told."""

    def __init__(self, declare):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(2, 2))
        self.b = nn.Parameter(torch.zeros(2, 2))
        self.declare = declare

    def own_parameter_roles(self):
        return self.declare(self)


def test_bad_declarations_are_refused_naming_the_module():
    with pytest.raises(ValueError, match=r"Holder \(the model\) declares the unknown parameter role 'mlp_up'"):
        declared_roles(Holder(lambda m: {"mlp_up": [m.a]}))
    stranger = nn.Parameter(torch.zeros(1))
    with pytest.raises(ValueError, match=r"declares the role 'mlp_fc' for a parameter that is not its own"):
        declared_roles(Holder(lambda m: {"mlp_fc": [stranger]}))
    with pytest.raises(ValueError, match=r"parameter 'a' is declared twice, as 'mlp_fc' and 'mlp_proj'"):
        declared_roles(Holder(lambda m: {"mlp_fc": [m.a], "mlp_proj": [m.a]}))
    holder = Holder(lambda m: {"mlp_proj": [m.b, m.a]})
    roles = declared_roles(holder)
    assert sorted(roles) == sorted(PARAM_ROLES) and roles["mlp_fc"] == [] and roles["attention_gate"] == []
    assert [p is q for p, q in zip(roles["mlp_proj"], (holder.a, holder.b))] == [True, True]  # parameter order


def test_groups_follow_the_roles_not_the_names():
    """An MLP held under another attribute name (``ffn``) still gets its lr factors; a matrix named like an MLP
    weight but declared by no module does not."""

    class Renamed(nn.Module):
        def __init__(self):
            super().__init__()
            config = build_model_config("tiny", {"n_layer": 1, "vocab_size": 64})
            self.ffn = MLP(config)
            self.blocks = nn.ModuleDict({"mlp": nn.ModuleDict({"proj": nn.Linear(64, 64, bias=False)})})

        def parameter_roles(self):
            return {role: [n for n, p in self.named_parameters() if any(p is q for q in params)]
                    for role, params in declared_roles(self).items()}

    model = Renamed()
    kinds = {name: "matrix" for name, _ in model.named_parameters()}
    muon = build_optimizers(model, kinds, OptimConfig(muon_lr=0.02, mlp_fc_lr_mul=0.5, mlp_proj_lr_mul=4.0))
    groups = [(g["initial_lr"], g["params"]) for g in muon.optimizers[-1].param_groups]
    assert groups == [(0.02, [model.blocks.mlp.proj.weight]), (0.01, [model.ffn.fc.weight]),
                      (0.08, [model.ffn.proj.weight])]


def test_equal_factors_keep_two_groups():
    model = small_gpt()
    muon = build_optimizers(model, model.parameter_kinds(),
                            OptimConfig(muon_lr=0.02, mlp_fc_lr_mul=0.5, mlp_proj_lr_mul=0.5)).optimizers[-1]
    groups = [(g["initial_lr"], len(g["params"])) for g in muon.param_groups]
    assert groups == [(0.02, 12), (0.01, 3), (0.01, 3)]
    assert len({id(p) for g in muon.param_groups for p in g["params"]}) == 18


def test_given_roles_are_checked_and_used():
    model = small_gpt()
    kinds = model.parameter_kinds()
    with pytest.raises(ValueError, match=r"unknown roles \['mlp_up'\]"):
        build_optimizers(model, kinds, OptimConfig(), roles={"mlp_up": []})
    with pytest.raises(ValueError, match=r"names of no parameter \['blocks.9.mlp.fc.weight'\]"):
        check_roles(model, {"mlp_fc": ["blocks.9.mlp.fc.weight"]})
    with pytest.raises(ValueError, match=r"parameters in two roles \['blocks.0.mlp.fc.weight'\]"):
        check_roles(model, {"mlp_fc": ["blocks.0.mlp.fc.weight"], "mlp_proj": ["blocks.0.mlp.fc.weight"]})
    only = {"mlp_proj": ["blocks.1.mlp.proj.weight"]}
    muon = build_optimizers(model, kinds, OptimConfig(muon_lr=0.02, mlp_proj_lr_mul=4.0), roles=only).optimizers[-1]
    params = dict(model.named_parameters())
    assert [(g["initial_lr"], g["params"]) for g in muon.param_groups][1] == (0.08, [params[only["mlp_proj"][0]]])
    matrices = [p for n, p in model.named_parameters() if kinds[n] == "matrix"]
    with pytest.raises(ValueError, match=r"\['embed.weight'\] of role 'mlp_fc' are not Muon matrices"):
        muon_param_groups(model, matrices, OptimConfig(mlp_fc_lr_mul=0.5), {"mlp_fc": ["embed.weight"]})
    with pytest.raises(ValueError, match="muon_attention_gates is on but the model has no attention gate"):
        build_optimizers(model, kinds, OptimConfig(muon_attention_gates=True))


def test_a_model_without_roles_takes_no_factor_group():
    model = nn.Sequential(nn.Linear(4, 4, bias=False))
    muon = build_optimizers(model, {"0.weight": "matrix"}, OptimConfig(mlp_fc_lr_mul=0.5)).optimizers[-1]
    assert [g["initial_lr"] for g in muon.param_groups] == [0.05]


def test_record12_draws_the_declared_inputs_in_parameter_order():
    """``linear_init: torch`` draws again exactly the parameters of roles ``attention_qk``, ``attention_value``
    and ``mlp_fc`` (here with an attention under another name too: it declares nothing the init would find by
    name), in the order of the model's parameters whatever the order given (tests/test_init_digests.py: bit for
    bit as the names chose them)."""
    config = build_model_config("record12", {"n_layer": 2, "model_dim": 64, "n_head": 2, "head_dim": 32,
                                             "vocab_size": 64, "window_pattern": "LL"})
    torch.manual_seed(0)
    model = GPT(config)
    roles = model.role_parameters()
    chosen = roles["attention_qk"] + roles["attention_value"] + roles["mlp_fc"]
    assert len(chosen) == 2 * 4
    assert all(p.abs().max() <= 64 ** -0.5 and p.abs().max() > 0.9 * 64 ** -0.5 for p in chosen[:6])
    assert all(m.proj.weight.count_nonzero() == 0 for m in (model.blocks[0].mlp, model.blocks[1].mlp))
    before = {name: p.clone() for name, p in model.named_parameters()}
    torch.manual_seed(7)
    init_torch_linear_inputs_(model, chosen)
    drawn = {name: p.clone() for name, p in model.named_parameters()}
    torch.manual_seed(7)
    init_torch_linear_inputs_(model, chosen[::-1])
    assert all(torch.equal(p, drawn[name]) for name, p in model.named_parameters())
    changed = sorted(n for n, p in model.named_parameters() if not torch.equal(p, before[n]))
    assert changed == sorted(n for role in ("attention_qk", "attention_value", "mlp_fc")
                             for n in model.parameter_roles()[role])
    with pytest.raises(ValueError, match=r"1 of the matrices to re-initialize are not parameters of the GPT"):
        init_torch_linear_inputs_(model, [nn.Parameter(torch.zeros(2, 2))])


def test_record12_refuses_an_attention_that_declares_no_inputs(monkeypatch):
    config = build_model_config("record12", {"n_layer": 2, "model_dim": 64, "n_head": 2, "head_dim": 32,
                                             "vocab_size": 64, "window_pattern": "LL"})
    monkeypatch.setattr(CausalSelfAttention, "own_parameter_roles", lambda self: {})
    with pytest.raises(ValueError, match=r"role 'attention_qk'.*declare 0: missing on layers \[0, 1\]"):
        GPT(config)
