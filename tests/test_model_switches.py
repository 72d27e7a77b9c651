"""The GPT's technique switches against plain references written here: with every switch off the model is
the plain GPT (a naive float64 forward); the attention output gate (record #28), U-net and gated skips
(records #11, #45/#55, against the records' own loops), a layer without attention, shared value-embedding
tables, the FP8 wiring; ln V at initialization and a gradient check with every switch on; the presets."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from preset_sizes import ATTENTION_PARAMS, MLP_PARAMS, C, V, meta_presets, parameter_count
from torch import nn

import speedrun.model.gpt as gpt_module
from speedrun.errors import SpeedrunError
from speedrun.model.attention import PackedDocuments
from speedrun.model.block import AttentionContext, Block, CausalSelfAttention
from speedrun.model.config import PRESETS, GPTConfig, build_model_config
from speedrun.model.embeddings import ValueEmbeddings
from speedrun.model.fp8 import FP8Linear
from speedrun.model.gpt import GPT
from speedrun.model.skips import GatedSkip, UNetSkips

SMALL = dict(vocab_size=48, n_layer=2, model_dim=16, n_head=2, head_dim=8, attention_backend="reference")
# Every switch on (FP8 aside: it rounds to 3 mantissa bits), small enough for a gradient check.
ALL_ON = dict(vocab_size=16, n_layer=3, model_dim=12, n_head=2, head_dim=4, mlp_ratio=1, logit_softcap=5.0,
              x0_lambdas=True, smear=True, value_embed_layers=(0, 2), value_embed_tables=1,
              bigram_vocab_size=7, bigram_sign_trick=True, skip_connections="gated", skip_from=0, skip_to=2,
              attention_gate_layers=(0, 2), paired_head_layers=(0,), attention_free_layers=(1,),
              window_pattern="SLS", window_block_size=2, rope="half_truncated", attention_backend="reference",
              loss_chunk_tokens=5)
BOUNDS = (0, 6, 7, 15)


def batch(vocab, tokens=15, seed=1):
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, vocab, (tokens,), generator=g, dtype=torch.int32)
    return inputs, torch.randint(0, vocab, (tokens,), generator=g), torch.tensor(BOUNDS, dtype=torch.int32)


def trained_looking(model: GPT) -> GPT:
    """Every parameter that starts at zero or at a constant gets random values."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith(("embed.", "value_embeds.", "blocks.0.attn.q")):
                p.normal_(0, 0.3)
    return model


