"""The FlashAttention 3/4 backends (speedrun.model.flash) and ``attention_backend: auto``.

On a CPU the libraries are replaced by fake modules injected into ``sys.modules``: each records the arguments
it was called with and computes what the real library computes from them (its own window and causal
conventions, implemented here as a per-document loop), so a wrong translation of our window, scale or
cu_seqlens gives a wrong result, not only a wrong recorded argument. The real libraries are compared with
the reference backend on a GPU (``gpu`` marker), skipped exactly when CUDA or the library is missing.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model import attention as attention_module
from speedrun.model import flash
from speedrun.model.attention import PackedDocuments, attention, resolve_backend
from speedrun.training.config import TrainConfig


def library_semantics(q, k, v, cu, scale, causal, window_size):
    """Attention as FA3/FA4 define it: per document (cu), query i sees keys j with i - left <= j <= i + right,
    right = 0 when causal; a None or negative bound is unbounded. Plain loops in float64."""
    left, right = window_size
    left = None if left is None or left < 0 else left
    right = 0 if causal else (None if right is None or right < 0 else right)
    out = torch.zeros_like(q)
    bounds = cu.tolist()
    for start, stop in zip(bounds[:-1], bounds[1:]):
        for i in range(start, stop):
            first = start if left is None else max(start, i - left)
            last = stop - 1 if right is None else min(stop - 1, i + right)
            keys = list(range(first, last + 1))
            for h in range(q.size(1)):
                scores = torch.stack([scale * torch.dot(q[i, h], k[j, h]) for j in keys])
                out[i, h] = sum(w * v[j, h] for w, j in zip(scores.softmax(dim=0), keys))
    return out


class FakeLibrary:
    """A ``flash_attn_varlen_func`` that records its calls; returns (out, lse) when ``returns_tuple``."""

    def __init__(self, returns_tuple: bool):
        self.calls: list[tuple[tuple, dict]] = []
        self.returns_tuple = returns_tuple

    def flash_attn_varlen_func(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        q, k, v = args
        out = library_semantics(q, k, v, kwargs["cu_seqlens_q"], kwargs["softmax_scale"], kwargs["causal"],
                                kwargs["window_size"])
        return (out, None) if self.returns_tuple else out


@pytest.fixture
def fresh_flash():
    """Forget loaded libraries and resolved backends before and after the test."""
    flash.clear_cache()
    attention_module._resolve_cuda.cache_clear()
    yield
    flash.clear_cache()
    attention_module._resolve_cuda.cache_clear()


def inject(monkeypatch, library: str, fake: FakeLibrary) -> None:
    module = types.ModuleType("fake")
    module.flash_attn_varlen_func = fake.flash_attn_varlen_func
    if library == "fa3":
        monkeypatch.setitem(sys.modules, "flash_attn_interface", module)
    else:
        monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
        monkeypatch.setitem(sys.modules, "flash_attn.cute", module)


def qkv(tokens=13, heads=2, dim=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(tokens, heads, dim, generator=g, dtype=torch.float64) for _ in range(3)]


def test_window_size_counts_the_keys_left_of_the_query():
    assert flash.window_size("fa3", 384) == (383, 0) == flash.window_size("fa4", 384)
    assert flash.window_size("fa3", 1) == (0, 0)
    assert flash.window_size("fa3", None) == (-1, -1)
    assert flash.window_size("fa4", None) == (None, None)


@pytest.mark.parametrize("library,returns_tuple", [("fa3", False), ("fa3", True), ("fa4", True)])
@pytest.mark.parametrize("window", [None, 1, 3, 100])
def test_call_translation_gives_the_reference_result(monkeypatch, fresh_flash, library, returns_tuple, window):
    fake = FakeLibrary(returns_tuple)
    inject(monkeypatch, library, fake)
    q, k, v = qkv()
    cu = torch.tensor([0, 4, 5, 13, 13], dtype=torch.int64)          # int64 in, an empty padding document
    out = flash.varlen_attention(library, q, k, v, cu, 8, 0.3, window)
    expected = attention(q, k, v, cu.to(torch.int32), 0.3, window, backend="reference")
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    (args, kwargs), = fake.calls
    assert len(args) == 3 and all(a is b for a, b in zip(args, (q, k, v)))    # FA4's 4th positional is qv
    assert kwargs["cu_seqlens_q"].dtype == torch.int32 and kwargs["cu_seqlens_q"].tolist() == [0, 4, 5, 13, 13]
    assert kwargs["cu_seqlens_k"] is kwargs["cu_seqlens_q"]
    assert (kwargs["max_seqlen_q"], kwargs["max_seqlen_k"]) == (8, 8)
    assert type(kwargs["max_seqlen_q"]) is int and type(kwargs["softmax_scale"]) is float
    assert kwargs["softmax_scale"] == 0.3 and kwargs["causal"] is True
    unbounded = (-1, -1) if library == "fa3" else (None, None)
    assert kwargs["window_size"] == (unbounded if window is None else (window - 1, 0))


@pytest.mark.parametrize("library", ["fa3", "fa4"])
def test_backend_passes_the_longest_document(monkeypatch, fresh_flash, library):
    fake = FakeLibrary(returns_tuple=False)
    inject(monkeypatch, library, fake)
    monkeypatch.setattr(attention_module, "_check_flash", lambda name, q: None)   # CPU tensors allowed here
    q, k, v = qkv()
    cu = torch.tensor([0, 4, 5, 13], dtype=torch.int32)
    attention(q, k, v, cu, 0.5, 3, backend=library)                                   # read from cu_seqlens: 8
    attention(q, k, v, PackedDocuments(cu, 13, max_seqlen=10), 0.5, 3, backend=library)   # the loader's bound
    attention(q, k, v, PackedDocuments(cu, 13, max_seqlen=64), 0.5, 3, backend=library)   # capped at T
    assert [kwargs["max_seqlen_q"] for _, kwargs in fake.calls] == [8, 10, 13]


def test_a_returned_shape_other_than_q_raises(monkeypatch, fresh_flash):
    module = types.ModuleType("fake")
    module.flash_attn_varlen_func = lambda q, k, v, **kwargs: q[:-1]
    monkeypatch.setitem(sys.modules, "flash_attn_interface", module)
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match=r"returned shape \(12, 2, 4\), expected \(13, 2, 4\)"):
        flash.varlen_attention("fa3", q, k, v, torch.tensor([0, 13]), 13, 0.5, None)


def test_tensor_scale_or_window_is_refused(monkeypatch, fresh_flash):
    inject(monkeypatch, "fa3", FakeLibrary(False))
    q, k, v = qkv()
    with pytest.raises(ValueError, match="Python numbers"):
        flash.varlen_attention("fa3", q, k, v, torch.tensor([0, 13]), 13, torch.tensor(0.5), None)
    with pytest.raises(ValueError, match="Python numbers"):
        flash.varlen_attention("fa4", q, k, v, torch.tensor([0, 13]), 13, 0.5, torch.tensor(3))


def test_fa3_comes_from_the_kernels_hub_when_no_local_build(monkeypatch, fresh_flash):
    fake, asked = FakeLibrary(False), []

    def get_kernel(repo, version=None):
        asked.append((repo, version))
        return types.SimpleNamespace(flash_attn_interface=types.SimpleNamespace(
            flash_attn_varlen_func=fake.flash_attn_varlen_func))

    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)           # import raises ImportError
    monkeypatch.setitem(sys.modules, "kernels", types.SimpleNamespace(get_kernel=get_kernel))
    assert flash.unavailable_reason("fa3") is None
    assert asked == [("kernels-community/flash-attn3", 1)]
    q, k, v = qkv()
    flash.varlen_attention("fa3", q, k, v, torch.tensor([0, 13]), 13, 0.5, None)
    assert len(fake.calls) == 1 and asked == [("kernels-community/flash-attn3", 1)]    # loaded once


def test_missing_libraries_give_their_reasons(monkeypatch, fresh_flash):
    def offline(repo, version=None):
        raise OSError("no network")

    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    monkeypatch.setitem(sys.modules, "kernels", types.SimpleNamespace(get_kernel=offline))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    reason = flash.unavailable_reason("fa3")
    assert "flash_attn_interface is not importable" in reason and "OSError: no network" in reason
    assert "flash-attn-4" in flash.unavailable_reason("fa4")
    with pytest.raises(flash.FlashUnavailable, match="no network"):
        flash.load("fa3")
    with pytest.raises(ValueError, match="unknown FlashAttention library 'fa5'"):
        flash.load("fa5")


@pytest.mark.parametrize("backend", ["fa3", "fa4"])
def test_flash_backends_refuse_cpu_tensors(monkeypatch, fresh_flash, backend):
    inject(monkeypatch, backend, FakeLibrary(False))
    q, k, v = (t.float() for t in qkv())
    with pytest.raises(ValueError, match=f"'{backend}' needs CUDA bf16/fp16"):
        attention(q, k, v, torch.tensor([0, 13], dtype=torch.int32), 0.3, backend=backend)


def test_auto_is_sdpa_docs_on_a_cpu_and_names_pass_through():
    assert resolve_backend("auto", "cpu") == "sdpa_docs" == resolve_backend("auto", torch.device("cpu"))
    assert resolve_backend("flex", "cuda") == "flex" and resolve_backend("fa4", "cpu") == "fa4"
    q, k, v = qkv()
    cu = torch.tensor([0, 4, 5, 13], dtype=torch.int32)
    torch.testing.assert_close(attention(q, k, v, cu, 0.3, 3, backend="auto"),
                               attention(q, k, v, cu, 0.3, 3, backend="reference"), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("capability,installed,expected", [
    ((9, 0), {"fa3", "fa4"}, "fa3"),          # Hopper: the records' kernel first
    ((9, 0), {"fa4"}, "fa4"),
    ((10, 0), {"fa3", "fa4"}, "fa4"),         # Blackwell: FA3 has no kernels there
    ((8, 0), {"fa3", "fa4"}, "varlen"),       # Ampere: neither library's tuned path
    ((9, 0), set(), "varlen"),
])
def test_auto_on_cuda_takes_the_first_installed_in_order(monkeypatch, fresh_flash, capability, installed,
                                                         expected):
    monkeypatch.setattr(flash, "unavailable_reason", lambda lib: None if lib in installed else "missing")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert resolve_backend("auto", "cuda") == expected


def test_auto_on_cuda_falls_back_to_flex_without_varlen(monkeypatch, fresh_flash):
    monkeypatch.setattr(flash, "unavailable_reason", lambda lib: "missing")
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", None)
    assert attention_module._resolve_cuda((9, 0)) == "flex"


def test_train_config_resolves_auto_once_for_the_device(monkeypatch):
    settings = {"preset": "gpt124m", "model": {"attention_backend": "auto"}}
    cpu = TrainConfig.from_dict(settings).resolved_for("cpu")
    assert cpu.model_config().attention_backend == "sdpa_docs"
    assert '"attention_backend":"sdpa_docs"' in cpu.to_json()
    asked = []
    monkeypatch.setattr(attention_module, "resolve_backend", lambda name, device: asked.append(device) or "fa3")
    cuda = TrainConfig.from_dict({**settings, "device": "cuda"}).resolved_for("cuda")
    assert cuda.model_config().attention_backend == "fa3" and asked == ["cuda"]
    assert not cuda.model_config().schedule_as_graph_inputs
    explicit = TrainConfig.from_dict({"preset": "gpt124m", "device": "cuda"}).resolved_for("cuda")
    assert explicit.model_config().attention_backend == "flex" and asked == ["cuda"]    # not asked again


@pytest.mark.parametrize("backend", ["fa3", "fa4"])
def test_flash_backends_train_on_cuda_only(backend):
    with pytest.raises(SpeedrunError, match=f"'{backend}' trains on CUDA only"):
        TrainConfig.from_dict({"model": {"attention_backend": backend}})


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["fa3", "fa4"])
def test_flash_backends_match_reference_values_and_gradients_in_bfloat16(backend):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    reason = flash.unavailable_reason(backend)
    if reason is not None:
        pytest.skip(reason)
    g = torch.Generator().manual_seed(5)
    for tokens, heads, dim in ((1000, 4, 64), (2048, 6, 128)):     # a ragged end; the model's head shape
        cu = torch.tensor([0, 130, 131, 600, tokens - 200, tokens, tokens], dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(tokens, heads, dim, generator=g).cuda().bfloat16().requires_grad_()
                   for _ in range(3))
        weights = torch.randn(tokens, heads, dim, generator=g).cuda()
        for window in (None, 1, 128, 384):
            ref = attention(*(t.float() for t in (q, k, v)), cu, 0.12, window, backend="reference")
            got = attention(q, k, v, PackedDocuments(cu, tokens, max_seqlen=2048), 0.12, window, backend=backend)
            assert got.dtype == torch.bfloat16 and got.shape == q.shape
            torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)
            grads_ref = torch.autograd.grad((ref * weights).sum(), (q, k, v))
            grads_got = torch.autograd.grad((got.float() * weights).sum(), (q, k, v))
            for g_got, g_ref in zip(grads_got, grads_ref):
                torch.testing.assert_close(g_got.float(), g_ref.float(), rtol=5e-2, atol=5e-2)


def test_a_run_with_auto_logs_the_backend_that_ran(tmp_path):
    from speedrun.training.loop import run_training
    from synthetic_data import counting_documents, write_dataset

    shards, bos = write_dataset(tmp_path / "data", counting_documents(200), shard_tokens=16384)
    cfg = TrainConfig.from_dict({"preset": "tiny", "steps": 2, "tokens_per_step": 256, "max_seq_len": 128,
                                 "val_tokens": 256, "val_batch_tokens": 256, "val_every": 0,
                                 "model": {"n_layer": 1, "model_dim": 16, "n_head": 2, "head_dim": 8,
                                           "attention_backend": "auto"}})
    log = tmp_path / "seed0.txt"
    run_training(cfg, variant="auto", seed=0, shards_dir=shards, bos_dir=bos, log_path=log, env={})
    header = log.read_text(encoding="utf-8").split("=" * 100)[0].splitlines()
    assert "attention_backend: sdpa_docs" in header
    config_line = next(line for line in header if line.startswith("config: "))
    assert '"attention_backend":"sdpa_docs"' in config_line


def test_a_block_loads_its_flash_library_when_built(monkeypatch, fresh_flash):
    from speedrun.model.block import CausalSelfAttention
    from speedrun.model.config import GPTConfig

    fake = FakeLibrary(returns_tuple=True)
    inject(monkeypatch, "fa4", fake)
    CausalSelfAttention(GPTConfig(vocab_size=8, n_layer=1, model_dim=8, n_head=2, head_dim=4,
                                  attention_backend="fa4"))
    assert flash._LOADED["fa4"] == (fake.flash_attn_varlen_func, None)     # found before any forward pass


def test_the_benchmark_runs_on_a_cpu_and_reports_a_missing_backend(tmp_path, capsys):
    import runpy

    bench = runpy.run_path(str(Path(__file__).parents[1] / "benchmarks" / "attention_backends.py"))
    out = tmp_path / "rows.jsonl"
    status = bench["main"](["--device", "cpu", "--tokens", "300", "--heads", "2", "--head-dim", "8", "--windows",
                            "50", "--repeats", "1", "--backends", "reference,sdpa_docs,fa4", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert status == 1 and [r["backend"] for r in rows] == ["reference", "sdpa_docs", "fa4"]
    assert rows[0]["baseline"] and rows[0]["fwd_bwd_ms"] > 0
    assert max(rows[1][f"rel_diff_{n}"] for n in ("out", "dq", "dk", "dv")) < 1e-5
    assert rows[2]["error"].startswith("ValueError: attention backend 'fa4' needs CUDA")
