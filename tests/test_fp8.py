"""FP8 products (speedrun.model.fp8) against float64 references: the quantization error stays within what
e4m3's 3 mantissa bits allow, gradients are the bf16 ones, evaluation is never FP8, and the FP8 head in
both cross-entropy implementations agrees with the bf16 head. The per-step weight cache (issue 6): bit for bit
the per-call quantization when fresh, visibly stale when not refreshed, an error when never filled, one
compiled graph across refreshes, and a training run's losses unchanged by it."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch._dynamo.testing import CompileCounter

from speedrun.model.config import build_model_config
from speedrun.model.fp8 import (E4M3_MAX, HEAD_SCALES, FP8Linear, FP8Scales, FP8WeightCache, fp8_linear, fp8_matmul,
                                quantize, refresh_caches_, scaled_mm)
from speedrun.model.fp8_mlp import DelayedFP8WeightCache
from speedrun.model.gpt import GPT
from speedrun.model.loss import linear_cross_entropy
from speedrun.training.config import TrainConfig
from speedrun.training.loop import run_training
from synthetic_data import counting_documents, write_dataset
from test_train import QUICK

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


@pytest.mark.parametrize("b_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_cpu_scaled_mm_is_torchs_emulated_scaled_mm_bit_for_bit(b_dtype, out_dtype):
    """On a CPU ``scaled_mm`` computes the product itself, as torch's ``_scaled_mm`` does without oneDNN
    (whose FP8 loop takes seconds on a CPU without FP8 instructions): bit for bit torch's result, at shapes
    whose sums a blocked product would order differently (K 64 and 96, N 512)."""
    g = torch.Generator().manual_seed(0)
    for m, k, n in ((64, 64, 512), (33, 96, 80)):
        a8 = (3 * torch.randn(m, k, generator=g)).to(torch.float8_e4m3fn)
        b8 = (2 * torch.randn(n, k, generator=g)).to(b_dtype)
        a_scale, b_scale = torch.tensor(0.37), torch.tensor(1.9)
        with torch.backends.mkldnn.flags(enabled=False):
            torchs = torch._scaled_mm(a8, b8.t(), scale_a=a_scale, scale_b=b_scale, out_dtype=out_dtype)
        ours = scaled_mm(a8, a_scale, b8, b_scale, out_dtype=out_dtype)
        assert ours.dtype == out_dtype and torch.equal(ours, torchs)
        assert not torch.equal(ours, scaled_mm(a8, a_scale * 2, b8, b_scale, out_dtype=out_dtype))


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


# ---- the per-step weight cache (issue 6) -------------------------------------------------------------


def _forward_backward(fn, x: torch.Tensor, weight: torch.Tensor, upstream: torch.Tensor):
    """(output, dL/dx, dL/dW) of ``fn(x)`` with upstream gradient ``upstream``; fresh leaves each call."""
    x.grad = weight.grad = None
    out = fn(x)
    out.backward(upstream.to(out.dtype))
    return out.detach(), x.grad.clone(), weight.grad.clone()


def _equal(got, ref) -> bool:
    return all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))


def test_a_fresh_cache_gives_the_per_call_products_bit_for_bit():
    g = torch.Generator().manual_seed(10)
    layer = FP8Linear(32, 48, fp8=True)
    x = torch.randn(2, 8, 32, generator=g, requires_grad=True)
    upstream = torch.randn(2, 8, 48, generator=g)
    ref = _forward_backward(layer, x, layer.weight, upstream)
    layer.quantize_weight_()
    cache = layer.weight_cache
    w8, w_scale = quantize(layer.weight)                                   # the cache's contents, made here
    assert torch.equal(cache.w8.float(), w8.float()) and torch.equal(cache.w_scale, w_scale)
    assert cache.w_back.dtype == torch.bfloat16 and torch.equal(cache.w_back, layer.weight.detach().bfloat16())
    cache.enabled = True
    got = _forward_backward(layer, x, layer.weight, upstream)
    assert _equal(got, ref)
    assert 1e-3 < rel_error(got[0], x.detach().double() @ layer.weight.detach().double().T) < FP8_MATRIX_TOLERANCE


def test_a_bf16_weights_cache_keeps_no_bf16_copy_and_gives_the_per_call_products_bit_for_bit():
    """The records' bf16 weights: the cache stores w8 and its scale only, and hands out the weight itself as
    the bf16 backward's operand (no copy written per refresh); products and gradients as per call."""
    g = torch.Generator().manual_seed(13)
    layer = FP8Linear(32, 48, fp8=True).to(torch.bfloat16)
    x = torch.randn(16, 32, generator=g).bfloat16().requires_grad_()
    upstream = torch.randn(16, 48, generator=g)
    ref = _forward_backward(layer, x, layer.weight, upstream)
    layer.quantize_weight_()
    cache = layer.weight_cache
    w8, w_scale, w_back = cache.operands(layer.weight)
    assert cache.w_back.numel() == 0 and w_back.data_ptr() == layer.weight.data_ptr()
    assert torch.equal(w8.float(), quantize(layer.weight)[0].float()) and torch.equal(w_scale, quantize(layer.weight)[1])
    cache.enabled = True
    assert _equal(_forward_backward(layer, x, layer.weight, upstream), ref)
    layer.float().quantize_weight_()                                     # a wider weight: its bf16 copy again
    assert cache.w_back.dtype == torch.bfloat16 and torch.equal(cache.w_back, layer.weight.detach().bfloat16())


