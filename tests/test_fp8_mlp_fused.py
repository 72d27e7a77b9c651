"""The fused FP8 ReLU² MLP (speedrun.model.fp8_mlp, speedrun.kernels.relu_square_mlp; records #84, #89).

On the CPU: the delayed scales' bookkeeping against hand-computed amax sequences (post: the previous
forward's amax · 1.80/448, the first forward at 1.0; W2: the previous refresh's amax · 1.12/448 after the
bootstrap refreshes at the weight's own amax/448), saturation at 448 when the amax grows past the headroom,
and the plain PyTorch reference against the float64 MLP within FP8 tolerance, forward and gradients. Exact
cases use values that e4m3 represents exactly: powers of two times the amax (448 = 1.75·2⁸).

In Triton's interpreter (CPU, a child process, ``slow`` mark; tests/triton_interpreter.py): the FP8 up
projection with every autotune config against float64 (post, the tile amaxes, post8 and its saturation), and
its variant without the FP8 down product (post alone) against it.

On CUDA (``gpu`` mark): the Triton kernel against the reference at the record's shape (T=16384, C=768,
F=3072), forward and the input and weight gradients, eager and under torch.compile(fullgraph=True).
"""

from __future__ import annotations

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model.config import build_model_config
from speedrun.model.fp8 import E4M3, E4M3_MAX, quantize
from speedrun.model.fp8_mlp import DelayedFP8WeightCache, fp8_mlp_reference, next_post_scale
from speedrun.model.gpt import GPT
from speedrun.model.mlp import MLP
from triton_interpreter import config_runs, interpreted_fixture, save_every_config

# e4m3 keeps 3 mantissa bits: x, W1, post and W2 each rounded (<= 2^-4 relative per element) gives a whole-
# matrix relative error of a few percent against the exact product (0.066 in test_model_switches).
FP8_TOLERANCE = 0.1
FUSED = {"fp8_mlp": True, "mlp_kernel": "triton"}


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double(), ref.detach().double()
    return float((got - ref).norm() / ref.norm())


def diagonal_mlp(dim: int = 64) -> MLP:
    """The fused FP8 MLP of the tiny preset (C=64, F=256) with W1 = W2ᵀ = [I 0]: pre[t, j] = x[t, j] for
    j < C, so post = relu(x)² and out = post, all exact in e4m3 for powers of two."""
    mlp = MLP(build_model_config("tiny", FUSED)).train()
    with torch.no_grad():
        eye = torch.eye(dim, mlp.fc.weight.size(0))
        mlp.fc.weight.copy_(eye.t())
        mlp.proj.weight.copy_(eye)
    return mlp


def test_the_post_scale_is_the_previous_forwards_amax_times_the_headroom():
    mlp = diagonal_mlp()
    assert float(mlp.post_scale) == 1.0                                 # HEAD's initial scale
    outs, scales = [], []
    for peak in (2.0, 4.0, 1.0):                                         # amax(post) = 4, 16, 1
        x = torch.zeros(8, 64)
        x[0, 0], x[1, 1], x[2, 2] = peak, peak / 2, peak / 4
        outs.append(mlp(x))
        scales.append(float(mlp.post_scale))
    for got, amax in zip(scales, (4.0, 16.0, 1.0)):
        assert got == pytest.approx(amax * 1.80 / 448, rel=1e-6)
    # forward 1 at scale 1.0: post = 4, 1, 0.25 exactly
    torch.testing.assert_close(outs[0][[0, 1, 2], [0, 1, 2]].float(), torch.tensor([4.0, 1.0, 0.25]))
    # forward 2 at scale 4·1.8/448: post 16 saturates at 448·scale = 7.2 (bf16: 7.1875); 4 and 1 round in e4m3
    got = outs[1][[0, 1, 2], [0, 1, 2]].detach().float()
    assert float(got[0]) == pytest.approx(7.2, rel=2 ** -8)
    torch.testing.assert_close(got[1:], torch.tensor([4.0, 1.0]), rtol=2 ** -4, atol=0)
    # forward 3 at scale 16·1.8/448: post 1, 0.25, 0.0625 inside the range
    torch.testing.assert_close(outs[2][[0, 1, 2], [0, 1, 2]].float(), torch.tensor([1.0, 0.25, 0.0625]),
                               rtol=2 ** -4, atol=0)
    assert not outs[2].float()[3:].any()


