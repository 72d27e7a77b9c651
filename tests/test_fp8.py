"""FP8 products (speedrun.model.fp8) against float64 references: the quantization error stays within what
e4m3's 3 mantissa bits allow, gradients are the bf16 ones, evaluation is never FP8, and the FP8 head in
both cross-entropy implementations agrees with the bf16 head."""

from __future__ import annotations

import pytest
import torch

from speedrun.model.fp8 import E4M3_MAX, HEAD_SCALES, FP8Linear, FP8Scales, fp8_linear, fp8_matmul, quantize
from speedrun.model.loss import linear_cross_entropy

# e4m3 rounds to 3 mantissa bits: relative error per element <= 2^-4; a product of two such values summed
# over K terms of random sign keeps a relative error of the whole matrix near 2^-4 / sqrt(3) ~ 0.036.
FP8_MATRIX_TOLERANCE = 0.06


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double(), ref.detach().double()
    return float((got - ref).norm() / ref.norm())


def test_quantize_maps_the_largest_magnitude_to_448_and_round_trips():
    t = torch.tensor([[0.5, -3.0], [1.25, 0.0]])
    t8, scale = quantize(t)
    assert t8.dtype == torch.float8_e4m3fn
    assert float(scale) == pytest.approx(3.0 / E4M3_MAX)
    assert float(t8.float().abs().max()) == E4M3_MAX
    torch.testing.assert_close(t8.float() * scale, t, rtol=2 ** -4, atol=0.0)
    zeros8, zero_scale = quantize(torch.zeros(3, 4))
    assert float(zero_scale) > 0 and not zeros8.float().any()


def test_fp8_matmul_is_close_to_the_float64_product():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 96, generator=g), torch.randn(48, 96, generator=g) * 0.02
    got = fp8_matmul(x, w)
    assert got.dtype == torch.bfloat16 and got.shape == (64, 48)
    err = rel_error(got, x.double() @ w.double().T)
    assert 1e-3 < err < FP8_MATRIX_TOLERANCE      # FP8 is really used (bf16 alone would be ~4e-3 at most)


def test_fp8_linear_gradients_are_the_bf16_products():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, 32, generator=g, requires_grad=True)
    w = torch.randn(48, 32, generator=g, requires_grad=True)
    out = fp8_linear(x, w)
    assert out.shape == (2, 16, 48)
    upstream = torch.randn(out.shape, generator=g)
    out.backward(upstream.to(out.dtype))
    up, xb, wb = (t.to(torch.bfloat16).double() for t in (upstream, x.detach(), w.detach()))
    assert x.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    assert rel_error(x.grad, up @ wb) < 1e-2
    assert rel_error(w.grad, up.reshape(-1, 48).T @ xb.reshape(-1, 32)) < 1e-2


def test_fp8_linear_module_is_plain_in_evaluation_and_fp8_in_training():
    torch.manual_seed(2)
    layer = FP8Linear(32, 16, fp8=True)
    x = torch.randn(8, 32)
    exact = x.double() @ layer.weight.double().T
    layer.eval()
    assert rel_error(layer(x), exact) < 1e-6                      # fp32 product, no quantization
    layer.train()
    trained = layer(x)
    assert trained.dtype == torch.bfloat16 and 1e-3 < rel_error(trained, exact) < FP8_MATRIX_TOLERANCE
    plain = FP8Linear(32, 16, fp8=False).train()
    assert rel_error(plain(x), x.double() @ plain.weight.double().T) < 1e-6
    assert isinstance(layer, torch.nn.Linear) and layer.bias is None


