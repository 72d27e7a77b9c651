"""Value-embedding init std and record #28's value lambdas (``GPTConfig.value_embed_std``,
``GPTConfig.value_lambdas``): v = λ0·v + λ1·ve (λ0·v without a value embedding), against float64 by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from speedrun.errors import SpeedrunError
from speedrun.model.attention import PackedDocuments, attention
from speedrun.model.block import AttentionContext, CausalSelfAttention
from speedrun.model.config import PRESETS, GPTConfig, build_model_config
from speedrun.model.gpt import GPT
from speedrun.model.rotary import apply_rotary, rotary_frequencies, rotary_table
from speedrun.optim.groups import OptimConfig, build_optimizers

TINY = dict(vocab_size=11, n_layer=2, model_dim=8, n_head=2, head_dim=4, attention_backend="reference")
CU = torch.tensor([0, 3, 7], dtype=torch.int32)                     # documents of 3 and 4 tokens
POSITIONS = torch.tensor([0, 1, 2, 0, 1, 2, 3])


def _attention_layer(value_lambdas: bool, lambdas=(0.3, 1.7)) -> tuple[CausalSelfAttention, AttentionContext]:
    """A float64 attention layer with random q, k, v, o weights (and λ set to ``lambdas``), and the context
    of the documents CU with the real rotary tables."""
    cfg = GPTConfig(**TINY, value_lambdas=value_lambdas)
    torch.manual_seed(3)
    attn = CausalSelfAttention(cfg).double()
    with torch.no_grad():
        attn.o.weight.normal_()
        if value_lambdas:
            attn.value_lambdas.copy_(torch.tensor(lambdas, dtype=torch.float64))
    cos, sin = rotary_table(rotary_frequencies(cfg.head_dim, cfg.rope_base).double(), 8)
    context = AttentionContext(PackedDocuments(CU, 7), cos[POSITIONS], sin[POSITIONS], 0.5)
    return attn, context


def _by_hand(attn: CausalSelfAttention, context: AttentionContext, x: torch.Tensor, ve: torch.Tensor | None,
             lambdas: torch.Tensor | None) -> torch.Tensor:
    """float64: three separate projections, RMS norm of q and k written out, RoPE, v mixed with the given
    (λ0, λ1) (None: v + ve), reference attention, output projection. (T, C)."""
    t = x.size(0)
    q, k, v = (x @ lin.weight.T for lin in (attn.q, attn.k, attn.v))
    q, k, v = (z.view(t, 2, 4) for z in (q, k, v))
    norm = lambda z: z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + torch.finfo(z.dtype).eps)  # noqa: E731
    q = apply_rotary(norm(q), context.cos, context.sin, "full")
    k = apply_rotary(norm(k), context.cos, context.sin, "full")
    ve = None if ve is None else ve.view(t, 2, 4)
    if lambdas is None:
        mixed = v if ve is None else v + ve
    else:
        mixed = lambdas[0] * v if ve is None else lambdas[0] * v + lambdas[1] * ve
    y = attention(q, k, mixed, CU, 0.5, backend="reference")
    return y.reshape(t, 8) @ attn.o.weight.T


def test_value_lambdas_mix_v_and_the_value_embedding_by_hand():
    attn, context = _attention_layer(True)
    g = torch.Generator().manual_seed(5)
    x, ve = torch.randn(7, 8, generator=g, dtype=torch.float64), torch.randn(7, 8, generator=g, dtype=torch.float64)
    lambdas = torch.tensor([0.3, 1.7], dtype=torch.float64, requires_grad=True)
    expected = _by_hand(attn, context, x, ve, lambdas)
    got = attn(x, context, None, ve)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    # λ is not (1, 1): the mix differs from v + ve and from v
    assert (got - _by_hand(attn, context, x, ve, None)).abs().max() > 0.1
    # the gradient of λ: that of the hand computation
    w = torch.randn(7, 8, generator=g, dtype=torch.float64)
    (expected_grad,) = torch.autograd.grad((expected * w).sum(), lambdas)
    (got * w).sum().backward()
    torch.testing.assert_close(attn.value_lambdas.grad, expected_grad, rtol=1e-12, atol=1e-12)
    assert expected_grad.abs().min() > 1e-3


def test_value_lambdas_without_a_value_embedding_scale_v_by_lambda0_only():
    attn, context = _attention_layer(True)
    x = torch.randn(7, 8, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    got = attn(x, context, None, None)
    torch.testing.assert_close(got, _by_hand(attn, context, x, None, torch.tensor([0.3, 0.0], dtype=torch.float64)),
                               rtol=1e-12, atol=1e-12)
    # attention is linear in v: λ0·v gives 0.3 times the output of v
    torch.testing.assert_close(got, 0.3 * _by_hand(attn, context, x, None, None), rtol=1e-12, atol=1e-12)
    got.pow(2).sum().backward()
    grad = attn.value_lambdas.grad
    assert grad[0].abs() > 1e-3 and grad[1] == 0                 # λ1 is unused in such a layer


def test_without_value_lambdas_the_values_are_v_plus_ve_exactly():
    """value_lambdas off: no parameter (checkpoints keep their keys), v + ve as before; and the mix at
    λ = (1, 1) is bit for bit the same model."""
    off, context = _attention_layer(False)
    on, _ = _attention_layer(True, lambdas=(1.0, 1.0))
    assert off.value_lambdas is None and "value_lambdas" not in off.state_dict()
    g = torch.Generator().manual_seed(7)
    x, ve = torch.randn(7, 8, generator=g, dtype=torch.float64), torch.randn(7, 8, generator=g, dtype=torch.float64)
    got = off(x, context, None, ve)
    torch.testing.assert_close(got, _by_hand(off, context, x, ve, None), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, on(x, context, None, ve), rtol=0, atol=0)
    torch.testing.assert_close(off(x, context, None, None), on(x, context, None, None), rtol=0, atol=0)


def test_value_lambdas_keep_a_bf16_v_in_bf16():
    """The record's arithmetic: 0-d fp32 λ times bf16 v stays bf16 (attention runs in v's dtype)."""
    attn = CausalSelfAttention(GPTConfig(**TINY, value_lambdas=True))
    v, ve = torch.randn(5, 2, 4, dtype=torch.bfloat16), torch.randn(5, 8)
    mixed = attn.mix_values(v, ve)
    assert mixed.dtype == torch.bfloat16 and attn.value_lambdas.dtype == torch.float32
    expected = (0.5 * v.double() + 0.5 * ve.view(5, 2, 4).bfloat16().double())
    torch.testing.assert_close(mixed.double(), expected, rtol=1e-2, atol=1e-2)


def _small_gpt(value_lambdas: bool, backend: str = "reference", **overrides) -> GPT:
    """2 + 2 layers of record-like switches: value embeddings on layers 0 and 2, paired heads on 2, gates
    everywhere, λ moved off their init (float64)."""
    cfg = build_model_config("tiny", dict(vocab_size=64, n_layer=4, model_dim=16, n_head=2, head_dim=8,
                                          value_embed_layers=(0, 2), attention_gate_layers=(0, 1, 2, 3),
                                          paired_head_layers=(2,), value_lambdas=value_lambdas,
                                          value_embed_std=1.0, attention_backend=backend, cross_entropy="full",
                                          **overrides))
    torch.manual_seed(0)
    model = GPT(cfg).double()
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            block.attn.o.weight.normal_(0, 0.3)
            block.attn.gate.weight.normal_()
            if value_lambdas:
                block.attn.value_lambdas.copy_(torch.tensor([0.3 + 0.1 * i, 1.7 - 0.2 * i], dtype=torch.float64))
        model.lm_head.weight.normal_(0, 0.1)
    return model


def _batch(tokens=24):
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, 64, (tokens,), generator=g, dtype=torch.int32)
    targets = torch.randint(0, 64, (tokens,), generator=g)
    return inputs, targets, torch.tensor([0, 9, 10, tokens], dtype=torch.int32)


def test_value_lambdas_agree_across_backends_and_train_as_adam_scalars():
    inputs, targets, cu = _batch()
    ref = _small_gpt(True)
    loss = ref(inputs, targets, cu)
    with torch.no_grad():
        for backend in ("sdpa", "sdpa_docs", "flex"):
            torch.testing.assert_close(_small_gpt(True, backend)(inputs, targets, cu), loss.detach())
        # the λ change the loss: not the v + ve model
        assert abs(float(_small_gpt(False)(inputs, targets, cu)) - float(loss)) > 1e-3
    loss.backward()
    names = [f"blocks.{i}.attn.value_lambdas" for i in range(4)]
    params = dict(ref.named_parameters())
    kinds = ref.parameter_kinds()
    assert all(kinds[n] == "scalar" and params[n].shape == (2,) for n in names)
    assert all(params[n].grad[0].abs() > 0 for n in names)
    assert [bool(params[n].grad[1] != 0) for n in names] == [True, False, True, False]   # ve on 0 and 2
    config = OptimConfig()
    groups = [g for g in build_optimizers(ref, kinds, config).groups()
              if any(p is params[names[0]] for p in g["params"])]
    assert [(g["kind"], g["lr"]) for g in groups] == [("scalar", config.scalar_lr)]
    # a state dict round trip carries the λ
    fresh = _small_gpt(False)
    with pytest.raises(RuntimeError, match="value_lambdas"):
        fresh.load_state_dict(ref.state_dict())
    other = GPT(ref.config).double()
    other.load_state_dict(ref.state_dict())
    torch.testing.assert_close(other.blocks[1].attn.value_lambdas, torch.tensor([0.4, 1.5], dtype=torch.float64))


def compiled_in_one_graph(model: GPT, batch) -> None:
    """Compile ``model`` (fullgraph, static shapes), run forward and backward on ``batch``: one graph, the
    eager loss; the gradients are left on the parameters."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, dynamic=False, fullgraph=True)
    loss = compiled(*batch)
    loss.backward()
    torch._dynamo.reset()
    assert counter.frame_count == 1
    torch.testing.assert_close(loss, model(*batch))


