"""The value-embedding gate (record #55, "VE gates"; tuned in #70; speedrun-spec.md 2.2 item 8, 2.3):
``v += 2·σ(W_g · [x[:6], ve[:6]])_h · ve_h`` (``GPTConfig.value_embed_gates``, :class:`ValueEmbedGate`),
against float64 formulas written here: the gate and its gradients, the mix with and without value lambdas,
the model at initialization, the optimizer kinds, the config errors, a few training steps and one graph."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model.attention import PackedDocuments
from speedrun.model.block import AttentionContext, CausalSelfAttention
from speedrun.model.config import PRESETS, GPTConfig, build_model_config
from speedrun.model.gates import ValueEmbedGate
from speedrun.model.gpt import GPT
from speedrun.model.rotary import rotary_frequencies, rotary_table
from speedrun.optim.groups import OptimConfig, build_optimizers, optimizer_kinds
from test_value_embeddings import _batch as batch, compiled_in_one_graph

F64 = torch.float64
# 2 heads of 4: the value embedding is 8 wide, x 9 wide (neither is 6 or 12, so slicing errors show)
LAYER = dict(vocab_size=11, n_layer=2, model_dim=9, n_head=2, head_dim=4, value_embed_layers=(0,),
             value_embed_gates=True, attention_backend="reference")
CU = torch.tensor([0, 3, 7], dtype=torch.int32)                     # documents of 3 and 4 tokens
POSITIONS = torch.tensor([0, 1, 2, 0, 1, 2, 3])


def gate_by_hand(weight: torch.Tensor, x: torch.Tensor, ve: torch.Tensor) -> torch.Tensor:
    """float64 2·σ(z), z_h = Σ_j<6 W[h, j]·x[:, j] + Σ_j<6 W[h, 6+j]·ve[:, j]: (T, H)."""
    z = x[:, :6] @ weight[:, :6].T + ve[:, :6] @ weight[:, 6:].T
    return 2.0 / (1.0 + torch.exp(-z))


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


# ---- the gate ------------------------------------------------------------------------------------------


def test_gate_forward_and_gradients_by_hand():
    gate = ValueEmbedGate(3).double()
    assert gate.weight.shape == (3, 12) and not gate.weight.any()
    x, ve = randn(5, 9, seed=1).requires_grad_(), randn(5, 12, seed=2).requires_grad_()
    torch.testing.assert_close(gate(x, ve), torch.ones(5, 3, 1, dtype=F64), rtol=0, atol=0)   # 2·σ(0) = 1
    with torch.no_grad():
        gate.weight.copy_(0.4 * randn(3, 12, seed=3))
    out = gate(x, ve)
    g = gate_by_hand(gate.weight.detach(), x.detach(), ve.detach())
    assert out.shape == (5, 3, 1) and out.dtype == F64
    torch.testing.assert_close(out[..., 0], g, rtol=1e-13, atol=1e-13)
    assert 0.05 < float(g.min()) < 0.5 and 1.5 < float(g.max()) < 1.99           # both sides of 1, unsaturated
    # gradients: dL/dz = w·g·(1 - g/2) (d/dz 2σ(z) = 2σ(1-σ)); W gets dzᵀ [x6, ve6], x and ve get dz W
    w = randn(5, 3, seed=4)
    (out[..., 0] * w).sum().backward()
    dz = w * g * (1 - g / 2)                                                        # (T, H)
    inputs = torch.cat((x.detach()[:, :6], ve.detach()[:, :6]), dim=1)              # (T, 12)
    torch.testing.assert_close(gate.weight.grad, dz.T @ inputs, rtol=1e-12, atol=1e-12)
    W = gate.weight.detach()
    expected_x = torch.zeros(5, 9, dtype=F64)
    expected_x[:, :6] = dz @ W[:, :6]
    expected_ve = torch.zeros(5, 12, dtype=F64)
    expected_ve[:, :6] = dz @ W[:, 6:]
    torch.testing.assert_close(x.grad, expected_x, rtol=1e-12, atol=1e-12)        # channels >= 6: exactly 0
    torch.testing.assert_close(ve.grad, expected_ve, rtol=1e-12, atol=1e-12)
    assert expected_x[:, :6].abs().min() > 1e-6 and expected_ve[:, :6].abs().min() > 1e-6


def test_gate_keeps_x_dtype_and_rejects_narrow_inputs():
    gate = ValueEmbedGate(2)
    with torch.no_grad():
        gate.weight.normal_()
    x, ve = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(4, 8)
    out = gate(x, ve)
    assert out.dtype == torch.bfloat16 and gate.weight.dtype == torch.float32
    expected = gate_by_hand(gate.weight.bfloat16().double(), x.double(), ve.bfloat16().double())
    torch.testing.assert_close(out[..., 0].double(), expected, rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="reads 6 channels of x and of ve, x has 5 and ve 8"):
        gate(torch.randn(4, 5), ve)
    with pytest.raises(ValueError, match="x has 8 and ve 4"):
        gate(x, torch.randn(4, 4))


# ---- the attention layer -------------------------------------------------------------------------------


def attention_layer(value_lambdas: bool, layer: int = 0, **overrides) -> tuple[CausalSelfAttention, AttentionContext]:
    """A float64 attention layer of LAYER with random weights (λ (0.3, 1.7) with value_lambdas) and the
    context of the documents CU."""
    cfg = GPTConfig(**{**LAYER, **overrides}, value_lambdas=value_lambdas)
    torch.manual_seed(3)
    attn = CausalSelfAttention(cfg, layer).double()
    with torch.no_grad():
        attn.o.weight.normal_()
        if value_lambdas:
            attn.value_lambdas.copy_(torch.tensor([0.3, 1.7], dtype=F64))
    cos, sin = rotary_table(rotary_frequencies(cfg.head_dim, cfg.rope_base).double(), 8)
    return attn, AttentionContext(PackedDocuments(CU, 7), cos[POSITIONS], sin[POSITIONS], 0.5)


@pytest.mark.parametrize("value_lambdas", [False, True])
def test_mix_values_with_random_gates_by_hand(value_lambdas):
    attn, _ = attention_layer(value_lambdas)
    with torch.no_grad():
        attn.ve_gate.weight.copy_(randn(2, 12, seed=5))
    x, v, ve = randn(7, 9, seed=6), randn(7, 2, 4, seed=7), randn(7, 8, seed=8)
    g = gate_by_hand(attn.ve_gate.weight.detach(), x, ve)[..., None]                # (T, H, 1)
    gated = g * ve.view(7, 2, 4)
    expected = 0.3 * v + 1.7 * gated if value_lambdas else v + gated
    torch.testing.assert_close(attn.mix_values(v, ve, x), expected, rtol=1e-13, atol=1e-13)
    # the gate matters: not the ungated mix
    ungated = 0.3 * v + 1.7 * ve.view(7, 2, 4) if value_lambdas else v + ve.view(7, 2, 4)
    assert (attn.mix_values(v, ve, x) - ungated).abs().max() > 0.1
    # no value embedding: the gate is not read (λ0·v or v)
    torch.testing.assert_close(attn.mix_values(v, None, x), 0.3 * v if value_lambdas else v, rtol=0, atol=0)
    with pytest.raises(ValueError, match="needs the attention input x"):
        attn.mix_values(v, ve)


def test_the_forward_gates_the_value_embedding_with_its_own_input():
    """A gated layer equals the ungated one fed gate·ve, the gate read from the layer's input x."""
    gated, context = attention_layer(False)
    plain, _ = attention_layer(False, value_embed_gates=False)
    assert plain.ve_gate is None
    with torch.no_grad():
        gated.ve_gate.weight.copy_(randn(2, 12, seed=9))
    x, ve = randn(7, 9, seed=10), randn(7, 8, seed=11)
    g = gate_by_hand(gated.ve_gate.weight.detach(), x, ve)[..., None]
    expected = plain(x, context, None, (g * ve.view(7, 2, 4)).reshape(7, 8))
    torch.testing.assert_close(gated(x, context, None, ve), expected, rtol=1e-12, atol=1e-12)
    assert (expected - plain(x, context, None, ve)).abs().max() > 1e-2


