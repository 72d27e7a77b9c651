"""The optimizer settings that reproduce record #28 (2025-08-23 SparseAttnGate, its train_gpt.py):
``mlp_fc_lr_mul`` (the MLP input matrices' Muon lr, with the shape factor on top), ``adam_eps`` (Adam's ε in
every Adam group) and ``muon_attention_gates`` (the (H, 12) gates trained by Muon). Each against a reference
written here: the groups' lrs by hand, one Adam step by its formula, one Muon step from a float64
Newton-Schulz / Polar Express iteration typed in from speedrun-spec.md 3.1; the TrainConfig checks; short
training runs, and (slow) two sharded gloo ranks against one."""

from __future__ import annotations

import math

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model.config import build_model_config
from speedrun.model.gpt import GPT
from speedrun.optim.groups import OptimConfig, build_optimizers
from speedrun.optim.muon import Muon
from speedrun.training.config import TrainConfig
from speedrun.training.loop import run_training
from synthetic_data import counting_documents, write_dataset
from test_train import QUICK, SMALL, _run_ranks

F64 = torch.float64
GATED = {"attention_gate_layers": (0, 1)}
# (coefficients per iteration, norm factor, eps), typed in from speedrun-spec.md 3.1.
REFERENCE = {
    "newton_schulz": ([(3.4445, -4.7750, 2.0315)] * 5, 1.0, 1e-7),
    "polar_express": ([(8.156554524902461, -22.48329292557795, 15.878769915207462),
                       (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                       (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                       (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                       (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)], 1.02, 1e-6),
}


def reference_orthogonalize(g: torch.Tensor, method: str) -> torch.Tensor:
    """X <- aX + b(XXᵀ)X + c(XXᵀ)²X from X0 = G/(‖G‖_F·factor + eps), float64, tall matrices transposed."""
    table, factor, eps = REFERENCE[method]
    tall = g.shape[0] > g.shape[1]
    x = (g.T if tall else g).to(F64)
    x = x / (torch.linalg.matrix_norm(x) * factor + eps)
    for a, b, c in table:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def tiny_gpt(**model):
    torch.manual_seed(0)
    return GPT(build_model_config("tiny", {"n_layer": 2, "vocab_size": 64, **model})).to(F64)


def names_of(model, params):
    return {n for n, p in model.named_parameters() if any(p is q for q in params)}


def random_gradients(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)


def expected_muon_step(param, grad, lr, momentum, method):
    """W after one Muon step from zero state: Nesterov direction (1-β)(1+β)·G, orthogonalized, times lr and
    the shape factor max(1, rows/cols)**0.5 (no weight decay)."""
    direction = (1 - momentum) * (1 + momentum) * grad
    rows, cols = param.shape
    return param - lr * max(1.0, rows / cols) ** 0.5 * reference_orthogonalize(direction, method)


# ---- mlp_fc_lr_mul -----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["newton_schulz", "polar_express"])
def test_mlp_input_matrices_get_their_own_muon_lr_and_keep_the_shape_factor(method):
    model = tiny_gpt()
    config = OptimConfig(muon_lr=0.02, mlp_fc_lr_mul=0.5, mlp_proj_lr_mul=4.0, orthogonalizer=method)
    opts = build_optimizers(model, model.parameter_kinds(), config)
    muon = opts.optimizers[-1]
    by_lr = {g["initial_lr"]: names_of(model, g["params"]) for g in muon.param_groups}
    assert sorted(by_lr) == [0.01, 0.02, 0.08]
    assert by_lr[0.01] == {"blocks.0.mlp.fc.weight", "blocks.1.mlp.fc.weight"}
    assert by_lr[0.08] == {"blocks.0.mlp.proj.weight", "blocks.1.mlp.proj.weight"}
    assert "blocks.0.attn.qkv.weight" in by_lr[0.02] or "blocks.0.attn.q.weight" in by_lr[0.02]
    assert len(by_lr[0.02]) == sum(1 for k in model.parameter_kinds().values() if k == "matrix") - 4
    fc, proj = model.blocks[0].mlp.fc.weight, model.blocks[0].mlp.proj.weight
    assert fc.shape == (256, 64) and proj.shape == (64, 256)            # (4C, C) and (C, 4C)
    random_gradients(model)
    before = {n: (p.detach().clone(), p.grad.clone()) for n, p in model.named_parameters()}
    muon.step()
    # fc: group lr 0.01 times shape factor 2 = 0.02, the record's step for its (C, 4C) c_fc at lr 0.02
    w, g = before["blocks.0.mlp.fc.weight"]
    torch.testing.assert_close(fc.detach(), expected_muon_step(w, g, 0.02 * 0.5, 0.95, method),
                               rtol=1e-12, atol=1e-12)
    record_step = 0.02 * reference_orthogonalize(0.05 * 1.95 * g, method)      # lr 0.02, shape factor 1
    torch.testing.assert_close(fc.detach(), w - record_step, rtol=1e-12, atol=1e-12)
    w, g = before["blocks.0.mlp.proj.weight"]
    torch.testing.assert_close(proj.detach(), expected_muon_step(w, g, 0.08, 0.95, method), rtol=1e-12, atol=1e-12)


def test_the_default_fc_multiplier_leaves_one_muon_group():
    model = tiny_gpt()
    opts = build_optimizers(model, model.parameter_kinds(), OptimConfig(muon_lr=0.02))
    assert [g["initial_lr"] for g in opts.optimizers[-1].param_groups] == [0.02]
    only_fc = build_optimizers(model, model.parameter_kinds(), OptimConfig(muon_lr=0.02, mlp_fc_lr_mul=3.0))
    by_lr = {g["initial_lr"]: names_of(model, g["params"]) for g in only_fc.optimizers[-1].param_groups}
    assert by_lr[0.06] == {"blocks.0.mlp.fc.weight", "blocks.1.mlp.fc.weight"}
    assert "blocks.0.mlp.proj.weight" in by_lr[0.02]


# ---- adam_eps ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("cautious", [False, True])
def test_adam_eps_reaches_every_adam_group_and_sets_the_step(cautious):
    cfg = TrainConfig.from_dict({"model": {"n_layer": 2, "vocab_size": 64, **GATED}, "adam_eps": 2.5e-16,
                                 "cautious_weight_decay": cautious})
    assert cfg.optimizer.adam_eps == 2.5e-16
    model = tiny_gpt(**GATED).float()
    opts = build_optimizers(model, model.parameter_kinds(), cfg.optimizer)
    adam = opts.optimizers[0]
    assert not isinstance(adam, Muon) and {g["kind"] for g in adam.param_groups} == {"embed", "head", "scalar"}
    assert [g["eps"] for g in adam.param_groups] == [2.5e-16] * len(adam.param_groups)
    # first Adam step: p -= lr·g/(|g| + eps') with eps' = eps for torch's AdamW and eps/sqrt(1-β2) for
    # CautiousAdam (its ε sits before the bias correction); a gradient of 1e-14 (sum-scale 1e-14·393216 ≈
    # 4e-9) moves scalars by ~lr at eps 2.5e-16 and by ~lr·1e-4 at the default 1e-10
    scalars = next(g for g in adam.param_groups if g["kind"] == "scalar")
    p = scalars["params"][0]
    for group in adam.param_groups:
        for q in group["params"]:
            q.grad = torch.full_like(q, 1e-14)
    before = p.detach().clone()
    adam.step()
    eps = 2.5e-16 / math.sqrt(1 - 0.95) if cautious else 2.5e-16
    expected = before - 0.04 * 1e-14 / (1e-14 + eps)
    torch.testing.assert_close(p.detach(), expected, rtol=1e-6, atol=1e-7)
    default = TrainConfig.from_dict({"model": {"n_layer": 2}}).optimizer
    assert default.adam_eps == 1e-10


# ---- muon_attention_gates ----------------------------------------------------------------------------


def test_without_the_switch_the_gates_stay_in_adams_scalar_group():
    model = tiny_gpt(**GATED)
    opts = build_optimizers(model, model.parameter_kinds(), OptimConfig())
    scalars = next(g for g in opts.optimizers[0].param_groups if g["kind"] == "scalar")
    assert {"blocks.0.attn.gate.weight", "blocks.1.attn.gate.weight"} <= names_of(model, scalars["params"])


def test_the_switch_on_a_model_without_gates_raises():
    model = tiny_gpt()
    assert not any(".attn.gate." in name for name in model.parameter_kinds())
    with pytest.raises(ValueError, match=r"muon_attention_gates is on but the model has no attention gate"):
        build_optimizers(model, model.parameter_kinds(), OptimConfig(muon_attention_gates=True))


@pytest.mark.parametrize("method", ["newton_schulz", "polar_express"])
@pytest.mark.parametrize("shard", [True, False])
def test_the_switch_moves_the_gates_to_muon_with_an_orthogonalized_step(method, shard):
    model = tiny_gpt(**GATED)
    gates = {"blocks.0.attn.gate.weight", "blocks.1.attn.gate.weight"}
    config = OptimConfig(muon_lr=0.03, scalar_lr=0.04, mlp_fc_lr_mul=0.5, orthogonalizer=method, shard_muon=shard,
                         muon_attention_gates=True)
    opts = build_optimizers(model, model.parameter_kinds(), config)
    adam, muon = opts.optimizers
    assert not gates & names_of(model, [p for g in adam.param_groups for p in g["params"]])
    gate_groups = [g for g in muon.param_groups if gates & names_of(model, g["params"])]
    assert len(gate_groups) == 1 and gate_groups[0]["initial_lr"] == 0.03 and gate_groups[0]["kind"] == "matrix"
    assert model.parameter_kinds()["blocks.0.attn.gate.weight"] == "scalar"      # the model's labels unchanged
    gate = model.blocks[1].attn.gate.weight
    assert gate.shape == (2, 12)                                    # wide: shape factor 1
    with torch.no_grad():
        gate.copy_(torch.randn(2, 12, generator=torch.Generator().manual_seed(5), dtype=F64))
    random_gradients(model, seed=2)
    w, g = gate.detach().clone(), gate.grad.clone()
    opts.step()
    torch.testing.assert_close(gate.detach(), expected_muon_step(w, g, 0.03, 0.95, method), rtol=1e-12, atol=1e-12)
    assert (gate.detach() - w).abs().max() > 1e-3
    if method == "polar_express":                       # the step is near the polar factor: singular values ≈ 1
        s = torch.linalg.svdvals((w - gate.detach()) / 0.03)
        assert s.min() > 0.8 and s.max() < 1.2
    # the momentum went on: a second step uses buf = β(1-β)G1 + (1-β)G2
    g2 = torch.randn(2, 12, generator=torch.Generator().manual_seed(6), dtype=F64)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    gate.grad = g2.clone()
    w2 = gate.detach().clone()
    opts.step()
    buf = 0.95 * 0.05 * g + 0.05 * g2
    direction = 0.05 * g2 + 0.95 * buf
    torch.testing.assert_close(gate.detach(), w2 - 0.03 * reference_orthogonalize(direction, method),
                               rtol=1e-12, atol=1e-12)


# ---- TrainConfig -------------------------------------------------------------------------------------


def test_the_settings_reach_the_optim_config():
    cfg = TrainConfig.from_dict({"model": {"attention_gate_layers": [0, 1]}, "mlp_fc_lr_mul": 0.5,
                                 "adam_eps": 2.54e-16, "muon_attention_gates": True})
    optim = cfg.optimizer
    assert (optim.mlp_fc_lr_mul, optim.adam_eps, optim.muon_attention_gates) == (0.5, 2.54e-16, True)
    defaults = TrainConfig().optimizer
    assert (defaults.mlp_fc_lr_mul, defaults.adam_eps, defaults.muon_attention_gates) == (1.0, 1e-10, False)


@pytest.mark.parametrize("settings,match", [
    ({"mlp_fc_lr_mul": -0.5}, r"train.mlp_fc_lr_mul must be a finite number >= 0.0, got -0.5"),
    ({"mlp_fc_lr_mul": float("inf")}, r"train.mlp_fc_lr_mul must be a finite number >= 0.0, got inf"),
    ({"mlp_fc_lr_mul": "0.5"}, "train.mlp_fc_lr_mul must be a finite number >= 0.0, got .0.5. \\(text, not a number"),
    ({"adam_eps": 0.0}, r"train.adam_eps must be a finite number > 0 \(Adam's ε\), got 0.0"),
    ({"adam_eps": -1e-10}, "train.adam_eps must be a finite number > 0"),
    ({"adam_eps": float("nan")}, "train.adam_eps must be a finite number > 0"),
    ({"adam_eps": float("inf")}, "train.adam_eps must be a finite number > 0"),
    ({"adam_eps": True}, "train.adam_eps must be a finite number > 0"),
    ({"adam_eps": "1e-10"}, "train.adam_eps must be a finite number > 0"),
    ({"muon_attention_gates": "yes"}, "train.muon_attention_gates must be true or false, got 'yes'"),
    ({"muon_attention_gates": True}, "train.muon_attention_gates needs a model with attention gates"),
])
def test_bad_record28_settings_are_named(settings, match):
    with pytest.raises(SpeedrunError, match=match):
        TrainConfig.from_dict(settings)


# ---- training runs -----------------------------------------------------------------------------------

RECORD28_OPTIM = {"model": {**SMALL, "attention_gate_layers": [0, 1]}, "mlp_fc_lr_mul": 0.5,
                  "adam_eps": 2.54e-16, "muon_attention_gates": True}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("synth"), counting_documents(600), shard_tokens=16384)


def test_a_short_run_with_the_record28_optimizer_settings_learns(synthetic, tmp_path):
    shards, bos = synthetic
    cfg = TrainConfig.from_dict({**QUICK, **RECORD28_OPTIM, "steps": 8, "val_every": 0})
    result = run_training(cfg, variant="r28", seed=0, shards_dir=shards, bos_dir=bos, log_path=tmp_path / "r.txt",
                          env={})
    assert result.status == "complete"
    val = [x for _, k, x in result.losses if k == "val"]
    assert len(val) == 2 and math.isfinite(val[-1]) and val[-1] < val[0] - 1.0


@pytest.mark.slow
def test_two_sharded_gloo_ranks_with_muon_gates_equal_one_rank(synthetic, tmp_path):
    """The gates form their own (2, 12) bank, one matrix per rank when sharded over two."""
    shards, bos = synthetic
    base = {**QUICK, **RECORD28_OPTIM, "steps": 4, "val_every": 2, "micro_batches": 2, "dtype": "float32"}
    one = _run_ranks(1, {**base, "world_size": 1}, shards, bos, tmp_path / "one.txt")[0]
    two = _run_ranks(2, {**base, "world_size": 2}, shards, bos, tmp_path / "two.txt")
    assert two[0] == two[1]
    assert [(s, k) for s, k, _ in one] == [(s, k) for s, k, _ in two[0]]
    for (_, _, a), (_, _, b) in zip(one, two[0]):
        assert a == pytest.approx(b, abs=1e-5)
