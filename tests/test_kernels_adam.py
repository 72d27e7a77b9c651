"""The one-pass cautious-Adam kernel (speedrun.kernels.adam) against CautiousAdam's eager update, the
reference it replaces on CUDA: in Triton's interpreter on the CPU (a child process, tests/triton_interpreter.py)
and on CUDA (``gpu`` mark). Three steps of fp32 and bf16 parameters, with and without cautious decay, a size
that is no multiple of the kernel's block; the eager update is itself tested against the records' formula in
tests/test_optim.py and tests/test_bf16_weights.py (C-Optim's in tests/test_record87_optimizer.py). The
many-parameter launch (``cautious_adam_many_``, the step's small parameters) against the one-parameter kernel,
bit for bit. The two-pass C-Optim kernel (``cautious_adam_coptim_``, record #87) against the eager update with a
C-Optim group: random gradients (about half the signs agree, counted over three blocks), and a gradient that
turns against the momentum (no sign agrees: the mask mean clamped at 1e-3)."""

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
COPTIM_CASES = {  # name: (numel, dtype, weight decay, C-Optim strength, gradients: "random" or "against")
    "coptim-fp32": (5000, torch.float32, 5.0, 0.5, "random"),
    "coptim-bf16": (2048 * 3 + 7, torch.bfloat16, 5.0, 0.5, "random"),
    "coptim-fp32-against": (3000, torch.float32, 0.0, 0.5, "against"),
}
# in the interpreter, fp32 only: its bf16 rounding truncates (see _interpreter_child), and one step of bf16 agrees
# everywhere (m and g share their signs), so C-Optim would not move it; bf16 runs on the GPU (three steps)
INTERPRETED_COPTIM = [name for name, case in COPTIM_CASES.items() if case[1] == torch.float32]


def case_gradients(numel, dtype, steps, seed, kind="random"):
    """The parameter and ``steps`` gradients of a case: random; or "against", a gradient and then -0.05 times
    it, so that at the second step every coordinate's momentum (β1 0.75) still points the first way."""
    g = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter((torch.randn(numel, generator=g) * 0.1).to(dtype))
    grads = [torch.randn(numel, generator=g).to(dtype) for _ in range(steps)]
    if kind == "against":
        grads = [grads[0], (-0.05 * grads[0].float()).to(dtype)][:steps]
    return p, grads


def run_case(numel, dtype, weight_decay, fused, steps=3, coptim=0.0, kind="random"):
    """``steps`` steps of CautiousAdam from one seed (C-Optim of strength ``coptim`` where > 0): the eager
    update, or the kernel for every step."""
    p, grads = case_gradients(numel, dtype, steps, numel, kind)
    opt = CautiousAdam([{"params": [p], "coptim": coptim}], weight_decay=weight_decay, **SETTINGS)
    for t, grad in enumerate(grads, 1):
        p.grad = grad
        if fused:
            from speedrun.kernels.adam import cautious_adam_, cautious_adam_coptim_

            state = opt.state[p]
            if not state:
                state.update(step=0, exp_avg=torch.zeros(numel), exp_avg_sq=torch.zeros(numel))
            state["step"] = t
            lr = SETTINGS["lr"]
            args = (p.data, grad, state["exp_avg"], state["exp_avg_sq"], *SETTINGS["betas"], SETTINGS["eps"],
                    lr * (1 - 0.95 ** t) ** 0.5 / (1 - 0.75 ** t), lr * lr * weight_decay)
            if coptim:
                cautious_adam_coptim_(*args, coptim)
            else:
                cautious_adam_(*args)
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
    for name in INTERPRETED_COPTIM:
        numel, dtype, decay, coptim, kind = COPTIM_CASES[name]
        steps = 3 if kind == "random" else 2
        results[name] = tuple(run_case(numel, dtype, decay, fused, steps, coptim, kind) for fused in (True, False))
    results["many"] = run_many()
    torch.save(results, out_path)


MANY_SIZES = [(1, torch.float32), (2, torch.float32), (72, torch.bfloat16), (2049, torch.float32),
              (64 * 768, torch.bfloat16), (65536, torch.float32), (5, torch.bfloat16)]