def test_only_layers_with_a_value_embedding_get_a_gate():
    cfg = GPTConfig(**{**LAYER, "n_layer": 3, "value_embed_layers": (0, 2)})
    assert [CausalSelfAttention(cfg, i).ve_gate is not None for i in range(3)] == [True, False, True]
    assert "ve_gate.weight" not in CausalSelfAttention(dataclasses.replace(cfg, value_embed_gates=False), 0).state_dict()


# ---- the model -----------------------------------------------------------------------------------------

SMALL = dict(vocab_size=64, n_layer=4, model_dim=16, n_head=2, head_dim=8, value_embed_layers=(0, 2),
             attention_gate_layers=(0, 1, 2, 3), paired_head_layers=(2,), value_embed_std=1.0,
             attention_backend="reference", cross_entropy="full")


def small_gpt(gates: bool, **overrides) -> GPT:
    """4 layers: value embeddings on 0 and 2 (2 paired), attention gates everywhere; o, the attention gates
    and the head moved off their zero or small init so that the values reach the loss (float64)."""
    torch.manual_seed(0)
    model = GPT(build_model_config("tiny", {**SMALL, "value_embed_gates": gates, **overrides})).double()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.o.weight.normal_(0, 0.3)
            block.attn.gate.weight.normal_()
        model.lm_head.weight.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("value_lambdas", [False, True])
