"""Multi-token prediction with the shared head (record #53; speedrun-spec.md 2.5) in
:func:`speedrun.model.loss.linear_cross_entropy`: ``L_t = Σ_k w_k · CE(z_t, target_{t+k})``, terms past the
end of the micro-batch dropped, the loss the mean of L_t over the T positions.

References written here: a V = 5, T = 4 case with the log-softmax arithmetic spelled out in Python floats
(loss and the gradient rows of the last two positions, where terms are dropped), a float64 autograd
reference that slices the targets (``targets[k:]``) instead of padding them, run against every impl and
softcap kind; K = 1 with weight 1 (and a prefix weight 0) equals today's plain loss bit for bit (chunked,
fused) or to rounding (full); one compiled graph for every weight value. The Triton kernel runs in
Triton's interpreter on the CPU (a child process, see tests/triton_interpreter.py) against the float64
reference of its per-token losses and gradient, and on CUDA (``gpu`` mark) in bf16 and with the FP8 head.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from speedrun.model.loss import linear_cross_entropy, loss_terms, softcap_logits, softcapped_cross_entropy
from triton_interpreter import interpreted_results

IMPLS = ("full", "chunked", "fused")
KINDS = {"none": None, "tanh": (4.0, "tanh"), "shifted_sigmoid": (23.0, "shifted_sigmoid")}
LOGITS = [[0.0, 1.0, 2.0, 0.0, -1.0],       # z_t of the hand-computed case: T = 4 positions, V = 5
          [1.0, 0.0, 0.0, 3.0, 0.0],
          [-2.0, 0.5, 0.0, 1.0, 1.0],
          [0.0, 0.0, 0.0, 0.0, 2.0]]
TARGETS = [1, 3, 4, 0]


def hand_ce(t: int, j: int) -> float:
    """CE(z_t, j) = log Σ_v exp(z_tv) - z_tj, in Python floats."""
    return math.log(sum(math.exp(v) for v in LOGITS[t])) - LOGITS[t][j]


def hand_softmax(t: int) -> list[float]:
    total = sum(math.exp(v) for v in LOGITS[t])
    return [math.exp(v) / total for v in LOGITS[t]]


def identity_head() -> tuple[torch.Tensor, torch.Tensor]:
    """x = the logits themselves and W = I (V = C = 5), so that z = x Wᵀ = LOGITS and dL/dx = dL/dz."""
    return torch.tensor(LOGITS, dtype=torch.float64), torch.eye(5, dtype=torch.float64)


def reference_loss(x, w, targets, softcap, mtp_weights, prefix_targets=None, prefix_weight=None):
    """mean_t L_t in float64 by slicing: position t < T - k takes w_k · CE(z_t, targets[t + k])."""
    logits = x.double() @ w.double().T
    if softcap is not None:
        logits = softcap_logits(logits, *softcap)
    num = targets.size(0)
    per_position = torch.zeros(num, dtype=torch.float64)
    for k, weight in enumerate(mtp_weights.tolist()[:num]):
        ce = F.cross_entropy(logits[:num - k], targets[k:], reduction="none")
        per_position = per_position + F.pad(weight * ce, (0, k))
    if prefix_targets is not None:
        has = prefix_targets >= 0
        ce = F.cross_entropy(logits[has], prefix_targets[has], reduction="none")
        per_position = per_position.index_add(0, has.nonzero()[:, 0], float(prefix_weight) * ce)
    return per_position.mean()


def loss_and_grads(impl, x, w, targets, softcap=None, chunk=3, **auxiliary):
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss = linear_cross_entropy(xs, ws, targets, softcap=None if softcap is None else softcap[0],
                                softcap_kind="tanh" if softcap is None else softcap[1], impl=impl,
                                chunk_tokens=chunk, **auxiliary)
    loss.backward()
    return loss.detach(), xs.grad, ws.grad


# ---------------------------------------------------------------- hand-computed case (V = 5, T = 4)


@pytest.mark.parametrize("impl", IMPLS)
def test_three_token_loss_by_hand(impl):
    x, w = identity_head()
    weights = torch.tensor([1.0, 0.5, 0.25])
    # position t takes targets t, t+1, t+2 while they exist: 3, 3, 2 and 1 terms
    y0, y1, y2, y3 = TARGETS
    per_position = [hand_ce(0, y0) + 0.5 * hand_ce(0, y1) + 0.25 * hand_ce(0, y2),
                    hand_ce(1, y1) + 0.5 * hand_ce(1, y2) + 0.25 * hand_ce(1, y3),
                    hand_ce(2, y2) + 0.5 * hand_ce(2, y3),
                    hand_ce(3, y3)]
    loss, grad_x, _ = loss_and_grads(impl, x, w, torch.tensor(TARGETS), mtp_weights=weights)
    assert loss.item() == pytest.approx(sum(per_position) / 4, rel=1e-13)
    # dL/dz_2 = (1.5 · softmax - onehot(y2) - 0.5 · onehot(y3)) / 4: the dropped term takes no softmax share
    row2 = [1.5 * p for p in hand_softmax(2)]
    row2[y2] -= 1.0
    row2[y3] -= 0.5
    row3 = hand_softmax(3)
    row3[y3] -= 1.0
    torch.testing.assert_close(grad_x[2], torch.tensor(row2, dtype=torch.float64) / 4, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_x[3], torch.tensor(row3, dtype=torch.float64) / 4, rtol=1e-12, atol=1e-14)


def test_loss_terms_by_hand():
    targets = torch.tensor([7, 8, 9])
    terms, weights = loss_terms(targets, torch.tensor([1.0, 0.5]), torch.tensor([3, -1, 4]), torch.tensor(0.25))
    assert terms.tolist() == [[7, 8, 3], [8, 9, 0], [9, 0, 4]]
    assert weights.tolist() == [[1.0, 0.5, 0.25], [1.0, 0.5, 0.0], [1.0, 0.0, 0.25]]
    terms, weights = loss_terms(targets)
    assert terms.tolist() == [[7], [8], [9]] and weights.tolist() == [[1.0], [1.0], [1.0]]


@pytest.mark.parametrize("bad, match", [
    (dict(mtp_weights=torch.ones(2, 2)), "mtp_weights must be a"),
    (dict(mtp_weights=torch.ones(0)), "mtp_weights must be a"),
    (dict(prefix_targets=torch.zeros(4, dtype=torch.int64)), "go together"),
    (dict(prefix_weight=torch.tensor(0.5)), "go together"),
    (dict(prefix_targets=torch.zeros(3, dtype=torch.int64), prefix_weight=torch.tensor(0.5)), "prefix_targets must"),
])
def test_bad_auxiliary_inputs_raise(bad, match):
    x, w = identity_head()
    with pytest.raises(ValueError, match=match):
        linear_cross_entropy(x, w, torch.tensor(TARGETS), **bad)


# ---------------------------------------------------------------- float64 autograd reference, every impl


def random_case(tokens=11, vocab=37, dim=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, dim, generator=g, dtype=torch.float64)
    w = torch.randn(vocab, dim, generator=g, dtype=torch.float64)
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    if tokens > 6:
        targets[4] = targets[5] = targets[6]                          # repeated targets share a column
    return x, w, targets


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("impl,chunk", [("full", 0), ("chunked", 1), ("chunked", 4), ("fused", 0)])
@pytest.mark.parametrize("weights", [[1.0, 0.5, 0.25], [1.0, 0.3], [0.7, 0.0, -0.2, 0.1]])
def test_every_impl_matches_float64_autograd(kind, impl, chunk, weights):
    x, w, targets = random_case()
    mtp = torch.tensor(weights)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    want = reference_loss(xs, ws, targets, KINDS[kind], mtp)
    want_x, want_w = torch.autograd.grad(want, (xs, ws))
    loss, grad_x, grad_w = loss_and_grads(impl, x, w, targets, KINDS[kind], chunk, mtp_weights=mtp)
    torch.testing.assert_close(loss, want.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_x, want_x, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad_w, want_w, rtol=1e-10, atol=1e-12)


def test_a_horizon_longer_than_the_batch_keeps_what_fits():
    x, w, targets = random_case(tokens=3)
    mtp = torch.tensor([1.0, 0.5, 0.25, 0.125, 0.0625])
    want = reference_loss(x, w, targets, None, mtp)
    for impl in IMPLS:
        torch.testing.assert_close(linear_cross_entropy(x, w, targets, impl=impl, mtp_weights=mtp), want,
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", list(KINDS))
def test_one_token_with_weight_one_is_todays_loss_exactly(kind):
    x, w, targets = random_case(seed=4)
    prefix = torch.randint(-1, 37, (11,), generator=torch.Generator().manual_seed(9))
    variants = (dict(mtp_weights=torch.ones(1)),
                dict(mtp_weights=torch.ones(1), prefix_targets=prefix, prefix_weight=torch.tensor(0.0)))
    for impl, chunk in (("full", 0), ("chunked", 4), ("fused", 0)):
        today = loss_and_grads(impl, x, w, targets, KINDS[kind], chunk)
        for auxiliary in variants:
            got = loss_and_grads(impl, x, w, targets, KINDS[kind], chunk, **auxiliary)
            for a, b in zip(got, today):
                if impl == "full":          # log_softmax + gather, not F.cross_entropy's own reduction
                    torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15)
                else:
                    assert torch.equal(a, b), (impl, auxiliary.keys())


def test_bfloat16_products_agree_across_impls():
    x, w, targets = random_case(tokens=24, vocab=300, dim=16, seed=5)
    x, w = x.float(), w.float() * 0.3
    auxiliary = dict(mtp_weights=torch.tensor([1.0, 0.5, 0.25]),
                     prefix_targets=torch.randint(-1, 300, (24,), generator=torch.Generator().manual_seed(2)),
                     prefix_weight=torch.tensor(0.25))
    want = reference_loss(x, w, targets, KINDS["shifted_sigmoid"], **auxiliary)
    for impl in IMPLS:
        got = linear_cross_entropy(x, w, targets, softcap=23.0, softcap_kind="shifted_sigmoid", impl=impl,
                                   compute_dtype=torch.bfloat16, chunk_tokens=8, **auxiliary)
        assert got.dtype == torch.float32
        assert got.item() == pytest.approx(want.item(), rel=5e-3)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("impl", IMPLS)
def test_fp8_head_with_weighted_targets(impl):
    """The FP8 head: K = 1 with weight 1 is today's FP8 loss bit for bit; large weights (Σ|w| = 8, eight
    times the plain gradient's bound) stay finite in the e5m2 gradient and close to the bf16 loss."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(48, 64, generator=g)
    w = torch.randn(320, 64, generator=g) * 0.1
    targets = torch.randint(0, 320, (48,), generator=g)
    prefix = torch.randint(-1, 320, (48,), generator=g)
    options = dict(softcap=23.0, softcap_kind="shifted_sigmoid", impl=impl, chunk_tokens=16,
                   compute_dtype=torch.bfloat16)
    today = loss_and_grads_fp8(x, w, targets, fp8=True, **options)
    one = loss_and_grads_fp8(x, w, targets, fp8=True, mtp_weights=torch.ones(1), prefix_targets=prefix,
                             prefix_weight=torch.tensor(0.0), **options)
    for a, b in zip(one, today):
        if impl == "full":
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(a, b)
    heavy = dict(mtp_weights=torch.tensor([2.0, 2.0, 2.0]), prefix_targets=prefix, prefix_weight=torch.tensor(2.0))
    bf16 = loss_and_grads_fp8(x, w, targets, **heavy, **options)
    fp8 = loss_and_grads_fp8(x, w, targets, fp8=True, **heavy, **options)
    assert fp8[0].item() == pytest.approx(bf16[0].item(), rel=2e-3) and fp8[0].item() != bf16[0].item()
    for a, b in zip(fp8[1:], bf16[1:]):
        assert torch.isfinite(a).all() and relative_error(a, b) < (0.05 if impl == "chunked" else 0.12)