def many_case(seed: int = 5):
    """Parameters of MANY_SIZES (numel, dtype) with gradients, fp32 moments and settings that differ per parameter
    (betas, eps, step size, decay), moments already warm."""
    g = torch.Generator().manual_seed(seed)
    params = [(torch.randn(n, generator=g) * 0.1).to(dtype) for n, dtype in MANY_SIZES]
    grads = [torch.randn(n, generator=g).to(dtype) for n, dtype in MANY_SIZES]
    moments = [(torch.randn(n, generator=g) * 0.1, torch.rand(n, generator=g) * 0.01) for n, _ in MANY_SIZES]
    hyper = [(0.9 - 0.05 * i, 0.95 + 0.005 * i, 1e-10 * (i + 1), 0.01 * (i + 1), 0.5 * i)
             for i in range(len(MANY_SIZES))]
    # fp32 values, as a GPU kernel receives its float arguments (the interpreter keeps them wider: one-ulp differences)
    return params, grads, moments, [tuple(float(torch.tensor(x, dtype=torch.float32)) for x in h) for h in hyper]


def run_many():
    """Two steps of ``cautious_adam_many_`` over :func:`many_case` and of ``cautious_adam_`` one parameter at a
    time: the parameters and moments of each."""
    from speedrun.kernels.adam import cautious_adam_, cautious_adam_many_

    out = {}
    for name in ("many", "one"):
        params, grads, moments, hyper = many_case()
        for _ in range(2):
            if name == "many":
                cautious_adam_many_(params, grads, [m for m, _ in moments], [v for _, v in moments], hyper)
            else:
                for p, grad, (m, v), h in zip(params, grads, moments, hyper):
                    cautious_adam_(p, grad, m, v, *h)
        out[name] = (params, moments)
    return out


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


def test_interpreted_many_parameter_launch_equals_one_launch_per_parameter(interpreted):
    """Parameters of 1 to 65,536 elements, fp32 and bf16 (two launches), each with its own settings: the same
    bits as the one-parameter kernel, and every parameter moved."""
    many, one = interpreted["many"]["many"], interpreted["many"]["one"]
    start, _, _, _ = many_case()
    for p, q, p0 in zip(many[0], one[0], start, strict=True):
        assert torch.equal(p, q) and not torch.equal(p, p0)
    for (m, v), (m1, v1) in zip(many[1], one[1], strict=True):
        assert torch.equal(m, m1) and torch.equal(v, v1)


def coptim_mask_mean(numel, dtype, steps, kind):
    """The fraction of coordinates whose eager step at the last of ``steps`` agrees in sign with the gradient (the
    C-Optim mask's mean, before its clamp), recomputed from the case's gradients."""
    _, grads = case_gradients(numel, dtype, steps, numel, kind)
    beta1, beta2 = SETTINGS["betas"]
    m, v = torch.zeros(numel), torch.zeros(numel)
    for grad in grads:
        m = beta1 * m + (1 - beta1) * grad.float()
        v = beta2 * v + (1 - beta2) * grad.float() ** 2
    return ((m / (v.sqrt() + SETTINGS["eps"]) * grads[-1].float()) > 0).float().mean().item()


@pytest.mark.parametrize("name", INTERPRETED_COPTIM)
def test_interpreted_coptim_kernel_matches_the_eager_coptim_update(interpreted, name):
    """The two-pass kernel against CautiousAdam's eager C-Optim update: the same moments and parameters (fp32: a
    few ulps), a mask mean of about one half over three blocks or of zero (every
    step against its gradient: the 1e-3 clamp), and a result that C-Optim moved (not the plain update's)."""
    fused, eager = interpreted[name]
    numel, dtype, decay, coptim, kind = COPTIM_CASES[name]
    steps = 3 if kind == "random" else 2
    assert_same_update(fused, eager, (numel, dtype, decay), steps=steps)
    mean = coptim_mask_mean(numel, dtype, steps, kind)
    if kind == "random":
        assert 0.3 < mean < 0.9
    else:
        assert mean == 0.0
    plain = run_case(numel, dtype, decay, fused=False, steps=steps, coptim=0.0, kind=kind)[0]
    assert not torch.equal(eager[0], plain)


def test_the_many_parameter_launch_rejects_a_large_or_mismatched_parameter():
    pytest.importorskip("triton")
    from speedrun.kernels.adam import MANY_MAX_NUMEL, cautious_adam_many_

    big, small = torch.zeros(MANY_MAX_NUMEL + 1), torch.zeros(3)
    with pytest.raises(SpeedrunError, match="parameter 1 must have at most 65536 elements"):
        cautious_adam_many_([small, big], [small, big], [small, big], [small, big], [(0.9, 0.95, 1e-8, 0.1, 0.0)] * 2)
    with pytest.raises(SpeedrunError, match="parameter 0 .*fp32 moments"):
        cautious_adam_many_([small], [small], [small.bfloat16()], [small], [(0.9, 0.95, 1e-8, 0.1, 0.0)])