def test_at_initialization_the_gated_model_is_the_ungated_one(value_lambdas):
    gated, plain = small_gpt(True, value_lambdas=value_lambdas), small_gpt(False, value_lambdas=value_lambdas)
    state = gated.state_dict()
    assert sorted(k for k in state if "ve_gate" in k) == ["blocks.0.attn.ve_gate.weight",
                                                         "blocks.2.attn.ve_gate.weight"]
    plain.load_state_dict({k: v for k, v in state.items() if "ve_gate" not in k})    # strict: the same rest
    inputs, targets, cu = batch()
    loss = gated(inputs, targets, cu)
    torch.testing.assert_close(loss, plain(inputs, targets, cu), rtol=0, atol=1e-14)
    loss.backward()
    for i in (0, 2):                                                  # the zero gates learn
        assert gated.blocks[i].attn.ve_gate.weight.grad.abs().max() > 1e-4
    # and the gated values reach the loss (else the test could not tell a gate from none)
    with torch.no_grad():
        gated.blocks[0].attn.ve_gate.weight.fill_(-2.0)
        assert abs(float(gated(inputs, targets, cu)) - float(loss)) > 1e-4


def test_gates_are_adam_scalars_even_with_muon_attention_gates():
    model = small_gpt(True)
    kinds = model.parameter_kinds()
    names = ["blocks.0.attn.ve_gate.weight", "blocks.2.attn.ve_gate.weight"]
    params = dict(model.named_parameters())
    assert [(kinds[n], tuple(params[n].shape)) for n in names] == [("scalar", (2, 12))] * 2
    assert sorted(n for n in kinds if "ve_gate" in n) == names
    moved = optimizer_kinds(kinds, OptimConfig(muon_attention_gates=True), model.parameter_roles())
    assert [moved[n] for n in names] == ["scalar", "scalar"]
    assert moved["blocks.0.attn.gate.weight"] == "matrix"                       # the output gate does move
    for config in (OptimConfig(), OptimConfig(muon_attention_gates=True)):
        optimizers = build_optimizers(model, kinds, config)
        adam = optimizers.optimizers[0]
        groups = [g for g in adam.param_groups if any(p is params[names[0]] for p in g["params"])]
        assert [(g["kind"], g["lr"]) for g in groups] == [("scalar", config.scalar_lr)]
        muon_params = [p for opt in optimizers.optimizers[1:] for g in opt.param_groups for p in g["params"]]
        assert not any(p is params[n] for p in muon_params for n in names)


def test_presets():
    assert PRESETS["gpt124m"].value_embed_gates and not PRESETS["record28"].value_embed_gates
    assert not PRESETS["tiny"].value_embed_gates
    with torch.device("meta"):
        wide = GPT(PRESETS["gpt124m"])
    kinds = wide.parameter_kinds()
    gates = {n: tuple(p.shape) for n, p in wide.named_parameters() if "ve_gate" in n}
    assert gates == {f"blocks.{i}.attn.ve_gate.weight": (6, 12) for i in (1, 2, 8, 9, 10)}
    assert all(kinds[n] == "scalar" for n in gates)


@pytest.mark.parametrize("overrides,match", [
    ({"value_embed_gates": True}, "model.value_embed_gates .*needs non-empty model.value_embed_layers"),
    ({"value_embed_gates": "yes", "value_embed_layers": (0,)}, "value_embed_gates must be true or false"),
    ({"value_embed_gates": 1, "value_embed_layers": (0,)}, "value_embed_gates must be true or false"),
    ({"value_embed_gates": True, "value_embed_layers": (0,), "model_dim": 4},
     "value_embed_gates read 6 channels .* model_dim is 4"),
    ({"value_embed_gates": True, "value_embed_layers": (0,), "n_head": 1, "head_dim": 4},
     "value_embed_gates read 6 channels .* n_head\\*head_dim 4"),
])
def test_bad_settings_raise(overrides, match):
    with pytest.raises(SpeedrunError, match=match):
        build_model_config("tiny", overrides)


def test_a_gated_model_trains_on_a_cpu():
    """Ten steps of both optimizers on one batch (float32): the loss falls and the gates leave zero."""
    model = small_gpt(True).float()
    optimizers = build_optimizers(model, model.parameter_kinds(), OptimConfig())
    losses = train_losses(model, optimizers, batch(), steps=10)
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < losses[0] - 0.5, losses
    assert model.blocks[0].attn.ve_gate.weight.abs().min() > 0


def test_gates_compile_as_one_graph():
    model = small_gpt(True, value_lambdas=True)
    with torch.no_grad():
        for i in (0, 2):
            model.blocks[i].attn.ve_gate.weight.normal_()
    compiled_in_one_graph(model, batch())
    assert model.blocks[2].attn.ve_gate.weight.grad.abs().min() > 0


def train_losses(model, optimizers, batch, steps: int) -> list[float]:
    """The losses of ``steps`` optimizer steps of ``model`` on one batch (inputs, targets, cu_seqlens)."""
    losses = []
    for _ in range(steps):
        loss = model(*batch)
        loss.backward()
        optimizers.step()
        optimizers.zero_grad()
        losses.append(float(loss.detach()))
    return losses
