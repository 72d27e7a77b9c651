"""The persistent TMA variants of the ReLU² MLP's two hot products (speedrun.kernels.relu_square_mlp; record
#88's persistent ``linear_relu_square_kernel``) against the one-program-per-tile kernels they replace.

In Triton's interpreter (CPU, a child process, ``slow`` mark; tests/triton_interpreter.py), with small block
configs forced one at a time on the old and the new kernels alike (the same BLOCK_K, so the same order of
the K blocks), 4 programs looping over 6-14 output tiles, partial last tiles in rows, columns and K:

* the FP8 up projection post = relu(dequant · x8 w1_8ᵀ)² (bf16): bit for bit the old kernel's, and the
  float64 product within bf16 rounding;
* the backward g_pre = (g_out W2) · 2·sqrt(post), in float16 (the interpreter multiplies bf16 tiles wrongly,
  see tests/test_kernels_relu_square.py): bit for bit the old kernel's, the float64 value within fp16
  rounding, and the same from transposed (non-TMA) operand layouts, which the wrapper copies;
* ``relu_square_mlp_fp8(..., down_fp8=False, persistent=True)``: output and gradients bit for bit those of
  ``persistent=False`` (the gradients' bf16 product is wrong in the interpreter either way: equality only).

In this process (no kernel runs): the ``persistent`` switch routes the up projection and g_pre to the
persistent operators and nothing else, refuses the FP8 down product, and the operators refuse rows that TMA
cannot address (not a multiple of 16 bytes).

On CUDA (``gpu`` mark): at the record's shape (T=16384, C=768, F=3072, bf16) and with partial tiles, the
persistent operators against the old ones, and the MLP with and without ``persistent``, eager and under
``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import sys

import pytest
import torch
import triton

from speedrun.errors import SpeedrunError
from speedrun.model.fp8 import quantize
from triton_interpreter import config_runs, interpreted_fixture, save_every_config

# name -> (T, C, F): partial last row and column tiles with K = C = 64; and a partial last K block (C = 80)
CASES = {"tiles": (200, 64, 192), "k_tail": (77, 80, 176)}
# Small tiles for the interpreter; each is the only config of all four kernels in turn.
SMALL_CONFIGS = [
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 2}),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 1}),
]


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double(), ref.detach().double()
    return float((got - ref).norm() / ref.norm())


def random_inputs(tokens: int, dim: int, hidden: int, seed: int = 0, device: str = "cpu"):
    """x ~ N(0, 1) (T, C), W1 ~ N(0, 0.5²/C) (F, C), W2 ~ N(0, 1/F) (C, F), g_out ~ N(0, 1) (T, C), float32."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, dim, generator=g)
    w1 = torch.randn(hidden, dim, generator=g) * 0.5 / dim ** 0.5
    w2 = torch.randn(dim, hidden, generator=g) / hidden ** 0.5
    g_out = torch.randn(tokens, dim, generator=g)
    return [t.to(device) for t in (x, w1, w2, g_out)]


def fp8_mlp_results(mlp_fp8, x, w1, w2, g_out, persistent: bool):
    """(out, g_x, g_w1, g_w2) of ``mlp_fp8`` (relu_square_mlp_fp8, maybe compiled) with the bf16 down
    product."""
    xs, w1s, w2s = (t.detach().clone().requires_grad_() for t in (x, w1, w2))
    w8, w_scale = quantize(w1)
    out, _ = mlp_fp8(xs, w1s, w2s, (w8, w_scale, w1.bfloat16()), None, None, down_fp8=False,
                     persistent=persistent)
    return (out, *torch.autograd.grad(out, (xs, w1s, w2s), g_out.bfloat16()))


# ----------------------------------------------------------- Triton interpreter (CPU, child process)


