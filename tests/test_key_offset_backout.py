"""The partial key offset (record #49, ``GPTConfig.key_offset``) and backout (record #40,
``GPTConfig.backout_layer``) against float64 computations written here: which key dims shift (exactly those
that half-truncated RoPE leaves unrotated), on which layers, across document boundaries; the backed-out
residual stream before the final norm and the head; gradients, parameter kinds, validation, presets, a
few training steps and one compiled graph."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import speedrun.model.block as block_module
from speedrun.errors import SpeedrunError
from speedrun.model.attention import PackedDocuments
from speedrun.model.block import AttentionContext, CausalSelfAttention, offset_keys
from speedrun.model.config import PRESETS, GPTConfig, build_model_config
from speedrun.model.gpt import GPT
from speedrun.model.rotary import apply_rotary, rotary_frequencies, rotary_table
from speedrun.optim.config import OptimConfig
from speedrun.optim.groups import build_optimizers
from test_value_embed_gates import train_losses

# 3 layers: 0 short, 1 long, 2 long but paired: only layer 1 takes the key offset
LAYERS = dict(vocab_size=11, n_layer=3, model_dim=16, n_head=2, head_dim=8, rope="half_truncated",
              window_pattern="SLL", window_block_size=2, paired_head_layers=(2,), key_offset=True,
              attention_backend="reference")
CU = torch.tensor([0, 4, 9], dtype=torch.int32)                      # documents of 4 and 5 tokens
POSITIONS = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4])
SCALE, WINDOW = 0.4, 3


def _norm(z: torch.Tensor) -> torch.Tensor:
    return z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + torch.finfo(z.dtype).eps)


def _stationary_dims(head_dim: int) -> list[int]:
    """The dims that half-truncated RoPE leaves unchanged, found by rotating one vector at two positions."""
    cos, sin = rotary_table(rotary_frequencies(head_dim, 10000.0, mode="half_truncated").double(), 64)
    x = torch.randn(1, 1, head_dim, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    at = lambda p: apply_rotary(x, cos[p:p + 1], sin[p:p + 1], "half_truncated")[0, 0]  # noqa: E731
    return [d for d in range(head_dim) if at(3)[d] == at(50)[d]]


@pytest.mark.parametrize("head_dim", [8, 128])
def test_the_offset_dims_are_exactly_the_ones_rope_leaves_put(head_dim):
    stationary = _stationary_dims(head_dim)
    assert stationary == list(range(head_dim // 2, head_dim))         # our layout: adjacent pairs in dims 0..Dh/2-1
    cos, _ = rotary_table(rotary_frequencies(head_dim, 10000.0, mode="half_truncated"), 4)
    k = torch.randn(6, 2, head_dim, dtype=torch.float64)
    moved = (offset_keys(k, 2 * cos.size(-1)) != k).any(0).any(0)   # the start the attention layer passes
    assert moved.nonzero().flatten().tolist() == stationary


def test_offset_keys_by_hand():
    k = torch.randn(5, 3, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    before = k.clone()
    got = offset_keys(k, 4)
    expected = torch.empty_like(k)
    for t in range(5):
        expected[t, :, :4] = k[t, :, :4]
        expected[t, :, 4:] = k[max(t - 1, 0), :, 4:]                 # position 0 keeps its own
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(k, before, rtol=0, atol=0)             # out of place
    assert got.dtype == k.dtype and offset_keys(k.bfloat16(), 4).dtype == torch.bfloat16


def test_offset_keys_gradcheck():
    k = torch.randn(4, 2, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: offset_keys(z, 4), (k,))
    (grad,) = torch.autograd.grad(offset_keys(k, 4).sum(), k)
    expected = torch.ones(4, 2, 8, dtype=torch.float64)
    expected[-1, :, 4:] = 0                                           # the last row's moving dims feed nothing
    expected[0, :, 4:] = 2                                            # row 0's feed rows 0 and 1
    torch.testing.assert_close(grad, expected, rtol=0, atol=0)


def _layer(layer: int) -> tuple[CausalSelfAttention, AttentionContext]:
    cfg = GPTConfig(**LAYERS)
    torch.manual_seed(3)
    attn = CausalSelfAttention(cfg, layer).double()
    with torch.no_grad():
        attn.o.weight.normal_()
    cos, sin = rotary_table(rotary_frequencies(8, cfg.rope_base, mode="half_truncated").double(), 16)
    return attn, AttentionContext(PackedDocuments(CU, 9), cos[POSITIONS], sin[POSITIONS], SCALE)


def _attention_by_hand(attn: CausalSelfAttention, x: torch.Tensor, shift: str) -> torch.Tensor:
    """float64 (T, C): projections, RMS norm, half-truncated RoPE as complex turns of adjacent pairs, the
    stationary dims of k taken from the previous token (``shift`` "flat": of the packed sequence; "doc": not
    across a document start; "none"), windowed document-causal softmax attention, output projection."""
    t, heads, dim = x.size(0), 2, 8
    q, k, v = ((x @ lin.weight.T).view(t, heads, dim) for lin in (attn.q, attn.k, attn.v))
    freqs = rotary_frequencies(dim, 10000.0, mode="half_truncated").double()          # (2,)
    turn = torch.polar(torch.ones(t, 1, 2, dtype=torch.float64), (POSITIONS[:, None] * freqs)[:, None])

    def rope(z):
        pairs = torch.complex(z[..., 0:4:2], z[..., 1:4:2]) * turn                   # (T, H, 2)
        return torch.cat((torch.stack((pairs.real, pairs.imag), -1).flatten(-2), z[..., 4:]), -1)

    q, k = rope(_norm(q)), rope(_norm(k))
    stationary = _stationary_dims(dim)
    starts = set(CU.tolist())
    shifted = k.clone()
    for i in range(1, t):
        if shift == "flat" or (shift == "doc" and i not in starts):
            shifted[i, :, stationary] = k[i - 1, :, stationary]
    doc = torch.tensor([0] * 4 + [1] * 5)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    visible = (doc[:, None] == doc[None, :]) & (j <= i) & (i - j < WINDOW)
    scores = torch.einsum("thd,shd->hts", q, shifted) * SCALE
    y = torch.einsum("hts,shd->thd", scores.masked_fill(~visible, -math.inf).softmax(-1), v)
    return y.reshape(t, heads * dim) @ attn.o.weight.T


def test_key_offset_on_a_long_layer_matches_the_hand_computation():
    attn, context = _layer(1)
    assert attn.key_offset
    x = torch.randn(9, 16, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    got = attn(x, context, WINDOW)
    torch.testing.assert_close(got, _attention_by_hand(attn, x, "flat"), rtol=1e-12, atol=1e-12)
    # the shift matters, and it crosses the document start at token 4 as the record's does
    assert (got - _attention_by_hand(attn, x, "none")).abs().max() > 1e-2
    assert (got - _attention_by_hand(attn, x, "doc")).abs().max() > 1e-2


def test_no_key_offset_on_short_or_paired_layers():
    short, context = _layer(0)
    paired, _ = _layer(2)
    assert not short.key_offset and not paired.key_offset and paired.paired
    x = torch.randn(9, 16, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    torch.testing.assert_close(short(x, context, WINDOW), _attention_by_hand(short, x, "none"),
                               rtol=1e-12, atol=1e-12)


def test_the_model_offsets_keys_on_long_unpaired_attention_layers_only(monkeypatch):
    cfg = build_model_config("tiny", dict(LAYERS, n_layer=5, window_pattern="LSLLF", paired_head_layers=(3,),
                                          attention_free_layers=(2,)))
    model = GPT(cfg).double()
    assert [b.attn is not None and b.attn.key_offset for b in model.blocks] == [True, False, False, False, False]
    calls = []

    def spy(k, start):
        calls.append((tuple(k.shape), start))
        return offset_keys(k, start)

    monkeypatch.setattr(block_module, "offset_keys", spy)
    inputs = torch.randint(0, 11, (9,), dtype=torch.int32)
    model(inputs, torch.randint(0, 11, (9,)), CU)
    assert calls == [((9, 2, 8), 4)]                                 # layer 0, dims 4..7


def _backout_model(dtype=torch.float64, **overrides) -> GPT:
    settings = dict(vocab_size=32, n_layer=3, model_dim=16, n_head=2, head_dim=8, attention_backend="reference",
                    cross_entropy="full")
    cfg = build_model_config("tiny", {**settings, **overrides})
    torch.manual_seed(0)
    model = GPT(cfg).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o.weight", "proj.weight")) or name.startswith("lm_head"):
                p.normal_(0, 0.3)
    return model


def _batch(tokens=12, vocab=32):
    g = torch.Generator().manual_seed(2)
    inputs = torch.randint(0, vocab, (tokens,), generator=g, dtype=torch.int32)
    return inputs, torch.randint(0, vocab, (tokens,), generator=g), torch.tensor([0, 5, tokens], dtype=torch.int32)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_backout_logits_by_hand(dtype, tol):
    model = _backout_model(dtype, backout_layer=1)
    with torch.no_grad():
        model.backout_lambda.fill_(0.7)
    inputs, targets, cu = _batch()
    lam = torch.tensor(0.7, dtype=dtype, requires_grad=True)
    context = model.attention_context(PackedDocuments(cu, 12))
    x0 = x = _norm(model.embed.weight[inputs.long()])
    for i, block in enumerate(model.blocks):
        x = block(x, x0, context)
        if i == 1:
            saved = x
    logits = _norm(x - lam * saved) @ model.lm_head.weight.T                          # (T, V)
    got = model.hidden_states(inputs, cu) @ model.lm_head.weight.T
    torch.testing.assert_close(got, logits, rtol=tol, atol=tol)
    assert (logits - _norm(x) @ model.lm_head.weight.T).abs().max() > 0.1          # the subtraction matters
    expected_loss = F.cross_entropy(logits, targets)
    loss = model(inputs, targets, cu)
    torch.testing.assert_close(loss, expected_loss, rtol=tol, atol=tol)
    # λ's gradient: that of the hand computation
    (expected_grad,) = torch.autograd.grad(expected_loss, lam)
    loss.backward()
    assert model.backout_lambda.grad.shape == (1,) and abs(float(expected_grad)) > 1e-3
    torch.testing.assert_close(model.backout_lambda.grad[0], expected_grad, rtol=tol * 10, atol=tol)


def test_backout_at_zero_is_the_model_without_it_and_lambda_passes_gradcheck():
    inputs, targets, cu = _batch()
    off, on = _backout_model(), _backout_model(backout_layer=0)
    assert not hasattr(off, "backout_lambda") and "backout_lambda" not in off.state_dict()
    assert on.backout_lambda.dtype == torch.float64 and on.backout_lambda.tolist() == [0.5]
    with torch.no_grad():
        on.backout_lambda.zero_()
        torch.testing.assert_close(on(inputs, targets, cu), off(inputs, targets, cu), rtol=0, atol=0)
    names = [n for n, _ in on.named_parameters()]
    params = [p.detach().clone().normal_(0, 0.5) if n == "backout_lambda" else p.detach().clone()
              for n, p in on.named_parameters()]
    lam = names.index("backout_lambda")

    def loss_of(value):
        values = list(params)
        values[lam] = value
        return torch.func.functional_call(on, dict(zip(names, values)), (inputs, targets, cu))

    assert torch.autograd.gradcheck(loss_of, (params[lam].requires_grad_(),))


def test_parameter_kinds_and_the_scalar_optimizer_group():
    model = _backout_model(backout_layer=1, key_offset=True, rope="half_truncated", window_pattern="SLS")
    kinds = model.parameter_kinds()
    assert kinds["backout_lambda"] == "scalar"
    assert set(kinds) == {n for n, _ in model.named_parameters()}
    assert "backout_lambda" not in _backout_model().parameter_kinds()
    config = OptimConfig()
    groups = [g for g in build_optimizers(model, kinds, config).groups()
              if any(p is model.backout_lambda for p in g["params"])]
    assert [(g["kind"], g["lr"]) for g in groups] == [("scalar", config.scalar_lr)]
    # the key offset adds no parameter
    without = _backout_model(backout_layer=1)
    assert {n for n, _ in model.named_parameters()} == {n for n, _ in without.named_parameters()}


@pytest.mark.parametrize("overrides,match", [
    ({"key_offset": True, "window_pattern": "SL"}, "model.key_offset .*rope half_truncated"),
    ({"key_offset": True, "rope": "half_truncated"}, "model.key_offset .*L layer"),
    ({"key_offset": True, "rope": "half_truncated", "window_pattern": "SS"}, "model.key_offset .*L layer"),
    ({"key_offset": True, "rope": "half_truncated", "window_pattern": "SL", "paired_head_layers": (1,)},
     "model.key_offset .*neither paired"),
    ({"key_offset": True, "rope": "half_truncated", "window_pattern": "SL", "attention_free_layers": (1,)},
     "model.key_offset .*attention-free"),
    ({"key_offset": 1, "rope": "half_truncated", "window_pattern": "SL"}, "model.key_offset must be true or false"),
    ({"backout_layer": -1}, "model.backout_layer"),
    ({"backout_layer": 1}, "model.backout_layer .*n_layer - 1 = 1"),
    ({"backout_layer": 5}, "model.backout_layer"),
    ({"backout_layer": 0.0}, "model.backout_layer"),
    ({"backout_layer": True}, "model.backout_layer"),
])
def test_invalid_settings_name_the_field(overrides, match):
    with pytest.raises(SpeedrunError, match=match):
        build_model_config("tiny", dict(n_layer=2, **overrides))


def test_valid_settings():
    cfg = build_model_config("tiny", dict(n_layer=2, backout_layer=0, key_offset=True, rope="half_truncated",
                                          window_pattern="LS", paired_head_layers=(1,)))
    assert (cfg.backout_layer, cfg.key_offset) == (0, True)


def test_presets():
    wide, record28, tiny = PRESETS["gpt124m"], PRESETS["record28"], PRESETS["tiny"]
    assert (wide.key_offset, wide.backout_layer) == (True, 7)          # HEAD's layer 7 of 11
    assert (record28.key_offset, record28.backout_layer) == (False, None)    # it predates #40 and #49
    assert (tiny.key_offset, tiny.backout_layer) == (False, None)
    with torch.device("meta"):
        offset = [i for i in range(11) if i != 6 and CausalSelfAttention(wide, i).key_offset]
    assert offset == [3, 10]                                          # HEAD's: long, not paired


def _switched_model(backend="reference") -> GPT:
    return _backout_model(torch.float32, backout_layer=1, key_offset=True, rope="half_truncated",
                          window_pattern="LSL", window_block_size=4, attention_backend=backend)


def test_a_tiny_model_with_both_switches_trains():
    model = _switched_model()
    optimizers = build_optimizers(model, model.parameter_kinds(), OptimConfig())
    losses = train_losses(model, optimizers, _batch(), steps=12)
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0] - 0.5, losses
    assert abs(float(model.backout_lambda.detach()) - 0.5) > 1e-4                # λ trained


@pytest.mark.parametrize("backend", ["reference", "flex"])
def test_both_switches_compile_as_one_graph(backend):
    """fullgraph: the key offset and the backout are per-layer constants, no data-dependent branch. Flex on
    a CPU has no backward: forward only there."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = _switched_model(backend)
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, dynamic=False, fullgraph=True)
    inputs, targets, cu = _batch()
    with torch.set_grad_enabled(backend != "flex"):
        loss = compiled(inputs, targets, cu)
        expected = _switched_model().requires_grad_(False)(inputs, targets, cu)       # the reference backend
    if backend != "flex":
        loss.backward()
        assert model.backout_lambda.grad.abs().min() > 0
    torch._dynamo.reset()
    assert counter.frame_count == 1
    torch.testing.assert_close(loss.detach(), expected)