def naive_loss(model: GPT, inputs, targets, bounds) -> torch.Tensor:
    """The plain GPT (records #2-#5: RoPE "full", QK-norm, ReLU², RMS norms, untied head) in float64."""
    cfg, w = model.config, dict(model.named_parameters())
    tokens, heads, dim = len(inputs), cfg.n_head, cfg.head_dim
    norm = lambda x: x / torch.sqrt((x * x).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)  # noqa: E731
    pos = torch.tensor([t - b for b, c in zip(bounds, bounds[1:]) for t in range(b, c)], dtype=torch.float64)
    doc = torch.tensor([d for d in range(len(bounds) - 1) for _ in range(bounds[d + 1] - bounds[d])])
    freqs = (cfg.rope_base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)).double()  # fp32 buffer
    turn = torch.polar(torch.ones(tokens, 1, dim // 2, dtype=torch.float64), (pos[:, None] * freqs)[:, None])

    def rope(x):
        z = torch.complex(x[..., :dim // 2], x[..., dim // 2:]) * turn
        return torch.cat((z.real, z.imag), dim=-1)

    visible = (doc[:, None] == doc[None, :]) & (torch.arange(tokens)[:, None] >= torch.arange(tokens)[None, :])
    x = norm(w["embed.weight"][inputs.long()])
    for i in range(cfg.n_layer):
        h, b = norm(x), f"blocks.{i}."
        q, k, v = ((h @ w[b + f"attn.{n}.weight"].T).view(tokens, heads, dim) for n in "qkv")
        scores = torch.einsum("thd,shd->hts", rope(norm(q)), rope(norm(k))) / math.sqrt(dim)
        y = torch.einsum("hts,shd->thd", scores.masked_fill(~visible, -math.inf).softmax(-1), v)
        x = x + y.reshape(tokens, -1) @ w[b + "attn.o.weight"].T
        x = x + torch.relu(norm(x) @ w[b + "mlp.fc.weight"].T).square() @ w[b + "mlp.proj.weight"].T
    return F.cross_entropy(norm(x) @ w["lm_head.weight"].T, targets)


def test_with_every_switch_off_the_model_is_the_plain_gpt():
    torch.manual_seed(0)
    model = trained_looking(GPT(build_model_config("tiny", SMALL)).double())
    assert {n for n, _ in model.named_parameters()} == {"embed.weight", "lm_head.weight"} | {
        f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.fc",
                                                             "mlp.proj")}
    inputs, targets, cu = batch(48)
    expected = naive_loss(model, inputs, targets, BOUNDS)
    torch.testing.assert_close(model(inputs, targets, cu), expected, rtol=0, atol=1e-12)


def test_a_zero_bigram_table_leaves_the_loss_of_the_same_seed_unchanged():
    inputs, targets, cu = batch(48)
    losses = []
    for overrides in ({}, {"bigram_vocab_size": 11, "bigram_sign_trick": True}):
        torch.manual_seed(0)
        model = GPT(build_model_config("tiny", {**SMALL, **overrides})).double()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("o.weight", "proj.weight")) or name.startswith("lm_head"):
                    p.normal_(0, 0.3)
        losses.append(model(inputs, targets, cu))
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=1e-12)


def test_attention_gate_scales_each_head_by_sigmoid_of_the_first_12_channels():
    cfg = GPTConfig(vocab_size=8, n_layer=1, model_dim=12, n_head=2, head_dim=6, attention_gate_layers=(0,),
                    attention_backend="reference")
    torch.manual_seed(0)
    gated = CausalSelfAttention(cfg).double()
    plain = CausalSelfAttention(GPTConfig(**{**cfg.__dict__, "attention_gate_layers": ()})).double()
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("gate.")})
    assert plain.gate is None and gated.gate.weight.shape == (2, 12) and not gated.gate.weight.any()
    with torch.no_grad():
        for attn in (gated, plain):
            attn.o.weight.copy_(torch.eye(12))
    x = torch.randn(5, 12, dtype=torch.float64)
    context = AttentionContext(PackedDocuments(torch.tensor([0, 2, 5], dtype=torch.int32), 5),
                               torch.ones(5, 3, dtype=torch.float64), torch.zeros(5, 3, dtype=torch.float64), 0.4)
    y = plain(x, context).view(5, 2, 6)
    torch.testing.assert_close(gated(x, context).view(5, 2, 6), 0.5 * y)          # sigmoid(0) at init
    with torch.no_grad():
        gated.gate.weight.normal_()
    g = 1.0 / (1.0 + torch.exp(-(x @ gated.gate.weight.T)))                        # (T, H)
    torch.testing.assert_close(gated(x, context).view(5, 2, 6), g[..., None] * y)


def test_unet_skips_follow_the_records_push_pop_loop():
    """Record #11's loop, with the blocks replaced by distinguishable affine maps."""
    model = GPT(build_model_config("tiny", {**SMALL, "n_layer": 6, "skip_connections": "unet"})).double()
    with torch.no_grad():
        model.skips.weights.copy_(torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64))
    scales = [1.5, -0.5, 2.0, 0.25, -1.0, 3.0]
    model.blocks = nn.ModuleList(Affine(c) for c in scales)
    inputs, _, cu = batch(48)
    x = model.embed.weight[inputs.long()]
    x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)
    saved, weights = [], [0.5, -2.0, 3.0]
    for i, c in enumerate(scales):
        if i >= 3:
            x = x + weights[i - 3] * saved.pop()
        x = c * x + c
        if i < 3:
            saved.append(x)
    got = model.hidden_states(inputs, cu)
    torch.testing.assert_close(got, x / torch.sqrt((x * x).mean(-1, keepdim=True) + 2.0 ** -52))