def _interpreter_child(out_path: str) -> None:
    """In the child (TRITON_INTERPRET=1): each case with each small config, old and persistent kernels."""
    from speedrun.kernels import relu_square_mlp as kernels

    def run_case(index, config, case):
        x, w1, w2, g_out = random_inputs(*case, seed=index)
        (x8, x_scale), (w8, w_scale) = quantize(x), quantize(w1)
        dequant = x_scale * w_scale
        post = kernels.relu_square_matmul_fp8_up(x8, w8, dequant)                      # (T, F) bf16
        g16, w2_16, post16 = g_out.half(), w2.half(), post.half()
        transposed = [t.t().contiguous().t() for t in (g16, w2_16, post16)]         # column-major copies
        return {
            "fp8_inputs": (x8, w8, dequant),
            "post": post,
            "post_persistent": kernels.relu_square_matmul_fp8_up_persistent(x8, w8, dequant),
            "grad_inputs": (g16, w2_16, post16),
            "g_pre": kernels.relu_square_grad(g16, w2_16, post16),
            "g_pre_persistent": kernels.relu_square_grad_persistent(g16, w2_16, post16),
            "g_pre_persistent_transposed": kernels.relu_square_grad_persistent(*transposed),
            "mlp": fp8_mlp_results(kernels.relu_square_mlp_fp8, x, w1, w2, g_out, persistent=False),
            "mlp_persistent": fp8_mlp_results(kernels.relu_square_mlp_fp8, x, w1, w2, g_out, persistent=True),
        }

    every_kernel = [kernels._relu_square_fp8_kernel, kernels._relu_square_grad_kernel,
                    kernels._relu_square_fp8_persistent_kernel, kernels._relu_square_grad_persistent_kernel]
    save_every_config(out_path, SMALL_CONFIGS, every_kernel, CASES, run_case)


interpreted = interpreted_fixture(__file__)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_interpreted_persistent_fp8_up_projection_is_bit_equal_to_the_per_tile_kernel(interpreted, case):
    for index, run in config_runs(interpreted, case):
        x8, w8, dequant = run["fp8_inputs"]
        got, old = run["post_persistent"], run["post"]
        assert got.dtype == torch.bfloat16 and got.shape == old.shape
        assert torch.equal(got, old), f"config {index}: max diff {(got.float() - old.float()).abs().max()}"
        pre = float(dequant) * (x8.double() @ w8.double().t())
        assert rel_error(got, torch.relu(pre).square()) < 5 * 2 ** -9, f"config {index}"      # as test_fp8_mlp_fused


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_interpreted_persistent_g_pre_is_bit_equal_to_the_per_tile_kernel_in_any_layout(interpreted, case):
    for index, run in config_runs(interpreted, case):
        g16, w2_16, post16 = run["grad_inputs"]
        got, old = run["g_pre_persistent"], run["g_pre"]
        assert got.dtype == torch.float16 and got.shape == old.shape
        assert torch.equal(got, old), f"config {index}: max diff {(got.float() - old.float()).abs().max()}"
        assert torch.equal(run["g_pre_persistent_transposed"], got), f"config {index}"
        want = (g16.double() @ w2_16.double()) * 2 * post16.double().sqrt()
        assert rel_error(got, want) < 2 ** -10, f"config {index}"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_interpreted_fp8_mlp_with_persistent_kernels_equals_the_default_forward_and_backward(interpreted, case):
    for index, run in config_runs(interpreted, case):
        for name, got, old in zip(("out", "g_x", "g_w1", "g_w2"), run["mlp_persistent"], run["mlp"]):
            assert got.dtype == old.dtype and torch.equal(got, old), f"config {index}: {name}"


# ---------------------------------------------------------------- the switch (CPU, no kernel runs)


def test_persistent_switch_routes_only_the_up_projection_and_g_pre_to_the_persistent_ops(monkeypatch):
    from speedrun.kernels import relu_square_mlp as kernels

    def up(x8, w8, dequant):                                   # the kernels' formulas in plain PyTorch
        return torch.relu(dequant * (x8.float() @ w8.float().t())).square().bfloat16()

    def grad(g_out, w2, post):
        return ((g_out.float() @ w2.float()) * 2 * post.float().sqrt()).to(g_out.dtype)

    calls = []

    def recording(name, fn):
        def op(*args):
            calls.append(name)
            return fn(*args)
        return op

    for name, fn in (("relu_square_matmul_fp8_up", up), ("relu_square_grad", grad)):
        for op_name in (name, name + "_persistent"):
            monkeypatch.setattr(kernels, op_name, recording(op_name, fn))
    x, w1, w2, g_out = random_inputs(16, 32, 64)
    for persistent in (False, True):
        calls.clear()
        fp8_mlp_results(kernels.relu_square_mlp_fp8, x, w1, w2, g_out, persistent)
        suffix = "_persistent" if persistent else ""
        assert calls == ["relu_square_matmul_fp8_up" + suffix, "relu_square_grad" + suffix]


