"""Run a kernel test file's cases in Triton's interpreter, in a child process, and load what it saved.

Triton reads ``TRITON_INTERPRET`` when a kernel is defined, i.e. when the kernel module is first imported:
setting it in the pytest process would leak into every later test and into any module that imports Triton.
So each kernel test file runs itself as a script in a child with the variable set (its ``__main__`` saves
inputs and results with ``torch.save``), and its tests compare those with a float64 reference. The
interpreter needs triton >= 3.7 with NumPy 2.4; without them the tests that use it skip.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


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
