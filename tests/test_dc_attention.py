"""Lightweight DC attention (speedrun.model.dc, speedrun.kernels.dc_attention; record #85, Xiao et al. 2024).

The reference implementation against a brute-force softmax mixing written here with explicit loops over
queries, heads and keys in float64; its gradients against torch.autograd.gradcheck; w2 = 0 returning y; a
window of 1 (hand-computed: each query mixes only its own value); document boundaries and padded
cu_seqlens. The Triton kernels against the float64 reference, forward and gradients: on the CPU in Triton's
interpreter (a child process, see tests/triton_interpreter.py; float32 and float16, since the interpreter
multiplies bf16 tiles wrongly), and on CUDA at the record's shape in bf16 (``gpu`` mark).

Accuracy bound of the kernels: the whole-tensor relative error ``‖got - ref‖ / ‖ref‖`` of the output and
of each gradient below 5·u, u the unit roundoff of the dtype (fp16 2⁻¹¹, bf16 2⁻⁹): P and A are fp32 and
each product rounds one operand (A, G, dS) to the 16-bit dtype, so correct code stays near u; a wrong mask,
window edge or gradient term gives errors of order 0.1-1. In float32 (interpreter: exact fp32 products)
the bound is 1e-5.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model.dc import dc_attention
from triton_interpreter import interpreted_results

UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -9, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}

# name -> (T, H, Dh, window, cu_seqlens): a window shorter than the documents (and one document shorter
# than the window), a window longer than a block of 16 queries, padding slots (T repeated), window 1, the
# largest window 128 (256 keys per program) over one document; record #85's heads and window (6 x 128, 112).
KERNEL_CASES = {
    "short_window": (45, 3, 16, 5, [0, 7, 30, 45]),
    "long_window": (50, 2, 32, 20, [0, 3, 40, 50, 50, 50]),
    "window_one": (20, 2, 16, 1, [0, 9, 20]),
    "max_window": (150, 2, 16, 128, [0, 150]),
    "record_heads": (160, 6, 128, 112, [0, 30, 150, 160, 160]),
}


def random_inputs(T: int, H: int, Dh: int, dtype=torch.float64, device="cpu", seed=0) -> dict:
    """y, q, k, v (T, H, Dh) and w1, w2 (T, H): q, k with unit RMS per head (as after QK-norm), w1 around
    1 (record #85's bias init) with spread, w2 nonzero (a trained model's, not the zero init)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q, k = randn(T, H, Dh), randn(T, H, Dh)
    q = q / q.square().mean(-1, keepdim=True).sqrt()
    k = k / k.square().mean(-1, keepdim=True).sqrt()
    inputs = {"y": randn(T, H, Dh), "q": q, "k": k, "v": randn(T, H, Dh),
              "w1": 1.0 + 0.5 * randn(T, H), "w2": randn(T, H)}
    return {name: t.to(device, dtype) for name, t in inputs.items()}


def brute_force(y, q, k, v, w1, w2, cu_seqlens, scale, window) -> torch.Tensor:
    """The DC output in float64 by explicit loops: for each query t its keys are those of its document at
    most window - 1 tokens back (itself included); per head a softmax of scale·q·k over them; the map A
    mixes the heads' probabilities with w1 RMS-normalised over the heads (eps 1e-6); head h adds
    w2[t, h] · sum_s A[t, s] v[s, h]."""
    T, H, _ = q.shape
    y, q, k, v, w1, w2 = (t.detach().double() for t in (y, q, k, v, w1, w2))
    bounds = [int(b) for b in cu_seqlens]
    out = y.clone()
    for t in range(T):
        start = max(b for b in bounds if b <= t)
        keys = [s for s in range(start, t + 1) if t - s < window]
        rms = math.sqrt(sum(float(w1[t, g]) ** 2 for g in range(H)) / H + 1e-6)
        probs = []
        for h in range(H):
            logits = [scale * float(torch.dot(q[t, h], k[s, h])) for s in keys]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            probs.append([w / sum(weights) for w in weights])
        mixed = [sum(float(w1[t, g]) / rms * probs[g][i] for g in range(H)) for i in range(len(keys))]
        for h in range(H):
            for i, s in enumerate(keys):
                out[t, h] += float(w2[t, h]) * mixed[i] * v[s, h]
    return out


def reference_outputs(inputs: dict, cu_seqlens, scale, window, g_out) -> dict:
    """Output and gradients of <out, g_out> by the reference implementation in float64."""
    leaves = {name: t.detach().double().requires_grad_() for name, t in inputs.items()}
    cu = torch.tensor(cu_seqlens, dtype=torch.int32, device=g_out.device)
    out = dc_attention(**leaves, cu_seqlens=cu, scale=scale, window=window, impl="reference")
    out.backward(g_out.double())
    return {"out": out.detach(), **{f"d{name}": t.grad for name, t in leaves.items()}}


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """‖got - ref‖ / ‖ref‖ over the whole tensor, in float64."""
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# ---------------------------------------------------------------- the reference (CPU)


@pytest.mark.parametrize("cu_seqlens, window", [([0, 4, 11, 16], 3), ([0, 16], 5), ([0, 2, 3, 9, 16, 16], 16)])
def test_reference_matches_brute_force_softmax_mixing(cu_seqlens, window):
    inputs = random_inputs(16, 3, 4)
    cu = torch.tensor(cu_seqlens, dtype=torch.int32)
    got = dc_attention(**inputs, cu_seqlens=cu, scale=0.7, window=window, impl="reference")
    expected = brute_force(**inputs, cu_seqlens=cu_seqlens, scale=0.7, window=window)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_reference_in_float32_with_tensor_scale_matches_brute_force():
    inputs = random_inputs(21, 2, 8, dtype=torch.float32, seed=3)
    cu_seqlens = [0, 10, 21]
    got = dc_attention(**inputs, cu_seqlens=torch.tensor(cu_seqlens, dtype=torch.int32),
                       scale=torch.tensor(0.35), window=4, impl="reference")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), brute_force(**inputs, cu_seqlens=cu_seqlens, scale=0.35, window=4),
                               rtol=1e-5, atol=1e-5)


