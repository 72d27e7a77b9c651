"""speedrun.support.cpu_math: after :func:`resolve_cpu_math_dispatch`, a fresh process's first threaded float math
is exact. Without it, about one fresh process in ten on this project's CPU machine (torch 2.13.0+cpu, two
threads) computed its first ``sqrt`` of 5,000 fp32 values inexactly on half of them (pytorch/pytorch#188792);
so each of several fresh processes checks that its first call equals its second, bit for bit."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import torch
from speedrun.support.cpu_math import resolve_cpu_math_dispatch
resolve_cpu_math_dispatch()
torch.set_num_threads(2)
g = torch.Generator().manual_seed(5000)
v = torch.rand(5000, generator=g) + 0.1
x = torch.randn(5000, generator=g).double()
first = [v.sqrt(), v.exp(), x.log1p().nan_to_num(), x.tanh()]
again = [v.sqrt(), v.exp(), x.log1p().nan_to_num(), x.tanh()]
print(all(torch.equal(a, b) for a, b in zip(first, again)))
"""


@pytest.mark.slow
def test_a_fresh_process_first_float_math_equals_its_second_after_the_warm_up():
    for _ in range(12):
        proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["True"]


def test_the_warm_up_calls_each_function_on_both_float_dtypes_once_per_process(monkeypatch):
    import torch

    from speedrun.support import cpu_math

    calls = []
    monkeypatch.setattr(cpu_math, "_resolved", False)
    monkeypatch.setattr(cpu_math, "_UNARY", (lambda x: calls.append(x.dtype), torch.sqrt))
    cpu_math.resolve_cpu_math_dispatch()
    cpu_math.resolve_cpu_math_dispatch()
    assert calls == [torch.float32, torch.float64] and cpu_math._resolved
