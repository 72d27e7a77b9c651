"""Muon's parameter banks: the batched orthogonalization and NorMuon normalization against the 2-D code looped
over the matrices, and whole banked Muon steps against a plain per-matrix implementation written here from the
formulas (float64 on CPU, to 1e-12); the grouping into banks; the per-parameter state as views of the bank
buffers and its round trip through state_dict."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from speedrun.optim.banks import make_banks, stack_padded, write_back
from speedrun.optim.muon import Muon, variance_normalize
from speedrun.optim.orthogonalize import orthogonalize

F64 = torch.float64


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


@pytest.mark.parametrize("method", ["newton_schulz", "polar_express"])
@pytest.mark.parametrize("shape", [(6, 16, 24), (5, 24, 16), (3, 12, 12), (2, 3, 7, 5)])
def test_batched_orthogonalization_equals_the_2d_code_looped(method, shape):
    stack = _randn(*shape, seed=0)
    stack[0] = 0.0                                           # a padding slot stays zero
    got = orthogonalize(stack, method, dtype=F64)
    flat = stack.reshape(-1, *shape[-2:])
    expected = torch.stack([orthogonalize(m, method, dtype=F64) for m in flat]).reshape(shape)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert torch.count_nonzero(got[0]) == 0


def test_orthogonalize_rejects_a_vector():
    with pytest.raises(ValueError, match="shape"):
        orthogonalize(torch.ones(4))


@pytest.mark.parametrize("shape", [(4, 12, 5), (4, 5, 12)])
def test_batched_variance_normalization_equals_the_2d_code_looped(shape):
    updates = [_randn(*shape, seed=1), _randn(*shape, seed=2)]
    rows, cols = shape[1:]
    moment_shape = (rows, 1) if rows >= cols else (1, cols)
    batched = torch.zeros(shape[0], *moment_shape, dtype=F64)
    single = [torch.zeros(moment_shape, dtype=F64) for _ in range(shape[0])]
    for update in updates:                                   # two steps: the EMA carries over
        got = variance_normalize(update, batched, 0.9)
        expected = torch.stack([variance_normalize(u, m, 0.9) for u, m in zip(update, single)])
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(batched, torch.stack(single), rtol=1e-12, atol=0)


def reference_muon_step(param, grad, state, lr, momentum, nesterov, weight_decay, method, beta2, cautious):
    """One Muon step of one (rows, cols) float64 matrix, written from the formulas of speedrun-spec.md 3.2."""
    rows, cols = param.shape
    buf = state.setdefault("buf", torch.zeros_like(param))
    buf.mul_(momentum).add_((1 - momentum) * grad)
    direction = (1 - momentum) * grad + momentum * buf if nesterov else buf.clone()
    u = orthogonalize(direction, method, dtype=F64)
    if beta2 is not None:
        dim = 1 if rows >= cols else 0
        m = state.setdefault("m", torch.zeros(rows if dim == 1 else 1, 1 if dim == 1 else cols, dtype=F64))
        m.mul_(beta2).add_((1 - beta2) * (u * u).mean(dim=dim, keepdim=True))
        n = u / torch.sqrt(m.clamp_min(1e-10))          # the records: clamp_min(1e-10).rsqrt()
        u = n * (torch.sqrt((u * u).sum()) / torch.sqrt((n * n).sum()))
    lr_eff = lr * math.sqrt(max(1.0, rows / cols))
    if cautious:
        param = param - lr * weight_decay * lr_eff * param * ((u * param) >= 0)
    else:
        param = param * (1 - lr * weight_decay)
    return param - lr_eff * u


SHAPES = [(16, 8), (16, 8), (8, 12), (16, 8), (8, 12), (10, 10)]          # banks of 3, 2 and 1


@pytest.mark.parametrize("settings", [
    dict(nesterov=True, weight_decay=0.0, method="polar_express", beta2=None, cautious=False),
    dict(nesterov=False, weight_decay=0.3, method="newton_schulz", beta2=None, cautious=False),
    dict(nesterov=True, weight_decay=1.2, method="polar_express", beta2=0.9, cautious=True),
    dict(nesterov=True, weight_decay=0.5, method="polar_express", beta2=0.95, cautious=False),
])
def test_banked_muon_steps_equal_a_per_matrix_reference(settings):
    params = [nn.Parameter(_randn(*s, seed=10 + i)) for i, s in enumerate(SHAPES)]
    reference = [p.detach().clone() for p in params]
    states = [{} for _ in params]
    opt = Muon(params, lr=0.02, momentum=0.9, nesterov=settings["nesterov"],
               weight_decay=settings["weight_decay"], orthogonalizer=settings["method"],
               normuon_beta2=settings["beta2"], cautious_weight_decay=settings["cautious"])
    for step in range(3):
        grads = [_randn(*s, seed=100 * step + i) for i, s in enumerate(SHAPES)]
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
        reference = [reference_muon_step(r, g, st, 0.02, 0.9, settings["nesterov"], settings["weight_decay"],
                                         settings["method"], settings["beta2"], settings["cautious"])
                     for r, g, st in zip(reference, grads, states)]
        for p, r in zip(params, reference):
            torch.testing.assert_close(p.detach(), r, rtol=1e-12, atol=1e-12)


def test_banks_group_equal_shapes_within_a_group_and_skip_parameters_without_gradients():
    a, b, c, d = (nn.Parameter(torch.zeros(4, 3)) for _ in range(4))
    e = nn.Parameter(torch.zeros(3, 4))
    f = nn.Parameter(torch.zeros(4, 3, dtype=F64))
    for p in (a, b, d, e, f):
        p.grad = torch.zeros_like(p)
    groups = [{"params": [a, e, b, c, f]}, {"params": [d]}]
    banks = make_banks(groups)
    assert [(bank.group_index, bank.params, bank.param_indices) for bank in banks] == [
        (0, (a, b), (0, 2)), (0, (e,), (1,)), (0, (f,), (4,)), (1, (d,), (0,))]
    assert banks[0].shape == (4, 3)
    with pytest.raises(ValueError, match="2-D"):
        make_banks([{"params": [nn.Parameter(torch.zeros(3))]}])


def test_stack_padded_and_write_back():
    tensors = [torch.full((2, 3), float(i), dtype=torch.bfloat16) for i in range(1, 4)]
    out = stack_padded(tensors, 5, (2, 3), torch.float32, torch.device("cpu"))
    assert out.dtype == torch.float32 and out.shape == (5, 2, 3)
    assert out[:, 0, 0].tolist() == [1.0, 2.0, 3.0, 0.0, 0.0]
    assert torch.count_nonzero(stack_padded([], 2, (2, 3), torch.float32, torch.device("cpu"))) == 0
    targets = [torch.zeros(2, 3) for _ in range(2)]
    write_back(targets, out)
    assert [t[1, 2].item() for t in targets] == [1.0, 2.0]


def _trained(normuon):
    params = [nn.Parameter(_randn(8, 4, seed=i)) for i in range(3)]
    opt = Muon(params, lr=0.01, momentum=0.9, normuon_beta2=normuon)
    for step in range(2):
        for i, p in enumerate(params):
            p.grad = _randn(8, 4, seed=50 + 10 * step + i)
        opt.step()
    return params, opt


def test_per_parameter_state_is_a_view_of_the_bank_buffers():
    params, opt = _trained(0.9)
    bank_state = next(iter(opt._bank_states.values()))
    for j, p in enumerate(params):
        assert opt.state[p]["momentum_buffer"].shape == (8, 4)
        assert opt.state[p]["second_moment"].shape == (8, 1)
        assert opt.state[p]["momentum_buffer"].data_ptr() == bank_state.momentum[j].data_ptr()


def test_state_dict_round_trip_continues_the_same_trajectory():
    params, opt = _trained(0.9)
    clone_params = [nn.Parameter(p.detach().clone()) for p in params]
    clone = Muon(clone_params, lr=0.01, momentum=0.9, normuon_beta2=0.9)
    clone.load_state_dict(copy.deepcopy(opt.state_dict()))
    for opt_, ps in ((opt, params), (clone, clone_params)):
        for i, p in enumerate(ps):
            p.grad = _randn(8, 4, seed=90 + i)
        opt_.step()
    for p, q in zip(params, clone_params):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=0)


def test_a_parameter_that_loses_its_gradient_keeps_its_state_and_value():
    params, opt = _trained(None)
    before = params[1].detach().clone()
    buffer = opt.state[params[1]]["momentum_buffer"].clone()
    params[1].grad = None
    params[0].grad, params[2].grad = _randn(8, 4, seed=7), _randn(8, 4, seed=8)
    opt.step()
    torch.testing.assert_close(params[1].detach(), before, rtol=0, atol=0)
    torch.testing.assert_close(opt.state[params[1]]["momentum_buffer"], buffer, rtol=0, atol=0)
    params[1].grad = _randn(8, 4, seed=9)                 # back in the bank, with its momentum
    opt.step()
    torch.testing.assert_close(opt.state[params[1]]["momentum_buffer"],
                               0.9 * buffer + 0.1 * _randn(8, 4, seed=9), rtol=1e-12, atol=1e-12)


def test_muon_reduces_nothing_itself_without_torch_distributed():
    params, opt = _trained(None)
    assert opt.communicator() is None and opt.self_reduced_parameters() == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_banked_muon_on_cuda_agrees_with_cpu_up_to_the_bf16_orthogonalization():
    """CUDA orthogonalizes in bf16 (CPU: fp32): the three steps' displacement agrees to a few percent; with
    Langevin noise, two CUDA runs agree exactly."""
    shapes = [(256, 64), (256, 64), (64, 128), (96, 96)]

    def run(device, noise):
        params = [nn.Parameter(_randn(*s, seed=20 + i).float().to(device)) for i, s in enumerate(shapes)]
        opt = Muon(params, lr=0.02, momentum=0.9, weight_decay=1.2, normuon_beta2=0.9,
                   cautious_weight_decay=True, langevin_noise=noise)
        for step in range(3):
            for i, p in enumerate(params):
                p.grad = _randn(*p.shape, seed=200 + 10 * step + i).float().to(device)
            opt.step()
        return [p.detach().cpu().double() for p in params]

    start = [_randn(*s, seed=20 + i).float().double() for i, s in enumerate(shapes)]
    for cpu, cuda, p0 in zip(run("cpu", 0.0), run("cuda", 0.0), start):
        assert torch.linalg.matrix_norm(cuda - cpu) < 0.05 * torch.linalg.matrix_norm(cpu - p0)
    for a, b in zip(run("cuda", 0.3), run("cuda", 0.3)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _compiled_against_eager(device: str, dtype: torch.dtype) -> tuple[list, list, int, int]:
    """Three steps of Muon (NorMuon, cautious decay, a group in 4-row blocks, β changing every step) eager and with
    ``compile``, from the same weights and gradients: (eager weights, compiled weights, graphs compiled by
    ``warm_up``, graphs compiled by the steps after it)."""
    from torch._dynamo.utils import counters

    shapes = [(16, 8)] * 3 + [(8, 8)] * 2
    runs = {}
    for compile in (False, True):
        params = [nn.Parameter(_randn(*s, seed=30 + i).to(device, dtype)) for i, s in enumerate(shapes)]
        opt = Muon([{"params": params[:3]}, {"params": params[3:], "block_rows": 4}], lr=0.02, momentum=0.9,
                   weight_decay=1.2, normuon_beta2=0.9, cautious_weight_decay=True, compile=compile)
        before = counters["stats"]["unique_graphs"]
        opt.warm_up()
        warmed = counters["stats"]["unique_graphs"]
        for step in range(3):
            for group in opt.param_groups:
                group["momentum"] = 0.85 + 0.05 * step               # the schedule's warm-up: no new graph
            for i, p in enumerate(params):
                p.grad = _randn(*p.shape, seed=300 + 10 * step + i).to(device, dtype)
            opt.step()
        runs[compile] = ([p.detach().double().cpu() for p in params], warmed - before,
                         counters["stats"]["unique_graphs"] - warmed)
    return runs[False][0], runs[True][0], runs[True][1], runs[True][2]


def test_compiled_bank_directions_equal_the_eager_ones_and_compile_only_in_warm_up():
    """Muon with ``compile`` (the training loop's on CUDA): the same steps as eager up to fp32 rounding (measured
    5e-7 of weights moved about 0.05 each), one graph per bank compiled by ``warm_up``, none by the steps."""
    eager, compiled, warm_graphs, step_graphs = _compiled_against_eager("cpu", torch.float32)
    assert (warm_graphs, step_graphs) == (2, 0)
    start = [_randn(*s, seed=30 + i).float().double() for i, s in enumerate([(16, 8)] * 3 + [(8, 8)] * 2)]
    for a, b, p0 in zip(eager, compiled, start, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=5e-6)
        assert (a - p0).abs().max() > 0.01


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_bank_directions_on_cuda_agree_with_eager_up_to_bf16():
    """On CUDA (bf16 orthogonalization, the records' bf16 weights with their mantissa): compiled and eager Muon
    agree to a small fraction of the displacement; warm_up compiles every graph the steps use."""
    eager, compiled, warm_graphs, step_graphs = _compiled_against_eager("cuda", torch.bfloat16)
    assert warm_graphs == 2 and step_graphs == 0
    start = [_randn(*s, seed=30 + i).bfloat16().double() for i, s in enumerate([(16, 8)] * 3 + [(8, 8)] * 2)]
    for a, b, p0 in zip(eager, compiled, start, strict=True):
        assert torch.linalg.matrix_norm(b - a) < 0.05 * torch.linalg.matrix_norm(a - p0)
