"""Adam every other step (``train.adam_every``, record #39; speedrun-spec.md 3.3: the records' Adam params are
stepped only on odd steps, on the gradients of both steps): :class:`speedrun.optim.groups.Optimizers` against one
Adam step computed here by hand, Muon's update at every step, the setting's refusal, and the record configs
against the records' own ``_is_adam_step``. The training loop's side (Adam's gradients kept and averaged over the
ranks only when Adam updates) is in tests/test_training_staged.py's 2-rank gloo run, whose record settings have
``adam_every: 2``."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from speedrun.errors import SpeedrunError
from speedrun.optim.config import OptimConfig
from speedrun.optim.groups import Optimizers, build_optimizers
from speedrun.training.config import TrainConfig
from speedrun.training.loop import run_training

from synthetic_data import counting_documents, write_dataset
from test_training_staged import RECORD_SETTINGS, SETTINGS

ROOT = Path(__file__).resolve().parents[1]
LR, BETAS, EPS = 0.1, (0.8, 0.95), 1e-8


class TwoKinds(nn.Module):
    """One Adam parameter (kind ``scalar``) and one Muon matrix."""

    def __init__(self):
        super().__init__()
        self.lam = nn.Parameter(torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64))
        self.w = nn.Parameter(torch.eye(4, dtype=torch.float64))


def _optimizers(model: TwoKinds, adam_every: int) -> Optimizers:
    config = OptimConfig(scalar_lr=LR, adam_betas=BETAS, adam_eps=EPS, muon_lr=0.02, adam_every=adam_every)
    return build_optimizers(model, {"lam": "scalar", "w": "matrix"}, config, roles={})


def _set_grads(model: TwoKinds, g_lam: torch.Tensor, g_w: torch.Tensor) -> None:
    """As a backward pass does: add into a kept gradient, set a cleared one."""
    for p, g in ((model.lam, g_lam), (model.w, g_w)):
        p.grad = g.clone() if p.grad is None else p.grad + g


G0 = torch.tensor([0.3, -0.1, 0.2, -0.4], dtype=torch.float64)
G1 = torch.tensor([-0.5, -0.2, 0.1, 0.1], dtype=torch.float64)       # disagrees with G0 in sign at 0 and 3
GW = torch.arange(16, dtype=torch.float64).reshape(4, 4) / 10


def _first_adam_step(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Adam's first update by hand: m = (1-β1)·g, v = (1-β2)·g², p - lr·sqrt(1-β2)/(1-β1) · m/(sqrt(v)+ε)
    (torch's AdamW adds ε after the bias correction: the two differ by about lr·ε/|g|, 1e-8 here)."""
    b1, b2 = BETAS
    m, v = (1 - b1) * g, (1 - b2) * g * g
    return p - LR * math.sqrt(1 - b2) / (1 - b1) * m / (v.sqrt() + EPS)


def test_adam_updates_after_odd_steps_on_the_sum_of_both_gradients():
    model = TwoKinds()
    lam0, w0 = model.lam.detach().clone(), model.w.detach().clone()
    opt = _optimizers(model, 2)
    assert [opt.adam_updates_after(s) for s in range(5)] == [False, True, False, True, False]
    assert opt.adam_parameters() == {id(model.lam)}

    _set_grads(model, G0, GW)                                       # step 0: Muon only, Adam's gradient kept
    opt.step(adam=opt.adam_updates_after(0))
    opt.zero_grad(adam=opt.adam_updates_after(0))
    assert torch.equal(model.lam.detach(), lam0) and torch.equal(model.lam.grad, G0)
    assert not torch.equal(model.w.detach(), w0) and model.w.grad is None
    w_after_0 = model.w.detach().clone()

    _set_grads(model, G1, GW)                                       # step 1: Adam on G0 + G1, Muon again
    opt.step(adam=opt.adam_updates_after(1))
    opt.zero_grad(adam=opt.adam_updates_after(1))
    expected = _first_adam_step(lam0, G0 + G1)
    assert torch.allclose(model.lam.detach(), expected, rtol=0, atol=1e-7)
    # G1 alone would move coordinates 0 and 3 the other way: the sum is what Adam took
    assert not torch.allclose(model.lam.detach(), _first_adam_step(lam0, G1), atol=1e-3)
    assert opt.optimizers[0].state[model.lam]["step"] == 1           # its bias correction counts updates
    assert model.lam.grad is None and model.w.grad is None
    assert not torch.equal(model.w.detach(), w_after_0)