def loss_and_grads_fp8(x, w, targets, **options):
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss = linear_cross_entropy(xs, ws, targets, **options)
    return (loss.detach(), *torch.autograd.grad(loss, (xs, ws)))


def test_one_compiled_graph_serves_every_weight_value():
    from torch._dynamo.testing import CompileCounter

    x, w, targets = random_case()
    counter = CompileCounter()
    compiled = torch.compile(lambda mtp, pw: linear_cross_entropy(
        x, w, targets, impl="full", mtp_weights=mtp, prefix_targets=targets.flip(0), prefix_weight=pw),
        backend=counter, fullgraph=True)
    for step in range(3):
        mtp, pw = torch.tensor([1.0, 0.5, 0.25 - 0.1 * step]), torch.tensor(0.25 - 0.1 * step)
        want = reference_loss(x, w, targets, None, mtp, targets.flip(0), pw)
        torch.testing.assert_close(compiled(mtp, pw), want, rtol=1e-12, atol=1e-12)
    assert counter.frame_count == 1


# ---------------------------------------------------------------- the Triton kernel (interpreter, CUDA)

KERNEL_CASES = {  # name: (tokens, vocab, mtp weights, with a prefix)
    "three-ahead+prefix": (7, 1000, [1.0, 0.5, 0.25], True),
    "two-ahead-ragged": (5, 2 * 4096 + 37, [1.0, 0.3], False),
}