def test_window_one_mixes_only_the_querys_own_value():
    """W = 1: every P_g is 1 on the query itself, so out_h = y_h + w2_h · (sum_g u_g) · v_h[t]."""
    inputs = random_inputs(6, 2, 3, seed=1)
    w1 = inputs["w1"]
    u_sum = (w1 / (w1.square().mean(-1, keepdim=True) + 1e-6).sqrt()).sum(-1)          # (T,)
    expected = inputs["y"] + (inputs["w2"] * u_sum[:, None])[:, :, None] * inputs["v"]
    got = dc_attention(**inputs, cu_seqlens=torch.tensor([0, 2, 6], dtype=torch.int32), scale=1.0, window=1,
                       impl="reference")
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_reference_gradients_pass_gradcheck():
    inputs = random_inputs(9, 2, 3, seed=2)
    leaves = tuple(inputs[name].requires_grad_() for name in ("y", "q", "k", "v", "w1", "w2"))
    cu = torch.tensor([0, 4, 9, 9], dtype=torch.int32)

    def fn(y, q, k, v, w1, w2):
        return dc_attention(y, q, k, v, w1, w2, cu, 0.8, window=3, impl="reference")

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-8)


def test_zero_w2_returns_y_unchanged():
    for dtype in (torch.float32, torch.bfloat16):
        inputs = random_inputs(12, 3, 4, dtype=dtype)
        inputs["w2"] = torch.zeros_like(inputs["w2"])
        got = dc_attention(**inputs, cu_seqlens=torch.tensor([0, 5, 12], dtype=torch.int32), scale=0.5,
                           window=4, impl="reference")
        assert got.dtype == dtype and torch.equal(got, inputs["y"])


def test_other_documents_do_not_change_a_documents_output():
    cu = torch.tensor([0, 5, 11, 16], dtype=torch.int32)
    inputs = random_inputs(16, 2, 4)
    base = dc_attention(**inputs, cu_seqlens=cu, scale=0.9, window=8, impl="reference")
    changed = {name: t.clone() for name, t in inputs.items()}
    for name in ("q", "k", "v", "y", "w1", "w2"):
        changed[name][5:11] = torch.randn_like(changed[name][5:11])              # the middle document
    out = dc_attention(**changed, cu_seqlens=cu, scale=0.9, window=8, impl="reference")
    assert torch.equal(out[:5], base[:5]) and torch.equal(out[11:], base[11:])
    assert not torch.allclose(out[5:11], base[5:11])
    padded = torch.tensor([0, 5, 11, 16, 16, 16], dtype=torch.int32)               # empty padding documents
    assert torch.equal(dc_attention(**inputs, cu_seqlens=padded, scale=0.9, window=8, impl="reference"), base)


