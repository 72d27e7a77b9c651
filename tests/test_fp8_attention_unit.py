"""Record #87's FP8 q/k/v and o projections (``GPTConfig.fp8_attention_scales: unit``; its FP8LinearFunction in
shared/reference-code/record87/train_gpt.py): the product against a computation written here (bf16 cast, e4m3
cast at scale 1, fp32 product, bf16 backward), forward and gradients, the sa_lambdas folded into the weight
before the cast, no weight caches, evaluation in bf16; then the record83 and record87 presets against the
scripts' differences."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import speedrun.model.block as block_module
from speedrun.errors import SpeedrunError
from speedrun.model.attention import PackedDocuments
from speedrun.model.block import AttentionContext, CausalSelfAttention
from speedrun.model.config import PRESETS, GPTConfig, build_model_config
from speedrun.model.fp8 import DYNAMIC_SCALES, UNIT_SCALES, quantize
from speedrun.model.gpt import GPT

E4M3 = torch.float8_e4m3fn
CFG = GPTConfig(vocab_size=8, n_layer=1, model_dim=32, n_head=2, head_dim=16, attention_backend="reference",
                sa_lambdas=True, fp8_attention=True, fp8_attention_scales="unit")


def context(tokens: int) -> AttentionContext:
    cos = torch.ones(tokens, CFG.head_dim // 2)
    return AttentionContext(PackedDocuments(torch.tensor([0, 3, tokens], dtype=torch.int32), tokens),
                            cos, torch.zeros_like(cos), 0.25)


def layer(seed: int = 0) -> CausalSelfAttention:
    torch.manual_seed(seed)
    attn = CausalSelfAttention(CFG)
    with torch.no_grad():
        attn.o.weight.normal_(0, 0.02)                      # zero at init: give the o product something to do
        attn.sa_lambdas.copy_(torch.tensor([0.7, 1.3]))
    return attn.train()


def test_the_unit_product_casts_bf16_then_e4m3_at_scale_one_with_the_lambda_folded_in():
    attn = layer()
    x = torch.randn(16, 32, requires_grad=True)
    g = torch.randn(16, 3 * 32)
    out = attn._unit_fp8(x, attn._qkv_weight(), 0)
    (out.float() * g).sum().backward()
    lam = attn.sa_lambdas.detach()[0]
    w = torch.cat((attn.q.weight, attn.k.weight, attn.v.weight)).detach()          # (3·H·Dh, C) fp32
    w_eff = (lam * w).to(torch.bfloat16)                                             # the record's type_as(x)
    x_bf = x.detach().to(torch.bfloat16)
    expected = (x_bf.to(E4M3).float() @ w_eff.to(E4M3).float().T).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, atol=0, rtol=1e-2)
    # backward in bf16 from the unquantized bf16 operands: dx = g W_eff, dW_eff = gᵀ x, then the lambda's chain
    g_bf = g.to(torch.bfloat16)
    torch.testing.assert_close(x.grad, (g_bf.float() @ w_eff.float()), atol=2e-2, rtol=2e-2)
    dw_eff = g_bf.float().T @ x_bf.float()
    torch.testing.assert_close(attn.q.weight.grad, lam * dw_eff[:32], atol=5e-2, rtol=2e-2)
    torch.testing.assert_close(attn.sa_lambdas.grad[0], (dw_eff * w).sum(), atol=0.5, rtol=2e-2)
    assert attn.sa_lambdas.grad[1] == 0


def test_a_unit_cast_rounds_small_weights_more_coarsely_than_a_dynamic_scale():
    """Below 2^-6 (e4m3's smallest normal) a unit cast lands on the subnormal grid of spacing 2^-9."""
    torch.manual_seed(1)
    for std, factor in ((0.02, 1.2), (0.01, 2.0), (0.005, 4.0)):
        w = torch.randn(256, 256) * std
        err = {}
        for name, scales in (("unit", UNIT_SCALES), ("dynamic", DYNAMIC_SCALES)):
            w8, scale = quantize(w, scales.weight)
            err[name] = ((w8.float() * scale - w).abs().mean() / w.abs().mean()).item()
        assert err["unit"] > factor * err["dynamic"], (std, err)
    assert quantize(torch.tensor([2.0 ** -9, 3 * 2.0 ** -11]), 1.0)[0].float().tolist() == [2.0 ** -9, 2.0 ** -9]


def test_the_unit_layer_quantizes_both_products_per_call_in_training_only(monkeypatch):
    attn = layer()
    assert attn.fp8_unit and attn.qkv_fp8 is None and attn.o.weight_cache is None      # nothing cached
    calls, outputs = [], []
    real = block_module.fp8_linear

    def spy(x, weight, scales=DYNAMIC_SCALES, cache=None, **kw):
        calls.append((tuple(weight.shape), scales, weight.dtype))
        outputs.append(real(x, weight, scales, cache, **kw))
        return outputs[-1]

    monkeypatch.setattr(block_module, "fp8_linear", spy)
    x = torch.randn(8, 32)
    y_train = attn(x, context(8))
    assert calls == [((96, 32), UNIT_SCALES, torch.bfloat16), ((32, 32), UNIT_SCALES, torch.bfloat16)]
    assert y_train is outputs[1]                       # the o product with λ1 inside the cast, nothing after it
    attn.eval()
    calls.clear()
    y_eval = attn(x, context(8))
    assert calls == [] and y_eval.dtype == torch.float32                          # evaluation: plain products
    assert not torch.equal(y_train.float(), y_eval)
    torch.testing.assert_close(y_train.float(), y_eval, atol=0.02, rtol=0.2)       # within FP8 tolerance


def test_unit_scales_need_fp8_attention():
    with pytest.raises(SpeedrunError, match=r"model\.fp8_attention_scales unit \(record #87\).*fp8_attention true"):
        GPTConfig(fp8_attention_scales="unit")
    with pytest.raises(SpeedrunError, match=r"model\.fp8_attention_scales must be one of dynamic, unit"):
        GPTConfig(fp8_attention=True, fp8_attention_scales="fixed")


def test_record83_and_record87_presets_are_their_scripts_differences_from_record88():
    r88, r83, r87 = PRESETS["record88"], PRESETS["record83"], PRESETS["record87"]
    # record83/train_gpt.py has neither build_prefix_table (record88 L1145) nor quantize_mlp_fp8 (record88 L1356)
    assert (r83.prefix_token_loss, r83.fp8_mlp, r83.fp8_attention, r83.mlp_kernel) == (False, False, False, "triton")
    # record83 L1185 and record88 L1209: paired_head_layers = [0, 2, 5, 9]; record87 L1278: [0, 5]
    assert r83.paired_head_layers == r88.paired_head_layers == (0, 2, 5, 9) and r87.paired_head_layers == (0, 5)
    # record87 L1169-1174, L1223-1227: fp8_linear_fn (unit scales, L43-65) on q/k/v and o in training
    assert (r87.fp8_attention, r87.fp8_attention_scales, r87.fp8_mlp, r87.prefix_token_loss) == (
        True, "unit", False, False)
    same = {f.name for f in dataclasses.fields(r88)} - {"prefix_token_loss", "fp8_mlp", "fp8_mlp_down",
                                                        "paired_head_layers", "fp8_attention", "fp8_attention_scales"}
    assert all(getattr(r83, n) == getattr(r88, n) == getattr(r87, n) for n in same)


@pytest.mark.parametrize("preset", ["record83", "record87"])
def test_a_tiny_record83_or_record87_trains_a_step_on_the_cpu(preset):
    cfg = build_model_config(preset, dict(vocab_size=64, model_dim=24, n_head=6, head_dim=4, bigram_vocab_size=30,
                                          bigram_dim=6,
                                          window_block_size=2, rotary_positions=64, attention_backend="reference",
                                          cross_entropy="full", rotary_kernel="torch", mlp_kernel="torch",
                                          fp8_head=False))
    torch.manual_seed(0)
    model = GPT(cfg).train()
    inputs = torch.randint(0, 64, (20,))
    loss = model(inputs, torch.roll(inputs, -1), torch.tensor([0, 9, 20, 20], dtype=torch.int32))
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters()
                                        if p.grad is not None)
    attn = [b.attn for b in model.blocks if getattr(b, "attn", None) is not None]
    assert [a.paired for a in attn].count(True) == (4 if preset == "record83" else 2)
    assert all(a.fp8_unit == (preset == "record87") for a in attn)
