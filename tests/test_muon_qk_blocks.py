"""Muon's q/k head blocks (record #80; records #83-#89 and HEAD update Q and K as (256, 768) head-pair blocks,
their ``qk_bank``, speedrun-spec.md 3.2 "Groups"): a matrix in a group with ``block_rows`` b steps exactly as
its rows/b blocks stepped as separate matrices (float64, the per-matrix reference of test_muon_banks); the
``train.muon_qk_block_heads`` setting puts exactly the q and k weights in such a group; bad values are
named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from speedrun.errors import SpeedrunError
from speedrun.model.config import build_model_config
from speedrun.model.gpt import GPT
from speedrun.optim.groups import OptimConfig, build_optimizers
from speedrun.optim.muon import Muon, row_blocks
from speedrun.training.config import TrainConfig
from test_muon_banks import reference_muon_step

F64 = torch.float64


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def test_row_blocks_is_a_writable_view_in_row_order():
    stack = torch.arange(2 * 6 * 3, dtype=F64).view(2, 6, 3)
    blocks = row_blocks(stack, 2)
    assert blocks.shape == (6, 2, 3)
    torch.testing.assert_close(blocks[4], stack[1, 2:4])
    blocks[5].zero_()
    assert torch.count_nonzero(stack[1, 4:]) == 0


@pytest.mark.parametrize("settings", [
    dict(method="polar_express", beta2=0.9, weight_decay=1.2, cautious=True),      # the records' q/k settings
    dict(method="newton_schulz", beta2=None, weight_decay=0.3, cautious=False),
])
def test_a_blocked_matrix_steps_as_its_blocks_stepped_separately(settings):
    # two (12, 8) matrices in blocks of 4 rows: wide (4, 8) blocks, unlike the tall (12, 8) whole matrix, so
    # the normalization's axis, the shape factor and the orthogonalization all differ from the unblocked step
    qk = [nn.Parameter(_randn(12, 8, seed=1)), nn.Parameter(_randn(12, 8, seed=2))]
    other = nn.Parameter(_randn(12, 8, seed=3))                  # same shape, whole-matrix group
    opt = Muon([{"params": qk, "block_rows": 4}, {"params": [other]}], lr=0.02, momentum=0.9,
               weight_decay=settings["weight_decay"], orthogonalizer=settings["method"],
               normuon_beta2=settings["beta2"], cautious_weight_decay=settings["cautious"])
    blocks = [p.detach()[i:i + 4].clone() for p in qk for i in (0, 4, 8)]
    whole = other.detach().clone()
    block_states, whole_state = [{} for _ in blocks], {}
    for step in range(3):
        grads = [_randn(12, 8, seed=10 * step + i) for i in range(3)]
        for p, g in zip((*qk, other), grads):
            p.grad = g.clone()
        opt.step()
        block_grads = [g[i:i + 4] for g in grads[:2] for i in (0, 4, 8)]
        blocks = [reference_muon_step(b, g, st, 0.02, 0.9, True, settings["weight_decay"], settings["method"],
                                      settings["beta2"], settings["cautious"])
                  for b, g, st in zip(blocks, block_grads, block_states)]
        whole = reference_muon_step(whole, grads[2], whole_state, 0.02, 0.9, True, settings["weight_decay"],
                                    settings["method"], settings["beta2"], settings["cautious"])
        torch.testing.assert_close(torch.cat([p.detach() for p in qk]), torch.cat(blocks), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(other.detach(), whole, rtol=1e-12, atol=1e-12)
    if settings["beta2"] is not None:
        assert opt.state[qk[0]]["second_moment"].shape == (3, 1, 8)      # per block, per column
        assert opt.state[other]["second_moment"].shape == (12, 1)         # whole tall matrix, per row
    # blocking changes the step: the same gradients on a whole matrix land elsewhere
    assert (torch.cat(blocks[:3]) - whole).abs().max() > 1e-3


@pytest.mark.parametrize("block_rows,match", [
    (0, r"block_rows must be None or an integer >= 1, got 0"),
    (2.0, r"block_rows must be None or an integer >= 1, got 2.0"),
    (5, r"block_rows 5 does not divide the rows of a parameter of shape \(12, 8\)"),
])
def test_bad_block_rows_are_refused(block_rows, match):
    with pytest.raises(ValueError, match=match):
        Muon([{"params": [nn.Parameter(torch.zeros(12, 8))], "block_rows": block_rows}])


def _gpt(**model):
    torch.manual_seed(0)
    return GPT(build_model_config("tiny", {"n_layer": 3, "vocab_size": 64, **model}))


def test_the_setting_puts_exactly_q_and_k_in_a_group_of_head_blocks():
    model = _gpt()
    config = model.config
    assert config.n_head % 2 == 0
    opts = build_optimizers(model, model.parameter_kinds(), OptimConfig(muon_lr=0.03, muon_qk_block_heads=1,
                                                                         mlp_proj_lr_mul=2.0))
    muon = opts.optimizers[1]
    names = {id(p): n for n, p in model.named_parameters()}
    blocked = [g for g in muon.param_groups if g.get("block_rows") is not None]
    assert len(blocked) == 1 and blocked[0]["block_rows"] == config.head_dim and blocked[0]["lr"] == 0.03
    assert sorted(names[id(p)] for p in blocked[0]["params"]) == sorted(model.parameter_roles()["attention_qk"])
    assert sorted(model.parameter_roles()["attention_qk"]) == sorted(
        f"blocks.{i}.attn.{m}.weight" for i in range(3) for m in "qk")
    others = [g for g in muon.param_groups if g.get("block_rows") is None]
    assert sorted(g["lr"] for g in others) == [0.03, 0.06]                 # the plain group and mlp_proj's
    assert not any(".attn.q." in names[id(p)] or ".attn.k." in names[id(p)] for g in others for p in g["params"])
    default = build_optimizers(model, model.parameter_kinds(), OptimConfig()).optimizers[1]
    assert all(g.get("block_rows") is None for g in default.param_groups)


def test_a_blocked_model_trains_one_step_differently_from_an_unblocked_one():
    steps = {}
    for heads in (0, 1):
        model = _gpt()
        opts = build_optimizers(model, model.parameter_kinds(), OptimConfig(muon_qk_block_heads=heads))
        q = model.blocks[0].attn.q.weight
        v = model.blocks[0].attn.v.weight
        before = (q.detach().clone(), v.detach().clone())
        g = torch.Generator().manual_seed(4)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        opts.step()
        steps[heads] = (q.detach() - before[0], v.detach() - before[1])
    assert (steps[0][0] - steps[1][0]).abs().max() > 1e-4                  # q's step changes
    torch.testing.assert_close(steps[0][1], steps[1][1], rtol=0, atol=0)  # v's does not


def test_train_config_checks_the_setting():
    assert TrainConfig().optimizer.muon_qk_block_heads == 0
    cfg = TrainConfig.from_dict({"muon_qk_block_heads": 2})
    assert cfg.optimizer.muon_qk_block_heads == 2
    with pytest.raises(SpeedrunError, match=r"train.muon_qk_block_heads 3 must divide the model's n_head 2"):
        TrainConfig.from_dict({"muon_qk_block_heads": 3})
    with pytest.raises(SpeedrunError, match=r"train.muon_qk_block_heads must be an integer >= 0"):
        TrainConfig.from_dict({"muon_qk_block_heads": -1})