def test_auto_on_cpu_is_the_reference():
    inputs = random_inputs(10, 2, 4, dtype=torch.float32)
    cu = torch.tensor([0, 10], dtype=torch.int32)
    assert torch.equal(dc_attention(**inputs, cu_seqlens=cu, scale=0.5),
                       dc_attention(**inputs, cu_seqlens=cu, scale=0.5, impl="reference"))


def test_auto_takes_the_kernel_only_for_the_shapes_it_takes(monkeypatch):
    """On CUDA, ``auto`` calls the Triton path only where it takes the shape (a tiny model's head_dim 4
    fell into its head_dim check in a GPU test, 2026-12-06); the device test is stood in for by a q whose
    ``is_cuda`` is true and a spy kernel."""
    pytest.importorskip("triton")
    import speedrun.model.dc as dc
    from speedrun.kernels.dc_attention import MAX_WINDOW, takes_shape

    assert takes_shape(16, 1) and takes_shape(128, MAX_WINDOW)
    assert not takes_shape(4, 112) and not takes_shape(48, 112) and not takes_shape(128, MAX_WINDOW + 1)
    calls = []
    monkeypatch.setattr(dc, "_TRITON_CORRECTION", lambda *args: calls.append(args[1].shape) or args[0])

    class CudaLooking(torch.Tensor):
        is_cuda = True

    for dim, window, kernel in ((4, 8, False), (16, 8, True), (16, MAX_WINDOW + 1, False)):
        inputs = random_inputs(10, 2, dim, dtype=torch.float32)
        inputs["q"] = inputs["q"].as_subclass(CudaLooking)
        cu = torch.tensor([0, 10], dtype=torch.int32)
        calls.clear()
        dc_attention(**inputs, cu_seqlens=cu, scale=0.5, window=window)
        assert calls == ([(10, 2, dim)] if kernel else [])


def test_reference_traces_as_one_graph_with_tensor_scale():
    """torch.compile(fullgraph=True) raises on a graph break; the eager backend keeps the test fast."""
    inputs = {name: t.requires_grad_() for name, t in random_inputs(20, 2, 4, dtype=torch.float32).items()}
    cu = torch.tensor([0, 7, 20, 20], dtype=torch.int32)
    compiled = torch.compile(dc_attention, fullgraph=True, backend="eager")
    out = compiled(**inputs, cu_seqlens=cu, scale=torch.tensor(0.5), window=6)
    expected = brute_force(**inputs, cu_seqlens=cu.tolist(), scale=0.5, window=6)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert all(t.grad is not None for t in inputs.values())


def test_bad_arguments_raise_speedrun_error():
    inputs = random_inputs(8, 2, 16, dtype=torch.float32)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(SpeedrunError, match="impl must be one of auto, reference, triton"):
        dc_attention(**inputs, cu_seqlens=cu, scale=1.0, impl="cuda")
    with pytest.raises(SpeedrunError, match=r"w1 and w2 must be \(T, H\)"):
        dc_attention(**{**inputs, "w1": inputs["w1"][:, :1]}, cu_seqlens=cu, scale=1.0)
    with pytest.raises(SpeedrunError, match="share one"):
        dc_attention(**{**inputs, "v": inputs["v"][:4]}, cu_seqlens=cu, scale=1.0)
    with pytest.raises(SpeedrunError, match="window must be an int >= 1"):
        dc_attention(**inputs, cu_seqlens=cu, scale=1.0, window=0)
    pytest.importorskip("triton")
    with pytest.raises(SpeedrunError, match=r"window must be an int in 1\.\.128"):
        dc_attention(**inputs, cu_seqlens=cu, scale=1.0, window=129, impl="triton")
    with pytest.raises(SpeedrunError, match="power of two"):
        dc_attention(**random_inputs(8, 2, 12, dtype=torch.float32), cu_seqlens=cu, scale=1.0, impl="triton")


# ---------------------------------------------------------------- Triton interpreter (CPU, child process)


def run_triton(inputs: dict, cu_seqlens, scale, window, g_out) -> dict:
    """Output and gradients of <out, g_out> through impl="triton"."""
    leaves = {name: t.detach().clone().requires_grad_() for name, t in inputs.items()}
    cu = torch.tensor(cu_seqlens, dtype=torch.int32, device=g_out.device)
    out = dc_attention(**leaves, cu_seqlens=cu, scale=scale, window=window, impl="triton")
    out.backward(g_out)
    return {"out": out.detach(), **{f"d{name}": t.grad for name, t in leaves.items()}}


