"""HEAD's own DC Triton kernels (../shared/reference-code/head/dc_triton_kernels.py, record #85's lightweight
dynamically composable attention as HEAD runs it on its last layer), forward and backward, against our
:func:`speedrun.model.dc.dc_attention_reference` in float64.

tests/test_head_model.py runs HEAD's GPT through a float64 transcription of HEAD's forward kernel, because HEAD's
kernels take CUDA tensors only; HEAD's backward kernels were left unchecked. Here HEAD's autograd Function
(``_DCPostOnlyCorrectionAddBaseTriton``, past its wrapper's CUDA-only shape check) runs in Triton's interpreter on
the CPU, in a child process (tests/triton_interpreter.py), in float16: the interpreter has no bf16 atomic add,
which HEAD's backward uses for dv, and the wrapper takes float16 as well as bf16. HEAD's shape: 6 heads of 128.
Its ``post_w1`` is already RMS-normalised over the heads (HEAD's ``dc_gate``), our ``u``; ``post_w2`` is our
``w2``. Each case has a document longer than the window and one shorter, so that both the window and the
document start bound the keys. Found: HEAD's backward is right for windows up to 113 tokens only, though its
wrapper accepts 128 (:func:`test_heads_backward_is_wrong_past_113_tokens_of_window`); HEAD trains with 112. Skipped where ../shared is absent (as in CI) or Triton's interpreter is not usable.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from speedrun.model.dc import dc_attention_reference, document_starts

from record_code import SHARED_CODE
from record_models import relative_error
from triton_interpreter import interpreted_fixture

HEAD_DC = SHARED_CODE / "head" / "dc_triton_kernels.py"
HEADS, HEAD_DIM, SCALE = 6, 128, 0.12
CASES = {  # name: (document ends (cu_seqlens without the 0), window in tokens)
    "window-24": ((37, 96), 24),
    "window-112": ((150, 160), 112),                # HEAD's window (its wrapper's default), a document of 150
    "window-113": ((150, 160), 113),                # the largest HEAD's backward takes (module docstring)
    "many-documents": ((5, 9, 40, 41, 80), 16),     # documents shorter than the window, one of one token
}
BEYOND = ((150, 160), 128)                          # a window HEAD's wrapper accepts and its backward does not
TOLERANCE = 2e-3                                    # relative to the largest element: float16 (2^-11) + sums


def case_inputs(ends: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """The float16 inputs of a case: base (FA3's output), q, k (unit rows times 4, as after QK-norm), v
    (T, H, D); w1, w2 (T, H); the upstream gradient (T, H, D); cu_seqlens (S,) int32."""
    T = ends[-1]
    g = torch.Generator().manual_seed(T)
    base, q, k, v, grad = (torch.randn(T, HEADS, HEAD_DIM, generator=g) for _ in range(5))
    q, k = (4 * x / x.norm(dim=-1, keepdim=True) for x in (q, k))
    w1, w2 = (torch.randn(T, HEADS, generator=g) for _ in range(2))
    inputs = dict(base=base, q=q, k=k, v=v, w1=w1, w2=w2, grad=grad)
    return {**{name: x.half() for name, x in inputs.items()},
            "cu_seqlens": torch.tensor((0, *ends), dtype=torch.int32)}


def heads_correction(module, inputs: dict[str, torch.Tensor], window: int) -> dict[str, torch.Tensor]:
    """HEAD's Function forward and backward: ``out`` (T, H, D) and the gradients of base, q, k, v, w1, w2."""
    leaves = {name: inputs[name].clone().requires_grad_() for name in ("base", "q", "k", "v", "w1", "w2")}
    batched = [leaves[name][None] for name in ("q", "k", "v", "w1", "w2")]         # HEAD's (1, T, ...)
    out = module._DCPostOnlyCorrectionAddBaseTriton.apply(
        leaves["base"], *batched, inputs["cu_seqlens"], torch.empty(0), SCALE, window, 16, 32)
    out.backward(inputs["grad"].reshape(out.shape))
    return {"out": out.detach().reshape(inputs["base"].shape),
            **{f"d{name}": leaf.grad.reshape(leaf.shape) for name, leaf in leaves.items()}}


def _interpreter_child(out_path: Path) -> None:
    """In the child (TRITON_INTERPRET=1): HEAD's kernels on every case, saved with their inputs."""
    spec = importlib.util.spec_from_file_location("head_dc_triton_kernels", HEAD_DC)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = {}
    for name, (ends, window) in {**CASES, "beyond": BEYOND}.items():
        inputs = case_inputs(ends)
        results[name] = (inputs, heads_correction(module, inputs, window))
    torch.save(results, out_path)


_interpreted = interpreted_fixture(__file__)


@pytest.fixture(scope="module")
def interpreted(request):
    if not HEAD_DC.exists():
        pytest.skip(f"{HEAD_DC} is not here")
    return request.getfixturevalue("_interpreted")


def ours(inputs: dict[str, torch.Tensor], window: int) -> dict[str, torch.Tensor]:
    """Our reference in float64 on the same inputs: ``out`` and the gradients, named as HEAD's."""
    leaves = {name: inputs[name].double().requires_grad_() for name in ("base", "q", "k", "v", "w1", "w2")}
    T = leaves["q"].size(0)
    out = dc_attention_reference(leaves["base"], leaves["q"], leaves["k"], leaves["v"], leaves["w1"], leaves["w2"],
                                 document_starts(inputs["cu_seqlens"], T), SCALE, window)
    out.backward(inputs["grad"].double())
    return {"out": out.detach(), **{f"d{name}": leaf.grad for name, leaf in leaves.items()}}


def errors(theirs: dict[str, torch.Tensor], mine: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per tensor: max |HEAD's - ours| / max |ours| (:func:`record_models.relative_error`)."""
    return {name: relative_error(theirs[name].double(), mine[name]) for name in mine}


@pytest.mark.parametrize("name", list(CASES))
def test_heads_dc_kernels_forward_and_backward_are_our_reference(interpreted, name):
    inputs, theirs = interpreted[name]
    _, window = CASES[name]
    measured = errors(theirs, ours(inputs, window))
    assert max(measured.values()) < TOLERANCE, measured


def test_the_comparison_tells_a_window_one_token_shorter(interpreted):
    """Our reference with the window one token shorter is far outside the tolerance against HEAD's output and
    its q, k, w1 gradients: the comparison above sees the window's last key."""
    inputs, theirs = interpreted["window-24"]
    measured = errors(theirs, ours(inputs, 23))
    assert min(measured[name] for name in ("out", "dq", "dk", "dw1")) > 10 * TOLERANCE, measured


def test_heads_backward_is_wrong_past_113_tokens_of_window(interpreted):
    """HEAD's wrapper accepts windows up to 128 tokens, and its forward is right there (its key block grows to
    256), but its backward kernels score a fixed block of 128 keys per 16 queries, which covers a window of at
    most 128 - 16 + 1 = 113: at 128 its q, k and w2 gradients are far from the formula's (measured: relative
    error 1.0, and 0.3 already at 120), while 112, the window HEAD trains with, is right (above). Pinned so that
    our reference, which is right at every window up to 128 (tests/test_dc_attention.py), is not bent to it."""
    inputs, theirs = interpreted["beyond"]
    measured = errors(theirs, ours(inputs, BEYOND[1]))
    assert measured["out"] < TOLERANCE
    assert min(measured[name] for name in ("dq", "dk", "dw2")) > 0.1, measured


if __name__ == "__main__":
    _interpreter_child(Path(sys.argv[1]))
