"""The one-sweep softcapped cross-entropy kernel (``one_sweep=True`` of
speedrun.kernels.softcapped_cross_entropy.softcapped_cross_entropy_kernel: each row read once and kept in
registers, one cap and one exponential per column; record #88's ce_fwd_bwd_kernel keeps the row on chip)
against float64 autograd and against the two-sweep kernel, for both softcap kinds, one target or four weighted
ones (record #88's TERMS: three multi-token terms and the prefix term, with a repeated target column and
dropped terms), and fp32, bf16 and e5m2 gradients.

Accuracy: the losses come from the fp32 sum of the exponentials, as the two-sweep kernel's: within 2e-6 of
float64. fp32 and bf16 gradients keep ``exp(y - c) · dy/dz`` in fp32: as the two-sweep kernel's, within
1e-5 relative of float64 (fp32) or half a bf16 step (2⁻⁸ relative) and at most one bf16 step from the
two-sweep kernel's (a tie broken the other way by the last fp32 bit; measured: 0.06% of the elements at most).
An e5m2 gradient keeps it in bf16 (relative error at most 2⁻⁸) before the final rounding: within half an e5m2
step (2⁻³ relative) plus 2⁻⁸ of float64 and at most one e5m2 step from the two-sweep kernel's (measured at
V = 50304: 0.5-0.8% of the elements other than float64 rounded to nearest, 0.0% for the two-sweep kernel).

Without a GPU the kernels run in Triton's interpreter in a child process (tests/triton_interpreter.py), each
case with one fixed config (CHUNK and warps: the interpreter cannot benchmark). The cases cover a row of
several pieces with a masked last piece of CHUNK columns, a last piece shorter than CHUNK (its own sum),
masked or exact, a row shorter than one piece, and the record's V = 50304 with the GPU's CHUNK 2048 and 8
warps. The child makes the interpreter's fp32 -> bf16 and fp32 -> e5m2 casts round to nearest even, as the
GPU does (Triton 3.9's interpreter truncates to bf16 and drops the exponent carry of a rounded-up e5m2
mantissa: 7860.5 becomes 4096). The e5m2 runs take the approximate-tanh path (the caps through tanh, the
folded exponent and slope of the FAST form) with an exact tanh: the kernel's ``_tanh_approx`` is
2·sigmoid(2x) - 1 in the interpreter, which cannot run inline PTX. Also there: the operator under
torch.compile(fullgraph=True), where Inductor calls the opaque one-sweep operator, equal to eager.

GPU (``gpu`` mark): record #88's call (T = 16384, V = 50304, shifted sigmoid, e5m2, four weighted terms)
through both kernels, and the bf16 gradient eager and compiled.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from speedrun.errors import SpeedrunError
from speedrun.model.config import CROSS_ENTROPY_IMPLS, GPTConfig
from speedrun.model.loss import gradient_bound, linear_cross_entropy, loss_terms, softcap_logits
from triton_interpreter import interpreted_results

KINDS = {"tanh": (15.0, "tanh"), "shifted_sigmoid": (23.0, "shifted_sigmoid")}
GRADS = ("fp32", "bf16", "e5m2")
WEIGHTINGS = ("unweighted", "weighted")
CASES = {  # name: (tokens, vocab, CHUNK, warps)
    "masked-last-piece": (5, 1000, 256, 4),           # 3 pieces of 256, then 232 columns in a masked 256
    "short-masked-tail": (5, 1100, 512, 4),           # 2 pieces of 512, then 76 columns in a masked 128
    "short-exact-tail": (4, 1152, 512, 4),            # 2 pieces of 512, then an exact 128
    "below-one-piece": (4, 300, 1024, 4),             # one masked piece of 512
    "record-vocab": (3, 50304, 2048, 8),              # 24 pieces of 2048, then 1152 columns in a masked 2048
}
E5M2_MUL = 28672.0          # the FP8 head's multiplier is this over gradient_bound (speedrun.model.loss)
MTP_WEIGHTS = (1.0, 0.5, 0.25)
PREFIX_WEIGHT = 0.3


def random_case(tokens: int, vocab: int, seed: int, weighted: bool):
    """fp32 logits (T, V) of spread 4 (some far above the cap); targets (T,) with the last in the last column,
    or with ``weighted`` record #88's terms (T, 4) and weights (T, 4) (:func:`loss_terms`: three multi-token
    terms, dropped past the end, and the prefix term, absent at one position), with row 0 naming one column in
    two terms and row 1's prefix term naming its next-token target."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, vocab, generator=g) * 4.0
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    targets[-1] = vocab - 1
    if not weighted:
        return logits, targets, None
    targets[1] = targets[0]
    prefix = torch.randint(0, vocab, (tokens,), generator=g)
    prefix[1], prefix[2] = targets[1], -1
    terms, weights = loss_terms(targets, torch.tensor(MTP_WEIGHTS), prefix, torch.tensor(PREFIX_WEIGHT))
    return logits, terms, weights