def _interpreter_child(out_path: Path) -> None:
    """In the child (TRITON_INTERPRET=1): every case in float32 and float16, saved to ``out_path``."""
    results = {}
    for dtype in (torch.float32, torch.float16):
        for index, (name, (T, H, Dh, window, cu_seqlens)) in enumerate(KERNEL_CASES.items()):
            inputs = random_inputs(T, H, Dh, dtype=dtype, seed=index)
            g_out = torch.randn(T, H, Dh, generator=torch.Generator().manual_seed(99)).to(dtype)
            scale = torch.tensor(0.4) if name == "long_window" else 0.4
            results[(name, str(dtype))] = {"inputs": inputs, "g_out": g_out, "scale": float(scale),
                                           "got": run_triton(inputs, cu_seqlens, scale, window, g_out)}
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    return interpreted_results(__file__, tmp_path_factory.mktemp("interpreter"))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_interpreted_triton_kernel_matches_reference_forward_and_gradients(interpreted, case, dtype):
    T, H, Dh, window, cu_seqlens = KERNEL_CASES[case]
    run = interpreted[(case, str(dtype))]
    ref = reference_outputs(run["inputs"], cu_seqlens, run["scale"], window, run["g_out"])
    bound = 1e-5 if dtype == torch.float32 else 5 * UNIT_ROUNDOFF[dtype]
    for name, expected in ref.items():
        got = run["got"][name]
        assert got.shape == expected.shape and got.dtype == dtype, name
        error = relative_error(got, expected)
        assert error < bound, f"{case} {dtype}: {name} relative error {error:.2e} >= {bound:.2e}"


# ---------------------------------------------------------------- GPU


def record_shape_inputs(T: int, seed: int = 0):
    """Record #85's layer-10 shape (H = 6, Dh = 128) in bf16 on CUDA; documents of 1..2000 tokens, every
    third one shorter than 100 (under the window), cu_seqlens (CPU) padded with T."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 2000, (T // 100,), generator=g)
    lengths[::3] = torch.randint(1, 100, lengths[::3].shape, generator=g)
    lengths = lengths.cumsum(0)
    cu = torch.cat([torch.tensor([0]), lengths[lengths < T], torch.tensor([T, T, T])]).to(torch.int32)
    inputs = random_inputs(T, 6, 128, dtype=torch.bfloat16, device="cuda", seed=seed)
    g_out = torch.randn(T, 6, 128, generator=g).to("cuda", torch.bfloat16)
    return inputs, cu, g_out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_triton_kernel_matches_float64_reference_at_record_shape():
    inputs, cu, g_out = record_shape_inputs(8192)
    scale = 0.12
    got = run_triton(inputs, cu.tolist(), scale, 112, g_out)
    assert got["out"].dtype == torch.bfloat16
    ref = reference_outputs(inputs, cu.tolist(), scale, 112, g_out)           # float64 on the GPU
    for name, expected in ref.items():
        error = relative_error(got[name], expected)
        assert error < 5 * UNIT_ROUNDOFF[torch.bfloat16], f"{name} relative error {error:.2e}"
    auto = dc_attention(**inputs, cu_seqlens=cu.cuda(), scale=scale)             # auto picks the kernel
    assert torch.equal(auto, got["out"])                                          # the forward has no atomics


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_triton_kernel_under_compile_fullgraph_with_tensor_scale():
    inputs, cu, g_out = record_shape_inputs(4096, seed=1)
    scale = torch.tensor(0.12, device="cuda")
    eager = run_triton(inputs, cu.tolist(), scale, 112, g_out)
    leaves = {name: t.detach().clone().requires_grad_() for name, t in inputs.items()}
    compiled = torch.compile(dc_attention, fullgraph=True)
    out = compiled(**leaves, cu_seqlens=cu.cuda(), scale=scale, window=112, impl="triton")
    out.backward(g_out)
    assert relative_error(out, eager["out"].double()) < 1e-3
    for name, t in leaves.items():
        assert relative_error(t.grad, eager[f"d{name}"].double()) < 1e-2, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_zero_w2_returns_y_unchanged():
    inputs, cu, _ = record_shape_inputs(2048)
    inputs["w2"] = torch.zeros_like(inputs["w2"])
    assert torch.equal(dc_attention(**inputs, cu_seqlens=cu.cuda(), scale=0.12, impl="triton"), inputs["y"])


if __name__ == "__main__":
    _interpreter_child(Path(sys.argv[1]))
