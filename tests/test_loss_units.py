"""The records' gradient units (``train.loss_units: micro_batch_sum``; records #83-#89 and HEAD differentiate
``model(...).sum() * grad_scale``, each micro-batch's loss summed over its tokens over the micro-batches of a
step): the training step against that objective written out here in float64, gradients kept over two steps of
different micro-batch sizes weighted by their tokens (what a batch-size stage that starts on a step without an
Adam update gives the records' Adam), Adam's ε converted between the units, the loop's scale per stage, and the
refusal of an unknown unit."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from speedrun.data.loader import padded_cu_seqlens
from speedrun.errors import SpeedrunError
from speedrun.model.config import build_model_config
from speedrun.model.gpt import GPT
from speedrun.optim.groups import Optimizers
from speedrun.training import loop
from speedrun.training.config import TrainConfig
from speedrun.training.loop import run_training, train_step

from synthetic_data import counting_documents, write_dataset
from test_training_staged import SETTINGS

F64 = torch.float64
MODEL = {"n_layer": 2, "model_dim": 32, "n_head": 2, "head_dim": 16, "vocab_size": 64, "cross_entropy": "full"}


def _model() -> GPT:
    torch.manual_seed(0)
    model = GPT(build_model_config("tiny", MODEL)).to(F64)
    for p in model.parameters():                  # the tiny preset starts some matrices at zero: no gradient there
        torch.nn.init.normal_(p, std=0.3)
    return model


def _micro_batch(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tokens`` random ids (vocabulary 64) in two documents."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (tokens + 1,), generator=g)
    cu = torch.from_numpy(padded_cu_seqlens(np.array([0, tokens // 3, tokens], dtype=np.int32)))
    return ids[:-1].to(torch.int32), ids[1:].to(torch.int64), cu


def _grads(model: GPT) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def _step(model: GPT, micro_batches, loss_scale: float) -> float:
    return float(train_step(model, model, micro_batches, torch.device("cpu"), contextlib.nullcontext, 1, 64,
                            loss_scale=loss_scale))


def _records_objective(model: GPT, micro_batches) -> torch.Tensor:
    """Record #88's ``model(...).sum() * grad_scale`` over one step: each micro-batch's summed next-token
    cross-entropy, grad_scale = 1 / the step's micro-batches (one rank)."""
    total = torch.zeros((), dtype=F64)
    for inputs, targets, cu in micro_batches:
        logits = model.hidden_states(inputs, cu, 64) @ model.lm_head.weight.t()                 # (T, V)
        total = total + F.cross_entropy(logits, targets, reduction="sum") / len(micro_batches)
    return total


def test_micro_batch_sum_gradients_are_the_records_objective_and_the_logged_loss_stays_the_mean():
    step = [_micro_batch(48, 1), _micro_batch(48, 2)]
    model = _model()
    mean_loss = _step(model, step, 1.0)
    mean_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    assert _step(model, step, 48.0) == pytest.approx(mean_loss, rel=1e-15)        # the log's loss: the mean
    summed = _grads(model)
    model.zero_grad(set_to_none=True)
    _records_objective(model, step).backward()
    records = _grads(model)
    assert any(g.abs().max() > 1e-3 for g in records)
    for ours, theirs, mean in zip(summed, records, mean_grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(ours, 48.0 * mean, rtol=1e-10, atol=1e-12)


def test_gradients_kept_over_two_steps_are_weighted_by_their_micro_batch_tokens():
    """Two steps kept for one Adam update (adam_every 2) at a stage start: 2 x 32 tokens, then 2 x 64. In the
    records' units the kept gradient is 32·ḡ1 + 64·ḡ2 (their sum over all 192 tokens / 2); in the mean's,
    ḡ1 + ḡ2, the two steps weighed alike."""
    small, large = [_micro_batch(32, 3), _micro_batch(32, 4)], [_micro_batch(64, 5), _micro_batch(64, 6)]
    model = _model()
    per_step = []
    for step in (small, large):
        _step(model, step, 1.0)
        per_step.append(_grads(model))
        model.zero_grad(set_to_none=True)
    _step(model, small, 32.0)
    _step(model, large, 64.0)                     # no zero_grad between: the kept gradients add up
    kept = _grads(model)
    model.zero_grad(set_to_none=True)
    (_records_objective(model, small) + _records_objective(model, large)).backward()
    for ours, theirs, g1, g2 in zip(kept, _grads(model), *per_step):
        torch.testing.assert_close(ours, 32.0 * g1 + 64.0 * g2, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


# ---- the settings ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("loss_units, eps_units, expected", [
    ("mean_loss", "mean_loss", [1e-10, 1e-10]),
    ("mean_loss", "micro_batch_sum", [1e-10 / 128, 1e-10 / 256]),     # the records' ε on our mean
    ("micro_batch_sum", "micro_batch_sum", [1e-10, 1e-10]),          # the records' ε on their own gradients
    ("micro_batch_sum", "mean_loss", [1e-10 * 128, 1e-10 * 256]),
])
def test_adam_eps_goes_from_its_units_to_the_gradients(loss_units, eps_units, expected):
    """SETTINGS: 2 micro-batches of 256 tokens per step at steps 0-1, of 512 from step 2."""
    cfg = TrainConfig.from_dict({**SETTINGS, "adam_eps": 1e-10, "adam_eps_units": eps_units,
                                 "loss_units": loss_units})
    assert [cfg.adam_eps_at(s) for s in (0, 2)] == pytest.approx(expected, rel=1e-15)
    scale = [128.0, 256.0] if loss_units == "micro_batch_sum" else [1.0, 1.0]
    assert [cfg.loss_scale_at(s) for s in (0, 1, 2, 7)] == [scale[0], scale[0], scale[1], scale[1]]


def test_an_unknown_unit_is_refused_naming_the_setting():
    with pytest.raises(SpeedrunError, match=r"train\.loss_units must be one of mean_loss, micro_batch_sum"):
        TrainConfig.from_dict({**SETTINGS, "loss_units": "sum"})


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("synth"), counting_documents(600), shard_tokens=16384)


def test_the_loop_scales_each_stages_loss_and_keeps_the_records_eps(synthetic, tmp_path, monkeypatch):
    """The staged schedule of test_training_staged (2 micro-batches; 256 tokens per step, then 512) in the
    records' units: the loss scale is each step's tokens per micro-batch, and Adam keeps their ε 1e-10."""
    shards, bos = synthetic
    scales, eps = [], []
    real_train_step, real_step = loop.train_step, Optimizers.step

    def train_step(*args, loss_scale=1.0, **kwargs):
        scales.append(loss_scale)
        return real_train_step(*args, loss_scale=loss_scale, **kwargs)

    def step(self, adam=True):
        eps.append(sorted({g["eps"] for opt in self.optimizers for g in opt.param_groups if "betas" in g}))
        return real_step(self, adam=adam)

    monkeypatch.setattr(loop, "train_step", train_step)
    monkeypatch.setattr(Optimizers, "step", step)
    cfg = TrainConfig.from_dict({**SETTINGS, "adam_eps": 1e-10, "adam_eps_units": "micro_batch_sum",
                                 "loss_units": "micro_batch_sum"})
    result = run_training(cfg, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=tmp_path / "u.txt",
                          env={})
    assert result.status == "complete"
    assert scales == [128.0, 128.0] + [256.0] * 6
    assert eps == [[1e-10]] * 8
