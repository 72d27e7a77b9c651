"""The fused QK-norm + rotary kernel (speedrun.kernels.qk_norm_rotary; records #2, #5, #17) against
``apply_rotary(rms_norm(x))`` and its gradient computed by autograd in float64 from the same inputs, and the
model's ``rotary_kernel`` switch.

Accuracy bound: the whole-tensor relative error ``‖got - ref‖ / ‖ref‖`` of q_out, k_out and of the gradients
of q and k (from a random upstream gradient) must stay below ``5·u``, u the unit roundoff of the dtype (bf16
2⁻⁹, fp16 2⁻¹¹, fp32 2⁻²⁴). The kernel computes in fp32 and rounds each result once (≤ u/2 relative), so
correct code stays near u/2 (interpreter, fp16: 2.1-2.3e-4 = 0.43-0.47u; fp32: 6.3-9.4e-8 = 1.1-1.6u, where the
fp32 arithmetic itself is the error); a wrong pair, sign, mask, stride or norm term gives errors of 3e-2 or more.

The reference uses the norm's eps of the tested dtype as ``F.rms_norm`` takes it, the machine epsilon of the
dtype it computes in (fp32 for fp16 and bf16 input: the kernel's ``norm_eps``), not float64's.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, triton >= 3.7 with NumPy 2.4)
in a child process that this file starts (running itself as a script): Triton reads the variable when a
kernel is defined, so setting it in the pytest process would leak into every later test. The interpreter
multiplies bf16 wrongly, so the child runs float16 and float32, with each autotune config in turn, on
strided views of a (T, 3·H·Dh) QKV tensor with T·H rows not a multiple of any row block. The GPU tests
(``gpu`` mark) run bf16 at the record's width, eager and under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model.config import GPTConfig, build_model_config
from speedrun.model.gpt import GPT
from speedrun.model.norm import rms_norm
from speedrun.model.rotary import apply_rotary, rotary_frequencies, rotary_tables
from triton_interpreter import interpreted_results

# name -> (T, H, Dh, mode, R, gradient layout). T·H rows: 111, 87, 126, 78, 35 (none a multiple of 8, 16 or
# 32); Dh = 24 has 12 pairs (a masked power-of-two block); R = Dh/2 in half_truncated turns every adjacent
# pair; gradients contiguous, as (H, T, Dh) tensors seen as (T, H, Dh), or with stride 2 along Dh (copied).
CASES = {
    "truncated": (37, 3, 32, "half_truncated", 8, "contiguous"),
    "full_odd_half": (29, 3, 24, "full", 12, "contiguous"),
    "truncated_record_width": (21, 6, 128, "half_truncated", 32, "transposed"),
    "full_record_width": (13, 6, 128, "full", 64, "transposed"),
    "truncated_all_pairs": (7, 5, 16, "half_truncated", 8, "dh_strided"),
    "no_tokens": (0, 6, 128, "half_truncated", 32, "contiguous"),
}
CHECKED = ("q_out", "k_out", "g_q", "g_k")
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -9, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}
INTERPRETED_DTYPES = (torch.float16, torch.float32)


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """‖got - ref‖ / ‖ref‖ over the whole tensor, in float64; ‖got‖ when ref is all zeros (or empty)."""
    scale = ref.norm().item()
    return (got.double() - ref).norm().item() / (scale if scale > 0 else 1.0)


def random_inputs(T: int, H: int, Dh: int, mode: str, R: int, layout: str, dtype, device="cpu", seed=0):
    """qkv (T, 3·H·Dh) ~ N(0, 1) with a random scale per token; q, k its strided (T, H, Dh) views; cos, sin
    (T, R) fp32 of random positions < 4096 (the model's frequencies when R is the mode's, random ones else);
    upstream gradients g_q, g_k ~ N(0, 1) in ``layout``."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(T, 3 * H * Dh, generator=g) * torch.randn(T, 1, generator=g).exp()).to(device, dtype)
    q, k, _ = qkv.view(T, 3, H, Dh).unbind(1)
    positions = torch.randint(0, 4096, (T,), generator=g)
    frequencies = rotary_frequencies(Dh, 1e4, mode=mode)
    if frequencies.numel() != R:
        frequencies = torch.rand(R, generator=g)
    cos, sin = (t.to(device) for t in rotary_tables(positions, frequencies))

    def gradient():
        if layout == "transposed":
            return torch.randn(H, T, Dh, generator=g).to(device, dtype).transpose(0, 1)
        if layout == "dh_strided":
            return torch.randn(T, H, 2 * Dh, generator=g).to(device, dtype)[..., ::2]
        return torch.randn(T, H, Dh, generator=g).to(device, dtype)

    return {"qkv": qkv, "q": q, "k": k, "cos": cos, "sin": sin, "mode": mode, "g_q": gradient(),
            "g_k": gradient()}


