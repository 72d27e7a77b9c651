"""Record #87's optimizer settings (shared/reference-code/record87/train_gpt.py) and the records' Adam ε per stage:
C-Optim in the cautious Adam (``adam_kind_coptim``) against one step computed here, the per-kind weight decay of
records #83-#89 (``adam_kind_wd_mul``), the Langevin noise's warm-up
and end (``langevin_warmup_steps``, ``langevin_end_frac``), and ``adam_eps_units: micro_batch_sum`` through the
real training loop (Adam's ε of every step is the records' ε over that step's micro-batch tokens)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from speedrun.errors import SpeedrunError
from speedrun.optim.adam import CautiousAdam, set_adam_eps
from speedrun.optim.config import OptimConfig
from speedrun.optim.groups import Optimizers, build_optimizers
from speedrun.optim.langevin import langevin_sigma
from speedrun.training.config import TrainConfig
from speedrun.training.loop import run_training

from synthetic_data import counting_documents, write_dataset
from test_training_staged import SETTINGS


def _one_step(strength: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(8, 5))
    before = p.detach().clone()
    grad = torch.randn(8, 5)
    opt = CautiousAdam([{"params": [p], "lr": 0.3, "coptim": strength}], betas=(0.75, 0.95), eps=1e-8,
                       weight_decay=0.2)
    p.grad = grad.clone()
    opt.step()
    return before, grad, p.detach()


@pytest.mark.parametrize("strength", [0.0, 0.5, 1.0])
def test_coptim_damps_the_coordinates_whose_step_disagrees_with_the_gradient(strength):
    before, g, after = _one_step(strength)
    # first step by hand: m = (1-β1) g, v = (1-β2) g², u = m / (sqrt(v) + ε); bias corrections 1-β1, sqrt(1-β2)
    m, v = 0.25 * g, 0.05 * g * g
    u = m / (v.sqrt() + 1e-8)
    keep = (u * g > 0).float()                       # on a first step every coordinate agrees: keep = 1
    u = (1 - strength) * u + strength * u * keep / keep.mean().clamp_min(1e-3)
    decay = 0.3 * 0.3 * 0.2 * before * ((u * before) > 0)
    expected = before - decay - 0.3 * math.sqrt(1 - 0.95) / (1 - 0.75) * u
    torch.testing.assert_close(after, expected, rtol=1e-6, atol=1e-7)


def test_coptim_on_a_second_step_with_a_flipped_gradient():
    """Second step: the momentum keeps the first gradient's sign where the new one flips weakly, so those
    coordinates disagree and are damped; the others scale by 1/mean(keep)."""
    torch.manual_seed(1)
    g1 = torch.randn(40)
    g2 = -0.3 * g1 + 0.2 * torch.randn(40)
    results = {}
    for s in (0.0, 0.5):
        p = nn.Parameter(torch.zeros(40))
        opt = CautiousAdam([{"params": [p], "lr": 0.1, "coptim": s}], betas=(0.75, 0.95), eps=1e-10)
        for g in (g1, g2):
            p.grad = g.clone()
            opt.step()
        results[s] = p.detach().clone()
    m = 0.75 * 0.25 * g1 + 0.25 * g2
    v = 0.95 * 0.05 * g1 ** 2 + 0.05 * g2 ** 2
    u = m / (v.sqrt() + 1e-10)
    keep = (u * g2 > 0).float()
    assert 0 < keep.mean() < 1                                                   # the case is a mixed one
    first = 0.1 * math.sqrt(0.05) / 0.25 * (0.25 * g1) / (math.sqrt(0.05) * g1.abs() + 1e-10)
    step2 = 0.1 * math.sqrt(1 - 0.95 ** 2) / (1 - 0.75 ** 2)
    for s, got in results.items():
        u_s = (1 - s) * u + s * u * keep / keep.mean()
        torch.testing.assert_close(got, -first - step2 * u_s, rtol=1e-5, atol=1e-7)


def test_the_coptim_strength_reaches_the_kinds_adam_group_only():
    model = nn.ModuleDict({"table": nn.Embedding(6, 4), "head": nn.Linear(4, 6, bias=False)})
    kinds = {"table.weight": "embed", "head.weight": "head"}
    opts = build_optimizers(model, kinds, OptimConfig(cautious_weight_decay=True, adam_kind_coptim={"embed": 0.5}))
    groups = {g["kind"]: g for g in opts.groups()}
    assert groups["embed"]["coptim"] == 0.5 and "coptim" not in groups["head"]


def test_adam_kind_wd_mul_scales_each_kinds_decay():
    model = nn.ModuleDict({"t": nn.Embedding(6, 4), "h": nn.Linear(4, 6, bias=False), "s": nn.Linear(4, 1),
                           "g": nn.Linear(2, 2, bias=False)})
    kinds = {"t.weight": "embed", "h.weight": "head", "s.weight": "scalar", "s.bias": "scalar", "g.weight": "gate"}
    opts = build_optimizers(model, kinds, OptimConfig(adam_weight_decay=0.005, cautious_weight_decay=True,
                                                      adam_kind_wd_mul={"head": 150, "embed": 5, "scalar": 0}))
    wd = {g["kind"]: g["weight_decay"] for g in opts.groups()}
    assert wd == pytest.approx({"embed": 0.025, "head": 0.75, "scalar": 0.0, "gate": 0.005})   # gate: its table's 1
    plain = build_optimizers(model, kinds, OptimConfig(adam_weight_decay=0.005, cautious_weight_decay=True))
    assert {g["kind"]: g["weight_decay"] for g in plain.groups()} == pytest.approx(
        {"embed": 0.005, "head": 0.005, "scalar": 0.005, "gate": 0.005})
    with pytest.raises(SpeedrunError, match=r"train\.adam_kind_wd_mul\.head must be a finite number >= 0\.0"):
        TrainConfig.from_dict({"adam_kind_wd_mul": {"head": -1}})


def test_langevin_warm_up_and_end_by_hand():
    # σ·(1 - s/end)·min(1, s/warm-up): end 10, warm-up 4
    got = [langevin_sigma(s, 20, 0.5, 0.2, warmup_steps=4, end_step=10) for s in (0, 2, 4, 6, 9, 10, 15)]
    assert got == pytest.approx([0.0, 0.2 * 0.8 * 0.5, 0.2 * 0.6, 0.2 * 0.4, 0.2 * 0.1, 0.0, 0.0])
    # without them: the cooldown's start int(20 * 0.5) = 10, no ramp
    assert langevin_sigma(2, 20, 0.5, 0.2) == pytest.approx(0.2 * 0.8)
    with pytest.raises(ValueError, match="warmup_steps >= 0"):
        langevin_sigma(0, 20, 0.5, 0.2, warmup_steps=-1)


def test_langevin_end_frac_is_a_fraction_of_the_scheduled_steps():
    plain = TrainConfig.from_dict({"steps": 40, "tokens_per_step": 64, "langevin_noise": 0.1,
                                   "langevin_end_frac": 0.25, "langevin_warmup_steps": 3})
    assert (plain.schedule_config().langevin_end_step, plain.schedule_config().langevin_warmup_steps) == (10, 3)
    assert TrainConfig.from_dict({"steps": 40, "tokens_per_step": 64}).schedule_config().langevin_end_step is None
    staged = TrainConfig.from_dict({**SETTINGS, "langevin_end_frac": 0.5})
    assert staged.schedule_config().langevin_end_step == 3                 # int(0.5 x 6 scheduled), not of 8


@pytest.mark.parametrize("extra,message", [
    ({"adam_kind_coptim": {"embed": 0.5}}, r"train\.adam_kind_coptim \(record #87's C-Optim\) runs in the "
                                           r"cautious Adam: it needs train\.cautious_weight_decay true"),
    ({"adam_kind_coptim": {"embed": 1.5}, "cautious_weight_decay": True},
     r"train\.adam_kind_coptim\.embed must be a number in \[0\.0, 1\.0\], got 1\.5"),
    ({"adam_kind_coptim": {"table": 0.5}}, r"train\.adam_kind_coptim has an unknown Adam kind 'table'"),
    ({"langevin_end_frac": 0}, r"train\.langevin_end_frac must be null or a number in \(0, 1\], got 0"),
    ({"langevin_warmup_steps": -2}, r"train\.langevin_warmup_steps must be an integer >= 0"),
    ({"adam_eps_units": "sum"}, r"train\.adam_eps_units must be one of mean_loss, micro_batch_sum"),
])
def test_refusals_name_the_setting(extra, message):
    with pytest.raises(SpeedrunError, match=message):
        TrainConfig.from_dict({"steps": 4, "tokens_per_step": 64, **extra})


def test_set_adam_eps_leaves_muon_alone():
    model = nn.ModuleDict({"e": nn.Embedding(6, 4), "m": nn.Linear(4, 4, bias=False)})
    opts = build_optimizers(model, {"e.weight": "embed", "m.weight": "matrix"}, OptimConfig())
    set_adam_eps(opts.optimizers, 3e-15)
    adam, muon = opts.optimizers
    assert [g["eps"] for g in adam.param_groups] == [3e-15] and all("eps" not in g or g["eps"] != 3e-15
                                                                    for g in muon.param_groups)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("synth"), counting_documents(600), shard_tokens=16384)


def test_the_loop_sets_the_records_eps_for_each_stages_micro_batch(synthetic, tmp_path, monkeypatch):
    """test_training_staged's schedule (2 micro-batches; 256 tokens per step, then 512): with adam_eps 1e-10 in
    micro_batch_sum units every Adam group steps with ε = 1e-10 x 2 / tokens_per_step."""
    shards, bos = synthetic
    seen = []
    real_step = Optimizers.step

    def step(self, adam=True):
        seen.append(sorted({g["eps"] for opt in self.optimizers for g in opt.param_groups if "betas" in g}))
        return real_step(self, adam=adam)

    monkeypatch.setattr(Optimizers, "step", step)
    cfg = TrainConfig.from_dict({**SETTINGS, "adam_eps": 1e-10, "adam_eps_units": "micro_batch_sum"})
    assert [cfg.adam_eps_at(s) for s in (0, 2)] == pytest.approx([1e-10 * 2 / 256, 1e-10 * 2 / 512], rel=1e-15)
    result = run_training(cfg, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=tmp_path / "e.txt",
                          env={})
    assert result.status == "complete"
    tokens = [256, 256, 512, 512, 512, 512, 512, 512]
    assert [len(eps) for eps in seen] == [1] * 8                                  # one ε for every Adam group
    assert [eps[0] for eps in seen] == pytest.approx([1e-10 * 2 / t for t in tokens], rel=1e-15)
    plain = TrainConfig.from_dict({**SETTINGS, "adam_eps": 1e-10})               # mean_loss: as written
    assert [plain.adam_eps_at(s) for s in range(8)] == [1e-10] * 8
