"""NorMuon's variance normalization, cautious weight decay (Muon and Adam) on hand-computed small cases, and
their switches in the optimizer assembly and the training settings."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from speedrun.errors import SpeedrunError
from speedrun.optim.adam import CautiousAdam
from speedrun.optim.groups import OptimConfig, build_optimizers
from speedrun.optim.muon import Muon, cautious_mask, second_moment_shape, variance_normalize
from speedrun.optim.orthogonalize import orthogonalize
from speedrun.training.config import TrainConfig


def _rows_normalized(rows, second_moments, target_norm):
    """Divide each row by sqrt(m), then rescale the whole matrix to target_norm (plain Python)."""
    out = [[x / math.sqrt(max(m, 1e-10)) for x in row] for row, m in zip(rows, second_moments)]
    norm = math.sqrt(sum(x * x for row in out for x in row))
    return [[x * target_norm / norm for x in row] for row in out]


def test_variance_normalization_of_a_tall_matrix_by_hand_over_two_steps():
    u1 = [[3.0, 4.0], [0.0, 1.0], [1.0, 1.0]]                  # (3, 2): one second moment per row
    u2 = [[1.0, 0.0], [2.0, 2.0], [0.0, 3.0]]
    assert second_moment_shape((3, 2)) == (3, 1) and second_moment_shape((2, 3)) == (1, 3)
    m = torch.zeros(3, 1, dtype=torch.float64)
    got1 = variance_normalize(torch.tensor(u1, dtype=torch.float64), m, 0.9)
    m1 = [0.1 * 12.5, 0.1 * 0.5, 0.1 * 1.0]                    # beta2 0.9 from zero: 0.1 x mean of squares
    assert m[:, 0].tolist() == pytest.approx(m1)
    torch.testing.assert_close(got1, torch.tensor(_rows_normalized(u1, m1, math.sqrt(28.0)),
                                                  dtype=torch.float64), rtol=1e-9, atol=1e-12)
    got2 = variance_normalize(torch.tensor(u2, dtype=torch.float64), m, 0.9)
    m2 = [0.9 * m1[0] + 0.1 * 0.5, 0.9 * m1[1] + 0.1 * 4.0, 0.9 * m1[2] + 0.1 * 4.5]
    assert m[:, 0].tolist() == pytest.approx(m2)
    torch.testing.assert_close(got2, torch.tensor(_rows_normalized(u2, m2, math.sqrt(18.0)),
                                                  dtype=torch.float64), rtol=1e-9, atol=1e-12)


def test_variance_normalization_of_a_wide_matrix_works_per_column_and_keeps_the_frobenius_norm():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(3, 5, generator=g, dtype=torch.float64)
    m = torch.zeros(1, 5, dtype=torch.float64)
    got = variance_normalize(u, m, 0.9)
    torch.testing.assert_close(m, 0.1 * u.square().mean(dim=0, keepdim=True))
    column_rms = got.square().mean(dim=0)                      # first step: every column ends equal
    torch.testing.assert_close(column_rms, column_rms.mean().expand(5))
    assert torch.linalg.matrix_norm(got).item() == pytest.approx(torch.linalg.matrix_norm(u).item())
    assert torch.count_nonzero(variance_normalize(torch.zeros(3, 5), torch.zeros(1, 5), 0.9)) == 0


def test_cautious_mask_by_hand():
    update = torch.tensor([[1.0, -1.0], [2.0, 0.0]])
    param = torch.tensor([[1.0, 1.0], [-1.0, 3.0]])
    assert cautious_mask(update, param).tolist() == [[True, False], [False, True]]


def test_muon_cautious_weight_decay_by_hand():
    """Momentum 0, diagonal gradient: the update is diag(m, m) > 0. Weight +1 agrees with it (decayed by
    lr * wd * lr_eff), weight -1 does not (not decayed)."""
    p = nn.Parameter(torch.tensor([[1.0, 0.0], [0.0, -1.0]], dtype=torch.float64))
    p.grad = torch.eye(2, dtype=torch.float64)
    Muon([p], lr=0.1, momentum=0.0, weight_decay=2.0, cautious_weight_decay=True).step()
    m = orthogonalize(torch.eye(2, dtype=torch.float64), dtype=torch.float64)[0, 0].item()
    expected = [[1.0 - 0.1 * 2.0 * 0.1 * 1.0 - 0.1 * m, 0.0], [0.0, -1.0 - 0.1 * m]]
    torch.testing.assert_close(p.detach(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=1e-7)


def test_muon_cautious_decay_leaves_the_groups_lr_factor_out_of_its_first_lr():
    """The records' decay of a matrix with an lr factor (record #88's c_proj: step lr_mul·2·lr, decay
    wd·lr · lr_mul·2·lr, L892-895): a group at lr 0.4 = 4 x 0.1 (``lr_mul`` 4, our mlp_proj_lr_mul) decays the
    agreeing weight by 0.1·2·0.4, not 0.4·2·0.4; the step is 0.4·m either way."""
    p = nn.Parameter(torch.tensor([[1.0, 0.0], [0.0, -1.0]], dtype=torch.float64))
    p.grad = torch.eye(2, dtype=torch.float64)
    Muon([{"params": [p], "lr": 0.4, "lr_mul": 4.0}], momentum=0.0, weight_decay=2.0,
         cautious_weight_decay=True).step()
    m = orthogonalize(torch.eye(2, dtype=torch.float64), dtype=torch.float64)[0, 0].item()
    expected = [[1.0 - 0.1 * 2.0 * 0.4 * 1.0 - 0.4 * m, 0.0], [0.0, -1.0 - 0.4 * m]]
    torch.testing.assert_close(p.detach(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=1e-7)


def test_the_mlp_lr_factors_reach_muon_as_lr_mul():
    from speedrun.model.config import build_model_config
    from speedrun.model.gpt import GPT

    model = GPT(build_model_config("tiny", {"n_layer": 2, "model_dim": 32, "n_head": 2, "head_dim": 16,
                                            "vocab_size": 64}))
    config = OptimConfig(muon_lr=0.023, mlp_proj_lr_mul=4.0, mlp_fc_lr_mul=0.5)
    muon = [o for o in build_optimizers(model, model.parameter_kinds(), config).optimizers if isinstance(o, Muon)][0]
    assert sorted((g["lr_mul"], round(g["lr"], 6)) for g in muon.param_groups) == [
        (0.5, 0.0115), (1.0, 0.023), (4.0, 0.092)]


def test_normuon_step_equalizes_rows_and_keeps_the_orthogonalized_norm():
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(8, 4, generator=g, dtype=torch.float64)
    p = nn.Parameter(torch.zeros(8, 4, dtype=torch.float64))
    p.grad = grad
    Muon([p], lr=0.01, momentum=0.0, normuon_beta2=0.9).step()
    step = -p.detach() / (0.01 * math.sqrt(8 / 4))             # the (8, 4) shape's lr multiplier
    ortho = orthogonalize(grad).double()
    assert torch.linalg.matrix_norm(step).item() == pytest.approx(torch.linalg.matrix_norm(ortho).item(),
                                                                 rel=1e-5)
    row_rms = step.square().mean(dim=1)
    torch.testing.assert_close(row_rms, row_rms.mean().expand(8), rtol=1e-5, atol=0)


def test_cautious_adam_without_decay_is_adam():
    g = torch.Generator().manual_seed(2)
    start = torch.randn(5, 3, generator=g, dtype=torch.float64)
    ours, ref = nn.Parameter(start.clone()), nn.Parameter(start.clone())
    opt = CautiousAdam([ours], lr=0.01, betas=(0.8, 0.95), eps=1e-10)
    ref_opt = torch.optim.Adam([ref], lr=0.01, betas=(0.8, 0.95), eps=1e-10)
    for _ in range(3):
        grad = torch.randn(5, 3, generator=g, dtype=torch.float64)
        ours.grad, ref.grad = grad.clone(), grad.clone()
        opt.step()
        ref_opt.step()
    torch.testing.assert_close(ours.detach(), ref.detach(), rtol=1e-8, atol=1e-10)


def test_cautious_adam_decay_by_hand():
    """One step from p = [2, -2, 3] with g = [1, 1, -1]: Adam's first update is sign(g) (up to eps); the
    step moves p[0] towards 0 (decayed by lr^2 * wd), p[1] and p[2] away (not decayed)."""
    p = nn.Parameter(torch.tensor([2.0, -2.0, 3.0], dtype=torch.float64))
    p.grad = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    CautiousAdam([p], lr=0.1, betas=(0.9, 0.99), eps=1e-12, weight_decay=3.0).step()
    step = 0.1 * math.sqrt(1 - 0.99) / (1 - 0.9) * (0.1 / math.sqrt(0.01))   # = lr · sign(g)
    expected = [2.0 - 0.01 * 3.0 * 2.0 - step, -2.0 - step, 3.0 + step]
    assert p.detach().tolist() == pytest.approx(expected, rel=1e-9)


def test_switches_reach_the_optimizers_and_are_checked_in_the_training_settings():
    model = nn.ModuleDict({"embed": nn.Embedding(10, 4), "blocks": nn.ModuleList([nn.Linear(4, 4, bias=False)])})
    kinds = {"embed.weight": "embed", "blocks.0.weight": "matrix"}
    adam, muon = build_optimizers(model, kinds, OptimConfig(normuon_beta2=0.9,
                                                            cautious_weight_decay=True)).optimizers
    assert isinstance(adam, CautiousAdam)
    assert muon.param_groups[0]["normuon_beta2"] == 0.9 and muon.param_groups[0]["cautious_weight_decay"]
    plain_adam, _ = build_optimizers(model, kinds, OptimConfig()).optimizers
    assert isinstance(plain_adam, torch.optim.AdamW)
    cfg = TrainConfig.from_dict({"normuon_beta2": 0.9, "cautious_weight_decay": True, "weight_decay": 1.2})
    assert (cfg.optimizer.normuon_beta2, cfg.optimizer.cautious_weight_decay) == (0.9, True)
    with pytest.raises(SpeedrunError, match="normuon_beta2"):
        TrainConfig.from_dict({"normuon_beta2": 1.0})
    with pytest.raises(SpeedrunError, match="cautious_weight_decay"):
        TrainConfig.from_dict({"cautious_weight_decay": "yes"})
    with pytest.raises(ValueError, match="normuon_beta2"):
        Muon([nn.Parameter(torch.zeros(2, 2))], normuon_beta2=1.5)


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (3, 32, 32)])
def test_variance_normalization_of_a_bf16_update_keeps_bf16_and_takes_its_statistics_in_fp32(shape):
    """The records keep the orthogonalized update in bf16 through NorMuon (record #88
    ``_apply_normuon_variance_reduction``: the means of squares in fp32, the scale cast to bf16): ours returns
    bf16, with the second moment as fp64 arithmetic on the same bf16 values gives it, and the update within one
    bf16 rounding of the exact result."""
    g = torch.Generator().manual_seed(3)
    u = torch.randn(shape, generator=g).to(torch.bfloat16)
    m_shape = (*shape[:-2], *second_moment_shape(shape))
    m, m64 = torch.full(m_shape, 0.01), torch.full(m_shape, 0.01, dtype=torch.float64)
    got = variance_normalize(u, m, 0.9)
    exact = variance_normalize(u.double(), m64, 0.9)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(m.double(), m64, rtol=1e-6, atol=0)
    torch.testing.assert_close(got.double(), exact, rtol=2 ** -7, atol=0)
    assert not torch.equal(got.double(), u.double())              # normalized, not passed through
