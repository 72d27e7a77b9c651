"""Compile reuse across runs (issue 6): the training graph must be stored by AOTAutograd's on-disk cache, so that
a second run of the same model (the next seed) loads its forward and backward instead of tracing them again.

Runs Inductor's C++ backend on the CPU, each case in a fresh cache folder."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

import speedrun
from speedrun.training.compile_cache import allow_training_graph_cache, compile_cache_tag
from test_model import batch, small_model

ROOT = Path(__file__).resolve().parents[1]


def _loss_with_autocast_off(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The pattern of :func:`speedrun.model.loss.linear_cross_entropy`: autocast turned off inside the graph."""
    h = torch.tanh(x @ w)
    with torch.autocast(x.device.type, enabled=False):
        return (h.float() @ w.float().T).square().mean()


def _compile_and_backward(fn, *args) -> dict[str, int]:
    """Compile ``fn``, run its forward and backward once; AOTAutograd's cache counters of that compilation."""
    torch._dynamo.reset()
    counters.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.compile(fn, dynamic=False)(*args)
    loss.backward()
    return dict(counters["aot_autograd"])


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A fresh Inductor cache folder and the cache switches as the process had them, restored after."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    with torch._inductor.config.patch(unsafe_marked_cacheable_functions={}), \
            torch._functorch.config.patch(autograd_cache_allow_custom_autograd_functions=False), \
            torch.compiler.config.patch(cache_key_tag=""):
        yield tmp_path / "inductor"


def test_autocast_off_inside_the_graph_is_cached_only_once_allowed(fresh_cache):
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(16, 16, requires_grad=True)
    refused = _compile_and_backward(_loss_with_autocast_off, x, w)
    assert refused.get("autograd_cache_bypass", 0) == 1 and refused.get("autograd_cache_saved", 0) == 0

    allow_training_graph_cache()
    allowed = _compile_and_backward(_loss_with_autocast_off, x, w)
    assert allowed.get("autograd_cache_bypass", 0) == 0 and allowed["autograd_cache_saved"] == 1
    assert "torch.amp.autocast_mode._enter_autocast" in torch._inductor.config.unsafe_marked_cacheable_functions
    package = Path(speedrun.__file__).parent
    assert torch.compiler.config.cache_key_tag == f"speedrun-{compile_cache_tag(package)}"


def test_the_cache_tag_changes_with_any_source_edit_and_only_then(tmp_path):
    """The entries are keyed by our sources: a custom operator's Python body (our Triton kernels' launch
    code) is not in the graph, so an edit must change the key."""
    package = tmp_path / "pkg"
    (package / "kernels").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    kernel = package / "kernels" / "k.py"
    kernel.write_text("BLOCK = 64\n")
    (package / "notes.txt").write_text("not code")
    tag = compile_cache_tag(package)
    assert len(tag) == 16 and compile_cache_tag(package) == tag
    (package / "notes.txt").write_text("still not code")
    assert compile_cache_tag(package) == tag
    kernel.write_text("BLOCK = 128\n")
    assert compile_cache_tag(package) != tag
    kernel.write_text("BLOCK = 64\n")
    assert compile_cache_tag(package) == tag
    kernel.rename(package / "kernels" / "k2.py")
    assert compile_cache_tag(package) != tag


@pytest.mark.slow
def test_the_tiny_models_training_graphs_are_all_cacheable(fresh_cache):
    """The real model's training forward and backward (fused cross-entropy: a custom autograd Function with
    autocast off around it) under bf16 autocast: no graph bypasses the cache."""
    allow_training_graph_cache()
    model = small_model(torch.float32, cross_entropy="fused")
    inputs, targets, cu_seqlens = batch()
    seen = _compile_and_backward(model, inputs, targets.long(), cu_seqlens, 40)
    assert seen.get("autograd_cache_bypass", 0) == 0
    assert seen["autograd_cache_saved"] >= 1


@pytest.mark.slow
def test_a_second_process_loads_the_training_graph_from_the_cache(tmp_path):
    """Processes with one cache folder: the first stores the graph (a miss), the second loads it (a hit, no
    miss), as the second seed of a variant does with ``--compile-cache``; a third, whose sources differ (its
    cache tag does), compiles again (a miss)."""
    script = textwrap.dedent("""
        import json, sys, torch
        from torch._dynamo.utils import counters
        from speedrun.training.compile_cache import allow_training_graph_cache
        sys.path.insert(0, sys.argv[1])
        from test_compile_cache import _loss_with_autocast_off
        allow_training_graph_cache()
        torch.compiler.config.cache_key_tag += sys.argv[2]      # "": the same sources; else an edit
        x = torch.randn(8, 16, requires_grad=True)
        w = torch.randn(16, 16, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.compile(_loss_with_autocast_off, dynamic=False)(x, w)
        loss.backward()
        print(json.dumps(dict(counters["aot_autograd"])))
    """)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "PYTHONPATH": str(ROOT / "src"),
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    runs = []
    for edit in ("", "", "-edited"):
        done = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent), edit], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second, edited = runs
    assert first.get("autograd_cache_miss") == 1 and first.get("autograd_cache_saved") == 1
    assert second.get("autograd_cache_hit") == 1 and second.get("autograd_cache_miss", 0) == 0
    assert edited.get("autograd_cache_miss") == 1 and edited.get("autograd_cache_hit", 0) == 0
