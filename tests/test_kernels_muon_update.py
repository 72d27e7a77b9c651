"""Muon's one-pass weight step on bf16 weights with their mantissa (speedrun.kernels.muon_update) against the
eager step it replaces on CUDA (``join_bf16``, :func:`speedrun.optim.muon.apply_update`, ``split_fp32_``): in
Triton's interpreter on the CPU (a child process, tests/triton_interpreter.py) and on CUDA (``gpu`` mark). Three
steps with cautious decay and a bf16 update (the records'), with decoupled decay and an fp32 update, and without
decay, at sizes that are no multiple of the kernel's block; the eager step is itself tested against the
records' formula in tests/test_muon_banks.py and tests/test_bf16_weights.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.optim.muon import apply_update, step_factors
from speedrun.optim.precision import join_bf16, split_fp32_
from triton_interpreter import interpreted_fixture

CASES = {  # name: (shape, update dtype, weight decay, cautious)
    "cautious-bf16": ((3, 96, 32), torch.bfloat16, 1.2, True),
    "decoupled-fp32": ((2, 40, 75), torch.float32, 0.3, False),
    "no-decay": ((1, 1, 1), torch.bfloat16, 0.0, False),
}
LR, DECAY_LR = 0.05, 0.02


def run_case(shape, update_dtype, weight_decay, cautious, fused, steps=3):
    """``steps`` weight steps of bf16 weights and their mantissa from one seed: the eager step or the kernel.
    Returns (weights bf16, mantissa int16)."""
    g = torch.Generator().manual_seed(shape[-1])
    precise = torch.randn(shape, generator=g) * 0.1
    p, mantissa = torch.empty(shape, dtype=torch.bfloat16), torch.empty(shape, dtype=torch.int16)
    split_fp32_(precise, p, mantissa)
    settings = (LR, weight_decay, cautious, DECAY_LR)
    for _ in range(steps):
        update = torch.randn(shape, generator=g).to(update_dtype)
        if fused:
            from speedrun.kernels.muon_update import muon_update_

            muon_update_(p, mantissa, update, *step_factors(shape, *settings))
        else:
            joined = join_bf16(p, mantissa)
            apply_update(joined, update, *settings)
            split_fp32_(joined, p, mantissa)
    return p.clone(), mantissa.clone()


def _interpreter_child(out_path: Path) -> None:
    torch.save({name: tuple(run_case(*case, fused=fused) for fused in (True, False))
                for name, case in CASES.items()}, out_path)


interpreted = interpreted_fixture(__file__)


def assert_same_step(fused, eager, case):
    """The kernel's fp32 weights against the eager step's: the same fp32 operations up to their rounding (the
    eager CPU add is a fused multiply-add, the interpreter's is not; on a GPU the kernel contracts both
    multiply-adds), so a few fp32 ulps of the step's operands (|x| <= 0.5, lr·|u| <= 0.25) apart, and many of
    them equal (H100: 46 % after three decoupled steps); the decay's term alone is about 1e-4."""
    (p, low), (p_ref, low_ref) = fused, eager
    got, want = join_bf16(p, low), join_bf16(p_ref, low_ref)
    assert ((got - want).abs() <= 4 * torch.finfo(torch.float32).eps * (want.abs() + 0.25)).all()
    assert (got == want).float().mean() > 0.25
    shape, update_dtype, decay, cautious = case
    start = run_case(shape, update_dtype, decay, cautious, fused=False, steps=0)
    assert not torch.equal(join_bf16(*start), want)                       # the steps moved the weights
    if decay:                                                               # and the decay moved them further
        assert not torch.equal(join_bf16(*run_case(shape, update_dtype, 0.0, cautious, fused=False)), want)


@pytest.mark.parametrize("name", list(CASES))
def test_interpreted_kernel_matches_the_eager_step(interpreted, name):
    fused, eager = interpreted[name]
    assert_same_step(fused, eager, CASES[name])


def test_step_factors_by_hand():
    # (rows, cols) = (4, 1): mu = 2; cautious: decay_lr * wd * lr * mu; decoupled: 1 - lr * wd
    assert step_factors((4, 1), 0.1, 2.0, True, 0.05) == pytest.approx((0.2, 0.05 * 2.0 * 0.2, 1.0))
    assert step_factors((4, 1), 0.1, 2.0, True) == pytest.approx((0.2, 0.1 * 2.0 * 0.2, 1.0))
    assert step_factors((1, 4), 0.1, 2.0, False) == pytest.approx((0.1, 0.0, 0.8))
    assert step_factors((1, 4), 0.1, 0.0, True) == (0.1, 0.0, 1.0)


def test_bad_arguments_raise_speedrun_error():
    pytest.importorskip("triton")
    from speedrun.kernels.muon_update import muon_update_

    p, low = torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int16)
    with pytest.raises(SpeedrunError, match="of one shape"):
        muon_update_(p, low, torch.zeros(5), 0.1, 0.0)
    with pytest.raises(SpeedrunError, match="mantissa int16"):
        muon_update_(p, low.to(torch.int32), torch.zeros(4), 0.1, 0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(CASES))
def test_cuda_kernel_matches_the_eager_step(name):
    from speedrun.kernels.muon_update import muon_update_

    shape, update_dtype, decay, cautious = CASES[name]
    eager = run_case(*CASES[name], fused=False)
    g = torch.Generator().manual_seed(shape[-1])
    precise = torch.randn(shape, generator=g) * 0.1
    p = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    low = torch.empty(shape, dtype=torch.int16, device="cuda")
    split_fp32_(precise.cuda(), p, low)
    for _ in range(3):
        update = torch.randn(shape, generator=g).to(update_dtype).cuda()
        muon_update_(p, low, update, *step_factors(shape, LR, decay, cautious, DECAY_LR))
    assert_same_step((p.cpu(), low.cpu()), eager, CASES[name])


if __name__ == "__main__":
    _interpreter_child(Path(sys.argv[1]))
