"""Run a kernel test file's cases in Triton's interpreter, in a child process, and load what it saved.

Triton reads ``TRITON_INTERPRET`` when a kernel is defined, i.e. when the kernel module is first imported:
setting it in the pytest process would leak into every later test and into any module that imports Triton.
So each kernel test file runs itself as a script in a child with the variable set (its ``__main__`` saves
inputs and results with ``torch.save``), and its tests compare those with a float64 reference. The
interpreter needs triton >= 3.7 with NumPy 2.4; without them the tests that use it skip.

    interpreted = interpreted_fixture(__file__)       # in the test file: its module-scoped fixture

A file that runs each case with each of a kernel's autotune configs in turn (the interpreter cannot benchmark)
saves with :func:`save_every_config` in the child and reads back with :func:`config_runs`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pytest
import torch

from speedrun.support.cpu_math import resolve_cpu_math_dispatch

# the children compute their eager references in a fresh process: first MKL's kernel choice, on one thread
resolve_cpu_math_dispatch()


def interpreted_results(test_file: str, out_dir: Path) -> dict:
    """Run ``python test_file OUT`` with ``TRITON_INTERPRET=1`` and return ``torch.load(OUT)``; skip the
    calling test without a suitable triton, fail with the child's stderr when it fails."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs the triton package")
    major, minor = (int(p) for p in importlib.metadata.version("triton").split(".")[:2])
    if (major, minor) < (3, 7):
        pytest.skip("Triton's interpreter needs triton >= 3.7 with NumPy 2.4")
    out = out_dir / "results.pt"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, test_file, str(out)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


def interpreted_fixture(test_file: str):
    """A module-scoped pytest fixture ``interpreted``: :func:`interpreted_results` of ``test_file`` (run once
    per module, in a fresh temporary folder). In the test file: ``interpreted = interpreted_fixture(__file__)``."""

    @pytest.fixture(scope="module")
    def interpreted(tmp_path_factory) -> dict:
        return interpreted_results(test_file, tmp_path_factory.mktemp("interpreter"))

    return interpreted


def save_every_config(out_path: str | Path, configs: Sequence[Any], kernels: Sequence[Any],
                      cases: Mapping[str, Any], run_case: Callable[[int, Any, Any], dict]) -> None:
    """In the child: with each of ``configs`` in turn as the only autotune config of every one of ``kernels``
    (Triton ``Autotuner`` objects), ``run_case(config index, config, cases[name])`` for every case; the
    results saved to ``out_path`` (``torch.save``) keyed ``(config index, name)``."""
    results = {}
    for index, config in enumerate(configs):
        for kernel in kernels:
            kernel.configs = [config]
        for name, case in cases.items():
            results[(index, name)] = run_case(index, config, case)
    torch.save(results, out_path)


def config_runs(interpreted: dict, case) -> list[tuple[int, dict]]:
    """(autotune config index, saved run) of each config that ran ``case``, from results keyed
    ``(config index, case)`` (:func:`save_every_config`); asserts that at least two configs ran (each of a
    kernel's configs runs)."""
    runs = [(key[0], run) for key, run in interpreted.items() if key[1] == case]
    assert len(runs) >= 2, f"{case}: {len(runs)} autotune configs ran"
    return runs