def reference(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None, softcap):
    """(losses (T,), d losses.sum() / d logits (T, V)) by float64 autograd: Σ_j w_j CE(y, target_j), or one
    target with weight 1."""
    z = logits.double().requires_grad_()
    logp = torch.log_softmax(softcap_logits(z, *softcap), dim=1)
    if weights is None:
        losses = F.nll_loss(logp, targets, reduction="none")
    else:
        losses = -(logp.gather(1, targets) * weights.double()).sum(1)
    (grad,) = torch.autograd.grad(losses.sum(), z)
    return losses.detach(), grad


def _round_casts_to_nearest_even() -> None:
    """In the child: the interpreter's fp32 -> bf16 and fp32 -> float8 e5m2 casts through torch's, which round
    to nearest even as the GPU does (see the module docstring)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float

    def convert(values, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype in (tl.bfloat16, tl.float8e5):
            to, bits, np_bits = ((torch.bfloat16, torch.int16, np.uint16) if output_dtype == tl.bfloat16
                                 else (torch.float8_e5m2, torch.uint8, np.uint8))
            x = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
            return x.to(to).view(bits).numpy().view(np_bits).reshape(values.shape)
        return original(values, input_dtype, output_dtype, rounding_mode)

    interpreter._convert_float = convert


def _interpreter_child(out_path: Path) -> None:
    """In the child (TRITON_INTERPRET=1): every case, kind, gradient dtype and weighting through the operator
    with both kernels, the one-sweep kernel also without the gradient; the no-softcap kind once with
    ``one_sweep``."""
    import triton

    from speedrun.kernels import softcapped_cross_entropy as module

    _round_casts_to_nearest_even()
    module._softcapped_ce_kernel.configs = [module._CONFIGS[0]]
    op = module.softcapped_cross_entropy_kernel
    results = {}
    for name, (tokens, vocab, chunk, warps) in CASES.items():
        for kernel in module._one_sweep_kernels.values():
            kernel.configs = [triton.Config({"CHUNK": chunk}, num_warps=warps)]
        for index, (kind, softcap) in enumerate(KINDS.items()):
            cap, code = softcap[0], module.SOFTCAP_KINDS[softcap[1]]
            for grad in GRADS:
                for weighting in WEIGHTINGS:
                    logits, targets, weights = random_case(tokens, vocab, 10 * index + len(name),
                                                           weighting == "weighted")
                    run = dict(logits=logits if grad == "fp32" else logits.bfloat16(), targets=targets,
                               weights=weights, norm=None, mul=3.0)
                    if grad == "e5m2":          # the FP8 head's multiplier and weight norm
                        run["mul"] = E5M2_MUL / gradient_bound(softcap)
                        if weights is not None:
                            run["norm"] = weights.abs().sum(1).amax()
                    for label, one in (("one", True), ("two", False)):
                        run[label] = op(run["logits"], targets, cap, code, True, run["mul"], grad == "e5m2",
                                        weights, run["norm"], one)
                    run["alone"] = op(run["logits"], targets, cap, code, False, 1.0, False, weights, None, True)[0]
                    results[(name, kind, grad, weighting)] = run
    logits, targets, _ = random_case(4, 1000, 0, False)
    results["no-softcap"] = dict(one=op(logits, targets, 0.0, 0, True, 3.0, False, None, None, True),
                                 two=op(logits, targets, 0.0, 0, True, 3.0, False, None, None, False))
    compiled = torch.compile(lambda *args: op(*args), fullgraph=True)
    for grad, weighting, kind in (("e5m2", "weighted", "shifted_sigmoid"), ("bf16", "unweighted", "tanh")):
        run = results[("short-masked-tail", kind, grad, weighting)]
        args = (run["logits"], run["targets"], KINDS[kind][0], module.SOFTCAP_KINDS[kind], True, run["mul"],
                grad == "e5m2", run["weights"], run["norm"], True)
        results[("compiled", grad)] = dict(eager=op(*args), compiled=compiled(*args))
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    return interpreted_results(__file__, tmp_path_factory.mktemp("interpreter"))


def _scaled_reference(run, softcap):
    """(losses, grad) of float64 autograd, the gradient times the run's multiplier (over its norm)."""
    want_losses, want_grad = reference(run["logits"].float(), run["targets"], run["weights"], softcap)
    mul = run["mul"] / (1.0 if run["norm"] is None else run["norm"].double().item())
    return want_losses, mul * want_grad


