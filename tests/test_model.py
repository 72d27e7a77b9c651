"""The GPT, its configuration and building blocks against independent references: ln V at
initialization, packing invariance (a document alone or packed gives the same hidden states), RoPE
against complex multiplication, ReLU² and RMS norm by hand, the chunked cross-entropy against
``F.cross_entropy`` on full float64 logits."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F

from speedrun.errors import SpeedrunError
from speedrun.model.config import PRESETS, GPTConfig, build_model_config
from speedrun.model.gpt import GPT
from speedrun.model.loss import linear_cross_entropy
from speedrun.model.mlp import MLP
from speedrun.model.norm import rms_norm
from speedrun.model.rotary import (apply_rotary, rotary_frequencies, rotary_table, rotary_tables,
                                   yarn_attention_scale, yarn_frequencies)

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
    assert (wide.model_dim, wide.n_layer, wide.n_head, wide.head_dim) == (768, 11, 6, 128)    # HEAD's shape
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


def test_full_chunked_and_fused_cross_entropy_give_the_same_model_loss_and_gradients():
    model = small_model(logit_softcap=3.0)
    inputs, targets, cu = batch()
    results = []
    for impl in ("full", "chunked", "fused"):
        model.config = dataclasses.replace(model.config, cross_entropy=impl, loss_chunk_tokens=7)
        model.zero_grad()
        loss = model(inputs, targets, cu)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    for loss, grads in results[1:]:
        torch.testing.assert_close(loss, results[0][0], rtol=1e-12, atol=1e-12)
        for g_other, g_full in zip(grads, results[0][1]):
            torch.testing.assert_close(g_other, g_full, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("softcap", [None, 2.5])
@pytest.mark.parametrize("impl,chunk", [("chunked", 1), ("chunked", 5), ("chunked", 64), ("fused", 0)])
def test_chunked_and_fused_cross_entropy_against_float64_reference(softcap, impl, chunk):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(19, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 8, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 50, (19,), generator=g)
    logits = x @ w.T
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    expected = F.cross_entropy(logits, t)
    ex, ew = torch.autograd.grad(expected, (x, w))
    got = linear_cross_entropy(x, w, t, softcap=softcap, impl=impl, chunk_tokens=chunk)
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


def test_record_switches_are_the_gpt124m_defaults_and_off_in_tiny():
    wide, tiny = PRESETS["gpt124m"], PRESETS["tiny"]
    assert (wide.rope, wide.attention_scale, wide.yarn) == ("half_truncated", 0.1, True)
    assert (wide.window_pattern, wide.window_block_size) == ("SSSLSSSSSSL", 128)
    assert (wide.window_short_blocks, wide.window_long_blocks) == (1, 3)
    assert (wide.logit_softcap, wide.softcap_kind) == (23.0, "shifted_sigmoid")
    assert (wide.bigram_vocab_size, wide.bigram_sign_trick) == (377280, True)
    assert (wide.skip_connections, wide.skip_from, wide.skip_to) == ("gated", 3, 6)
    assert wide.attention_free_layers == (6,) and wide.paired_head_layers == (0, 2, 5, 9)
    assert wide.attention_gate_layers == (0, 1, 2, 3, 4, 5, 7, 8, 9, 10)              # every attention layer
    assert (wide.fp8_attention, wide.fp8_head, wide.fp8_mlp, wide.attention_backend) == (True, True, True, "flex")
    assert not PRESETS["record28"].fp8_mlp                                   # record #28 predates #84
    assert (tiny.rope, tiny.attention_scale, tiny.yarn, tiny.window_pattern) == ("full", None, False, "")
    assert (tiny.bigram_vocab_size, tiny.skip_connections, tiny.attention_gate_layers, tiny.paired_head_layers,
            tiny.attention_free_layers, tiny.value_embed_tables, tiny.fp8_attention, tiny.fp8_head,
            tiny.fp8_mlp) == (0, "none", (), (), (), 0, False, False, False)
    with pytest.raises(SpeedrunError, match="yarn"):
        build_model_config("tiny", {"yarn": True})
    with pytest.raises(SpeedrunError, match="rope must be one of"):
        build_model_config("tiny", {"rope": "partial"})
    with pytest.raises(SpeedrunError, match="multiple of 4"):
        build_model_config("tiny", {"rope": "half_truncated", "head_dim": 6})


def test_half_truncated_frequencies_by_hand():
    """Record #17: 32 frequencies (1/1024)^linspace(0, 1, 32) for head_dim 128."""
    freqs = rotary_frequencies(128, 10000.0, mode="half_truncated").double()
    assert freqs.shape == (32,)
    assert freqs.tolist() == pytest.approx([1024.0 ** (-i / 31) for i in range(32)], rel=1e-6)
    assert rotary_frequencies(8, 10000.0, mode="half_truncated").tolist() == pytest.approx([1.0, 1 / 1024])