def test_gated_skip_adds_sigmoid_lambda_times_the_saved_output():
    model = GPT(build_model_config("tiny", {**SMALL, "n_layer": 4, "skip_connections": "gated",
                                            "skip_from": 1, "skip_to": 3})).double()
    assert model.skips.lambda_.item() == -1.5
    with torch.no_grad():
        model.skips.lambda_.fill_(0.3)
    scales = [1.5, -0.5, 2.0, 0.25]
    model.blocks = nn.ModuleList(Affine(c) for c in scales)
    inputs, _, cu = batch(48)
    x = model.embed.weight[inputs.long()]
    x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 2.0 ** -52)
    cache = None
    for i, c in enumerate(scales):
        if i == 3:
            x = x + cache / (1.0 + math.exp(-0.3))                                 # the output of layer 1
        x = c * x + c
        if i == 1:
            cache = x
    got = model.hidden_states(inputs, cu)
    torch.testing.assert_close(got, x / torch.sqrt((x * x).mean(-1, keepdim=True) + 2.0 ** -52))


class Affine(nn.Module):
    """A stand-in block: x -> c·x + c, ignoring everything else."""

    def __init__(self, c: float):
        super().__init__()
        self.c = c

    def forward(self, x, *_):
        return self.c * x + self.c


def test_skip_modules_by_hand():
    unet = UNetSkips(3)                                     # odd: the middle layer takes no skip
    assert [unet.keeps(i) for i in range(3)] == [True, False, False] and unet.weights.tolist() == [1.0]
    outputs = {0: torch.tensor([2.0])}
    x = torch.tensor([1.0])
    assert unet(1, x, outputs).item() == 1.0 and unet(2, x, outputs).item() == 3.0
    gated = GatedSkip(0, 2)
    assert [gated.keeps(i) for i in range(3)] == [True, False, False]
    assert gated(2, x, outputs).item() == pytest.approx(1.0 + 2.0 / (1.0 + math.exp(1.5)))
    assert gated(1, x, outputs).item() == 1.0
    with pytest.raises(SpeedrunError, match="skip_from and model.skip_to"):
        build_model_config("tiny", {"skip_connections": "gated"})            # 3 -> 6 in 4 layers
    with pytest.raises(SpeedrunError, match="skip_connections must be one of"):
        build_model_config("tiny", {"skip_connections": "dense"})


def test_a_layer_without_attention_is_mlp_only():
    cfg = GPTConfig(vocab_size=8, n_layer=2, model_dim=12, n_head=2, head_dim=6, x0_lambdas=True,
                    attention_free_layers=(1,), attention_backend="reference")
    torch.manual_seed(0)
    block = Block(cfg, layer=1).double()
    assert block.attn is None and Block(cfg, layer=0).attn is not None
    with torch.no_grad():
        block.mlp.proj.weight.normal_()
        block.lambdas.copy_(torch.tensor([0.5, 2.0]))
    x, x0 = torch.randn(4, 12, dtype=torch.float64), torch.randn(4, 12, dtype=torch.float64)
    mixed = 0.5 * x + 2.0 * x0
    h = mixed / torch.sqrt((mixed * mixed).mean(-1, keepdim=True) + 2.0 ** -52)
    expected = mixed + torch.relu(h @ block.mlp.fc.weight.T).square() @ block.mlp.proj.weight.T
    context = AttentionContext(PackedDocuments(torch.tensor([0, 4], dtype=torch.int32), 4), None, None, 1.0)
    torch.testing.assert_close(block(x, x0, context), expected)
    with pytest.raises(SpeedrunError, match="value_embed_layers names layer 1"):
        build_model_config("tiny", {"value_embed_layers": [1], "attention_free_layers": [1]})


def test_shared_value_embedding_tables_repeat_in_turn():
    ve = ValueEmbeddings(10, 4, (0, 1, 2, 9, 10, 11), tables=3)
    assert len(ve.tables) == 3 and ve.slot == {0: 0, 1: 1, 2: 2, 9: 0, 10: 1, 11: 2}
    out = ve.per_layer(torch.tensor([3, 7]), 12)
    torch.testing.assert_close(out[9], ve.tables[0].weight[[3, 7]], rtol=0, atol=0)
    torch.testing.assert_close(out[11], out[2], rtol=0, atol=0)
    assert out[5] is None and len(ValueEmbeddings(10, 4, (0, 1), tables=0).tables) == 2
    with pytest.raises(SpeedrunError, match="value_embed_tables must be an integer in 0..2"):
        build_model_config("tiny", {"value_embed_layers": [0, 1], "value_embed_tables": 3})