def _step(values: torch.Tensor, grad: str) -> torch.Tensor:
    """The spacing of the gradient dtype's values at each |value| (bf16: 8 significant bits, e5m2: 3; e5m2's
    subnormal spacing 2⁻¹⁶ below 2⁻¹⁴)."""
    bits, smallest = {"bf16": (8, 2.0 ** -133), "e5m2": (3, 2.0 ** -16)}[grad]
    exponent = torch.floor(torch.log2(values.abs().clamp_min(2.0 ** -126)))
    return torch.exp2(exponent - (bits - 1)).clamp_min(smallest)


ALL = [(case, kind, grad, weighting) for case in CASES for kind in KINDS for grad in GRADS for weighting in WEIGHTINGS]


@pytest.mark.parametrize("case,kind,grad,weighting", ALL)
def test_one_sweep_kernel_matches_float64_autograd(interpreted, case, kind, grad, weighting):
    run = interpreted[(case, kind, grad, weighting)]
    losses, got = run["one"]
    want_losses, want = _scaled_reference(run, KINDS[kind])
    label = f"{case} {kind} {grad} {weighting}"
    torch.testing.assert_close(losses.double(), want_losses, rtol=2e-6, atol=2e-6, msg=label)
    if grad == "e5m2":              # the e5m2 path's cap is the approximate tanh (here: the exact one)
        torch.testing.assert_close(run["alone"], losses, rtol=2e-6, atol=2e-6, msg=label)
    else:
        assert torch.equal(run["alone"], losses), f"{label}: the loss-only run differs"
    got = got.double()
    assert run["one"][1].dtype == {"fp32": torch.float32, "bf16": torch.bfloat16, "e5m2": torch.float8_e5m2}[grad]
    if grad == "fp32":
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * run["mul"], msg=label)
    elif grad == "bf16":            # half a bf16 step and fp32 rounding
        error = (got - want).abs()
        bound = (2 ** -8 + 2 ** -14) * want.abs() + 1e-6 * run["mul"]
        assert bool((error <= bound).all()), f"{label}: bf16 error {(error - bound).max():.3g} over the bound"
    else:                           # half an e5m2 step and the kept value's 2⁻⁸
        error = (got - want).abs()
        bound = (2 ** -3 + 2 ** -7) * want.abs() + 2 ** -17
        assert bool((error <= bound).all()), f"{label}: e5m2 error {(error - bound).max():.3g} over the bound"