def test_half_truncated_rotary_turns_adjacent_pairs_of_the_first_half_only():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(5, 2, 8, generator=g, dtype=torch.float64)
    positions = torch.tensor([0, 1, 3, 0, 7])
    freqs = torch.tensor([1.0, 0.25], dtype=torch.float64)
    cos, sin = rotary_tables(positions, freqs)
    got = apply_rotary(x, cos.double(), sin.double(), "half_truncated")
    for t in range(5):
        for i, f in enumerate(freqs.tolist()):
            z = complex(x[t, 0, 2 * i], x[t, 0, 2 * i + 1]) * complex(math.cos(positions[t] * f),
                                                                       math.sin(positions[t] * f))
            assert (got[t, 0, 2 * i].item(), got[t, 0, 2 * i + 1].item()) == pytest.approx((z.real, z.imag))
    torch.testing.assert_close(got[..., 4:], x[..., 4:], rtol=0, atol=0)     # dims 4..7 stay put


def test_yarn_frequencies_and_scale_by_hand():
    """Window 128 -> 384 tokens (s = 1/3): frequencies turning 40, 10, 0.5 and 0 times in the old window."""
    old, new = 128, 384
    turns = torch.tensor([40.0, 10.0, 0.5, 0.0], dtype=torch.float64)
    freqs = 2 * math.pi * turns / old
    got = yarn_frequencies(freqs, old, new)
    w = 9.0 / 31.0                                          # (10 - alpha 1) / (beta 32 - alpha 1)
    expected = [freqs[0].item(), freqs[1].item() * (1 / 3 + w * 2 / 3), freqs[2].item() / 3, 0.0]
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    assert yarn_attention_scale(0.1, old, new) == pytest.approx(0.1 * (1 + 0.2 * math.log(3)))
    torch.testing.assert_close(yarn_frequencies(freqs, old, old), freqs)


def test_model_applies_yarn_when_the_long_window_grows():
    cfg = build_model_config("tiny", {**SMALL, "rope": "half_truncated", "attention_scale": 0.1, "yarn": True,
                                      "window_pattern": "SL", "window_block_size": 4})
    model = GPT(cfg)
    start = model.rotary_frequencies.clone()
    assert model.layer_windows() == [4, 12]
    model.set_window_blocks(2, 3)                                 # short only: no rescale
    torch.testing.assert_close(model.rotary_frequencies, start, rtol=0, atol=0)
    assert model.attention_scale == 0.1 and model.layer_windows() == [8, 12]
    model.set_window_blocks(2, 7)                                 # long 12 -> 28 tokens
    torch.testing.assert_close(model.rotary_frequencies, yarn_frequencies(start, 12, 28))
    assert model.attention_scale == pytest.approx(0.1 * (1 + 0.2 * math.log(28 / 12)))
    plain = GPT(build_model_config("tiny", {**SMALL, "window_pattern": "SL", "window_block_size": 4}))
    before = plain.rotary_frequencies.clone()
    plain.set_window_blocks(2, 7)
    assert plain.attention_scale == 16 ** -0.5
    torch.testing.assert_close(plain.rotary_frequencies, before, rtol=0, atol=0)


