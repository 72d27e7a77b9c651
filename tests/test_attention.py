"""Document-causal attention: every backend against a naive per-document, per-query loop in float64
(values and gradients), with and without a sliding window; the packing helpers on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from speedrun.model.attention import attention
from speedrun.model.packing import document_causal_mask, document_ids, document_positions

BACKENDS = ["reference", "sdpa", "sdpa_docs"]


def naive_attention(q, k, v, cu_seqlens, scale, window=None):
    """For each document and each query i in it: softmax over keys j of the same document with
    j <= i (and i - j < window) of scale * q_i . k_j, applied to v_j. Plain loops, no masks."""
    num_tokens, heads, _ = q.shape
    out = torch.zeros_like(v)
    bounds = cu_seqlens.tolist()
    for start, stop in zip(bounds[:-1], bounds[1:]):
        for i in range(start, stop):
            first = start if window is None else max(start, i - window + 1)
            for h in range(heads):
                scores = torch.stack([scale * torch.dot(q[i, h], k[j, h]) for j in range(first, i + 1)])
                weights = torch.softmax(scores, dim=0)
                out[i, h] = sum(w * v[j, h] for w, j in zip(weights, range(first, i + 1)))
    return out


def random_qkv(num_tokens=23, heads=2, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(num_tokens, heads, dim, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(3)]


CASES = [
    (torch.tensor([0, 23], dtype=torch.int32), None),
    (torch.tensor([0, 5, 6, 14, 23], dtype=torch.int32), None),
    (torch.tensor([0, 5, 6, 14, 23], dtype=torch.int32), 3),
    (torch.tensor([0, 23], dtype=torch.int32), 1),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cu_seqlens,window", CASES)
def test_backend_matches_naive_loop_values_and_gradients(backend, cu_seqlens, window):
    q, k, v = random_qkv()
    scale = 0.3
    expected = naive_attention(q, k, v, cu_seqlens, scale, window)
    got = attention(q, k, v, cu_seqlens, scale, window, backend=backend)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    weights = torch.randn(got.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads_expected = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    grads_got = torch.autograd.grad((got * weights).sum(), (q, k, v))
    for g_got, g_exp in zip(grads_got, grads_expected):
        torch.testing.assert_close(g_got, g_exp, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("backend", ["sdpa", "sdpa_docs"])
def test_fast_backends_equal_reference_in_float32(backend):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(300, 4, 16, generator=g) for _ in range(3))
    cu_seqlens = torch.tensor([0, 1, 90, 91, 250, 300], dtype=torch.int32)
    for window in (None, 17):
        expected = attention(q, k, v, cu_seqlens, 0.25, window, backend="reference")
        got = attention(q, k, v, cu_seqlens, 0.25, window, backend=backend)
        torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-6)


def test_a_query_ignores_other_documents():
    q, k, v = (t.detach() for t in random_qkv())
    cu_seqlens = torch.tensor([0, 10, 23], dtype=torch.int32)
    base = attention(q, k, v, cu_seqlens, 0.5)
    k2, v2 = k.clone(), v.clone()
    k2[:10] += 5.0
    v2[:10] -= 3.0
    changed = attention(q, k2, v2, cu_seqlens, 0.5)
    torch.testing.assert_close(changed[10:], base[10:], rtol=0, atol=0)
    assert not torch.allclose(changed[:10], base[:10])


def test_unknown_backend_and_bad_window_raise():
    q, k, v = random_qkv()
    cu = torch.tensor([0, 23], dtype=torch.int32)
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        attention(q, k, v, cu, 1.0, backend="flash")
    with pytest.raises(ValueError, match="window"):
        attention(q, k, v, cu, 1.0, window=0)


def test_document_ids_and_positions_restart_at_each_document():
    cu = torch.tensor([0, 3, 5, 9], dtype=torch.int32)
    assert document_ids(cu, 9).tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert document_positions(cu, 9).tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert document_positions(torch.tensor([0, 4], dtype=torch.int32), 4).tolist() == [0, 1, 2, 3]


def test_document_causal_mask_by_hand():
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    expected = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    assert document_causal_mask(cu, 5).int().tolist() == expected
    windowed = [row[:] for row in expected]
    windowed[4][2] = 0                                    # window 2: token 4 sees 3 and 4 only
    assert document_causal_mask(cu, 5, window=2).int().tolist() == windowed


def test_uniform_attention_averages_the_visible_values():
    """With q = 0 every visible key gets the same weight: the output is the mean of the visible values."""
    v = torch.arange(12, dtype=torch.float64).reshape(6, 1, 2)
    q = torch.zeros(6, 1, 2, dtype=torch.float64)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    out = attention(q, q.clone(), v, cu, 1.0 / math.sqrt(2))
    expected = torch.stack([v[0], (v[0] + v[1]) / 2, v[2], (v[2] + v[3]) / 2, (v[2] + v[3] + v[4]) / 3,
                            (v[2] + v[3] + v[4] + v[5]) / 4])
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("cu_seqlens,window", CASES)
def test_flex_backend_forward_matches_naive_loop_on_cpu(cu_seqlens, window):
    """FlexAttention has no CPU backward: the forward here, the gradients in the GPU test below."""
    q, k, v = (t.detach() for t in random_qkv())
    expected = naive_attention(q, k, v, cu_seqlens, 0.3, window)
    got = attention(q, k, v, cu_seqlens, 0.3, window, backend="flex")
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_flex_backend_over_several_128_token_blocks_equals_reference():
    """Windows of 1 and 2 blocks of 128 tokens, documents that straddle block boundaries, a ragged end."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(421, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    cu_seqlens = torch.tensor([0, 100, 101, 300, 421], dtype=torch.int32)
    for window in (None, 128, 256):
        expected = attention(q, k, v, cu_seqlens, 0.4, window, backend="reference")
        got = attention(q, k, v, cu_seqlens, 0.4, window, backend="flex")
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def _random_documents(tokens: int, g: torch.Generator) -> torch.Tensor:
    """cu_seqlens (int32) of documents of 1 to 700 tokens filling ``tokens``, padded with two empty slots."""
    bounds = [0]
    while bounds[-1] < tokens:
        bounds.append(min(tokens, bounds[-1] + int(torch.randint(1, 700, (1,), generator=g))))
    return torch.tensor(bounds + [tokens, tokens], dtype=torch.int32)


