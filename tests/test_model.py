"""The GPT, its configuration and building blocks against independent references: ln V at
initialization, packing invariance (a document alone or packed gives the same hidden states), RoPE
against complex multiplication, ReLU² and RMS norm by hand, the chunked cross-entropy against
``F.cross_entropy`` on full float64 logits."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from speedrun.errors import SpeedrunError
from speedrun.model.config import PRESETS, GPTConfig, build_model_config
from speedrun.model.gpt import GPT
from speedrun.model.loss import linear_cross_entropy
from speedrun.model.mlp import MLP
from speedrun.model.norm import rms_norm
from speedrun.model.rotary import apply_rotary, rotary_frequencies, rotary_tables

SMALL = dict(vocab_size=320, n_layer=2, model_dim=32, n_head=2, head_dim=16, attention_backend="reference")


def small_model(dtype=torch.float64, **overrides) -> GPT:
    torch.manual_seed(0)
    model = GPT(build_model_config("tiny", {**SMALL, **overrides})).to(dtype)
    with torch.no_grad():                       # a trained-looking head and output projections
        for name, p in model.named_parameters():
            if name.endswith(("o.weight", "proj.weight")) or name.startswith("lm_head"):
                p.normal_(0, 0.1)
    return model


def batch(num_tokens=40, vocab=320, bounds=(0, 13, 14, 40), seed=1):
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, vocab, (num_tokens,), generator=g, dtype=torch.int32)
    targets = torch.randint(0, vocab, (num_tokens,), generator=g)
    return inputs, targets, torch.tensor(bounds, dtype=torch.int32)


def test_presets_and_overrides():
    wide = PRESETS["gpt124m"]
    assert (wide.model_dim, wide.n_layer, wide.n_head, wide.head_dim) == (768, 12, 6, 128)
    assert wide.vocab_size == 50304 and wide.vocab_size % 128 == 0 and wide.vocab_size >= 50257
    cfg = build_model_config("tiny", {"n_layer": 3, "logit_softcap": 15.0})
    assert cfg.n_layer == 3 and cfg.logit_softcap == 15.0
    assert cfg.model_dim == PRESETS["tiny"].model_dim


@pytest.mark.parametrize("overrides,match", [
    ({"n_layers": 3}, "unknown model setting 'n_layers'"),
    ({"head_dim": 15}, "head_dim must be even"),
    ({"model_dim": 0}, "model_dim must be a positive integer"),
    ({"attention_backend": "flash"}, "attention_backend must be one of"),
    ({"logit_softcap": -1.0}, "logit_softcap"),
])
def test_bad_model_settings_raise(overrides, match):
    with pytest.raises(SpeedrunError, match=match):
        build_model_config("tiny", overrides)
    with pytest.raises(SpeedrunError, match="unknown model preset 'huge'"):
        build_model_config("huge", {})


def test_forward_shapes_and_loss_at_initialization_is_ln_vocab():
    model = GPT(build_model_config("tiny", {"n_layer": 2}))
    inputs, targets, cu = batch(num_tokens=64, vocab=50257, bounds=(0, 20, 64))
    hidden = model.hidden_states(inputs, cu)
    assert hidden.shape == (64, model.config.model_dim) and hidden.dtype == torch.float32
    loss = model(inputs, targets, cu)
    assert loss.shape == () and loss.dtype == torch.float32
    assert loss.item() == pytest.approx(math.log(50304), abs=1e-5)     # zero-initialized head
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.002)
    assert model(inputs, targets, cu).item() == pytest.approx(math.log(50304), abs=0.01)


def test_a_document_packed_with_others_gives_the_same_hidden_states_as_alone():
    """Positions restart and attention stops at document starts, so packing changes nothing."""
    model = small_model()
    inputs, _, _ = batch()
    packed = model.hidden_states(inputs, torch.tensor([0, 13, 14, 40], dtype=torch.int32))
    alone = model.hidden_states(inputs[14:], torch.tensor([0, 26], dtype=torch.int32))
    torch.testing.assert_close(packed[14:], alone, rtol=1e-10, atol=1e-10)
    first = model.hidden_states(inputs[:13], torch.tensor([0, 13], dtype=torch.int32))
    torch.testing.assert_close(packed[:13], first, rtol=1e-10, atol=1e-10)


def test_full_and_chunked_cross_entropy_give_the_same_model_loss_and_gradients():
    model = small_model(logit_softcap=3.0)
    inputs, targets, cu = batch()
    results = []
    for impl in ("full", "chunked"):
        model.config = dataclasses.replace(model.config, cross_entropy=impl, loss_chunk_tokens=7)
        model.zero_grad()
        loss = model(inputs, targets, cu)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-12, atol=1e-12)
    for g_chunked, g_full in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(g_chunked, g_full, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("softcap", [None, 2.5])
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_cross_entropy_against_float64_reference(softcap, chunk):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(19, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 8, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 50, (19,), generator=g)
    logits = x @ w.T
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    expected = F.cross_entropy(logits, t)
    ex, ew = torch.autograd.grad(expected, (x, w))
    got = linear_cross_entropy(x, w, t, softcap=softcap, impl="chunked", chunk_tokens=chunk)
    gx, gw = torch.autograd.grad(3.0 * got, (x, w))                   # the upstream gradient scales
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gx, 3.0 * ex, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gw, 3.0 * ew, rtol=1e-10, atol=1e-12)


def test_chunked_cross_entropy_in_bfloat16_is_close_and_reports_huge_losses_exactly():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(64, 16, generator=g)
    w = torch.randn(1000, 16, generator=g) * 0.3
    t = torch.randint(0, 1000, (64,), generator=g)
    expected = F.cross_entropy(x.double() @ w.double().T, t)
    got = linear_cross_entropy(x, w, t, compute_dtype=torch.bfloat16, chunk_tokens=16)
    assert got.item() == pytest.approx(expected.item(), rel=2e-3)
    huge = linear_cross_entropy(x * 300.0, w, t, chunk_tokens=16)     # probabilities underflow to 0
    expected_huge = F.cross_entropy((x * 300.0).double() @ w.double().T, t)
    assert math.isfinite(huge.item()) and expected_huge.item() > 200
    assert huge.item() == pytest.approx(expected_huge.item(), rel=1e-5)


def test_no_grad_forward_computes_no_gradient_buffers():
    model = small_model(dtype=torch.float32)
    with torch.no_grad():
        loss = model(*batch())
    assert loss.grad_fn is None and math.isfinite(loss.item())


def test_rotary_equals_complex_multiplication_and_depends_on_relative_position():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 2, 8, generator=g, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 0, 5, 9])
    freqs = rotary_frequencies(8, 100.0).double()
    assert freqs.tolist() == pytest.approx([100.0 ** (-i / 4) for i in range(4)])
    cos, sin = rotary_tables(positions, freqs)
    got = apply_rotary(x, cos.double(), sin.double())
    z = torch.complex(x[..., :4], x[..., 4:]) * torch.polar(torch.ones(6, 1, 4, dtype=torch.float64),
                                                             (positions[:, None] * freqs)[:, None, :])
    torch.testing.assert_close(got, torch.cat([z.real, z.imag], dim=-1))
    q, k = x[0:1], x[1:2]

    def score(m, n):
        cq, sq = rotary_tables(torch.tensor([m]), freqs)
        ck, sk = rotary_tables(torch.tensor([n]), freqs)
        return (apply_rotary(q, cq.double(), sq.double()) * apply_rotary(k, ck.double(), sk.double())).sum()

    assert score(7, 3).item() == pytest.approx(score(4, 0).item(), rel=1e-6)
    assert score(7, 3).item() != pytest.approx(score(7, 0).item(), rel=1e-3)


def test_mlp_is_relu_squared_by_hand():
    cfg = GPTConfig(model_dim=2, mlp_ratio=1, n_head=1, head_dim=2)
    mlp = MLP(cfg)
    with torch.no_grad():
        mlp.fc.weight.copy_(torch.tensor([[1.0, 0.0], [1.0, -1.0]]))
        mlp.proj.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
    x = torch.tensor([[3.0, 1.0], [-2.0, 1.0]])
    # hidden: relu([3, 2])^2 = [9, 4]; relu([-2, -3])^2 = [0, 0]
    torch.testing.assert_close(mlp(x), torch.tensor([[9.0 + 8.0, 4.0], [0.0, 0.0]]))
    assert torch.count_nonzero(MLP(cfg).proj.weight) == 0                  # zero-initialized output


def test_rms_norm_by_hand():
    x = torch.tensor([[3.0, 4.0], [1.0, 1.0]], dtype=torch.float64)
    expected = torch.tensor([[3.0, 4.0], [1.0, 1.0]], dtype=torch.float64) / torch.tensor(
        [[math.sqrt(12.5)], [1.0]], dtype=torch.float64)
    torch.testing.assert_close(rms_norm(x), expected)


def test_parameter_kinds_put_every_block_matrix_in_muon_and_the_rest_in_adam():
    model = small_model()
    kinds = model.parameter_kinds()
    assert set(kinds) == {n for n, _ in model.named_parameters()}
    assert kinds["embed.weight"] == "embed" and kinds["lm_head.weight"] == "head"
    matrices = {n for n, k in kinds.items() if k == "matrix"}
    expected = {f"blocks.{i}.{m}.weight" for i in range(2)
                for m in ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.fc", "mlp.proj")}
    assert matrices == expected