def test_a_cache_is_used_until_refreshed_and_never_in_evaluation():
    g = torch.Generator().manual_seed(11)
    layer = FP8Linear(32, 48, fp8=True)
    x = torch.randn(16, 32, generator=g)
    layer.quantize_weight_()
    layer.weight_cache.enabled = True
    before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(3.0).add_(0.01)
    assert torch.equal(layer(x), before)                                   # stale: the old weight is used
    layer.eval()
    assert rel_error(layer(x), x.double() @ layer.weight.double().T) < 1e-6   # evaluation: plain product
    layer.train().quantize_weight_()
    fresh = layer(x)
    layer.weight_cache.enabled = False
    assert torch.equal(fresh, layer(x)) and not torch.equal(fresh, before)


def test_a_switched_on_cache_never_filled_raises():
    layer = FP8Linear(32, 48, fp8=True)
    layer.weight_cache.enabled = True
    with pytest.raises(RuntimeError, match="quantize_fp8_weights"):
        layer(torch.randn(4, 32))
    assert layer.eval()(torch.randn(4, 32)).shape == (4, 48)                # evaluation needs no cache
    assert FP8Linear(32, 48, fp8=False).weight_cache is None
    model = GPT(build_model_config("tiny", {**TINY_GPT, "fp8_attention": True, "fp8_head": True}))
    model.use_fp8_weight_cache(True)
    with pytest.raises(RuntimeError, match="quantize_fp8_weights"):
        model(*_gpt_batch())