def test_fp8_mlp_runs_both_products_in_fp8_in_training_only():
    """``fp8_mlp`` (records #84, #89): in training the MLP is within FP8 tolerance of the plain one (output
    and gradients; the backward products are bf16, so the gradients differ only through the forward's
    rounding of relu(pre)), in evaluation it equals it exactly; with the fused kernel it is refused."""
    from speedrun.model.mlp import MLP

    cfg = build_model_config("tiny", {**SMALL, "fp8_mlp": True})
    torch.manual_seed(0)
    fp8 = MLP(cfg)
    plain = MLP(dataclasses.replace(cfg, fp8_mlp=False))
    with torch.no_grad():
        fp8.proj.weight.normal_(0, 0.05)                                      # proj starts at zero
        plain.load_state_dict(fp8.state_dict())
    assert fp8.fc.fp8 and fp8.proj.fp8 and not plain.fc.fp8
    x = torch.randn(64, SMALL["model_dim"], generator=torch.Generator().manual_seed(1))
    outs, grads = {}, {}
    for name, mlp in (("fp8", fp8), ("plain", plain)):
        xi = x.clone().requires_grad_()
        outs[name] = mlp.train()(xi)
        outs[name].float().square().sum().backward()
        grads[name] = (xi.grad, mlp.fc.weight.grad, mlp.proj.weight.grad)
    assert outs["fp8"].dtype == torch.bfloat16                                   # _scaled_mm's output
    rel = (outs["fp8"].float() - outs["plain"]).norm() / outs["plain"].norm()
    assert 1e-3 < rel < 0.1       # e4m3 roundings of x, W1, relu(pre)², W2 (2^-4 each; 0.066 here), not zero
    for got, want in zip(grads["fp8"], grads["plain"]):
        assert ((got - want).norm() / want.norm()) < 0.15
    with torch.no_grad():
        torch.testing.assert_close(fp8.eval()(x), plain.eval()(x), rtol=0, atol=0)
    assert build_model_config("tiny", {"fp8_mlp": True, "mlp_kernel": "triton"}).fp8_mlp   # the fused FP8 MLP
    with pytest.raises(SpeedrunError, match="model.fp8_mlp must be true or false"):
        build_model_config("tiny", {"fp8_mlp": 1})


def test_fp8_switches_reach_the_projections_and_the_head(monkeypatch):
    model = GPT(build_model_config("tiny", {**SMALL, "fp8_attention": True, "fp8_head": True}))
    projections = [getattr(b.attn, n) for b in model.blocks for n in "qkvo"]
    assert all(isinstance(p, FP8Linear) and p.fp8 for p in projections)
    assert not any(getattr(b.attn, n).fp8 for b in GPT(build_model_config("tiny", SMALL)).blocks for n in "qkvo")
    seen = []
    real = gpt_module.linear_cross_entropy
    monkeypatch.setattr(gpt_module, "linear_cross_entropy", lambda *a, **k: seen.append(k["fp8"]) or real(*a, **k))
    inputs, targets, cu = batch(48)
    trained_looking(model)
    train_loss = model.train()(inputs, targets, cu)
    with torch.no_grad():
        eval_loss = model.eval()(inputs, targets, cu)
    assert seen == [True, False]
    assert train_loss.item() != eval_loss.item()                                  # FP8 really ran
    assert train_loss.item() == pytest.approx(eval_loss.item(), rel=0.05)


def test_loss_at_initialization_is_ln_vocab_with_every_switch_on():
    torch.manual_seed(0)
    model = GPT(build_model_config("tiny", ALL_ON)).double()
    inputs, targets, cu = batch(16)
    assert model(inputs, targets, cu).item() == pytest.approx(math.log(16), abs=1e-12)


def test_gradients_with_every_switch_on_match_finite_differences():
    torch.manual_seed(0)
    model = trained_looking(GPT(build_model_config("tiny", ALL_ON)).double())
    inputs, targets, cu = batch(16)
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in model.parameters()]

    def loss_of(*values):
        return torch.func.functional_call(model, dict(zip(names, values)), (inputs, targets, cu))

    assert torch.autograd.gradcheck(loss_of, params, fast_mode=True)
    new = [i for i, n in enumerate(names) if n.startswith(("bigram.", "skips.", "smear.")) or ".gate." in n]
    assert len(new) == 7                 # bigram table and gates, skip lambda_, 2 attention gates, smear's 2

    def loss_of_new(*values):
        full = list(params)
        for i, v in zip(new, values):
            full[i] = v
        return loss_of(*full)

    assert torch.autograd.gradcheck(loss_of_new, [params[i] for i in new])