@pytest.mark.parametrize("case,kind,grad,weighting", ALL)
def test_one_sweep_kernel_agrees_with_the_two_sweep_kernel(interpreted, case, kind, grad, weighting):
    run = interpreted[(case, kind, grad, weighting)]
    (losses, one), (losses2, two) = run["one"], run["two"]
    label = f"{case} {kind} {grad} {weighting}"
    torch.testing.assert_close(losses, losses2, rtol=2e-6, atol=2e-6, msg=label)
    assert one.dtype == two.dtype and one.shape == two.shape, label
    one, two = one.double(), two.double()
    if grad == "fp32":
        torch.testing.assert_close(one, two, rtol=1e-5, atol=1e-6 * run["mul"], msg=label)
    else:               # at most one step of the gradient's dtype apart
        apart = (one - two).abs()
        assert bool((apart <= _step(torch.maximum(one.abs(), two.abs()), grad)).all()), f"{label}: {apart.max():.3g}"


def test_one_sweep_flag_without_a_softcap_runs_the_two_sweep_kernel(interpreted):
    run = interpreted["no-softcap"]
    assert torch.equal(run["one"][0], run["two"][0]) and torch.equal(run["one"][1], run["two"][1])


@pytest.mark.parametrize("grad", ["e5m2", "bf16"])
def test_one_sweep_operator_under_torch_compile_equals_eager(interpreted, grad):
    """torch.compile(fullgraph=True) of the operator with ``one_sweep``: Inductor calls the opaque one-sweep
    operator inside it; the same losses and gradient, bit for bit (e5m2 weighted and normed, bf16 plain)."""
    run = interpreted[("compiled", grad)]
    for eager, compiled in zip(run["eager"], run["compiled"]):
        assert torch.equal(eager, compiled)


def test_one_sweep_kernel_refuses_a_row_longer_than_it_keeps_on_chip():
    from speedrun.kernels.softcapped_cross_entropy import ONE_SWEEP_MAX_VOCAB, softcapped_cross_entropy_kernel

    logits = torch.zeros(1, ONE_SWEEP_MAX_VOCAB + 1)
    with pytest.raises(SpeedrunError, match="one-sweep kernel keeps a row on chip"):
        softcapped_cross_entropy_kernel(logits, torch.zeros(1, dtype=torch.int64), 15.0, 1, True, 1.0, False,
                                        None, None, True)


def test_model_config_takes_the_fused_one_sweep_cross_entropy():
    assert "fused_one_sweep" in CROSS_ENTROPY_IMPLS
    assert GPTConfig(cross_entropy="fused_one_sweep").cross_entropy == "fused_one_sweep"
    with pytest.raises(SpeedrunError, match="model.cross_entropy must be one of .*fused_one_sweep"):
        GPTConfig(cross_entropy="one_sweep")