def float64_reference(inputs: dict) -> dict[str, torch.Tensor]:
    """apply_rotary(rms_norm(x, eps of x's dtype)) for x = q, k in float64, and the gradients of
    <q_out, g_q> + <k_out, g_k> with respect to q and k, by autograd."""
    eps = torch.finfo(torch.promote_types(inputs["q"].dtype, torch.float32)).eps    # F.rms_norm's, by hand
    cos, sin, mode = inputs["cos"].double(), inputs["sin"].double(), inputs["mode"]
    q, k = (inputs[n].detach().double().requires_grad_() for n in ("q", "k"))
    q_out = apply_rotary(rms_norm(q, eps), cos, sin, mode)
    k_out = apply_rotary(rms_norm(k, eps), cos, sin, mode)
    torch.autograd.backward((q_out, k_out), (inputs["g_q"].double(), inputs["g_k"].double()))
    return {"q_out": q_out.detach(), "k_out": k_out.detach(), "g_q": q.grad, "g_k": k.grad}


def run_fused(inputs: dict, fn=None) -> dict:
    """The outputs of ``fn`` (default: the kernel, eager) and the gradients of q and k (leaves that are strided
    views of qkv's storage); for the eager kernel, whether the backward saved exactly q, k, cos and sin."""
    from speedrun.kernels.qk_norm_rotary import qk_norm_rotary

    q, k = (inputs[n].detach().requires_grad_() for n in ("q", "k"))
    q_out, k_out = (fn or qk_norm_rotary)(q, k, inputs["cos"], inputs["sin"], inputs["mode"])
    saved_inputs = fn is None and [t.data_ptr() for t in q_out.grad_fn.saved_tensors] == [
        t.data_ptr() for t in (q, k, inputs["cos"], inputs["sin"])]
    torch.autograd.backward((q_out, k_out), (inputs["g_q"], inputs["g_k"]))
    return {"q_out": q_out.detach(), "k_out": k_out.detach(), "g_q": q.grad, "g_k": k.grad,
            "saved_inputs": saved_inputs}


def assert_matches_reference(inputs: dict, got: dict, dtype, label: str, bound: float | None = None) -> dict:
    """Every checked tensor: dtype, shape, contiguity and relative error below ``bound`` (5u); returns the
    errors."""
    ref = float64_reference(inputs)
    bound = bound or 5 * UNIT_ROUNDOFF[dtype]
    errors = {}
    for name in CHECKED:
        value = got[name]
        assert value.dtype == dtype and value.shape == ref[name].shape, (label, name)
        assert value.is_contiguous(), (label, name)
        errors[name] = relative_error(value.cpu(), ref[name].cpu())
        assert errors[name] < bound, f"{label}: {name} relative error {errors[name]:.2e} >= {bound:.2e}"
    return errors


# ---------------------------------------------------------------- Triton interpreter (CPU, child process)