def _block_sets(num: torch.Tensor, idx: torch.Tensor) -> list[set[int]]:
    return [set(idx[0, 0, r, :num[0, 0, r]].tolist()) for r in range(num.size(-1))]


@pytest.mark.parametrize("tokens", [1024, 2048])
@pytest.mark.parametrize("window", [None, 128, 200, 384, 1000])
def test_document_block_mask_has_the_blocks_of_create_block_mask(tokens, window):
    """The O(N²) block mask from per-block document ids marks the same partial and full blocks (and so
    the same transposed ones for the backward) as FlexAttention's evaluation of all T² pairs."""
    from torch.nn.attention.flex_attention import create_block_mask

    from speedrun.model.attention import _document_causal_mod, document_block_mask

    g = torch.Generator().manual_seed(tokens + (window or 0))
    for _ in range(3):
        ids = document_ids(_random_documents(tokens, g), tokens)
        mod = _document_causal_mod(ids, window)
        got = document_block_mask(ids, window, mod)
        want = create_block_mask(mod, None, None, tokens, tokens, device="cpu")
        assert _block_sets(got.kv_num_blocks, got.kv_indices) == _block_sets(want.kv_num_blocks, want.kv_indices)
        assert (_block_sets(got.full_kv_num_blocks, got.full_kv_indices)
                == _block_sets(want.full_kv_num_blocks, want.full_kv_indices))
        assert _block_sets(got.q_num_blocks, got.q_indices) == _block_sets(want.q_num_blocks, want.q_indices)
        assert (_block_sets(got.full_q_num_blocks, got.full_q_indices)
                == _block_sets(want.full_q_num_blocks, want.full_q_indices))
    one_doc = torch.zeros(tokens, dtype=torch.int64)          # one document: causal (and windowed) blocks
    mask = document_block_mask(one_doc, window, _document_causal_mod(one_doc, window))
    n = tokens // 128
    behind = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    full = (behind >= 1) if window is None else (behind >= 1) & ((behind + 1) * 128 - 1 < window)
    assert mask.full_kv_num_blocks[0, 0].tolist() == full.sum(-1).tolist()