def kernel_case(tokens, vocab, mtp, prefix, seed):
    """fp32 logits (T, V) of spread 4, targets with repeats, the prefix of position 0 equal to target 1, and
    the weighted terms of :func:`loss_terms` for them."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, vocab, generator=g) * 4.0
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    targets[-1], targets[2] = vocab - 1, targets[1]
    prefix_targets = torch.randint(-1, vocab, (tokens,), generator=g) if prefix else None
    if prefix:
        prefix_targets[0], prefix_targets[1] = targets[1], -1
    terms, weights = loss_terms(targets, torch.tensor(mtp), prefix_targets,
                                torch.tensor(0.25) if prefix else None)
    return logits, terms, weights


def kernel_reference(logits, terms, weights, softcap):
    """(losses (T,), dlosses.sum()/dlogits (T, V)) of the weighted terms by float64 autograd."""
    z = logits.double().requires_grad_()
    y = z if softcap is None else softcap_logits(z, *softcap)
    ce = -torch.log_softmax(y, dim=1).gather(1, terms)                                  # (T, J)
    losses = (ce * weights.double()).sum(1)
    (grad,) = torch.autograd.grad(losses.sum(), z)
    return losses.detach(), grad


def _interpreter_child(out_path: Path) -> None:
    """In the child (TRITON_INTERPRET=1): each case and softcap kind, weighted, with a gradient divided by a
    norm of 2; and K = 1 with weight 1 (prefix weight 0) next to the plain kernel."""
    from speedrun.kernels import softcapped_cross_entropy as module

    module._softcapped_ce_kernel.configs = [module._CONFIGS[0]]
    results = {}
    for name, case in KERNEL_CASES.items():
        for index, (kind, softcap) in enumerate(KINDS.items()):
            logits, terms, weights = kernel_case(*case, seed=index)
            cap, mode = (0.0, None) if softcap is None else softcap
            code = module.SOFTCAP_KINDS[mode]
            losses, grad = module.softcapped_cross_entropy_kernel(logits, terms, cap, code, True, 3.0, False,
                                                                  weights, torch.tensor(2.0))
            plain = module.softcapped_cross_entropy_kernel(logits, terms[:, 0].contiguous(), cap, code, True, 3.0)
            unit = torch.zeros_like(weights)
            unit[:, 0] = 1.0
            one = module.softcapped_cross_entropy_kernel(logits, terms, cap, code, True, 3.0, False, unit)
            results[(name, kind)] = dict(logits=logits, terms=terms, weights=weights, losses=losses, grad=grad,
                                         plain=plain, one=one)
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    return interpreted_results(__file__, tmp_path_factory.mktemp("interpreter"))


@pytest.mark.parametrize("case", list(KERNEL_CASES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_interpreted_kernel_matches_float64_reference(interpreted, case, kind):
    run = interpreted[(case, kind)]
    want_losses, want_grad = kernel_reference(run["logits"], run["terms"], run["weights"], KINDS[kind])
    torch.testing.assert_close(run["losses"].double(), want_losses, rtol=2e-6, atol=4e-6)
    torch.testing.assert_close(run["grad"].double(), 1.5 * want_grad, rtol=1e-5, atol=2e-6)
    for got, want in zip(run["one"], run["plain"]):              # weights [1, 0, ...]: the plain kernel's bits
        assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_kernel_and_fp8_head_match_the_reference():
    logits, terms, weights = kernel_case(256, 50304, [1.0, 0.5, 0.25], True, seed=7)
    softcap = KINDS["shifted_sigmoid"]
    want_losses, want_grad = kernel_reference(logits.bfloat16().float(), terms, weights, softcap)
    z = logits.cuda().bfloat16()
    run = lambda z, t, w: softcapped_cross_entropy(z, t, softcap, True, 2.0, weights=w)  # noqa: E731
    for label, fn in (("eager", run), ("compiled", torch.compile(run, fullgraph=True))):
        losses, grad = fn(z, terms.cuda(), weights.cuda())
        torch.testing.assert_close(losses.double().cpu(), want_losses, rtol=1e-5, atol=1e-4, msg=label)
        error = (grad.double().cpu() - 2.0 * want_grad).norm() / (2.0 * want_grad).norm()
        assert error < 2 ** -8, f"{label}: relative gradient error {error:.2e}"
    # the whole loss on CUDA: fused (FP8 head, e5m2 gradient divided by the weights' norm) against chunked bf16
    g = torch.Generator().manual_seed(8)
    x = torch.randn(512, 128, generator=g).cuda()
    w = (torch.randn(50304, 128, generator=g) * 0.05).cuda()
    targets = torch.randint(0, 50304, (512,), generator=g).cuda()
    auxiliary = dict(mtp_weights=torch.tensor([1.0, 0.5, 0.25]).cuda(),
                     prefix_targets=torch.randint(-1, 50304, (512,), generator=g).cuda(),
                     prefix_weight=torch.tensor(0.25).cuda())
    results = {}
    for impl, fp8 in (("chunked", False), ("fused", False), ("fused", True)):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        loss = linear_cross_entropy(xs, ws, targets, softcap=23.0, softcap_kind="shifted_sigmoid", impl=impl,
                                    compute_dtype=torch.bfloat16, fp8=fp8, **auxiliary)
        loss.backward()
        results[(impl, fp8)] = (loss.item(), xs.grad, ws.grad)
    want_loss, want_x, want_w = results[("chunked", False)]
    for key, (loss, grad_x, grad_w) in results.items():
        tolerance = 3e-2 if key[1] else 1e-2                      # FP8 logits: e4m3's 2⁻⁴ relative
        assert loss == pytest.approx(want_loss, rel=tolerance / 10), key
        for got, want in ((grad_x, want_x), (grad_w, want_w)):
            assert ((got - want).norm() / want.norm()).item() < tolerance * 5, key


if __name__ == "__main__":
    _interpreter_child(Path(sys.argv[1]))