def _interpreter_child(out_path: Path) -> None:
    """In the child (TRITON_INTERPRET=1): every case in fp16 and fp32 with every autotune config."""
    from speedrun.kernels import qk_norm_rotary as kernels

    results = {}
    for index, config in enumerate(kernels._CONFIGS):
        kernels._qk_norm_rotary_kernel.configs = [config]
        kernels._qk_norm_rotary_grad_kernel.configs = [config]
        for name, case in CASES.items():
            for dtype in INTERPRETED_DTYPES:
                inputs = random_inputs(*case, dtype, seed=index)
                results[(index, name, dtype)] = {"config": str(config), "inputs": inputs, "got": run_fused(inputs)}
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    return interpreted_results(__file__, tmp_path_factory.mktemp("interpreter"))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", INTERPRETED_DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_interpreted_kernels_match_float64_reference_with_every_config(interpreted, case, dtype):
    runs = [(key[0], run) for key, run in interpreted.items() if key[1:] == (case, dtype)]
    assert len(runs) >= 2                                             # every autotune config ran
    for index, run in runs:
        assert run["got"]["saved_inputs"], f"config {index}: the backward saved more than q, k, cos, sin"
        assert_matches_reference(run["inputs"], run["got"], dtype, f"{case} config {index} {run['config']}")


# ---------------------------------------------------------------- input checks (CPU, no kernel launch)


@pytest.mark.parametrize("change, message", [
    (lambda d: {**d, "q": d["q"][0]}, r"\(T, H, Dh\)"),
    (lambda d: {**d, "k": d["k"].float()}, "one dtype"),
    (lambda d: {**d, "q": d["q"].int(), "k": d["k"].int()}, "bfloat16, float16 or float32"),
    (lambda d: {**d, "mode": "cosine"}, "mode must be one of full, half_truncated"),
    (lambda d: {**d, "mode": "full"}, "takes R = 16"),
    (lambda d: {**d, "cos": d["cos"][:-1], "sin": d["sin"][:-1]}, r"\(T, R\) = \(5, R\)"),
    (lambda d: {**d, "cos": d["cos"].double(), "sin": d["sin"].double()}, "float32"),
    (lambda d: {**d, "cos": d["cos"].clone().requires_grad_()}, "no gradient"),
])
def test_bad_inputs_raise_before_any_launch(change, message):
    pytest.importorskip("triton")
    from speedrun.kernels.qk_norm_rotary import qk_norm_rotary

    d = change(random_inputs(5, 2, 32, "half_truncated", 8, "contiguous", torch.float16))
    with pytest.raises(SpeedrunError, match=message):
        qk_norm_rotary(d["q"], d["k"], d["cos"], d["sin"], d["mode"])


# ---------------------------------------------------------------- the model's switch (CPU)


def test_rotary_kernel_default_and_validation():
    assert GPTConfig().rotary_kernel == "torch"
    assert GPTConfig(rotary_kernel="triton").rotary_kernel == "triton"
    with pytest.raises(SpeedrunError, match="model.rotary_kernel must be one of torch, triton; got 'cuda'"):
        GPTConfig(rotary_kernel="cuda")


@pytest.mark.parametrize("rope", ["full", "half_truncated"])
def test_triton_switch_on_cpu_gives_exactly_the_torch_loss_and_gradients(rope):
    """On a CPU the switch falls back to rms_norm + apply_rotary: the same loss and gradients, bit for bit,
    with one paired layer (always torch) and one plain layer."""
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, 48, (15,), generator=g, dtype=torch.int32)
    targets = torch.randint(0, 48, (15,), generator=g)
    cu = torch.tensor([0, 6, 7, 15], dtype=torch.int32)
    results = {}
    for kernel in ("torch", "triton"):
        torch.manual_seed(0)
        config = build_model_config("tiny", dict(vocab_size=48, n_layer=2, model_dim=16, n_head=2, head_dim=8,
                                                 rope=rope, paired_head_layers=(0,), rotary_kernel=kernel,
                                                 attention_backend="reference"))
        model = GPT(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("o.weight", "proj.weight")) or name.startswith("lm_head"):
                    p.normal_(0, 0.3)                                 # zero-initialized: make them count
        loss = model(inputs, targets, cu)
        loss.backward()
        results[kernel] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
        if kernel == "triton" and importlib.util.find_spec("triton") is not None:
            assert model.blocks[1].attn._qk_norm_rotary is not None           # the switch reached the layer
    assert torch.equal(results["triton"][0], results["torch"][0])
    for name, grad in results["torch"][1].items():
        assert torch.equal(results["triton"][1][name], grad), name