def test_document_block_mask_refuses_a_ragged_sequence():
    from speedrun.model.attention import _document_causal_mod, document_block_mask

    ids = torch.zeros(200, dtype=torch.int64)
    with pytest.raises(ValueError, match="200 tokens is not a multiple of 128"):
        document_block_mask(ids, None, _document_causal_mod(ids, None))


def test_flex_backend_on_whole_blocks_equals_reference():
    """T a multiple of 128: the hand-built block mask path (the training shape), documents straddling
    blocks, windows of a few blocks and one not a multiple of 128."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(640, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    cu_seqlens = torch.tensor([0, 100, 101, 300, 555, 640, 640], dtype=torch.int32)
    for window in (None, 128, 200, 384):
        expected = attention(q, k, v, cu_seqlens, 0.4, window, backend="reference")
        got = attention(q, k, v, cu_seqlens, 0.4, window, backend="flex")
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["sdpa", "sdpa_docs", "flex", "varlen"])
def test_gpu_backends_match_reference_values_and_gradients_in_bfloat16(backend):
    g = torch.Generator().manual_seed(5)
    for tokens in (1000, 1024):            # a ragged end, and whole 128-token blocks (the training shape)
        cu_seqlens = torch.tensor([0, 130, 131, 600, tokens, tokens, tokens], dtype=torch.int32, device="cuda")
        _check_against_reference_in_bfloat16(backend, (tokens, 4, 64), cu_seqlens, g)


def _check_against_reference_in_bfloat16(backend, shape, cu_seqlens, g):
    q, k, v = (torch.randn(shape, generator=g).cuda().bfloat16().requires_grad_() for _ in range(3))
    weights = torch.randn(shape, generator=g).cuda()
    for window in (None, 128, 384):
        ref = attention(*(t.float() for t in (q, k, v)), cu_seqlens, 0.125, window, backend="reference")
        got = attention(q, k, v, cu_seqlens, 0.125, window, backend=backend)
        torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)
        grads_ref = torch.autograd.grad((ref * weights).sum(), (q, k, v))
        grads_got = torch.autograd.grad((got.float() * weights).sum(), (q, k, v))
        for g_got, g_ref in zip(grads_got, grads_ref):
            torch.testing.assert_close(g_got.float(), g_ref.float(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_documents_change_nothing(backend):
    q, k, v = (t.detach() for t in random_qkv())
    cu_seqlens = torch.tensor([0, 5, 6, 14, 23], dtype=torch.int32)
    padded = torch.tensor([0, 5, 6, 14, 23, 23, 23, 23], dtype=torch.int32)
    for window in (None, 3):
        expected = naive_attention(q, k, v, cu_seqlens, 0.3, window)
        got = attention(q, k, v, padded, 0.3, window, backend=backend)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_padded_document_ids_and_positions():
    padded = torch.tensor([0, 2, 5, 5, 5], dtype=torch.int32)
    assert document_ids(padded, 5).tolist() == [0, 0, 1, 1, 1]
    assert document_positions(padded, 5).tolist() == [0, 1, 0, 1, 2]


def test_packed_documents_cache_builds_once_and_doubles():
    from speedrun.model.attention import PackedDocuments

    docs = PackedDocuments(torch.tensor([0, 3, 7, 7], dtype=torch.int32), 7, max_seqlen=4)
    calls = []
    first = docs.cached("key", lambda: calls.append(1) or "mask")
    assert docs.cached("key", lambda: calls.append(1) or "other") == first == "mask" and calls == [1]
    doubled = docs.doubled()
    assert doubled.cu_seqlens.tolist() == [0, 6, 14, 14] and doubled.num_tokens == 14
    assert doubled.max_seqlen == 8 and docs.doubled() is doubled
    assert docs.longest() == 4 and PackedDocuments(docs.cu_seqlens, 7).longest() == 4


def test_varlen_backend_refuses_cpu_tensors():
    q, k, v = (t.detach().float() for t in random_qkv())
    with pytest.raises(ValueError, match="varlen.*CUDA"):
        attention(q, k, v, torch.tensor([0, 23], dtype=torch.int32), 0.3, backend="varlen")
