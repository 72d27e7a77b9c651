"""The tiled transposed copy (speedrun.kernels.transpose, for the FP8 head's weight gradient) against its reference
``t.t().contiguous()``: bit for bit, for every autotune config, ragged edges (sizes not multiples of a tile),
one row, one column, and every element width (uint8 standing in for float8, whose bytes the kernel moves as
uint8; int16 for bf16; int32 for fp32). A wrong offset, mask or tile order puts bytes in the wrong place,
which bit equality catches.

Without a GPU the kernel runs in Triton's interpreter in a child process (tests/triton_interpreter.py). The
GPU test (``gpu`` mark) checks float8 e5m2 and bf16 at the records' head size, eager and under
``torch.compile(fullgraph=True)``, and the dispatch :func:`speedrun.model.fp8.transposed`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model.fp8 import transposed
from triton_interpreter import config_runs, interpreted_fixture, save_every_config

CASES = {  # name: (rows, cols, dtype)
    "ragged-uint8": (130, 67, torch.uint8),
    "one-row-uint8": (1, 200, torch.uint8),
    "one-column-int16": (97, 1, torch.int16),
    "ragged-int16": (70, 129, torch.int16),
    "square-int32": (128, 128, torch.int32),
    "float32": (65, 33, torch.float32),
}


def case_tensor(rows: int, cols: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Distinct-looking values over the dtype's range (uint8: every byte value), row-major (rows, cols)."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(rows, cols, generator=g, dtype=dtype)
    high = 256 if dtype == torch.uint8 else 2 ** 15
    low = 0 if dtype == torch.uint8 else -(2 ** 15)
    return torch.randint(low, high, (rows, cols), generator=g, dtype=dtype)


def _interpreter_child(out_path: Path) -> None:
    """In the child (TRITON_INTERPRET=1): every case with each autotune config alone."""
    from speedrun.kernels import transpose as module

    def run_case(_index, _config, case):
        src = case_tensor(*case)
        return dict(src=src, dst=module.transpose_copy(src))

    save_every_config(out_path, module._CONFIGS, [module._transpose_kernel], CASES, run_case)


interpreted = interpreted_fixture(__file__)


@pytest.mark.parametrize("case", list(CASES))
def test_interpreted_kernel_equals_the_reference_bit_for_bit(interpreted, case):
    for config, run in config_runs(interpreted, case):
        src, dst = run["src"], run["dst"]
        assert dst.shape == (src.size(1), src.size(0)) and dst.dtype == src.dtype and dst.is_contiguous()
        assert torch.equal(dst, src.t().contiguous()), f"{case}, config {config}"


def test_the_cpu_dispatch_is_pytorchs_copy():
    src = case_tensor(5, 7, torch.float32)
    out = transposed(src)
    assert out.shape == (7, 5) and out.is_contiguous() and torch.equal(out, src.t())


def test_bad_inputs_are_named():
    pytest.importorskip("triton")
    from speedrun.kernels.transpose import transpose_copy

    with pytest.raises(SpeedrunError, match=r"transpose_copy: src must be a contiguous \(M, N\) tensor, got "
                                            r"shape \(3, 4, 5\)"):
        transpose_copy(torch.zeros(3, 4, 5))
    with pytest.raises(SpeedrunError, match=r"strides \(1, 3\)"):
        transpose_copy(torch.zeros(4, 3).t())
    with pytest.raises(SpeedrunError, match=r"elements of 1, 2 or 4 bytes, got torch.float64 \(8 bytes\)"):
        transpose_copy(torch.zeros(2, 2, dtype=torch.float64))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_kernel_equals_the_reference_eager_and_compiled():
    from speedrun.kernels.transpose import transpose_copy

    g = torch.Generator(device="cuda").manual_seed(0)
    for rows, cols in ((16384, 50304), (1000, 777)):
        for dtype in (torch.float8_e5m2, torch.bfloat16):
            src = torch.randn(rows, cols, device="cuda", generator=g).to(dtype)
            want = src.t().contiguous()
            for fn in (transpose_copy, transposed, torch.compile(lambda t: transposed(t), fullgraph=True)):
                got = fn(src)
                assert got.dtype == dtype and got.shape == (cols, rows)
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (rows, cols, dtype, fn)


if __name__ == "__main__":
    _interpreter_child(Path(sys.argv[1]))
