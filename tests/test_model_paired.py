"""Paired-head attention (record #58) against a naive float64 loop written here: heads 2p and 2p+1 of token
t sit at doubled positions 2t and 2t+1, rotated by those positions within their document, and attend
causally (within a window of doubled positions) to both heads of the pair."""

from __future__ import annotations

import cmath
import math

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model.attention import PackedDocuments
from speedrun.model.block import AttentionContext, CausalSelfAttention
from speedrun.model.config import GPTConfig, build_model_config
from speedrun.model.norm import rms_norm
from speedrun.model.paired import pair_heads, paired_attention, paired_positions, unpair_heads
from speedrun.model.rotary import rotary_frequencies, rotary_tables

BOUNDS = (0, 5, 6, 13)


def rotate(vec: list[float], phase: float, freqs: list[float], mode: str) -> list[float]:
    """RoPE of one head vector by complex multiplication: "full" pairs (i, i + D/2), "half_truncated"
    pairs (2i, 2i+1) for the len(freqs) frequencies, the remaining dims unchanged."""
    out = list(vec)
    half = len(vec) // 2
    for i, f in enumerate(freqs):
        a, b = (i, i + half) if mode == "full" else (2 * i, 2 * i + 1)
        z = complex(vec[a], vec[b]) * cmath.exp(1j * phase * f)
        out[a], out[b] = z.real, z.imag
    return out


def naive_paired(q, k, v, bounds, freqs, scale, window, mode):
    """The loop: for every token t, pair p and member e, the softmax over the (token, member) keys of the
    pair with doubled position 2t'+e' <= 2t+e in the same document (and within ``window`` positions)."""
    tokens, heads, dim = q.shape
    out = torch.zeros(tokens, heads, dim, dtype=torch.float64)
    doc_of = [d for d in range(len(bounds) - 1) for _ in range(bounds[d + 1] - bounds[d])]
    pos = [t - bounds[doc_of[t]] for t in range(tokens)]
    for t in range(tokens):
        for p in range(heads // 2):
            for e in range(2):
                me = 2 * t + e
                qv = rotate(q[t, 2 * p + e].tolist(), 2 * pos[t] + e, freqs, mode)
                scores, values = [], []
                for s in range(tokens):
                    for e2 in range(2):
                        other = 2 * s + e2
                        if doc_of[s] != doc_of[t] or other > me or (window and me - other >= window):
                            continue
                        kv = rotate(k[s, 2 * p + e2].tolist(), 2 * pos[s] + e2, freqs, mode)
                        scores.append(scale * sum(a * b for a, b in zip(qv, kv)))
                        values.append(v[s, 2 * p + e2])
                top = max(scores)
                weights = [math.exp(x - top) for x in scores]
                out[t, 2 * p + e] = sum(w * val for w, val in zip(weights, values)) / sum(weights)
    return out


def random_qkv(seed=0, tokens=13, heads=4, dim=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(tokens, heads, dim, generator=g, dtype=torch.float64) for _ in range(3)]


def test_pair_heads_places_head_2p_plus_e_of_token_t_at_position_2t_plus_e():
    x = torch.arange(2 * 6 * 3, dtype=torch.float64).reshape(2, 6, 3)
    y = pair_heads(x)
    assert y.shape == (4, 3, 3)
    for t in range(2):
        for p in range(3):
            for e in range(2):
                assert torch.equal(y[2 * t + e, p], x[t, 2 * p + e])
    assert torch.equal(unpair_heads(y), x)
    assert paired_positions(torch.tensor([0, 1, 0, 2])).tolist() == [0, 1, 2, 3, 0, 1, 4, 5]
    with pytest.raises(ValueError, match="even number of heads"):
        pair_heads(torch.zeros(2, 3, 4))


@pytest.mark.parametrize("mode,window", [("full", None), ("half_truncated", None), ("full", 5)])
def test_paired_attention_matches_the_naive_loop(mode, window):
    q, k, v = random_qkv()
    cu = torch.tensor(BOUNDS, dtype=torch.int32)
    positions = torch.tensor([t - b for b, c in zip(BOUNDS, BOUNDS[1:]) for t in range(b, c)])
    freqs = rotary_frequencies(8, 100.0, mode=mode).double()
    cos, sin = rotary_tables(paired_positions(positions), freqs)
    got = paired_attention(q, k, v, PackedDocuments(cu, 13), cos.double(), sin.double(), 0.3, window,
                           rope=mode)
    expected = naive_paired(q, k, v, BOUNDS, freqs.tolist(), 0.3, window, mode)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", ["sdpa", "sdpa_docs", "flex"])
def test_paired_attention_agrees_across_backends(backend):
    q, k, v = random_qkv(seed=1)
    cu = torch.tensor((0, 5, 6, 13, 13), dtype=torch.int32)                  # with an empty padding slot
    positions = torch.tensor([0, 1, 2, 3, 4, 0, 0, 1, 2, 3, 4, 5, 6])
    cos, sin = (t.double() for t in rotary_tables(paired_positions(positions), torch.tensor([1.0, 0.1])))
    args = (q, k, v, PackedDocuments(cu, 13), cos, sin, 0.5, 3)
    expected = paired_attention(*args, rope="half_truncated", backend="reference")
    got = paired_attention(*args, rope="half_truncated", backend=backend)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


def test_a_paired_attention_layer_projects_the_naive_paired_output():
    cfg = GPTConfig(vocab_size=8, n_layer=2, model_dim=12, n_head=4, head_dim=4, paired_head_layers=(1,),
                    attention_backend="reference")
    torch.manual_seed(0)
    attn = CausalSelfAttention(cfg, layer=1).double()
    assert attn.paired and not CausalSelfAttention(cfg, layer=0).paired
    with torch.no_grad():
        attn.o.weight.normal_()
    x = torch.randn(13, 12, dtype=torch.float64)
    cu = torch.tensor(BOUNDS, dtype=torch.int32)
    positions = torch.tensor([t - b for b, c in zip(BOUNDS, BOUNDS[1:]) for t in range(b, c)])
    freqs = rotary_frequencies(4, 10000.0).double()
    cos, sin = (t.double() for t in rotary_tables(positions, freqs))
    pcos, psin = (t.double() for t in rotary_tables(paired_positions(positions), freqs))
    got = attn(x, AttentionContext(PackedDocuments(cu, 13), cos, sin, 0.7, pcos, psin), window=6)
    heads = lambda w: (x @ w.T).view(13, 4, 4)                                  # noqa: E731
    q, k, v = rms_norm(heads(attn.q.weight)), rms_norm(heads(attn.k.weight)), heads(attn.v.weight)
    y = naive_paired(q.detach(), k.detach(), v.detach(), BOUNDS, freqs.tolist(), 0.7, 6, "full")
    torch.testing.assert_close(got, y.reshape(13, 16) @ attn.o.weight.T, rtol=1e-10, atol=1e-10)


def test_paired_heads_need_an_even_head_count_and_attention():
    with pytest.raises(SpeedrunError, match="n_head must be even"):
        build_model_config("tiny", {"n_head": 3, "paired_head_layers": [0]})
    with pytest.raises(SpeedrunError, match="paired_head_layers must be increasing"):
        build_model_config("tiny", {"paired_head_layers": [4]})
    with pytest.raises(SpeedrunError, match="paired_head_layers names layer 1"):
        build_model_config("tiny", {"paired_head_layers": [1], "attention_free_layers": [1]})