@pytest.mark.parametrize("rope", ["full", "half_truncated"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rotary_table_rows_equal_rotary_tables_of_their_positions(rope, dtype):
    """The model's (P, R) tables gathered at random positions equal cos/sin evaluated there, bit for bit
    (float64 after ``.double()``: the tables are rebuilt, not cast); row 3 against float64 by hand."""
    model = small_model(dtype, rope=rope, rotary_positions=5000)
    freqs = model.rotary_frequencies
    assert model.rotary_cos.shape == model.rotary_sin.shape == (5000, freqs.numel())
    assert model.rotary_cos.dtype == model.rotary_sin.dtype == dtype
    positions = torch.randint(0, 5000, (3000,), generator=torch.Generator().manual_seed(3))
    cos, sin = rotary_tables(positions, freqs)
    assert torch.equal(model.rotary_cos[positions], cos) and torch.equal(model.rotary_sin[positions], sin)
    table_cos, table_sin = rotary_table(freqs, 5000)
    assert torch.equal(table_cos, model.rotary_cos) and torch.equal(table_sin, model.rotary_sin)
    by_hand = [(math.cos(3 * f), math.sin(3 * f)) for f in freqs.double().tolist()]
    got = list(zip(model.rotary_cos[3].tolist(), model.rotary_sin[3].tolist()))
    assert [c for pair in got for c in pair] == pytest.approx([c for pair in by_hand for c in pair], abs=1e-6)


def test_yarn_rewrites_the_rotary_tables_in_place():
    cfg = build_model_config("tiny", {**SMALL, "rope": "half_truncated", "attention_scale": 0.1, "yarn": True,
                                      "window_pattern": "SL", "window_block_size": 4, "rotary_positions": 300})
    model = GPT(cfg)
    pointers = (model.rotary_cos.data_ptr(), model.rotary_sin.data_ptr())
    start = model.rotary_cos.clone()
    model.set_window_blocks(2, 3)                                 # short only: no rescale
    assert torch.equal(model.rotary_cos, start)
    model.set_window_blocks(2, 7)                                 # long 12 -> 28 tokens
    cos, sin = rotary_table(model.rotary_frequencies, 300)
    assert torch.equal(model.rotary_cos, cos) and torch.equal(model.rotary_sin, sin)
    assert not torch.equal(model.rotary_cos, start)
    assert (model.rotary_cos.data_ptr(), model.rotary_sin.data_ptr()) == pointers


@pytest.mark.parametrize("paired", [(), (0,)])
def test_a_sequence_beyond_the_rotary_tables_raises(paired):
    """T = 40 tokens need 40 rows, 80 with paired heads (positions up to 2T-1 of the doubled sequence)."""
    need = 80 if paired else 40
    inputs, targets, cu = batch()
    with torch.no_grad():
        small_model(rotary_positions=need, paired_head_layers=paired)(inputs, targets, cu)
        with pytest.raises(ValueError, match=f"model.rotary_positions = {need - 1} .* needs {need} positions"):
            small_model(rotary_positions=need - 1, paired_head_layers=paired)(inputs, targets, cu)
    with pytest.raises(SpeedrunError, match="rotary_positions must be a positive integer"):
        build_model_config("tiny", {"rotary_positions": 0})


@pytest.mark.parametrize("chunk", [5, 64])
def test_shifted_sigmoid_softcap_against_float64_reference(chunk):
    """Record #54: logits 23 * sigmoid((z + 5) / 7.5), written out here by hand."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(19, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 8, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 50, (19,), generator=g)
    z = 3.0 * x @ w.T
    logits = 23.0 / (1.0 + torch.exp(-(z + 5.0) / 7.5))
    expected = F.cross_entropy(logits, t)
    ex, ew = torch.autograd.grad(expected, (x, w))
    for impl in ("full", "chunked"):
        got = linear_cross_entropy(3.0 * x, w, t, softcap=23.0, softcap_kind="shifted_sigmoid", impl=impl,
                                   chunk_tokens=chunk)
        gx, gw = torch.autograd.grad(got, (x, w))
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gx, ex, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(gw, ew, rtol=1e-10, atol=1e-12)


def _record_model(backend="reference"):
    """The gpt124m switches on 3 layers (FP8 off: float64 on a CPU; the key offset on layer 1, backout of
    layer 1's output)."""
    cfg = build_model_config("gpt124m", {"vocab_size": 320, "n_layer": 3, "model_dim": 32, "n_head": 2,
                                         "head_dim": 16, "window_pattern": "SLS", "window_block_size": 4,
                                         "value_embed_layers": [0, 2], "attention_backend": backend,
                                         "loss_chunk_tokens": 16, "bigram_vocab_size": 97, "skip_from": 0,
                                         "skip_to": 2, "attention_gate_layers": [0, 1, 2],
                                         "paired_head_layers": [0, 2], "fp8_attention": False,
                                         "fp8_head": False, "backout_layer": 1, "attention_free_layers": []})
    torch.manual_seed(0)
    model = GPT(cfg).double()
    with torch.no_grad():                       # move the switches off their identity initialization
        for block in model.blocks:
            block.lambdas.copy_(torch.tensor([0.9, 0.3]))
            block.attn.gate.weight.normal_()
        model.smear.lambda_.fill_(0.5)
        model.smear.gate.normal_()
        model.bigram.table.normal_()
        model.skips.lambda_.fill_(0.4)
    return model


def test_gpt124m_switches_agree_across_backends_and_untie():
    inputs, targets, cu = batch()
    ref = _record_model()
    loss = ref(inputs, targets, cu)
    for backend in ("sdpa", "sdpa_docs", "flex"):
        with torch.no_grad():
            torch.testing.assert_close(_record_model(backend)(inputs, targets, cu), loss.detach())
    loss.backward()
    ref.fold_tied_gradients()
    grads = {n: p.grad for n, p in ref.named_parameters()}
    assert grads["embed.weight"] is None                              # tied: folded into the head's
    assert all(g is not None for n, g in grads.items() if n != "embed.weight")
    assert ref.config.value_embed_layers == (0, 2)
    ref.untie_embed_head()
    torch.testing.assert_close(ref.embed.weight, ref.lm_head.weight, rtol=0, atol=0)
    ref.zero_grad()
    ref(inputs, targets, cu).backward()
    assert ref.embed.weight.grad is not None and ref.embed.weight.grad.abs().sum() > 0
    with pytest.raises(RuntimeError, match="not tied"):
        ref.untie_embed_head()


def test_untying_the_embedding_compiles_nothing_new():
    """The forward pass reads the embedding's copy tied or untied, so the untie step reuses the graph: one
    Dynamo frame for both states, and after the untie the compiled model follows the embedding's own values."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = small_model(tie_embed_head=True, cross_entropy="full")
    model.sync_tied_embedding()                                  # small_model redrew the head after the copy
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, dynamic=False)
    inputs, targets, cu = batch()
    tied = compiled(inputs, targets, cu)
    tied.backward()
    model.zero_grad(set_to_none=True)
    model.untie_embed_head()
    with torch.no_grad():
        model.embed.weight.add_(torch.randn(model.embed.weight.shape, dtype=torch.float64,
                                            generator=torch.Generator().manual_seed(2)))  # now they differ
    untied = compiled(inputs, targets, cu)
    untied.backward()
    torch._dynamo.reset()
    assert counter.frame_count == 1
    torch.testing.assert_close(untied, model(inputs, targets, cu))
    assert abs(float(untied) - float(tied)) > 1e-3
    assert model.embed.weight.grad is not None and model.embed.weight.grad.abs().sum() > 0


def test_per_document_sdpa_compiles_once_for_every_document_layout():
    """``sdpa_docs`` (the CPU default) loops over the batch's documents in Python: compiled, it would guard on
    every layout and recompile inside the timed steps. It runs outside the graph, so a new layout (the loader
    pads ``cu_seqlens`` to a fixed length with empty documents) compiles nothing new, and the compiled model
    still gives the eager model's loss for each layout."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = small_model(attention_backend="sdpa_docs", cross_entropy="full").eval()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, dynamic=False)
    frames = []
    with torch.no_grad():
        for bounds in ((0, 13, 14, 40, 40), (0, 20, 40, 40, 40), (0, 5, 9, 30, 40), (0, 40, 40, 40, 40)):
            inputs, targets, cu = batch(bounds=bounds)
            torch.testing.assert_close(compiled(inputs, targets, cu), model(inputs, targets, cu))
            frames.append(counter.frame_count)
    torch._dynamo.reset()
    assert frames[0] > 0 and frames == [frames[0]] * 4


def test_merged_qkv_product_equals_the_three_projections():
    """One product with the stacked weights gives q, k, v of the three separate projections (fp64 exactly
    up to summation order; in training with fp8_attention within FP8 tolerance, one scale for the three)."""
    attn = small_model().blocks[0].attn
    x = torch.randn(9, 32, dtype=torch.float64)
    expected = torch.cat((attn.q(x), attn.k(x), attn.v(x)), dim=1)                   # (T, 3·H·Dh)
    torch.testing.assert_close(attn._qkv(x), expected, rtol=1e-12, atol=1e-12)
    fp8 = small_model(dtype=torch.float32, fp8_attention=True).blocks[0].attn.train()
    xf = torch.randn(16, 32)
    exact = xf.double() @ torch.cat((fp8.q.weight, fp8.k.weight, fp8.v.weight)).double().T
    got = fp8._qkv(xf)
    assert got.dtype == torch.bfloat16
    error = float((got.double() - exact).norm() / exact.norm())
    assert 1e-3 < error < 0.1                                     # quantized, and still the same product


def test_flex_takes_the_windows_and_the_yarn_scale_as_graph_inputs():
    """With FlexAttention the windows and the YaRN-rescaled attention scale are buffers that a compiled
    graph reads, not constants it guards on: growing the windows (and rescaling) compiles nothing new, and
    the captured graph's losses follow the new windows and scale as the reference backend's (which takes
    Python numbers, and so recompiles at each change) do."""
    from torch._dynamo.testing import CompileCounter

    overrides = dict(rope="half_truncated", attention_scale=0.1, yarn=True, window_pattern="SL",
                     window_block_size=4, cross_entropy="full")                  # one graph, no break
    inputs, targets, cu = batch()
    frames, losses = {}, {}
    for backend in ("flex", "reference"):
        torch._dynamo.reset()
        model = small_model(**overrides, attention_backend=backend).eval()
        counter = CompileCounter()
        compiled = torch.compile(model, backend=counter, dynamic=False)
        with torch.no_grad():
            losses[backend] = []
            for blocks in ((1, 3), (2, 3), (2, 7)):                   # 4/12, 8/12, 8/28 tokens; YaRN at 12 -> 28
                model.set_window_blocks(*blocks)
                losses[backend].append(compiled(inputs, targets, cu))
        frames[backend] = counter.frame_count
    torch._dynamo.reset()
    assert frames == {"flex": 1, "reference": 3}
    torch.testing.assert_close(losses["flex"], losses["reference"])
    assert len({round(float(loss), 6) for loss in losses["flex"]}) == 3       # each change moves the loss
    assert model.window_sizes.tolist() == [8, 28]
    assert float(model.attention_scale_buffer) == model.attention_scale == pytest.approx(
        0.1 * (1 + 0.2 * math.log(28 / 12)))
    half = small_model(torch.float32, **overrides, attention_backend="flex")
    half.set_window_blocks(2, 7)
    half = half.bfloat16()                                # a 16-bit model keeps the scale in fp32, not rounded
    assert half.attention_scale_buffer.dtype == torch.float32
    assert float(half.attention_scale_buffer) == pytest.approx(half.attention_scale, rel=1e-7)


def test_residual_lambda_init_grows_the_stream_by_hand():
    """Record #45: λ0 of the x0 lambdas from 1.1. With the output projections at their zero initialization
    every block returns λ0·x + λ1·x0 = 1.1·x, so the stream after n blocks is 1.1^n·x0 (float64)."""
    assert PRESETS["gpt124m"].resid_lambda_init == 1.1 and PRESETS["record28"].resid_lambda_init == 1.0
    torch.manual_seed(0)
    cfg = build_model_config("tiny", {**SMALL, "x0_lambdas": True, "resid_lambda_init": 1.1})
    model = GPT(cfg).to(torch.float64)
    assert all(block.lambdas.tolist() == pytest.approx([1.1, 0.0]) for block in model.blocks)
    inputs, _, bounds = batch()
    x0 = rms_norm(F.embedding(inputs, model.embed.weight))
    expected = rms_norm(1.1 ** cfg.n_layer * x0)
    torch.testing.assert_close(model.hidden_states(inputs, bounds), expected, rtol=1e-12, atol=1e-12)
    with torch.no_grad():                                # λ0 = 1 leaves the stream as it came
        for block in model.blocks:
            block.lambdas.copy_(torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(model.hidden_states(inputs, bounds), rms_norm(x0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("overrides, message", [
    ({"resid_lambda_init": 0.0}, "resid_lambda_init must be a finite number > 0, got 0.0"),
    ({"resid_lambda_init": "1e-1"}, "resid_lambda_init must be a finite number > 0, got '1e-1'"),
    ({"resid_lambda_init": 1.1, "x0_lambdas": False}, "resid_lambda_init 1.1 sets the x0 lambdas' λ0: it needs"),
])
def test_residual_lambda_init_errors(overrides, message):
    with pytest.raises(SpeedrunError, match=re.escape(message)):
        build_model_config("tiny", overrides)