# ---------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("mode", ["half_truncated", "full"])
def test_gpu_bf16_at_record_width_matches_float64_reference(mode, compiled):
    """bf16, T = 4096, H = 6, Dh = 128, q and k strided views of the QKV product, eager and under
    torch.compile(fullgraph=True) (a graph break raises)."""
    from speedrun.kernels.qk_norm_rotary import qk_norm_rotary

    R = 32 if mode == "half_truncated" else 64
    inputs = random_inputs(4096, 6, 128, mode, R, "contiguous", torch.bfloat16, device="cuda")
    fn = torch.compile(qk_norm_rotary, fullgraph=True) if compiled else qk_norm_rotary
    got = run_fused(inputs, fn)
    assert_matches_reference(inputs, got, torch.bfloat16, f"{mode} compiled={compiled}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_model_with_the_triton_switch_calls_the_kernel_and_matches_torch():
    """The tiny model under bf16 autocast on CUDA: every non-paired layer calls the kernel, and the loss is
    the torch path's up to bf16 rounding of q and k."""
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, 48, (300,), generator=g, dtype=torch.int32).cuda()
    targets = torch.randint(0, 48, (300,), generator=g).cuda()
    cu = torch.tensor([0, 100, 101, 300], dtype=torch.int32, device="cuda")
    losses, calls = {}, []
    for kernel in ("torch", "triton"):
        torch.manual_seed(0)
        config = build_model_config("tiny", dict(vocab_size=48, n_layer=2, model_dim=64, n_head=2,
                                                 head_dim=32, rope="half_truncated", paired_head_layers=(0,),
                                                 rotary_kernel=kernel, attention_backend="reference"))
        model = GPT(config).cuda()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("o.weight", "proj.weight")) or name.startswith("lm_head"):
                    p.normal_(0, 0.3)
        if kernel == "triton":
            fused = model.blocks[1].attn._qk_norm_rotary
            model.blocks[1].attn._qk_norm_rotary = lambda *a: calls.append(1) or fused(*a)
        with torch.autocast("cuda", torch.bfloat16):
            losses[kernel] = model(inputs, targets, cu).item()
    assert calls == [1]
    assert losses["triton"] == pytest.approx(losses["torch"], rel=1e-2)


if __name__ == "__main__":
    _interpreter_child(Path(sys.argv[1]))


def test_the_norms_eps_is_rms_norms_default_fp32_for_16_bit_input():
    """A bf16 row of mean square 0.0625 normalizes to rms 1 with F.rms_norm (eps 1.19e-7), where bf16's own
    machine epsilon (7.8e-3) would give 0.943: the kernel takes F.rms_norm's eps, as the records' norm(q)."""
    from speedrun.kernels.qk_norm_rotary import norm_eps

    x = torch.full((2, 128), 0.25, dtype=torch.bfloat16)
    assert torch.nn.functional.rms_norm(x, (128,)).float().pow(2).mean().sqrt().item() == 1.0
    assert norm_eps(torch.bfloat16) == norm_eps(torch.float16) == torch.finfo(torch.float32).eps
    assert norm_eps(torch.float64) == torch.finfo(torch.float64).eps