@pytest.mark.parametrize("impl", ["full", "chunked", "fused"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_heads_cached_weight_gives_the_per_call_loss_and_gradients_bit_for_bit(impl, dtype):
    g = torch.Generator().manual_seed(12)
    x = torch.randn(48, 64, generator=g, requires_grad=True)
    w = (torch.randn(320, 64, generator=g) * 0.1).requires_grad_()
    targets = torch.randint(0, 320, (48,), generator=g)
    kwargs = dict(softcap=23.0, softcap_kind="shifted_sigmoid", impl=impl, chunk_tokens=16, compute_dtype=dtype,
                  fp8=True)
    cache = FP8WeightCache(HEAD_SCALES)
    cache.refresh_(w)
    assert cache.w_back.dtype == torch.float8_e4m3fn and cache.w_back.shape == (64, 320)     # w8ᵀ (C, V)
    assert torch.equal(cache.w_back.float(), cache.w8.float().T)
    assert float(cache.w_scale) == pytest.approx(1.6 / 448)

    def loss_and_grads(fp8_weight):
        loss = linear_cross_entropy(x, w, targets, fp8_weight=fp8_weight, **kwargs)
        return (loss.detach(), *torch.autograd.grad(loss, (x, w)))

    ref = loss_and_grads(None)
    assert _equal(loss_and_grads(cache.operands(w)), ref)
    with torch.no_grad():
        w.add_(0.05)                        # a stale cache changes the result only through the weight's gradient
    assert torch.equal(loss_and_grads(cache.operands(w))[0], ref[0])
    cache.refresh_(w)
    assert _equal(loss_and_grads(cache.operands(w)), loss_and_grads(None))


# A GPT with every FP8 path; vocabulary and widths small for a CPU.
TINY_GPT = dict(vocab_size=64, n_layer=2, model_dim=32, n_head=2, head_dim=16, attention_backend="reference",
                logit_softcap=23.0, softcap_kind="shifted_sigmoid", loss_chunk_tokens=8)
ALL_FP8 = dict(fp8_attention=True, fp8_mlp=True, fp8_head=True)


class _CountOperators(TorchDispatchMode):
    """Counts the ATen operators dispatched inside it (each one a kernel launch or more on a GPU)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _buffers(cache: FP8WeightCache) -> list[torch.Tensor]:
    """The cache's buffers as bits (e4m3 as uint8), for comparing bit for bit."""
    return [b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b for b in cache.buffers()]


def test_refreshing_caches_together_writes_the_bits_of_refreshing_each_in_far_fewer_operators():
    """``refresh_caches_`` (the step's refresh, GPT.quantize_fp8_weights): eleven filled dynamic caches of bf16
    weights of one shape (an all-zero one among them: the minimum amax) go in one batch, two fp32 weights of
    another shape in a second (their bf16 backward copies too), and a head cache, a delayed cache, a lone shape and
    a first fill alone; every buffer equals what ``refresh_`` one by one writes. The eleven take a fixed handful of
    operators, not ten each."""
    gen = torch.Generator().manual_seed(3)
    weights = [torch.randn(32, 16, generator=gen).bfloat16() for _ in range(11)]
    weights += [torch.randn(16, 16, generator=gen) * 3, torch.randn(16, 16, generator=gen),
                torch.randn(48, 16, generator=gen).bfloat16()]
    kinds = [FP8WeightCache] * 14 + [lambda: FP8WeightCache(HEAD_SCALES), DelayedFP8WeightCache, FP8WeightCache]
    weights += [torch.randn(64, 16, generator=gen) * 0.01, torch.randn(32, 16, generator=gen), weights[0] * 2]
    pairs = [(kind(), w) for kind, w in zip(kinds, weights)]
    alone = [(kind(), w) for kind, w in zip(kinds, weights)]
    for (cache, w), (single, _) in zip(pairs[:-1], alone[:-1]):       # filled once from other values (the last: never)
        cache.refresh_(w * 0.5)
        single.refresh_(w * 0.5)
    assert [c.batchable(w) for c, w in pairs] == [True] * 14 + [False] * 3
    with torch.no_grad():
        for w in weights:
            w.add_(0.25)                                            # the step's update
        weights[4].zero_()
    refresh_caches_(pairs)
    for cache, w in alone:
        cache.refresh_(w)
    for (cache, _), (single, _) in zip(pairs, alone):
        assert all(torch.equal(a, b) for a, b in zip(_buffers(cache), _buffers(single), strict=True))
    zero = pairs[4][0]
    assert zero.w_scale.item() == pytest.approx(1e-12 / E4M3_MAX, rel=1e-6) and not zero.w8.float().any()
    with _CountOperators() as batch:
        refresh_caches_(pairs[:11])
    with _CountOperators() as one:
        refresh_caches_(pairs[:1])
    assert batch.count <= 20 < 11 * one.count, (batch.count, one.count)      # measured: 14 against 11 x 11


def _gpt_batch(tokens: int = 24, vocab: int = 64):
    g = torch.Generator().manual_seed(13)
    inputs = torch.randint(0, vocab, (tokens,), generator=g, dtype=torch.int32)
    return inputs, torch.randint(0, vocab, (tokens,), generator=g), torch.tensor([0, 10, tokens], dtype=torch.int32)


def _trained_looking_gpt(**overrides) -> GPT:
    torch.manual_seed(14)
    model = GPT(build_model_config("tiny", {**TINY_GPT, **ALL_FP8, **overrides}))
    with torch.no_grad():                                          # zero-initialized projections and head
        for name, p in model.named_parameters():
            if name.endswith(("o.weight", "proj.weight")) or name.startswith("lm_head"):
                p.normal_(0, 0.1)
    return model


def _loss_and_grads(model: GPT, forward=None):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = (model if forward is None else forward)(*_gpt_batch())
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("cross_entropy", ["chunked", "fused"])
def test_a_gpt_with_fresh_caches_trains_bit_for_bit_as_without(cross_entropy):
    model = _trained_looking_gpt(cross_entropy=cross_entropy)
    caches = [m for m in model.modules() if isinstance(m, FP8WeightCache)]
    assert len(caches) == 2 * 4 + 1            # per layer: stacked QKV, O, the MLP's two; and the head
    ref = _loss_and_grads(model)
    model.use_fp8_weight_cache(True)
    model.quantize_fp8_weights()
    assert all(c.enabled and c.w8.numel() > 0 for c in caches)
    assert _equal(_loss_and_grads(model), ref)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    assert torch.equal(_loss_and_grads(model)[0], ref[0])            # stale: the cached FP8 weights
    model.quantize_fp8_weights()
    cached = _loss_and_grads(model)
    model.use_fp8_weight_cache(False)
    assert _equal(cached, _loss_and_grads(model)) and not torch.equal(cached[0], ref[0])


def test_after_an_optimizer_step_and_a_state_dict_load_the_caches_hold_the_new_weights():
    """``after_optimizer_step`` refreshes switched-on caches (and the tied copy); ``load_state_dict`` into a
    model with filled caches refreshes them: the cached loss is then the per-call loss of the new weights."""
    model = _trained_looking_gpt(tie_embed_head=True)
    other = _trained_looking_gpt(tie_embed_head=True)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(15)) * 0.05)
    other.sync_tied_embedding()
    per_call = _loss_and_grads(other)[0]                     # caches off: per-call quantization
    model.use_fp8_weight_cache(True)
    model.quantize_fp8_weights()
    before = _loss_and_grads(model)[0]
    model.load_state_dict(other.state_dict())
    assert torch.equal(_loss_and_grads(model)[0], per_call) and not torch.equal(per_call, before)
    with torch.no_grad():                                    # an "update" of the head, the tied weight
        model.lm_head.weight.mul_(0.5)
    stale = _loss_and_grads(model)[0]
    model.after_optimizer_step()
    torch.testing.assert_close(model.embed.weight, model.lm_head.weight, rtol=0, atol=0)
    fresh = _loss_and_grads(model)[0]
    model.use_fp8_weight_cache(False)
    assert torch.equal(fresh, _loss_and_grads(model)[0]) and not torch.equal(fresh, stale)