def test_record28_preset_is_the_sparse_attention_gate_record():
    cfg = PRESETS["record28"]
    assert (cfg.n_layer, cfg.model_dim, cfg.n_head, cfg.head_dim, cfg.vocab_size) == (12, 768, 6, 128, 50304)
    assert cfg.window_pattern == "LSSSLSSLSSSL" and cfg.attention_free_layers == (7,)
    assert (cfg.rope, cfg.attention_scale, cfg.yarn) == ("half_truncated", 0.12, False)
    assert (cfg.value_embed_layers, cfg.value_embed_tables) == ((0, 1, 2, 9, 10, 11), 3)
    assert (cfg.value_embed_std, cfg.value_lambdas) == (1.0, True)                 # nn.Embedding's N(0, 1); SA λ
    assert (cfg.skip_connections, cfg.x0_lambdas, cfg.tie_embed_head, cfg.smear) == ("unet", True, False, False)
    assert cfg.attention_gate_layers == tuple(i for i in range(12) if i != 7)
    assert (cfg.fp8_head, cfg.fp8_attention, cfg.bigram_vocab_size, cfg.paired_head_layers) == (True, False, 0, ())
    assert cfg.attention_backend == "flex" == PRESETS["gpt124m"].attention_backend
    # its 30·sigmoid(z/7.5) is 15·tanh(z/15) + 15: the same cross-entropy
    z = torch.linspace(-40, 40, 9, dtype=torch.float64)
    torch.testing.assert_close(30 * torch.sigmoid(z / 7.5) - 15, 15 * torch.tanh(z / 15))
    assert (cfg.logit_softcap, cfg.softcap_kind) == (15.0, "tanh")


def test_preset_parameter_counts_by_hand():
    record28, wide = meta_presets("record28", "gpt124m")
    # embed + head + 3 value tables; 11 attentions with (6, 12) gates and (2,) value lambdas, 12 MLPs; x0
    # lambdas; 6 U-net weights
    assert parameter_count(record28) == (2 * V * C + 3 * V * C + 11 * (ATTENTION_PARAMS + 72 + 2) + 12 * MLP_PARAMS
                                         + 24 + 6)
    # embed + head + 5 value tables + bigram table and gates; 10 gated attentions, 11 MLPs and x0 lambdas;
    # 5 (6, 12) value-embedding gates; smear; skip; backout λ
    assert parameter_count(wide) == (7 * V * C + 377280 * C + 11 + 10 * (ATTENTION_PARAMS + 72)
                                     + 11 * (MLP_PARAMS + 2) + 5 * 72 + 13 + 1 + 1)
    kinds = wide.parameter_kinds()
    assert set(kinds) == {n for n, _ in wide.named_parameters()}
    assert {n for n, k in kinds.items() if k == "matrix"} == {
        f"blocks.{i}.{m}.weight" for i in range(11) for m in ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.fc",
                                                              "mlp.proj") if i != 6 or m.startswith("mlp")}
    assert kinds["blocks.0.attn.gate.weight"] == "scalar" and kinds["skips.lambda_"] == "scalar"
    assert kinds["blocks.1.attn.ve_gate.weight"] == "scalar"
    assert kinds["backout_lambda"] == "scalar" and "backout_lambda" not in record28.parameter_kinds()
    assert kinds["bigram.table"] == "embed" and kinds["bigram.gates"] == "scalar"
    assert record28.blocks[7].attn is None and kinds["embed.weight"] == "head"          # tied to the head
    assert wide.blocks[6].attn is None and len(wide.blocks) == 11
    assert record28.parameter_kinds()["embed.weight"] == "embed"                        # untied throughout
    assert record28.parameter_kinds()["blocks.0.attn.value_lambdas"] == "scalar"
    assert wide.bigram.signs.shape == (8192, 768) and wide.bigram.signs.device.type == "cpu"