@pytest.mark.parametrize("impl", ["full", "chunked", "fused"])
def test_fp8_head_loss_and_gradients_agree_with_bf16(impl):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(48, 64, generator=g, requires_grad=True)
    w = (torch.randn(320, 64, generator=g) * 0.1).requires_grad_()
    targets = torch.randint(0, 320, (48,), generator=g)
    kwargs = dict(softcap=23.0, softcap_kind="shifted_sigmoid", impl=impl, chunk_tokens=16,
                  compute_dtype=torch.bfloat16)
    ref = linear_cross_entropy(x, w, targets, **kwargs)
    ref_grads = torch.autograd.grad(ref, (x, w))
    got = linear_cross_entropy(x, w, targets, fp8=True, **kwargs)
    grads = torch.autograd.grad(got, (x, w))
    assert float(got.detach()) == pytest.approx(float(ref.detach()), rel=2e-3)
    assert float(got.detach()) != float(ref.detach())                                # the FP8 path ran
    # "full" and "fused" compute the gradient products in FP8 too (e5m2 gradient); "chunked" in bf16.
    tolerance = 0.05 if impl == "chunked" else 0.12
    for a, b in zip(grads, ref_grads):
        assert rel_error(a, b) < tolerance


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_fp8_matmul_agrees_with_the_cpu_reference():
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(256, 768, generator=g), torch.randn(768, 768, generator=g) * 0.03
    cpu = fp8_matmul(x, w).double()
    gpu = fp8_matmul(x.cuda(), w.cuda()).cpu().double()
    assert rel_error(gpu, x.double() @ w.double().T) < FP8_MATRIX_TOLERANCE
    assert rel_error(gpu, cpu) < 1e-2          # same quantization; fast accumulation differs slightly


def test_fixed_scales_saturate_instead_of_overflowing():
    t = torch.tensor([0.5, -2.0, 1000.0])
    t8, scale = quantize(t, scale=1.0)
    assert float(scale) == 1.0
    assert t8.float().tolist() == [0.5, -2.0, E4M3_MAX]          # 1000 saturates to 448, not NaN
    g8, g_scale = quantize(torch.tensor([3e-3, -1.0]), None, torch.float8_e5m2)
    assert g8.dtype == torch.float8_e5m2 and float(g_scale) == pytest.approx(1.0 / 57344.0)


def test_head_scales_fp8_backward_is_close_to_the_float64_gradients():
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(64, 48, generator=g)).requires_grad_()                  # RMS-normalized scale
    w = (torch.randn(80, 48, generator=g) * 0.05).requires_grad_()
    upstream = torch.randn(64, 80, generator=g) * 1e-4                      # a mean loss's small gradients
    out = fp8_linear(x, w, HEAD_SCALES)
    out.backward(upstream.to(out.dtype))
    xd, wd, ud = x.detach().double(), w.detach().double(), upstream.double()
    assert 1e-3 < rel_error(out, xd @ wd.T) < FP8_MATRIX_TOLERANCE
    # e5m2 keeps 2 mantissa bits: 2^-3 per element, about 0.07 for a random-sign sum; the e4m3 operand adds
    # its 0.036.
    assert 1e-3 < rel_error(x.grad, ud @ wd) < 0.12
    assert 1e-3 < rel_error(w.grad, ud.T @ xd) < 0.12
    assert x.grad.dtype == torch.float32 and w.grad.dtype == torch.float32


def test_head_scales_are_the_records():
    assert HEAD_SCALES.x == pytest.approx(100 / 448) and HEAD_SCALES.weight == pytest.approx(1.6 / 448)
    assert HEAD_SCALES.backward and not FP8Scales().backward


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compiled", [False, True])
def test_cuda_head_fp8_forward_and_backward_agree_with_the_cpu(compiled):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(512, 768, generator=g)
    w = torch.randn(1024, 768, generator=g) * 0.02
    upstream = torch.randn(512, 1024, generator=g) * 1e-4
    results = {}
    for device in ("cpu", "cuda"):
        xd, wd = x.clone().to(device).requires_grad_(), w.clone().to(device).requires_grad_()   # leaves
        fn = torch.compile(fp8_linear) if compiled and device == "cuda" else fp8_linear
        out = fn(xd, wd, HEAD_SCALES)
        out.backward(upstream.to(device, out.dtype))
        results[device] = [t.detach().cpu() for t in (out, xd.grad, wd.grad)]
    for got, ref in zip(results["cuda"], results["cpu"]):
        assert rel_error(got, ref) < 2e-2          # same quantization; fast accumulation differs slightly