def test_a_compiled_layer_reads_the_refreshed_cache_in_one_graph():
    g = torch.Generator().manual_seed(15)
    layer = FP8Linear(32, 48, fp8=True)
    x = torch.randn(16, 32, generator=g, requires_grad=True)
    upstream = torch.randn(16, 48, generator=g)
    layer.quantize_weight_()
    layer.weight_cache.enabled = True
    counter = CompileCounter()                                   # the "eager" backend: the same kernels
    compiled = torch.compile(layer, backend=counter, dynamic=False)
    assert _equal(_forward_backward(compiled, x, layer.weight, upstream),
                  _forward_backward(layer, x, layer.weight, upstream))
    with torch.no_grad():
        layer.weight.mul_(1.5)
    layer.quantize_weight_()                                     # in place: the graph's buffers
    got = _forward_backward(compiled, x, layer.weight, upstream)
    layer.weight_cache.enabled = False
    assert _equal(got, _forward_backward(layer, x, layer.weight, upstream))       # the per-call products
    assert counter.frame_count == 1


def test_a_compiled_gpt_reads_the_refreshed_cache_without_recompiling():
    model = _trained_looking_gpt(cross_entropy="fused")
    model.use_fp8_weight_cache(True)
    model.quantize_fp8_weights()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, dynamic=False)
    assert _equal(_loss_and_grads(model, compiled), _loss_and_grads(model))
    graphs = counter.frame_count             # on a CPU the loss's data-dependent branch splits the graph
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    model.quantize_fp8_weights()
    got = _loss_and_grads(model, compiled)
    model.use_fp8_weight_cache(False)
    assert _equal(got, _loss_and_grads(model))                            # the per-call quantization's
    assert counter.frame_count == graphs


