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


def naive_paired(q, k, v, bounds, freqs, scale, window, mode, layout="adjacent"):
    """The loop: for every token t, pair p and member e, the softmax over the (token, member) keys of the
    pair with doubled position 2t'+e' <= 2t+e in the same document (and within ``window`` positions). The pair
    p holds heads 2p+e ("adjacent") or e·H/2+p ("split"); head h is rotated by the phase 2·pos + h mod 2."""
    tokens, heads, dim = q.shape
    head = (lambda p, e: 2 * p + e) if layout == "adjacent" else (lambda p, e: e * heads // 2 + p)  # noqa: E731
    out = torch.zeros(tokens, heads, dim, dtype=torch.float64)
    doc_of = [d for d in range(len(bounds) - 1) for _ in range(bounds[d + 1] - bounds[d])]
    pos = [t - bounds[doc_of[t]] for t in range(tokens)]
    for t in range(tokens):
        for p in range(heads // 2):
            for e in range(2):
                me = 2 * t + e
                h = head(p, e)
                qv = rotate(q[t, h].tolist(), 2 * pos[t] + h % 2, freqs, mode)
                scores, values = [], []
                for s in range(tokens):
                    for e2 in range(2):
                        other = 2 * s + e2
                        if doc_of[s] != doc_of[t] or other > me or (window and me - other >= window):
                            continue
                        h2 = head(p, e2)
                        kv = rotate(k[s, h2].tolist(), 2 * pos[s] + h2 % 2, freqs, mode)
                        scores.append(scale * sum(a * b for a, b in zip(qv, kv)))
                        values.append(v[s, h2])
                top = max(scores)
                weights = [math.exp(x - top) for x in scores]
                out[t, h] = sum(w * val for w, val in zip(weights, values)) / sum(weights)
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


def test_split_pair_heads_is_the_records_flat_reshape_head_p_with_head_p_plus_half():
    x = torch.arange(2 * 6 * 3, dtype=torch.float64).reshape(2, 6, 3)
    y = pair_heads(x, "split")
    assert torch.equal(y, x.reshape(2, 18).view(4, 3, 3))                  # record #88 L1108: v.reshape(B, 2T, H/2, D)
    for t in range(2):
        for p in range(3):
            assert torch.equal(y[2 * t, p], x[t, p]) and torch.equal(y[2 * t + 1, p], x[t, p + 3])
    assert torch.equal(unpair_heads(y, "split"), x)
    with pytest.raises(ValueError, match="layout must be 'adjacent' or 'split'"):
        pair_heads(x, "interleaved")


@pytest.mark.parametrize("mode,window,layout", [("full", None, "adjacent"), ("half_truncated", None, "adjacent"),
                                                ("full", 5, "adjacent"), ("half_truncated", 5, "split"),
                                                ("full", None, "split")])
def test_paired_attention_matches_the_naive_loop(mode, window, layout):
    q, k, v = random_qkv(heads=6)
    cu = torch.tensor(BOUNDS, dtype=torch.int32)
    positions = torch.tensor([t - b for b, c in zip(BOUNDS, BOUNDS[1:]) for t in range(b, c)])
    freqs = rotary_frequencies(8, 100.0, mode=mode).double()
    cos, sin = rotary_tables(paired_positions(positions), freqs)
    got = paired_attention(q, k, v, PackedDocuments(cu, 13), cos.double(), sin.double(), 0.3, window,
                           rope=mode, layout=layout)
    expected = naive_paired(q, k, v, BOUNDS, freqs.tolist(), 0.3, window, mode, layout)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_split_paired_attention_is_record_88s_view_rotate_view_on_one_document():
    """Record #88's paired branch written out (L1101-1120, one document, window (W, 0) on the doubled
    sequence): q and k viewed (T, H/2, 2·Dh), rotated with the doubled tables of phases 2t and 2t+1 side by
    side, viewed (2T, H/2, Dh); v reshaped so; causal attention; y viewed back (T, H, Dh). Rotation here
    turns by +θ as ours (the record's x_flip turns by -θ: the same up to a sign of each pair's second
    coordinate, which Muon's orthogonalized updates commute with)."""
    tokens, heads, dim = 12, 6, 8
    q, k, v = random_qkv(seed=3, tokens=tokens, heads=heads, dim=dim)
    freqs = rotary_frequencies(dim, 0.0, mode="half_truncated").double()                   # R = 2
    angles = torch.arange(2 * tokens, dtype=torch.float64).view(tokens, 2)[..., None] * freqs  # (T, 2, R)

    def record_rotate(x):                                          # (T, H, Dh) -> (2T, H/2, Dh)
        pairs = x.reshape(tokens, heads // 2, 2, dim)              # (T, H/2, 2·Dh) seen as its two halves
        c, s = angles.cos()[:, None], angles.sin()[:, None]        # (T, 1, 2, R): phase 2t, 2t+1 per half
        a, b = pairs[..., :4:2], pairs[..., 1:4:2]                 # the R rotated (2i, 2i+1) pairs
        turned = torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
        return torch.cat((turned, pairs[..., 4:]), dim=-1).reshape(2 * tokens, heads // 2, dim)

    q2, k2, v2 = record_rotate(q), record_rotate(k), v.reshape(2 * tokens, heads // 2, dim)
    window = 5                                                     # FA3 window_size=(5, 0): 6 positions
    i = torch.arange(2 * tokens)
    allowed = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] <= window)
    scores = torch.einsum("thd,shd->hts", q2, k2) * 0.3
    y = torch.einsum("hts,shd->thd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v2)
    cos, sin = rotary_tables(paired_positions(torch.arange(tokens)), freqs)
    got = paired_attention(q, k, v, PackedDocuments(torch.tensor([0, tokens], dtype=torch.int32), tokens),
                           cos.double(), sin.double(), 0.3, window + 1, rope="half_truncated", layout="split")
    torch.testing.assert_close(got, y.reshape(tokens, heads, dim), rtol=1e-10, atol=1e-10)


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