def test_without_the_fp8_down_projection_post_leaves_in_bf16_and_no_delayed_scale_exists():
    """fp8_mlp_down false (records #84-#88): with the diagonal weights (x = 3, -2, 1.5 exact in e4m3 at the
    per-tensor scale 3/448), post = relu(x)² = 9, 0, 2.25 leaves unquantized in bf16, where the FP8 down
    projection's delayed post scale (here 1/64, which saturates e4m3 at 448/64 = 7) clips it; proj is no FP8
    layer, has no weight cache, and the module keeps no post scale (nothing reads one)."""
    mlp = MLP(build_model_config("tiny", {**FUSED, "fp8_mlp_down": False})).train()
    with torch.no_grad():
        eye = torch.eye(64, mlp.fc.weight.size(0))
        mlp.fc.weight.copy_(eye.t())
        mlp.proj.weight.copy_(eye)
    x = torch.zeros(8, 64)
    x[0, 0], x[1, 1], x[2, 2] = 3.0, -2.0, 1.5                    # relu(x)² = 9, 0, 2.25: bf16-exact
    out = mlp(x)
    assert not mlp.proj.fp8 and mlp.fc.fp8
    assert mlp.proj.weight_cache is None and not hasattr(mlp, "post_scale")
    assert out.dtype == torch.bfloat16
    assert (out[0, 0].item(), out[1, 1].item(), out[2, 2].item()) == (9.0, 0.0, 2.25)
    fp8_down = MLP(build_model_config("tiny", FUSED)).train()
    fp8_down.load_state_dict(mlp.state_dict())
    fp8_down.post_scale.fill_(1 / 64)
    assert fp8_down(x)[0, 0].item() == 7.0                       # post8 saturates at 448 x 1/64 = 7


def test_without_the_fp8_down_projection_the_reference_needs_no_w2_operands():
    """fp8_mlp_down false: the reference takes no W2 cache and no post scale (w2 itself in bf16), returns no
    amax, and gives the result of the call with W2's bf16 operand, gradients included; with the FP8 down
    product, missing operands are an error that names them."""
    x, w1, w2, g_out = random_mlp_inputs()
    results = []
    for w2_fp8 in (None, operands(w2)):
        xs, w1s, w2s = (t.clone().bfloat16().requires_grad_() for t in (x, w1, w2))
        out, amax = fp8_mlp_reference(xs, w1s, w2s, operands(w1), w2_fp8, None, down_fp8=False)
        assert amax is None
        results.append((out, *torch.autograd.grad(out, (xs, w1s, w2s), g_out.bfloat16())))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(SpeedrunError, match="needs w2_fp8 and post_scale"):
        fp8_mlp_reference(x, w1, w2, operands(w1), None, None)