def test_adam_every_one_updates_adam_at_every_step():
    model = TwoKinds()
    lam0 = model.lam.detach().clone()
    opt = _optimizers(model, 1)
    assert all(opt.adam_updates_after(s) for s in range(4))
    _set_grads(model, G0, GW)
    opt.step(adam=opt.adam_updates_after(0))
    opt.zero_grad(adam=opt.adam_updates_after(0))
    assert torch.allclose(model.lam.detach(), _first_adam_step(lam0, G0), rtol=0, atol=1e-7)
    assert model.lam.grad is None


@pytest.mark.parametrize("value", [0, -2, 1.5, True])
def test_adam_every_refuses_what_is_not_a_positive_integer(value):
    with pytest.raises(SpeedrunError, match=r"train\.adam_every must be an integer >= 1"):
        TrainConfig.from_dict({**SETTINGS, "adam_every": value})
    if isinstance(value, int) and not isinstance(value, bool):
        with pytest.raises(ValueError, match="adam_every must be >= 1"):
            Optimizers([], adam_every=value)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("synth"), counting_documents(600), shard_tokens=16384)


@pytest.mark.parametrize("every,expected", [(1, [True] * 8), (2, [False, True] * 4),
                                            (3, [False, False, True, False, False, True, False, False])])
def test_the_loop_steps_adam_after_every_nth_step_and_keeps_its_gradients_between(synthetic, tmp_path,
                                                                                  monkeypatch, every, expected):
    """The real training loop (test_training_staged's 8-step staged schedule): which steps update Adam, and that
    on the others the Adam parameters' gradients are still there after the step while Muon's are cleared, and all
    are cleared after an Adam update."""
    shards, bos = synthetic
    adam_flags, kept = [], []
    real_step, real_zero = Optimizers.step, Optimizers.zero_grad

    def step(self, adam=True):
        adam_flags.append(adam)
        return real_step(self, adam=adam)

    def zero_grad(self, adam=True):
        real_zero(self, adam=adam)
        params = [p for opt in self.optimizers for g in opt.param_groups for p in g["params"]]
        with_grad = {id(p) for p in params if p.grad is not None}    # (a tied embedding's is folded into the head's)
        kept.append(bool(with_grad) and with_grad <= self.adam_parameters() if not adam else not with_grad)

    monkeypatch.setattr(Optimizers, "step", step)
    monkeypatch.setattr(Optimizers, "zero_grad", zero_grad)
    cfg = TrainConfig.from_dict({**SETTINGS, "adam_every": every})
    result = run_training(cfg, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=tmp_path / "a.txt",
                          env={})
    assert result.status == "complete" and cfg.steps == 8
    assert adam_flags == expected and all(kept)


def test_the_gloo_record_settings_step_adam_on_odd_steps():
    """The 2-rank run of tests/test_training_staged.py covers the kept, later-reduced Adam gradients."""
    assert TrainConfig.from_dict(RECORD_SETTINGS).optimizer.adam_every == 2


RECORD_CONFIGS = {"configs/records/record12.yaml": 1, "configs/records/record31.yaml": 1,
                  "configs/records/record83.yaml": 2, "configs/records/record87.yaml": 2,
                  "configs/records/record88.yaml": 2, "configs/records/record89.yaml": 2,
                  "configs/fineweb-8xh100.yaml": 2, "benchmarks/configs/parity-record87.yaml": 2,
                  "benchmarks/configs/parity-record88.yaml": 2, "benchmarks/configs/parity-record89.yaml": 2}


@pytest.mark.parametrize("path,every", sorted(RECORD_CONFIGS.items()))
def test_the_record_configs_adam_every(path, every):
    """Records #12 (2024-11-19) and #31 (2025-09-10) step Adam at every step; #39 and every record since on odd
    steps only (the scripts' check is below)."""
    train = yaml.safe_load((ROOT / path).read_text())["train"]
    assert train.get("adam_every", 1) == every


def test_the_record_scripts_step_adam_on_odd_steps_only():
    """The scripts of records #83, #87, #88 and HEAD: ``_is_adam_step`` is ``step % 2 == 1`` and their
    optimizer keeps the Adam gradients on the other steps (``Don't clear Adam grads on even steps``)."""
    found = [up / "shared" / "reference-code" for up in ROOT.parents[:2] if (up / "shared" / "reference-code").is_dir()]
    if not found:
        pytest.skip("../shared/reference-code is not here")
    for record in ("record83", "record87", "record88", "head"):
        text = (found[0] / record / "train_gpt.py").read_text()
        assert re.search(r"def _is_adam_step\(self, step: int\):\n(\s+\"\"\".*\"\"\"\n)?\s+return step % 2 == 1",
                         text), record
        assert 'if p_cfg.optim == "adam" and not do_adam:\n                continue  # Don\'t clear' in text, record
