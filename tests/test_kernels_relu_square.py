"""The fused ReLU² MLP (speedrun.kernels.relu_square_mlp; records #59, #87) against ``relu(x W1ᵀ)² W2ᵀ`` and
its gradients computed by autograd in float64 from the same (16-bit) inputs, and the MLP's kernel switch.

Accuracy bound: the whole-tensor relative error ``‖got - ref‖ / ‖ref‖`` of the output, of ``post``, of
``g_pre`` and of the gradients of x, W1 and W2 must stay below ``5·u``, u the unit roundoff of the 16-bit
dtype (bf16 2⁻⁹: 9.8e-3; fp16 2⁻¹¹: 2.4e-3). Each of these values passes through at most three roundings
to 16 bits (post, g_pre, the result; each ≤ u relative, accumulation in fp32 adds about 1e-7), so correct
code stays below about 3u; a wrong mask, stride or epilogue factor gives errors of order 0.1-1.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``), which needs triton >= 3.7
with NumPy 2.4 and multiplies bf16 tiles wrongly (it stores bf16 as uint16 and multiplies the raw bits), so
the interpreter tests run in float16, the same kernel code with the other 16-bit dtype. The variable is set
only in a child process that this file starts (running itself as a script), because Triton reads it when a
kernel is defined, i.e. when the kernel module is first imported: setting it in the pytest process would
leak into every later test and into any module that imports Triton. The child runs every case with each
autotune config in turn (one config at a time: the interpreter cannot benchmark) and saves inputs and
results; the tests here compare them with the float64 reference. The GPU tests (``gpu`` mark) run bf16 and
fp16 at the record's width, eager and under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model.config import GPTConfig
from speedrun.model.mlp import MLP
from triton_interpreter import config_runs, interpreted_fixture, save_every_config

# name -> (x shape, F, layout): several tiles with partial last rows and columns, K = C = 128 a multiple of
# BLOCK_K; C = 96 and C = 32 (masked K); transposed (non-contiguous) x, weights, g_out and post; a 3-D x;
# no tokens at all (no kernel launch).
CASES = {
    "tiles": ((160, 128), 288, "contiguous"),
    "odd_k": ((77, 96), 200, "contiguous"),
    "strided": ((130, 64), 136, "transposed"),
    "batched": ((2, 45, 64), 72, "contiguous"),
    "one_token": ((1, 32), 48, "contiguous"),
    "no_tokens": ((0, 64), 64, "contiguous"),
}
CHECKED = ("out", "post", "g_pre", "g_x", "g_w1", "g_w2")
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -9, torch.float16: 2.0 ** -11}


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """‖got - ref‖ / ‖ref‖ over the whole tensor, in float64; ‖got‖ when ref is all zeros (or empty)."""
    scale = ref.norm().item()
    return (got.double() - ref).norm().item() / (scale if scale > 0 else 1.0)


def float64_reference(x, w1, w2, g_out) -> dict[str, torch.Tensor]:
    """out = relu(x W1ᵀ)² W2ᵀ in float64 by autograd, with post, g_pre = ∂/∂pre of <out, g_out> and the
    gradients of <out, g_out> with respect to x, W1 and W2."""
    x, w1, w2 = (t.detach().double().requires_grad_() for t in (x, w1, w2))
    pre = x @ w1.t()
    pre.retain_grad()
    post = torch.relu(pre).square()
    out = post @ w2.t()
    out.backward(g_out.double())
    hidden = w1.size(0)
    return {"out": out.detach(), "post": post.detach().reshape(-1, hidden), "g_pre": pre.grad.reshape(-1, hidden),
            "g_x": x.grad, "g_w1": w1.grad, "g_w2": w2.grad}


def random_inputs(shape, hidden: int, layout: str, dtype, device="cpu", seed=0):
    """x (*shape) ~ N(0, 1) (a normalized residual stream), W1 (F, C) ~ N(0, 0.5²/C) (record #5's scale),
    W2 (C, F) ~ N(0, 1/F) (trained weights, not the zero init), g_out like x; with ``layout="transposed"``
    x, W1, W2 and g_out are transposed views of contiguous tensors."""
    g = torch.Generator().manual_seed(seed)
    width = shape[-1]

    def make(rows, cols, scale):
        if layout == "transposed":
            return (torch.randn(cols, rows, generator=g) * scale).to(device, dtype).t()
        return (torch.randn(rows, cols, generator=g) * scale).to(device, dtype)

    x = make(int(torch.tensor(shape[:-1]).prod()), width, 1.0).reshape(shape)
    w1 = make(hidden, width, 0.5 / width ** 0.5)
    w2 = make(width, hidden, 1.0 / hidden ** 0.5)
    g_out = make(x.numel() // width, width, 1.0).reshape(shape)
    return x, w1, w2, g_out


def run_fused(x, w1, w2, g_out) -> dict[str, torch.Tensor]:
    """The fused MLP's output and gradients, and its two operators called directly (post given to the
    backward operator as a transposed-layout copy, to exercise its strides)."""
    from speedrun.kernels.relu_square_mlp import relu_square_grad, relu_square_matmul, relu_square_mlp

    leaves = [t.detach().requires_grad_() for t in (x, w1, w2)]
    out = relu_square_mlp(*leaves)
    out.backward(g_out)
    x2, g2 = x.reshape(-1, x.size(-1)), g_out.reshape(-1, g_out.size(-1))
    post = relu_square_matmul(x2, w1)
    g_pre = relu_square_grad(g2, w2, post.t().contiguous().t())
    return {"out": out.detach(), "post": post, "g_pre": g_pre, "g_x": leaves[0].grad,
            "g_w1": leaves[1].grad, "g_w2": leaves[2].grad}


def assert_matches_reference(inputs, got: dict[str, torch.Tensor], dtype, label: str) -> None:
    ref = float64_reference(*inputs)
    bound = 5 * UNIT_ROUNDOFF[dtype]
    for name in CHECKED:
        assert got[name].dtype == dtype and got[name].shape == ref[name].shape, (label, name)
        error = relative_error(got[name], ref[name])
        assert error < bound, f"{label}: {name} relative error {error:.2e} >= {bound:.2e}"


# ---------------------------------------------------------------- Triton interpreter (CPU, child process)


def _interpreter_child(out_path: Path) -> None:
    """In the child (TRITON_INTERPRET=1): every case with every autotune config, saved to ``out_path``."""
    from speedrun.kernels import relu_square_mlp as kernels

    def run_case(index, config, case):
        inputs = random_inputs(*case, torch.float16, seed=index)                      # case: shape, F, layout
        return {"config": str(config), "inputs": inputs, "got": run_fused(*inputs)}

    save_every_config(out_path, kernels._CONFIGS, [kernels._relu_square_kernel, kernels._relu_square_grad_kernel],
                      CASES, run_case)


interpreted = interpreted_fixture(__file__)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_interpreted_kernels_match_float64_reference_with_every_config(interpreted, case):
    for index, run in config_runs(interpreted, case):                # every autotune config ran
        assert_matches_reference(run["inputs"], run["got"], torch.float16, f"config {index} {run['config']}")


# ---------------------------------------------------------------- the MLP's switch (CPU)


def small_config() -> GPTConfig:
    return GPTConfig(n_layer=1, model_dim=32, n_head=2, head_dim=16, mlp_ratio=4)


def test_triton_switch_on_cpu_runs_the_reference_with_the_same_parameters():
    torch.manual_seed(0)
    reference, fused = MLP(small_config(), kernel="torch"), MLP(small_config(), kernel="triton")
    assert list(fused.state_dict()) == list(reference.state_dict()) == ["fc.weight", "proj.weight"]
    with torch.no_grad():
        reference.proj.weight.normal_()
    fused.load_state_dict(reference.state_dict())
    x = torch.randn(5, 32)
    w1, w2 = reference.fc.weight.double(), reference.proj.weight.double()
    expected = torch.relu(x.double() @ w1.t()).square() @ w2.t()
    torch.testing.assert_close(fused(x).double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(fused(x), reference(x))


def test_mlp_kernel_default_and_validation():
    assert MLP(small_config()).kernel == "torch"
    assert MLP(GPTConfig(n_layer=1, model_dim=32, n_head=2, head_dim=16, mlp_kernel="triton")).kernel == "triton"
    with pytest.raises(SpeedrunError, match="model.mlp_kernel must be one of torch, triton"):
        GPTConfig(mlp_kernel="cuda")
    with pytest.raises(SpeedrunError, match="mlp_kernel.*torch, triton.*'cuda'"):
        MLP(small_config(), kernel="cuda")


# ---------------------------------------------------------------- GPU

@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["tiles", "odd_k", "strided", "batched", "record_width"])
def test_gpu_kernels_match_float64_reference(dtype, case):
    shape, hidden, layout = ((4096 + 77, 768), 3072, "contiguous") if case == "record_width" else CASES[case]
    inputs = random_inputs(shape, hidden, layout, dtype, device="cuda")
    assert_matches_reference([t.cpu() for t in inputs], {k: v.cpu() for k, v in run_fused(*inputs).items()},
                             dtype, f"{case} {dtype}")


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_mlp_module_under_compile_fullgraph_and_autocast():
    """The training setting: fp32 parameters, bf16 autocast, torch.compile(fullgraph=True) (a graph break
    raises). Output and gradients of x, fc.weight and proj.weight of both kernels, the Triton one and the
    torch reference compiled the same way, against float64 from the bf16-rounded values."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=1, model_dim=768, n_head=6, head_dim=128, mlp_ratio=4)
    mlps = {kernel: MLP(config, kernel=kernel).cuda() for kernel in ("triton", "torch")}
    with torch.no_grad():
        mlps["torch"].proj.weight.normal_(std=3072 ** -0.5)
    mlps["triton"].load_state_dict(mlps["torch"].state_dict())
    x = torch.randn(8192 + 5, 768, device="cuda")
    g_out = torch.randn(8192 + 5, 768, device="cuda")
    rounded = [t.bfloat16() for t in (x, mlps["torch"].fc.weight, mlps["torch"].proj.weight, g_out)]
    ref = float64_reference(*[t.cpu() for t in rounded])
    for kernel, mlp in mlps.items():
        xg = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = torch.compile(mlp, fullgraph=True)(xg)
        out.backward(g_out)
        got = {"out": out, "g_x": xg.grad, "g_w1": mlp.fc.weight.grad, "g_w2": mlp.proj.weight.grad}
        assert out.dtype == torch.bfloat16
        for name, value in got.items():
            error = relative_error(value.detach().cpu(), ref[name])
            assert error < 5 * UNIT_ROUNDOFF[torch.bfloat16], f"{kernel}: {name} relative error {error:.2e}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_triton_switch_refuses_float32_compute():
    mlp = MLP(small_config(), kernel="triton").cuda()
    with pytest.raises(SpeedrunError, match="bfloat16 or float16"):
        mlp(torch.randn(3, 32, device="cuda"))


if __name__ == "__main__":
    _interpreter_child(Path(sys.argv[1]))