def test_value_lambdas_compile_as_one_graph():
    model = _small_gpt(True)
    compiled_in_one_graph(model, _batch())
    assert model.blocks[0].attn.value_lambdas.grad.abs().min() > 0


def test_value_lambdas_with_fp8_qkv():
    """The FP8 QKV path (training forward, float32 model on a CPU): the mix in bf16, within FP8 tolerance
    of the bf16-free model, and λ gets a gradient."""
    exact = _small_gpt(True).float()
    fp8 = _small_gpt(True, fp8_attention=True).float().train()
    torch.testing.assert_close(fp8.blocks[0].attn.v.weight, exact.blocks[0].attn.v.weight, rtol=0, atol=0)
    inputs, targets, cu = _batch()
    loss = fp8(inputs, targets, cu)
    loss.backward()
    assert abs(float(loss.detach()) - float(exact(inputs, targets, cu).detach())) < 0.05
    grad = fp8.blocks[0].attn.value_lambdas.grad
    assert grad.dtype == torch.float32 and torch.isfinite(grad).all() and grad.abs().min() > 0


@pytest.mark.parametrize("preset,std,lambdas", [("gpt124m", 0.01, False), ("record28", 1.0, True)])
def test_preset_value_embedding_std_and_lambdas(preset, std, lambdas):
    """The presets' tables at init (their vocabulary, narrower layers): std within sampling tolerance (one
    table holds 50304·48 draws: relative error of the std about 1/sqrt(2N) = 0.0005)."""
    cfg = PRESETS[preset]
    assert (cfg.value_embed_std, cfg.value_lambdas) == (std, lambdas)
    small = build_model_config(preset, dict(model_dim=48, head_dim=8, bigram_vocab_size=min(cfg.bigram_vocab_size, 97),
                                            fp8_attention=False, fp8_head=False, fp8_mlp=False))
    torch.manual_seed(0)
    model = GPT(small)
    tables = model.value_embeds.tables
    assert len(tables) == (3 if preset == "record28" else 5)
    for table in tables:
        assert table.weight.shape == (50304, 48)
        assert float(table.weight.detach().std()) == pytest.approx(std, rel=0.005)
        assert abs(float(table.weight.detach().mean())) < 0.005 * std
    attentions = [b.attn for b in model.blocks if b.attn is not None]
    if lambdas:
        assert len(attentions) == 11
        assert all(a.value_lambdas.tolist() == [0.5, 0.5] for a in attentions)
    else:
        assert all(a.value_lambdas is None for a in attentions)


