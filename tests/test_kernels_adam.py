"""The one-pass cautious-Adam kernel (speedrun.kernels.adam) against CautiousAdam's eager update, the
reference it replaces on CUDA: in Triton's interpreter on the CPU (a child process, tests/triton_interpreter.py)
and on CUDA (``gpu`` mark). Three steps of fp32 and bf16 parameters, with and without cautious decay, a size
that is no multiple of the kernel's block; the eager update is itself tested against the records' formula in
tests/test_optim.py and tests/test_bf16_weights.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.optim.adam import CautiousAdam
from triton_interpreter import interpreted_fixture

CASES = {  # name: (numel, dtype, weight decay)
    "fp32-decay": (5000, torch.float32, 5.0),
    "bf16-decay": (2048 * 3 + 7, torch.bfloat16, 150.0),
    "bf16-no-decay": (1, torch.bfloat16, 0.0),
}
SETTINGS = dict(lr=0.05, betas=(0.75, 0.95), eps=1e-10)


def run_case(numel, dtype, weight_decay, fused, steps=3):
    """``steps`` steps of CautiousAdam from one seed: the eager update, or the kernel for every step."""
    g = torch.Generator().manual_seed(numel)
    p = torch.nn.Parameter((torch.randn(numel, generator=g) * 0.1).to(dtype))
    grads = [torch.randn(numel, generator=g).to(dtype) for _ in range(steps)]
    opt = CautiousAdam([p], weight_decay=weight_decay, **SETTINGS)
    for t, grad in enumerate(grads, 1):
        p.grad = grad
        if fused:
            from speedrun.kernels.adam import cautious_adam_

            state = opt.state[p]
            if not state:
                state.update(step=0, exp_avg=torch.zeros(numel), exp_avg_sq=torch.zeros(numel))
            state["step"] = t
            lr = SETTINGS["lr"]
            cautious_adam_(p.data, grad, state["exp_avg"], state["exp_avg_sq"], *SETTINGS["betas"], SETTINGS["eps"],
                           lr * (1 - 0.95 ** t) ** 0.5 / (1 - 0.75 ** t), lr * lr * weight_decay)
        else:
            opt.step()
    state = opt.state[p]
    return p.detach().clone(), state["exp_avg"].clone(), state["exp_avg_sq"].clone()


def _interpreter_child(out_path: Path) -> None:
    """Three steps for fp32 parameters; one for bf16 ones, since the interpreter's fp32 -> bf16 conversion
    truncates where the GPU's rounds to nearest even (so bf16 results may sit one ulp apart, which three
    steps would compound; the GPU test below takes three steps of bf16 too)."""
    results = {}
    for name, (numel, dtype, decay) in CASES.items():
        steps = 3 if dtype == torch.float32 else 1
        results[name] = tuple(run_case(numel, dtype, decay, fused, steps) for fused in (True, False))
    torch.save(results, out_path)


interpreted = interpreted_fixture(__file__)


def assert_same_update(fused, eager, case, steps=3, rounds_to_nearest=True):
    """The kernel's (p, m, v) against the eager update's, for a CASES entry after ``steps`` steps."""
    (p, m, v), (p_ref, m_ref, v_ref) = fused, eager
    numel, dtype, decay = case
    torch.testing.assert_close(m, m_ref, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(v, v_ref, rtol=1e-6, atol=1e-12)
    if dtype == torch.float32:                     # the same fp32 operations up to their order: a few ulps
        torch.testing.assert_close(p, p_ref, rtol=1e-6, atol=5e-8)
    else:                                          # one rounding to bf16 per step: at most one bf16 ulp apart
        ulp = torch.finfo(torch.bfloat16).eps * p_ref.float().abs()
        assert ((p.float() - p_ref.float()).abs() <= ulp).all()
        assert (p == p_ref).float().mean() > (0.99 if rounds_to_nearest else 0.2)
    if decay and numel > 1:                        # the cautious decay moved the result
        assert not torch.equal(p_ref, run_case(numel, dtype, 0.0, fused=False, steps=steps)[0])


@pytest.mark.parametrize("name", list(CASES))
def test_interpreted_kernel_matches_the_eager_update(interpreted, name):
    fused, eager = interpreted[name]
    fp32 = CASES[name][1] == torch.float32
    assert_same_update(fused, eager, CASES[name], steps=3 if fp32 else 1, rounds_to_nearest=fp32)


def test_bad_arguments_raise_speedrun_error():
    pytest.importorskip("triton")
    from speedrun.kernels.adam import cautious_adam_

    p, m = torch.zeros(4), torch.zeros(4)
    with pytest.raises(SpeedrunError, match="of one shape"):
        cautious_adam_(p, torch.zeros(5), m, m.clone(), 0.9, 0.95, 1e-8, 0.1, 0.0)
    with pytest.raises(SpeedrunError, match="fp32 moments"):
        cautious_adam_(p, p.clone(), m.to(torch.bfloat16), m.clone(), 0.9, 0.95, 1e-8, 0.1, 0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(CASES))
def test_cuda_step_takes_the_kernel_and_matches_the_eager_update(name):
    numel, dtype, decay = CASES[name]
    g = torch.Generator().manual_seed(1)
    p = torch.nn.Parameter((torch.randn(numel, generator=g) * 0.1).to(dtype))
    cuda = torch.nn.Parameter(p.detach().cuda())
    eager, fused = CautiousAdam([p], weight_decay=decay, **SETTINGS), CautiousAdam([cuda], weight_decay=decay,
                                                                                    **SETTINGS)
    for _ in range(3):
        grad = torch.randn(numel, generator=g).to(dtype)
        p.grad, cuda.grad = grad, grad.cuda()
        eager.step()
        fused.step()
    state, ref = fused.state[cuda], eager.state[p]
    assert_same_update((cuda.detach().cpu(), state["exp_avg"].cpu(), state["exp_avg_sq"].cpu()),
                       (p.detach(), ref["exp_avg"], ref["exp_avg_sq"]), CASES[name])


if __name__ == "__main__":
    _interpreter_child(Path(sys.argv[1]))