def test_a_check_builds_its_message_only_when_it_fails():
    """``speedrun.kernels.require`` with a callable message (the per-step kernels' checks) calls it only to raise."""
    from speedrun.kernels import require

    require(True, lambda: 1 / 0)
    with pytest.raises(SpeedrunError, match="^built now$"):
        require(False, lambda: "built now")


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(COPTIM_CASES))
def test_cuda_coptim_step_takes_the_two_pass_kernel_and_matches_the_eager_update(name, monkeypatch):
    """CautiousAdam.step on CUDA with a C-Optim group (a small parameter too, which must not go to the
    many-parameter launch that has no mask): the two-pass kernel for each, the eager update's values."""
    import speedrun.optim.adam as adam
    from speedrun.kernels.adam import cautious_adam_coptim_

    numel, dtype, decay, coptim, kind = COPTIM_CASES[name]
    steps = 3 if kind == "random" else 2
    p, grads = case_gradients(numel, dtype, steps, numel, kind)
    small, small_grads = case_gradients(72, dtype, steps, 72, kind)
    calls = []
    monkeypatch.setattr(adam, "_FUSED_COPTIM", lambda *a: calls.append(a[0].numel()) or cautious_adam_coptim_(*a))
    on_cuda = [torch.nn.Parameter(q.detach().cuda()) for q in (p, small)]
    eager = CautiousAdam([{"params": [p, small], "coptim": coptim}], weight_decay=decay, **SETTINGS)
    fused = CautiousAdam([{"params": on_cuda, "coptim": coptim}], weight_decay=decay, **SETTINGS)
    for grad, small_grad in zip(grads, small_grads):
        p.grad, small.grad = grad, small_grad
        on_cuda[0].grad, on_cuda[1].grad = grad.cuda(), small_grad.cuda()
        eager.step()
        fused.step()
    assert calls == [numel, 72] * steps
    for q, ref, size in ((on_cuda[0], p, numel), (on_cuda[1], small, 72)):
        state, ref_state = fused.state[q], eager.state[ref]
        assert_same_update((q.detach().cpu(), state["exp_avg"].cpu(), state["exp_avg_sq"].cpu()),
                           (ref.detach(), ref_state["exp_avg"], ref_state["exp_avg_sq"]), (size, dtype, 0.0),
                           steps=steps)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_step_updates_the_small_parameters_in_one_launch_with_the_one_parameter_kernels_bits(monkeypatch):
    """CautiousAdam.step on CUDA: the small parameters through ``cautious_adam_many_`` (one launch per dtype pair),
    a large one through ``cautious_adam_``; the same bits as every parameter through ``cautious_adam_``."""
    import speedrun.optim.adam as adam

    params, grads, _, _ = many_case()
    params.append(torch.randn(200_000) * 0.1)
    grads.append(torch.randn(200_000))
    runs = {}
    for name, many in (("many", adam._FUSED_MANY), ("one", None)):
        monkeypatch.setattr(adam, "_FUSED_MANY", many)
        ps = [torch.nn.Parameter(p.cuda()) for p in params]
        opt = CautiousAdam([{"params": ps[:4], "weight_decay": 5.0}, {"params": ps[4:], "lr": 0.02}], **SETTINGS)
        calls = []
        if many is not None:
            monkeypatch.setattr(adam, "_FUSED_MANY", lambda *a: calls.append(len(a[0])) or many(*a))
        for _ in range(3):
            for p, grad in zip(ps, grads):
                p.grad = grad.cuda()
            opt.step()
        runs[name] = ([p.detach().cpu() for p in ps], calls)
    assert runs["many"][1] == [len(params) - 1] * 3
    assert all(torch.equal(a, b) for a, b in zip(runs["many"][0], runs["one"][0], strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_warm_up_compiles_the_kernels_and_changes_nothing():
    """CautiousAdam.warm_up (the training warm-up's) runs the kernels on scratch tensors (C-Optim's for a C-Optim
    group): no parameter and no state changes, and a step after it still updates every parameter."""
    params = [torch.nn.Parameter(torch.randn(n, device="cuda").to(dtype)) for n, dtype in
              ((5, torch.float32), (72, torch.bfloat16), (100_000, torch.bfloat16), (50_000, torch.bfloat16))]
    before = [p.detach().clone() for p in params]
    opt = CautiousAdam([{"params": params[:3]}, {"params": params[3:], "coptim": 0.5}], weight_decay=1.0,
                       **SETTINGS)
    opt.warm_up()
    assert all(torch.equal(p, b) for p, b in zip(params, before)) and not opt.state
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    assert all(not torch.equal(p, b) for p, b in zip(params, before))


if __name__ == "__main__":
    _interpreter_child(Path(sys.argv[1]))