def test_evaluation_is_bf16_and_leaves_the_post_scale_alone():
    mlp = diagonal_mlp()
    x = torch.randn(8, 64)
    plain = MLP(build_model_config("tiny", {"mlp_kernel": "triton"}))
    plain.load_state_dict(mlp.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(mlp.eval()(x), plain.eval()(x), rtol=0, atol=0)
    assert float(mlp.post_scale) == 1.0
    assert "post_scale" not in mlp.state_dict()                           # checkpoints do not see the switch


def test_next_post_scale_keeps_an_all_zero_post_positive():
    assert float(next_post_scale(torch.tensor(0.0))) == pytest.approx(1e-12 * 1.8 / 448)
    assert float(next_post_scale(torch.tensor(448.0), headroom=1.0)) == 1.0


def test_the_w2_scale_is_delayed_after_the_bootstrap_refreshes():
    cache = DelayedFP8WeightCache(bootstrap_refreshes=1)
    w = torch.zeros(4, 16)
    used = []
    for amax in (2.0, 4.0, 1.0):                                        # the weight's amax at each refresh
        w[0, 0], w[1, 1] = amax, amax / 2
        cache.refresh_(w)
        used.append(float(cache.w_scale))
        if amax == 4.0:                                               # delayed 2·1.12/448: 4 saturates
            assert float(cache.w8[0, 0].float()) == E4M3_MAX
            assert float(cache.w8[0, 0].float() * cache.w_scale) == pytest.approx(2.24, rel=1e-6)
    assert used == pytest.approx([2.0 / 448, 2.0 * 1.12 / 448, 4.0 * 1.12 / 448], rel=1e-6)
    assert float(cache.next_scale) == pytest.approx(1.12 / 448, rel=1e-6)
    assert cache.refreshes == 3 and cache.w8.dtype == E4M3
    torch.testing.assert_close(cache.w_back, w.bfloat16())


def test_the_default_bootstrap_covers_17_refreshes():
    cache = DelayedFP8WeightCache()
    for step in range(18):
        cache.refresh_(torch.full((2, 16), float(step + 1)))           # the weight grows every step
        want = (step + 1) / 448 if step < 17 else 17 * 1.12 / 448
        assert float(cache.w_scale) == pytest.approx(want, rel=1e-6), step


def random_mlp_inputs(tokens=48, dim=64, hidden=256, seed=0):
    """x ~ N(0, 1) (a normed residual stream), W1 ~ N(0, 0.5²/C) (record #5's scale), W2 ~ N(0, 1/F)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, dim, generator=g)
    w1 = torch.randn(hidden, dim, generator=g) * 0.5 / dim ** 0.5
    w2 = torch.randn(dim, hidden, generator=g) / hidden ** 0.5
    return x, w1, w2, torch.randn(tokens, dim, generator=g)


def float64_mlp(x, w1, w2, g_out):
    x, w1, w2 = (t.detach().double().requires_grad_() for t in (x, w1, w2))
    out = torch.relu(x @ w1.t()).square() @ w2.t()
    return (out, *torch.autograd.grad(out, (x, w1, w2), g_out.double()))


def operands(w: torch.Tensor):
    w8, scale = quantize(w)
    return w8, scale, w.bfloat16()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_reference_is_the_float64_mlp_within_fp8_tolerance(dtype):
    x, w1, w2, g_out = random_mlp_inputs()
    ref = float64_mlp(x, w1, w2, g_out)
    post_amax = float((torch.relu(x.double() @ w1.double().t()) ** 2).max())
    xs, w1s, w2s = (t.to(dtype).requires_grad_() for t in (x, w1, w2))
    post_scale = torch.tensor(post_amax * 1.8 / 448)
    out, amax = fp8_mlp_reference(xs, w1s, w2s, operands(w1), operands(w2), post_scale)
    grads = torch.autograd.grad(out, (xs, w1s, w2s), g_out.to(dtype))
    assert out.dtype == torch.bfloat16 and [g.dtype for g in grads] == [dtype] * 3
    assert float(amax) == pytest.approx(post_amax, rel=0.15)               # post from e4m3 x and W1
    errors = [rel_error(got, want) for got, want in zip((out, *grads), ref)]
    assert 1e-3 < errors[0] < FP8_TOLERANCE, errors                       # FP8 is really used
    assert max(errors[1:]) < FP8_TOLERANCE, errors


def test_the_fp8_mlp_matches_the_bf16_mlp_and_a_fresh_cache_changes_nothing():
    fp8 = MLP(build_model_config("tiny", FUSED)).train()
    torch.nn.init.normal_(fp8.proj.weight, std=fp8.proj.weight.size(1) ** -0.5)
    plain = MLP(build_model_config("tiny", {"mlp_kernel": "triton"})).train()
    plain.load_state_dict(fp8.state_dict())
    x, _, _, g_out = random_mlp_inputs()
    results = {}
    for name, mlp, cached in (("per_call", fp8, False), ("cached", fp8, True), ("plain", plain, False)):
        fp8.post_scale.fill_(0.02)
        fp8.fc.weight_cache.enabled = fp8.proj.weight_cache.enabled = cached
        if cached:
            fp8.fc.quantize_weight_()
            fp8.proj.quantize_weight_()                                   # bootstrap: the weight's amax/448
        xi = x.clone().requires_grad_()
        out = mlp(xi)
        results[name] = (out, *torch.autograd.grad(out, (xi, mlp.fc.weight, mlp.proj.weight), g_out))
    for got, want in zip(results["cached"], results["per_call"]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for got, want in zip(results["per_call"], results["plain"]):
        assert rel_error(got, want) < FP8_TOLERANCE


def test_a_gpt_with_the_fused_fp8_mlp_refreshes_the_delayed_w2_cache_and_trains_like_bf16():
    small = dict(vocab_size=48, n_layer=2, model_dim=16, n_head=2, head_dim=8, attention_backend="reference")
    torch.manual_seed(0)
    fp8 = GPT(build_model_config("tiny", {**small, **FUSED}))
    plain = GPT(build_model_config("tiny", {**small, "mlp_kernel": "triton"}))
    plain.load_state_dict(fp8.state_dict())
    for model in (fp8, plain):
        for block in model.modules():
            if isinstance(block, MLP):
                torch.nn.init.normal_(block.proj.weight, std=0.2)
    caches = [m.proj.weight_cache for m in fp8.modules() if isinstance(m, MLP)]
    assert len(caches) == 2 and all(isinstance(c, DelayedFP8WeightCache) for c in caches)
    fp8.use_fp8_weight_cache(True)
    fp8.quantize_fp8_weights()
    assert all(c.enabled and c.refreshes == 1 for c in caches)
    g = torch.Generator().manual_seed(1)
    inputs, targets = torch.randint(0, 48, (32,), generator=g), torch.randint(0, 48, (32,), generator=g)
    cu_seqlens = torch.tensor([0, 32], dtype=torch.int32)
    losses = [float(m.train()(inputs, targets, cu_seqlens, 32).detach()) for m in (fp8, plain)]
    assert losses[0] == pytest.approx(losses[1], rel=0.02)
    assert all(float(m.post_scale) != 1.0 for m in fp8.modules() if isinstance(m, MLP))


def test_fp8_casts_work_on_this_cpu():
    t = torch.tensor([1.0, 448.0, 0.0625, -3.5])
    torch.testing.assert_close(t.to(E4M3).float(), t, rtol=0, atol=0)


# ----------------------------------------------------------- Triton interpreter (CPU, child process)

# name -> (tokens, C, F): partial last tiles with K = 128 (a multiple of BLOCK_K), and K = 96 (masked K)
INTERPRETED = {"tiles": (160, 128, 288), "odd_k": (77, 96, 200)}


def _interpreter_child(out_path) -> None:
    """In the child (TRITON_INTERPRET=1): the FP8 up projection of each case with each autotune config, at
    a post scale small enough that the largest values saturate; inputs and results saved to out_path."""
    from speedrun.kernels import relu_square_mlp as kernels

    def run_case(index, config, case):
        tokens, dim, hidden = case
        x, w1, _, _ = random_mlp_inputs(tokens, dim, hidden, seed=index)
        (x8, x_scale), (w8, w_scale) = quantize(x), quantize(w1)
        post_scale = torch.tensor(0.004)                                  # 448 · 0.004 = 1.79: some saturate
        got = kernels.relu_square_matmul_fp8(x8, w8, x_scale * w_scale, post_scale)
        up = kernels.relu_square_matmul_fp8_up(x8, w8, x_scale * w_scale)   # the same kernel, post alone
        return {"inputs": (x8, x_scale, w8, w_scale, post_scale), "got": got, "up": up}

    save_every_config(out_path, kernels._FP8_CONFIGS, [kernels._relu_square_fp8_kernel], INTERPRETED, run_case)


interpreted = interpreted_fixture(__file__)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(INTERPRETED))
def test_interpreted_fp8_kernel_matches_float64_with_every_config(interpreted, case):
    for _, run in config_runs(interpreted, case):                     # every autotune config ran
        x8, x_scale, w8, w_scale, post_scale = run["inputs"]
        post, post8, partial_amax = run["got"]
        pre = (x8.double() * float(x_scale)) @ (w8.double() * float(w_scale)).t()
        want = torch.relu(pre).square()
        assert post.dtype == torch.bfloat16 and post8.dtype == E4M3
        assert rel_error(post, want) < 5 * 2 ** -9                         # bf16 rounding of post
        assert float(partial_amax.max()) == pytest.approx(float(want.max()), rel=1e-2)
        limit = E4M3_MAX * float(post_scale)
        saturated = want > limit * 1.07                                   # beyond the rounding to 448
        assert saturated.any() and (post8.float()[saturated] == E4M3_MAX).all()
        # The interpreter's float8 cast drops the carry of a round-up into the next binade (127 -> 64, 7.9 ->
        # 4; the GPU's cvt does not): leave out the values whose correct rounding is such a carry.
        exact8 = (want / float(post_scale)).clamp(max=E4M3_MAX).float().to(E4M3).double()
        carry = (exact8 > want / float(post_scale)) & (torch.frexp(exact8)[0] == 0.5)
        kept = ~carry
        assert carry.float().mean() < 0.1 and kept.float().mean() > 0.9
        torch.testing.assert_close(post8.double()[kept], exact8[kept], rtol=2 ** -3, atol=2 ** -9)
        assert rel_error(post8.double()[kept] * float(post_scale), want.clamp(max=limit)[kept]) < 2 ** -4
        # records #84-#88's up projection alone (no e4m3 post, no amax): the same post, bit for bit
        assert run["up"].dtype == torch.bfloat16 and torch.equal(run["up"], post)


# ---------------------------------------------------------------------------------------------- CUDA


def cuda_inputs(tokens: int, dim: int = 768, hidden: int = 3072):
    x, w1, w2, g_out = random_mlp_inputs(tokens, dim, hidden, seed=2)
    return x.cuda().bfloat16(), w1.cuda(), w2.cuda(), g_out.cuda().bfloat16()


def fp8_results(fn, x, w1, w2, g_out, post_scale, down_fp8=True):
    xs, w1s, w2s = (t.detach().clone().requires_grad_() for t in (x, w1, w2))
    w2_fp8 = operands(w2) if down_fp8 else None
    out, amax = fn(xs, w1s, w2s, operands(w1), w2_fp8, post_scale if down_fp8 else None, down_fp8)
    return (out, *torch.autograd.grad(out, (xs, w1s, w2s), g_out)), amax


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("down_fp8", [True, False], ids=["fp8_down", "bf16_down"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_cuda_fused_fp8_mlp_matches_the_reference_at_the_records_shape(compiled, down_fp8):
    from speedrun.kernels.relu_square_mlp import relu_square_mlp_fp8

    x, w1, w2, g_out = cuda_inputs(16384)
    pre = x.float() @ w1.t()
    post_scale = (torch.relu(pre).square().amax() * 1.8 / 448).float()
    fused = torch.compile(relu_square_mlp_fp8, fullgraph=True) if compiled else relu_square_mlp_fp8
    got, got_amax = fp8_results(fused, x, w1, w2, g_out, post_scale, down_fp8)
    want, want_amax = fp8_results(fp8_mlp_reference, x, w1, w2, g_out, post_scale, down_fp8)
    if down_fp8:
        assert float(got_amax) == pytest.approx(float(want_amax), rel=1e-3)
    else:
        assert got_amax is None and want_amax is None
    # same quantization: only the accumulation order and a few e4m3 roundings of post differ
    for name, g, w in zip(("out", "g_x", "g_w1", "g_w2"), got, want):
        assert rel_error(g, w) < 1e-2, name
    exact = float64_mlp(x.float(), w1, w2, g_out.float())
    for name, g, w in zip(("out", "g_x", "g_w1", "g_w2"), got, exact):
        assert rel_error(g, w) < FP8_TOLERANCE, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_fp8_mlp_module_compiles_in_one_graph_and_updates_its_scale():
    from torch._dynamo.testing import CompileCounter

    torch.manual_seed(0)
    config = build_model_config("gpt124m", {"fp8_mlp": True, "mlp_kernel": "triton"})
    mlp = MLP(config).cuda().train()
    torch.nn.init.normal_(mlp.proj.weight, std=config.mlp_hidden ** -0.5)
    mlp.fc.weight_cache.enabled = mlp.proj.weight_cache.enabled = True
    mlp.fc.quantize_weight_()
    mlp.proj.quantize_weight_()
    counter = CompileCounter()
    compiled = torch.compile(mlp, backend="inductor", fullgraph=True)
    eager_scales, compiled_scales = [], []
    x = torch.randn(4096, config.model_dim, device="cuda")
    for _ in range(3):
        compiled(x).float().sum().backward()
        compiled_scales.append(float(mlp.post_scale))
    mlp.post_scale.fill_(1.0)
    for _ in range(3):
        mlp(x).float().sum().backward()
        eager_scales.append(float(mlp.post_scale))
    assert compiled_scales == pytest.approx(eager_scales, rel=1e-3)
    amax = float(torch.relu(x @ mlp.fc.weight.t()).square().amax())
    assert compiled_scales[-1] == pytest.approx(amax * 1.8 / 448, rel=0.15)
    torch._dynamo.reset()
    counted = torch.compile(mlp, backend=counter, fullgraph=True)
    for _ in range(3):
        counted(x)
    assert counter.frame_count == 1


if __name__ == "__main__":
    import sys

    _interpreter_child(sys.argv[1])
