"""The fused softcapped cross-entropy kernel (speedrun.kernels.softcapped_cross_entropy; records #60, #75, #79)
against the per-token loss and gradient of ``F.cross_entropy(softcap(z))`` computed by autograd in float64
from the same inputs, and against the PyTorch path of :func:`speedrun.model.loss.softcapped_cross_entropy`.

Accuracy: the kernel works in fp32 from the stored logits, so the losses agree with the float64 reference to
about 1e-6 relative; the gradient is rounded once to the logits' dtype (fp32 here; bf16 on the GPU, u = 2⁻⁹).
A wrong mask, a missed block, a wrong target column or softcap derivative gives errors of order 0.1-1.

Without a GPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, triton >= 3.7), set only in a
child process this file starts (running itself as a script), as tests/test_kernels_relu_square.py explains.
The cases cover a vocabulary smaller than one block of columns, one of several blocks with a ragged end, a
target in the last partial block, and every softcap kind. The e5m2 gradient is checked on the GPU only:
Triton 3.9's interpreter rounds fp32 to float8 e5m2 wrongly (7860.5 becomes 4096; torch gives 8192), and it
cannot run the approximate tanh (inline PTX) that the e5m2 path uses. The
GPU tests (``gpu`` mark) run bf16 at the
record's vocabulary, eager and under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from speedrun.model.loss import gradient_bound, softcap_logits, softcapped_cross_entropy
from triton_interpreter import interpreted_results

KINDS = {"none": None, "tanh": (15.0, "tanh"), "shifted_sigmoid": (23.0, "shifted_sigmoid")}
CONFIGS = (0, 3)          # indices into the kernel's autotune configs: BLOCK 2048 and 8192
CASES = {  # name: (tokens, vocab)
    "one-block": (7, 1000),
    "ragged": (5, 2 * 4096 + 37),
}


def random_case(tokens: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 logits (T, V) of spread 4 (some far above the cap), targets (T,) with one in the last column."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, vocab, generator=g) * 4.0
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    targets[-1] = vocab - 1
    return logits, targets


def reference(logits: torch.Tensor, targets: torch.Tensor, softcap) -> tuple[torch.Tensor, torch.Tensor]:
    """(losses (T,), dlosses.sum()/dlogits (T, V)) by float64 autograd."""
    z = logits.double().requires_grad_()
    capped = z if softcap is None else softcap_logits(z, *softcap)
    losses = F.cross_entropy(capped, targets, reduction="none")
    (grad,) = torch.autograd.grad(losses.sum(), z)
    return losses.detach(), grad


E5M2_MUL = 28672.0          # the FP8 head's choice: the gradient's bound maps to half of e5m2's largest value


def assert_e5m2_matches(grad8, logits, targets, softcap, grad_mul, label):
    """An e5m2 gradient: every element within half an e5m2 step (2⁻³ relative) of the reference plus 2⁻⁶
    relative for the approximate tanh of the e5m2 path (its 2⁻¹¹ relative error moves a capped logit by at
    most c·2⁻¹¹, 0.011 for c = 23, and a probability by about as much relative), or below e5m2's smallest
    normal value."""
    _, want = reference(logits, targets, softcap)
    want = (grad_mul * want).float()
    assert grad8.dtype == torch.float8_e5m2, label
    error = (grad8.float() - want).abs()
    bound = (2 ** -3 + 2 ** -6) * want.abs() + 2 ** -14
    assert bool((error <= bound).all()), f"{label}: e5m2 error {error.max():.3g}"


def assert_matches(losses, grad, logits, targets, softcap, grad_mul, label):
    want_losses, want_grad = reference(logits, targets, softcap)
    assert losses.dtype == torch.float32 and grad.dtype == logits.dtype, label
    torch.testing.assert_close(losses.double(), want_losses, rtol=2e-6, atol=2e-6, msg=label)
    torch.testing.assert_close(grad.double(), grad_mul * want_grad, rtol=1e-5, atol=1e-6 * grad_mul,
                               msg=label)


# ---------------------------------------------------------------- the PyTorch path (CPU)


@pytest.mark.parametrize("kind", list(KINDS))
def test_pytorch_path_matches_float64_autograd(kind):
    logits, targets = random_case(6, 300, seed=1)
    losses, grad = softcapped_cross_entropy(logits, targets, KINDS[kind], with_grad=True, grad_mul=2.5)
    assert_matches(losses, grad, logits, targets, KINDS[kind], 2.5, kind)
    alone, none = softcapped_cross_entropy(logits, targets, KINDS[kind])
    assert none is None and torch.equal(alone, losses)


@pytest.mark.parametrize("kind", list(KINDS))
def test_gradient_bound_holds_and_is_reached(kind):
    """The bound the FP8 head scales its e5m2 gradient by: never exceeded, and nearly reached."""
    logits = torch.linspace(-60, 60, 4001).repeat(3, 1)
    targets = torch.tensor([0, 2000, 4000])
    _, grad = reference(logits, targets, KINDS[kind])
    bound = gradient_bound(KINDS[kind])
    assert grad.abs().max() <= bound and grad.abs().max() > 0.5 * bound
    expected = {"none": 1.0, "tanh": 1.0, "shifted_sigmoid": 23.0 / 30.0}[kind]
    assert bound == pytest.approx(expected)


# ---------------------------------------------------------------- Triton interpreter (CPU, child process)


def _interpreter_child(out_path: Path) -> None:
    """In the child (TRITON_INTERPRET=1): every case and softcap kind, with and without the gradient, with
    the smallest and a large autotune config (one at a time: the interpreter cannot benchmark)."""
    from speedrun.kernels import softcapped_cross_entropy as module

    results = {}
    for config in CONFIGS:
        module._softcapped_ce_kernel.configs = [module._CONFIGS[config]]
        for name, (tokens, vocab) in CASES.items():
            for index, (kind, softcap) in enumerate(KINDS.items()):
                logits, targets = random_case(tokens, vocab, seed=index)
                cap, mode = (0.0, None) if softcap is None else softcap
                code = module.SOFTCAP_KINDS[mode]
                losses, grad = module.softcapped_cross_entropy_kernel(logits, targets, cap, code, True, 3.0)
                alone, empty = module.softcapped_cross_entropy_kernel(logits, targets, cap, code, False, 1.0)
                results[(config, name, kind)] = dict(logits=logits, targets=targets, losses=losses, grad=grad,
                                                     alone=alone, empty=empty)
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    return interpreted_results(__file__, tmp_path_factory.mktemp("interpreter"))


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_interpreted_kernel_matches_float64_reference(interpreted, config, case, kind):
    run = interpreted[(config, case, kind)]
    assert_matches(run["losses"], run["grad"], run["logits"], run["targets"], KINDS[kind], 3.0, f"{case} {kind}")
    assert torch.equal(run["alone"], run["losses"]) and run["empty"].numel() == 0


# ---------------------------------------------------------------- GPU (bf16, the record's vocabulary)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", list(KINDS))
def test_cuda_kernel_in_bfloat16_matches_the_reference_eager_and_compiled(kind):
    logits, targets = random_case(256, 50304, seed=7)
    logits = logits.cuda().bfloat16()
    want_losses, want_grad = reference(logits.float().cpu(), targets, KINDS[kind])
    compiled = torch.compile(lambda z, t: softcapped_cross_entropy(z, t, KINDS[kind], True, 2.0), fullgraph=True)
    for label, fn in (("eager", lambda z, t: softcapped_cross_entropy(z, t, KINDS[kind], True, 2.0)),
                      ("compiled", compiled)):
        losses, grad = fn(logits, targets.cuda())
        assert grad.dtype == torch.bfloat16, label
        torch.testing.assert_close(losses.double().cpu(), want_losses, rtol=1e-5, atol=1e-5, msg=label)
        error = (grad.double().cpu() - 2.0 * want_grad).norm() / (2.0 * want_grad).norm()
        assert error < 2 ** -8, f"{label}: relative gradient error {error:.2e}"
        mul = E5M2_MUL / gradient_bound(KINDS[kind])
        losses8, grad8 = softcapped_cross_entropy(logits, targets.cuda(), KINDS[kind], True, mul, e5m2=True)
        assert_e5m2_matches(grad8.cpu(), logits.float().cpu(), targets, KINDS[kind], mul, label)
        # the e5m2 path's losses come from the approximate tanh (with a cap): within 1e-3 nats
        torch.testing.assert_close(losses8.double().cpu(), want_losses, rtol=0, atol=1e-3, msg=label)


if __name__ == "__main__":
    _interpreter_child(Path(sys.argv[1]))