def test_persistent_kernels_refuse_the_fp8_down_product():
    from speedrun.kernels.relu_square_mlp import relu_square_mlp_fp8

    x, w1, w2, _ = random_inputs(16, 32, 64)
    w1_fp8, w2_fp8 = (*quantize(w1), w1.bfloat16()), (*quantize(w2), w2.bfloat16())
    with pytest.raises(SpeedrunError, match="persistent kernels .* bf16 down product only"):
        relu_square_mlp_fp8(x, w1, w2, w1_fp8, w2_fp8, torch.tensor(1.0), down_fp8=True, persistent=True)


def test_persistent_ops_refuse_rows_that_tma_cannot_address():
    from speedrun.kernels.relu_square_mlp import relu_square_grad_persistent, relu_square_matmul_fp8_up_persistent

    x8, w8 = torch.zeros(8, 72).to(torch.float8_e4m3fn), torch.zeros(32, 72).to(torch.float8_e4m3fn)
    with pytest.raises(SpeedrunError, match="TMA needs rows of a multiple of 16 bytes; x8 is \\(8, 72\\)"):
        relu_square_matmul_fp8_up_persistent(x8, w8, torch.tensor(1.0))
    g_out, w2, post = torch.zeros(8, 32).bfloat16(), torch.zeros(32, 36).bfloat16(), torch.zeros(8, 36).bfloat16()
    with pytest.raises(SpeedrunError, match="relu_square_grad_persistent: TMA needs rows of a multiple of 16"):
        relu_square_grad_persistent(g_out, w2, post)


def test_tma_operands_are_copied_only_when_their_layout_needs_it():
    """Row-major operands with 16-byte aligned rows and start pass as they are, others are copied row-major;
    under torch.compile (Dynamo cannot trace ``storage_offset()``) the start is trusted."""
    from speedrun.kernels.relu_square_mlp import _tma_operand

    base = torch.zeros(10, 16, dtype=torch.bfloat16)
    assert _tma_operand("op", "t", base) is base
    column_major = base.t().contiguous().t()
    copy = _tma_operand("op", "t", column_major)
    assert copy is not column_major and copy.is_contiguous() and torch.equal(copy, column_major)
    shifted = base.view(-1)[4:4 + 9 * 16].view(9, 16)                  # starts 8 bytes into the storage
    assert _tma_operand("op", "t", shifted) is not shifted
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.compiler, "is_compiling", lambda: True)
        assert _tma_operand("op", "t", shifted) is shifted
        assert _tma_operand("op", "t", column_major) is not column_major


def test_persistent_ops_return_without_a_launch_when_there_is_nothing_to_multiply():
    from speedrun.kernels.relu_square_mlp import relu_square_grad_persistent, relu_square_matmul_fp8_up_persistent

    e4m3 = torch.float8_e4m3fn
    empty = relu_square_matmul_fp8_up_persistent(torch.zeros(0, 32).to(e4m3), torch.zeros(16, 32).to(e4m3),
                                                 torch.tensor(1.0))
    assert empty.shape == (0, 16) and empty.dtype == torch.bfloat16
    no_k = relu_square_grad_persistent(torch.zeros(8, 0).bfloat16(), torch.zeros(0, 16).bfloat16(),
                                       torch.ones(8, 16).bfloat16())
    assert no_k.shape == (8, 16) and not no_k.any()


# ---------------------------------------------------------------------------------------------- CUDA