@pytest.mark.parametrize("cross_entropy", ["chunked", "fused"])
def test_a_training_run_with_the_cache_logs_the_per_call_losses(cross_entropy, tmp_path, monkeypatch):
    shards, bos = write_dataset(tmp_path / "data", counting_documents(200), shard_tokens=16384)
    cfg = TrainConfig.from_dict({**QUICK, "model": {**QUICK["model"], **ALL_FP8, "cross_entropy": cross_entropy,
                                                    "logit_softcap": 23.0, "softcap_kind": "shifted_sigmoid"}})
    uses = []
    real_operands = FP8WeightCache.operands
    monkeypatch.setattr(FP8WeightCache, "operands", lambda self, w: uses.append(1) or real_operands(self, w))

    def train(name):
        uses.clear()
        result = run_training(cfg, variant=name, seed=0, shards_dir=shards, bos_dir=bos,
                              log_path=tmp_path / f"{name}.txt", env={})
        assert result.status == "complete"
        return [loss for _, _, loss in result.losses], len(uses)

    cached, cached_uses = train("cached")
    monkeypatch.setattr(GPT, "use_fp8_weight_cache", lambda self, on=True: None)     # per-call quantization
    per_call, per_call_uses = train("per_call")
    # 6 steps x 2 micro-batches x (2 layers x 4 caches + the head)
    assert (cached_uses, per_call_uses) == (6 * 2 * 9, 0)
    assert len(cached) == len(per_call) == 6 + 3
    assert cached == pytest.approx(per_call, rel=1e-6)
    assert all(math.isfinite(loss) for loss in cached)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compiled", [False, True])
def test_cuda_cached_weights_give_the_per_call_products(compiled):
    """On the GPU (``torch._scaled_mm`` on the tensor cores, optionally compiled), a fresh cache gives the
    per-call quantization's output and gradients, for a dynamic-scale FP8Linear and for the head's FP8
    backward, and a refresh in place is read by the same compiled graph."""
    torch.manual_seed(16)
    for scales in (None, HEAD_SCALES):
        layer = FP8Linear(768, 1024, fp8=True).cuda()
        if scales is not None:                                 # the head: fixed scales, FP8 backward
            layer.weight_cache = FP8WeightCache(scales).cuda()
            layer.forward = lambda x, layer=layer, scales=scales: fp8_linear(x, layer.weight, scales,
                                                                             cache=layer.weight_cache)
        with torch.no_grad():
            layer.weight.mul_(0.02 / layer.weight.std())
        x = torch.randn(512, 768, device="cuda", requires_grad=True)
        upstream = torch.randn(512, 1024, device="cuda") * 1e-4
        ref = _forward_backward(layer, x, layer.weight, upstream)            # cache off: per call
        layer.weight_cache.enabled = True
        layer.quantize_weight_()
        fn = torch.compile(layer) if compiled else layer
        assert _equal(_forward_backward(fn, x, layer.weight, upstream), ref)
        with torch.no_grad():
            layer.weight.mul_(1.5)
        layer.quantize_weight_()                               # in place: the compiled graph reads it
        layer.weight_cache.enabled = False
        fresh = _forward_backward(layer, x, layer.weight, upstream)
        layer.weight_cache.enabled = True
        assert _equal(_forward_backward(fn, x, layer.weight, upstream), fresh)