@pytest.mark.parametrize("kind", list(KINDS))
def test_fused_one_sweep_impl_equals_fused_off_cuda(kind):
    """Off CUDA both impls run the same PyTorch computation: loss and gradients bit for bit, weighted."""
    g = torch.Generator().manual_seed(3)
    x, weight = torch.randn(12, 16, generator=g), torch.randn(40, 16, generator=g)
    targets, prefix = torch.randint(0, 40, (12,), generator=g), torch.randint(-1, 40, (12,), generator=g)
    results = []
    for impl in ("fused", "fused_one_sweep"):
        xs, ws = x.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = linear_cross_entropy(xs, ws, targets, softcap=KINDS[kind][0], softcap_kind=KINDS[kind][1], impl=impl,
                                    mtp_weights=torch.tensor(MTP_WEIGHTS), prefix_targets=prefix,
                                    prefix_weight=torch.tensor(PREFIX_WEIGHT))
        loss.backward()
        results.append((loss.detach(), xs.grad, ws.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_one_sweep_kernel_matches_the_two_sweep_kernel_at_record88s_call():
    """T = 16384, V = 50304 bf16 logits, shifted sigmoid c = 23, e5m2 gradient with the FP8 head's multiplier
    and norm, four weighted terms: losses within 1e-4 nats of the two-sweep kernel's, gradients at most one
    e5m2 step apart, and the first 64 rows within half an e5m2 step plus the approximate tanh's 2⁻⁶ (as
    tests/test_kernels_softcapped_ce.py's bound) and the kept bf16's 2⁻⁸ of float64."""
    from speedrun.kernels.softcapped_cross_entropy import softcapped_cross_entropy_kernel

    softcap, (T, V) = KINDS["shifted_sigmoid"], (16384, 50304)
    g = torch.Generator(device="cuda").manual_seed(88)
    logits = (torch.randn(T, V, device="cuda", generator=g) * 4.0).bfloat16()
    targets, prefix = (torch.randint(lo, V, (T,), device="cuda", generator=g) for lo in (0, -1))
    terms, weights = loss_terms(targets, torch.tensor(MTP_WEIGHTS, device="cuda"), prefix,
                                torch.tensor(PREFIX_WEIGHT, device="cuda"))
    norm = weights.abs().sum(1).amax()
    mul = E5M2_MUL / gradient_bound(softcap)
    runs = [softcapped_cross_entropy_kernel(logits, terms, 23.0, 2, True, mul, True, weights, norm, one)
            for one in (True, False)]
    (losses, one), (losses2, two) = runs
    torch.testing.assert_close(losses, losses2, rtol=0, atol=1e-4)
    one, two = one.float(), two.float()
    apart = (one - two).abs()
    assert bool((apart <= _step(torch.maximum(one.abs(), two.abs()), "e5m2")).all())
    rows = slice(0, 64)
    _, want = reference(logits[rows].float().cpu(), terms[rows].cpu(), weights[rows].cpu(), softcap)
    want = want * mul / norm.item()
    error = (one[rows].double().cpu() - want).abs()
    bound = (2 ** -3 + 2 ** -6 + 2 ** -8) * want.abs() + 2 ** -14         # and the kept bf16's 2⁻⁸
    assert bool((error <= bound).all()), f"e5m2 error {(error - bound).max():.3g} over the bound"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", list(KINDS))
def test_cuda_one_sweep_bfloat16_gradient_eager_and_compiled(kind):
    """bf16 logits and gradient at V = 50304, one target: eager and under torch.compile(fullgraph=True),
    within 2⁻⁸ relative (norm) of float64 and at most one bf16 step from the two-sweep kernel."""
    from speedrun.model.loss import softcapped_cross_entropy

    logits, targets, _ = random_case(256, 50304, 7, weighted=False)
    logits, targets = logits.cuda().bfloat16(), targets.cuda()
    want_losses, want = reference(logits.float().cpu(), targets.cpu(), None, KINDS[kind])

    def one_sweep(z, t):
        return softcapped_cross_entropy(z, t, KINDS[kind], True, 2.0, one_sweep=True)

    _, two = softcapped_cross_entropy(logits, targets, KINDS[kind], True, 2.0)
    for label, fn in (("eager", one_sweep), ("compiled", torch.compile(one_sweep, fullgraph=True))):
        losses, grad = fn(logits, targets)
        assert grad.dtype == torch.bfloat16, label
        torch.testing.assert_close(losses.double().cpu(), want_losses, rtol=1e-5, atol=1e-5, msg=label)
        error = (grad.double().cpu() - 2.0 * want).norm() / (2.0 * want).norm()
        assert error < 2 ** -8, f"{label}: relative gradient error {error:.2e}"
        a, b = grad.double().cpu(), two.double().cpu()
        assert bool(((a - b).abs() <= _step(torch.maximum(a.abs(), b.abs()), "bf16")).all()), label


if __name__ == "__main__":
    _interpreter_child(Path(sys.argv[1]))