def assert_bf16_close(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    """Equal up to a bf16 rounding of each element (a reordered fp32 sum flips an element's last bit)."""
    equal = float((got == want).float().mean())
    print(f"{name}: {equal:.6f} of the elements bit-equal, relative error {rel_error(got, want):.2e}")
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-5 * float(want.abs().max()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [16384, 16384 + 77], ids=["records_shape", "partial_tiles"])
def test_gpu_persistent_ops_match_the_per_tile_ops_at_the_records_shape(tokens):
    from speedrun.kernels import relu_square_mlp as kernels

    x, w1, w2, g_out = random_inputs(tokens, 768, 3072, device="cuda")
    (x8, x_scale), (w8, w_scale) = quantize(x), quantize(w1)
    post = kernels.relu_square_matmul_fp8_up(x8, w8, x_scale * w_scale)                 # (T, F) bf16
    assert_bf16_close(kernels.relu_square_matmul_fp8_up_persistent(x8, w8, x_scale * w_scale), post, "post")
    g_out, w2 = g_out.bfloat16(), w2.bfloat16()
    assert_bf16_close(kernels.relu_square_grad_persistent(g_out, w2, post),
                      kernels.relu_square_grad(g_out, w2, post), "g_pre")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_gpu_fp8_mlp_with_persistent_kernels_matches_the_default(compiled):
    from speedrun.kernels.relu_square_mlp import relu_square_mlp_fp8

    x, w1, w2, g_out = random_inputs(16384, 768, 3072, device="cuda")
    mlp_fp8 = torch.compile(relu_square_mlp_fp8, fullgraph=True) if compiled else relu_square_mlp_fp8
    default = fp8_mlp_results(mlp_fp8, x.bfloat16(), w1, w2, g_out, persistent=False)
    persistent = fp8_mlp_results(mlp_fp8, x.bfloat16(), w1, w2, g_out, persistent=True)
    for name, got, want in zip(("out", "g_x", "g_w1", "g_w2"), persistent, default):
        assert got.dtype == want.dtype, name
        assert rel_error(got, want) < 1e-3, name


def test_the_triton_persistent_mlp_kernel_needs_the_fp8_up_projection_alone():
    """``model.mlp_kernel: triton_persistent`` (the persistent kernels in a model): accepted with records #84-#88's
    FP8 MLP (fp8_mlp, no FP8 down product; the record88 preset), refused naming both settings otherwise, by the
    config and by an MLP given the kernel directly."""
    from speedrun.model.config import build_model_config
    from speedrun.model.mlp import MLP

    config = build_model_config("record88", {"mlp_kernel": "triton_persistent"})
    assert (config.fp8_mlp, config.fp8_mlp_down) == (True, False) and MLP(config).persistent
    for changes in ({"fp8_mlp_down": True}, {"fp8_mlp": False}):
        with pytest.raises(SpeedrunError, match="triton_persistent.*fp8_mlp true and model.fp8_mlp_down false"):
            build_model_config("record88", {"mlp_kernel": "triton_persistent", **changes})
    with pytest.raises(SpeedrunError, match="'triton_persistent' needs model.fp8_mlp true"):
        MLP(build_model_config("record89"), kernel="triton_persistent")          # HEAD: the FP8 down product


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_mlp_module_with_the_persistent_kernel_matches_triton():
    """The record88 preset's MLP with ``mlp_kernel`` triton_persistent against triton, same weights, training
    forward and backward in bf16 on CUDA."""
    from speedrun.model.config import build_model_config
    from speedrun.model.mlp import MLP

    results = []
    for kernel in ("triton", "triton_persistent"):
        torch.manual_seed(0)
        mlp = MLP(build_model_config("record88", {"mlp_kernel": kernel})).cuda().train()
        with torch.no_grad():
            mlp.proj.weight.normal_(0, 0.02)
        x = torch.randn(16384, 768, device="cuda", generator=torch.Generator("cuda").manual_seed(1)).bfloat16()
        x.requires_grad_(True)
        out = mlp(x)
        out.float().square().sum().backward()
        results.append((out, x.grad, mlp.fc.weight.grad, mlp.proj.weight.grad))
    for name, want, got in zip(("out", "g_x", "g_fc", "g_proj"), *results):
        assert rel_error(got, want) < 1e-3, name


if __name__ == "__main__":
    _interpreter_child(sys.argv[1])