@pytest.mark.parametrize("overrides,match", [
    ({"value_embed_std": 0.0}, "value_embed_std must be a finite number > 0, got 0.0"),
    ({"value_embed_std": -1.0}, "value_embed_std"),
    ({"value_embed_std": float("inf")}, "value_embed_std"),
    ({"value_embed_std": "big"}, "value_embed_std"),
    ({"value_embed_std": True}, "value_embed_std"),
    ({"value_lambdas": "yes"}, "value_lambdas must be true or false"),
])
def test_bad_value_embedding_settings_raise(overrides, match):
    with pytest.raises(SpeedrunError, match=match):
        build_model_config("tiny", overrides)
    assert build_model_config("tiny", {"value_embed_std": 2}).value_embed_std == 2      # an integer is fine


def test_a_table_std_by_hand():
    """ValueEmbeddings(std=s): the std of a large table is s (and the F.embedding lookup returns its rows)."""
    from speedrun.model.embeddings import ValueEmbeddings

    torch.manual_seed(0)
    ve = ValueEmbeddings(4000, 16, (0, 1), tables=1, std=0.25)
    assert float(ve.tables[0].weight.detach().std()) == pytest.approx(0.25, rel=0.02)
    tokens = torch.tensor([5, 3999])
    first, second = ve.per_layer(tokens, 2)
    assert first is second
    torch.testing.assert_close(first, F.embedding(tokens, ve.tables[0].weight), rtol=0, atol=0)
    with pytest.raises(ValueError, match="std must be > 0"):
        ValueEmbeddings(10, 4, (0,), std=0.0)
