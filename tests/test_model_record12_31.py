"""The switches that records #12 (2024-11-19 FlexAttention) and #31 (2025-09-10 YaRN) need and the presets
built from them: value residual against a float64 re-write of record #12's own forward loop (loss and every
gradient), a block without MLP, nn.Linear's default init, their validation, the presets' fields and parameter
counts by hand, and a CPU forward and backward of a tiny-width variant of each preset."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from preset_sizes import ATTENTION_PARAMS, MLP_PARAMS, C, V, meta_presets, parameter_count

from speedrun.errors import SpeedrunError
from speedrun.model.attention import PackedDocuments
from speedrun.model.block import AttentionContext, Block
from speedrun.model.config import PRESETS, GPTConfig, build_model_config
from speedrun.model.gpt import GPT

BOUNDS = (0, 9, 10, 21)
# record12 shrunk: 4 layers of 16, 2 heads of 8, windows of 3 blocks of 2 tokens (6 keys), plain PyTorch paths
RECORD12_SMALL = dict(vocab_size=40, n_layer=4, model_dim=16, n_head=2, head_dim=8, window_block_size=2,
                      window_short_blocks=3, window_long_blocks=3, attention_backend="reference",
                      cross_entropy="full", rotary_kernel="torch", rotary_positions=32, window_pattern="LLLL")


def batch(vocab: int, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    tokens = BOUNDS[-1]
    inputs = torch.randint(0, vocab, (tokens,), generator=g, dtype=torch.int32)
    return inputs, torch.randint(0, vocab, (tokens,), generator=g), torch.tensor(BOUNDS, dtype=torch.int32)


def randomized(model: GPT) -> GPT:
    """Every parameter random (zero-initialized ones would hide most of the forward)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.4)
    return model


def record12_loss(model: GPT, inputs, targets, window: int) -> torch.Tensor:
    """Record #12's GPT.forward, re-written in float64 from its train_gpt.py with our parameters: x0 lambdas,
    layer 0's values v1 passed on and mixed as (1 - λ)·v + λ·v1, U-net push/pop, the window q - k < W within a
    document, 30·tanh(z/30). RoPE in our convention ("full": pair (i, i + D/2) turned by +θ, positions per
    document; the record's -θ over the packed sequence gives the same scores up to a sign flip of the weights'
    rows, see the preset's comment)."""
    cfg, w = model.config, dict(model.named_parameters())
    tokens, heads, dim = len(inputs), cfg.n_head, cfg.head_dim
    norm = lambda x: x / torch.sqrt((x * x).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)  # noqa: E731
    pos = torch.tensor([t - b for b, c in zip(BOUNDS, BOUNDS[1:]) for t in range(b, c)], dtype=torch.float64)
    doc = torch.tensor([d for d in range(len(BOUNDS) - 1) for _ in range(BOUNDS[d + 1] - BOUNDS[d])])
    freqs = (cfg.rope_base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)).double()
    turn = torch.polar(torch.ones(tokens, 1, dim // 2, dtype=torch.float64), (pos[:, None] * freqs)[:, None])

    def rope(x):
        z = torch.complex(x[..., :dim // 2], x[..., dim // 2:]) * turn
        return torch.cat((z.real, z.imag), dim=-1)

    t = torch.arange(tokens)
    visible = (doc[:, None] == doc[None, :]) & (t[:, None] >= t[None, :]) & (t[:, None] - t[None, :] < window)

    def attention(i, x, v1):
        b = f"blocks.{i}.attn."
        q, k, v = ((x @ w[b + f"{n}.weight"].T).view(tokens, heads, dim) for n in "qkv")
        if v1 is None:
            v1 = v
        lam = w[b + "value_residual_lambda"] if i > 0 else 0.0
        v = (1 - lam) * v + lam * v1
        scores = torch.einsum("thd,shd->hts", rope(norm(q)), rope(norm(k))) / math.sqrt(dim)
        y = torch.einsum("hts,shd->thd", scores.masked_fill(~visible, -math.inf).softmax(-1), v)
        return y.reshape(tokens, -1) @ w[b + "o.weight"].T, v1

    def block(i, x, v1, x0):
        lambdas = w[f"blocks.{i}.lambdas"]
        x = lambdas[0] * x + lambdas[1] * x0
        y, v1 = attention(i, norm(x), v1)
        x = x + y
        x = x + torch.relu(norm(x) @ w[f"blocks.{i}.mlp.fc.weight"].T).square() @ w[f"blocks.{i}.mlp.proj.weight"].T
        return x, v1

    x = x0 = norm(w["embed.weight"][inputs.long()])
    v1, skips, half = None, [], cfg.n_layer // 2
    for i in range(half):
        x, v1 = block(i, x, v1, x0)
        skips.append(x)
    for i in range(cfg.n_layer - half):
        x = x + w["skips.weights"][i] * skips.pop()
        x, v1 = block(half + i, x, v1, x0)
    logits = 30 * torch.tanh(norm(x) @ w["lm_head.weight"].T / 30)
    return F.cross_entropy(logits, targets)


def test_value_residual_preset_forward_and_gradients_equal_record12s_loop():
    model = randomized(GPT(build_model_config("record12", RECORD12_SMALL)).double())
    names = [n for n, _ in model.named_parameters()]
    assert "blocks.0.attn.value_residual_lambda" not in names                # its gradient would be 0 anyway
    assert all(f"blocks.{i}.attn.value_residual_lambda" in names for i in (1, 2, 3))
    inputs, targets, cu = batch(40)
    loss = model(inputs, targets, cu)
    ours = torch.autograd.grad(loss, list(model.parameters()))
    expected = record12_loss(model, inputs, targets, window=6)
    reference = torch.autograd.grad(expected, list(model.parameters()))
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-12)
    for name, a, b in zip(names, ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=name)
    # layer 0's W_v reaches the loss through every later layer too: its gradient changes with their λ
    assert ours[names.index("blocks.0.attn.v.weight")].abs().sum() > 0


def test_value_residual_at_lambda_zero_is_the_plain_model_and_at_one_reads_only_layer_0s_values():
    model = randomized(GPT(build_model_config("record12", RECORD12_SMALL)).double())
    plain = GPT(build_model_config("record12", {**RECORD12_SMALL, "value_residual": False})).double()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "value_residual" not in k})
    inputs, targets, cu = batch(40)
    with torch.no_grad():
        for i in (1, 2, 3):
            model.blocks[i].attn.value_residual_lambda.zero_()
        torch.testing.assert_close(model(inputs, targets, cu), plain(inputs, targets, cu), rtol=0, atol=1e-12)
        for i in (1, 2, 3):                 # λ = 1: the later layers' own W_v no longer matter
            model.blocks[i].attn.value_residual_lambda.fill_(1.0)
        before = model(inputs, targets, cu)
        model.blocks[2].attn.v.weight.normal_()
        torch.testing.assert_close(model(inputs, targets, cu), before, rtol=0, atol=1e-12)


def test_a_layer_without_mlp_is_attention_only():
    cfg = GPTConfig(vocab_size=8, n_layer=2, model_dim=8, n_head=2, head_dim=4, mlp_free_layers=(0,),
                    x0_lambdas=True, attention_backend="reference")
    torch.manual_seed(0)
    block, full = Block(cfg, 0).double(), Block(cfg, 1).double()
    assert block.mlp is None and full.mlp is not None and block.attn is not None
    assert not any(n.startswith("mlp.") for n, _ in block.named_parameters())
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.5)
    x, x0 = torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    context = AttentionContext(PackedDocuments(torch.tensor([0, 2, 5], dtype=torch.int32), 5),
                               torch.ones(5, 2, dtype=torch.float64), torch.zeros(5, 2, dtype=torch.float64), 0.5)
    mixed = block.lambdas[0] * x + block.lambdas[1] * x0
    rms = mixed / torch.sqrt((mixed * mixed).mean(-1, keepdim=True) + torch.finfo(torch.float64).eps)
    torch.testing.assert_close(block(x, x0, context), mixed + block.attn(rms, context), rtol=0, atol=1e-12)


def test_torch_linear_init_is_uniform_on_one_over_sqrt_fan_in():
    cfg = GPTConfig(vocab_size=8, n_layer=2, model_dim=64, n_head=2, head_dim=32, linear_init="torch")
    torch.manual_seed(0)
    model = GPT(cfg)
    for name, p in model.blocks.named_parameters():
        if name.endswith(("q.weight", "k.weight", "v.weight", "fc.weight")):
            bound = 1 / math.sqrt(64)                                                 # every fan_in is 64
            assert p.abs().max() <= bound and p.abs().max() > 0.95 * bound, name     # speedrun's: 0.866/8
            assert abs(p.std().item() - bound / math.sqrt(3)) < 0.1 * bound / math.sqrt(3), name
        elif name.endswith(("o.weight", "proj.weight")):
            assert not p.any(), name
    speedrun = GPT(GPTConfig(vocab_size=8, n_layer=2, model_dim=64, n_head=2, head_dim=32))
    assert speedrun.blocks[0].attn.q.weight.abs().max() <= math.sqrt(3) * 0.5 / 8


@pytest.mark.parametrize("overrides,match", [
    ({"value_residual": True, "value_embed_layers": (1,)}, r"model\.value_residual .*value embeddings"),
    ({"value_residual": True, "value_lambdas": True}, r"model\.value_residual .*value_lambdas"),
    ({"value_residual": True, "attention_free_layers": (0,)}, r"model\.value_residual .*layer 0 needs attention"),
    ({"value_residual": 1}, r"model\.value_residual must be true or false"),
    ({"mlp_free_layers": (1,), "attention_free_layers": (1,)}, r"model\.mlp_free_layers names layer 1"),
    ({"mlp_free_layers": (3,)}, r"model\.mlp_free_layers must be increasing layer indices in 0\.\.2"),
    ({"linear_init": "kaiming"}, r"model\.linear_init must be one of speedrun, torch"),
    ({"value_residual": True, "residual_form": "sublayer"},
     r"model\.value_residual .*needs model\.residual_form block"),
    ({"value_residual": True, "sa_lambdas": True}, r"model\.value_residual .*no model\.sa_lambdas"),
    ({"mlp_free_layers": (1,), "residual_form": "sublayer"},
     r"model\.mlp_free_layers .*need model\.residual_form block"),
])
def test_bad_record12_31_switches_are_named(overrides, match):
    with pytest.raises(SpeedrunError, match=match):
        GPTConfig(vocab_size=8, n_layer=3, model_dim=8, n_head=2, head_dim=4, **overrides)


def test_record12_and_record31_presets_hold_the_records_architecture():
    r12, r31 = PRESETS["record12"], PRESETS["record31"]
    for cfg in (r12, r31):
        assert (cfg.n_layer, cfg.model_dim, cfg.n_head, cfg.head_dim, cfg.mlp_ratio, cfg.vocab_size) == (
            12, 768, 6, 128, 4, 50304)
        assert cfg.x0_lambdas and cfg.resid_lambda_init == 1.0 and cfg.skip_connections == "unet"
        assert not (cfg.tie_embed_head or cfg.smear or cfg.bigram_vocab_size or cfg.fp8_mlp or cfg.fp8_attention)
    # record12: full RoPE base 10000, 1/sqrt(128), a fixed 1024-token window everywhere, 30·tanh(z/30)
    assert (r12.rope, r12.rope_base, r12.attention_scale, r12.yarn) == ("full", 10000.0, None, False)
    assert r12.window_pattern == "L" * 12 and r12.window_long_blocks * r12.window_block_size == 1024
    assert r12.window_extra_keys == 0                                     # q - k < 1024: 1024 keys
    assert (r12.logit_softcap, r12.softcap_kind, r12.value_residual, r12.linear_init) == (30.0, "tanh", True, "torch")
    assert (r12.value_embed_layers, r12.attention_gate_layers, r12.attention_free_layers, r12.fp8_head) == (
        (), (), (), False)
    # record31: half-truncated RoPE, scale 0.1 with YaRN, LSSSLSSLSSSL, VE 012...012, no attention in 7, no MLP in 0
    assert (r31.rope, r31.attention_scale, r31.yarn) == ("half_truncated", 0.1, True)
    assert (r31.window_pattern, r31.window_short_blocks, r31.window_long_blocks) == ("LSSSLSSLSSSL", 1, 3)
    assert (r31.value_embed_layers, r31.value_embed_tables, r31.value_embed_std) == ((0, 1, 2, 9, 10, 11), 3, 1.0)
    assert r31.value_lambdas and r31.attention_free_layers == (7,) and r31.mlp_free_layers == (0,)
    assert r31.window_extra_keys == 1                                     # FA3 window_size (W, 0)
    assert r31.attention_gate_layers == tuple(i for i in range(12) if i != 7) and r31.fp8_head
    z = torch.linspace(-40, 40, 9, dtype=torch.float64)       # its 30·σ(z/7.5) is 15·tanh(z/15) + 15
    torch.testing.assert_close(30 * torch.sigmoid(z / 7.5) - 15, 15 * torch.tanh(z / 15))
    assert (r31.logit_softcap, r31.softcap_kind) == (15.0, "tanh")


def test_record12_and_record31_parameter_counts_by_hand():
    r12, r31 = meta_presets("record12", "record31")
    # embed + head; 12 attentions and MLPs; x0 lambdas; 6 U-net weights; 11 value-residual λ (not layer 0's)
    assert parameter_count(r12) == 2 * V * C + 12 * (ATTENTION_PARAMS + MLP_PARAMS) + 24 + 6 + 11
    # embed + head + 3 value tables; 11 attentions with (6, 12) gates and (2,) SA lambdas; 11 MLPs; x0 λ; U-net
    assert parameter_count(r31) == 5 * V * C + 11 * (ATTENTION_PARAMS + 72 + 2) + 11 * MLP_PARAMS + 24 + 6
    assert r31.blocks[0].mlp is None and r31.blocks[7].attn is None and r31.blocks[7].mlp is not None
    kinds = r12.parameter_kinds()
    assert kinds["blocks.3.attn.value_residual_lambda"] == "scalar" and kinds["embed.weight"] == "embed"


# A tiny-width variant of each preset: every switch of the preset kept, widths, layers' vocabulary shrunk.
TINY = dict(vocab_size=96, model_dim=32, n_head=2, head_dim=16, window_block_size=4, rotary_positions=64,
            attention_backend="sdpa_docs", cross_entropy="chunked", rotary_kernel="torch", loss_chunk_tokens=16)


@pytest.mark.parametrize("preset,overrides", [("record12", {}), ("record31", {"fp8_head": False})])
def test_a_tiny_width_variant_of_the_preset_runs_forward_and_backward_on_the_cpu(preset, overrides):
    cfg = build_model_config(preset, {**TINY, **overrides})
    torch.manual_seed(0)
    model = GPT(cfg)
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 96, (48,), generator=g, dtype=torch.int32)
    targets = torch.randint(0, 96, (48,), generator=g)
    cu = torch.tensor([0, 17, 40, 48], dtype=torch.int32)
    loss = model(inputs, targets, cu)
    torch.testing.assert_close(loss, torch.tensor(math.log(96)), rtol=0, atol=1e-5)   # zero head: ln V
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert model.lm_head.weight.grad.abs().sum() > 0
    if cfg.yarn:                                                  # record31's window growth rescales scale 0.1
        model.set_window_blocks(3, 7)
        assert model.attention_scale == pytest.approx(0.1 * (1 + 0.2 * math.log(7 / 3)))
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(inputs, targets, cu))


@pytest.mark.parametrize("backend", ["reference", "sdpa_docs"])
def test_window_extra_keys_widen_every_window_by_that_many_keys(backend):
    """record31's FA3 window (W, 0) sees W + 1 keys: 3 blocks of 2 tokens plus 1 = 7 keys, the same layer as a
    window of one 7-token block; YaRN's ratios stay those of the blocks."""
    base = dict(vocab_size=40, n_layer=2, model_dim=16, n_head=2, head_dim=8, window_pattern="LS",
                attention_backend=backend, cross_entropy="full", rotary_positions=32)
    wide = GPT(GPTConfig(**base, window_block_size=2, window_short_blocks=1, window_long_blocks=3,
                         window_extra_keys=1)).double()
    plain = GPT(GPTConfig(**base, window_block_size=2, window_short_blocks=1, window_long_blocks=3)).double()
    randomized(wide)
    plain.load_state_dict(wide.state_dict())
    assert wide.layer_windows() == [7, 3] and wide.window_sizes.tolist() == [3, 7]
    inputs, targets, cu = batch(40)
    with torch.no_grad():
        loss_wide, loss_plain = wide(inputs, targets, cu), plain(inputs, targets, cu)
    assert not torch.allclose(loss_wide, loss_plain)                                   # the key mattered
    one = dict(base, n_layer=1, window_pattern="L")
    a = GPT(GPTConfig(**one, window_block_size=2, window_long_blocks=3, window_extra_keys=1)).double()
    b = GPT(GPTConfig(**one, window_block_size=7, window_short_blocks=1, window_long_blocks=1)).double()
    randomized(a)
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(a(inputs, targets, cu), b(inputs, targets, cu), rtol=0, atol=1e-12)
    yarn = GPT(GPTConfig(**base, window_block_size=2, window_long_blocks=3, window_extra_keys=1, yarn=True,
                         attention_scale=0.1))
    yarn.set_window_blocks(3, 7)
    assert yarn.attention_scale == pytest.approx(0.1 * (1 + 0.2 * math.log(7 / 3)))
    assert yarn.window_sizes.tolist() == [7, 15]
    with pytest.raises(SpeedrunError, match=r"model\.window_extra_keys must be an integer >= 0"):
        GPTConfig(**base, window_extra_keys=-1)
    with pytest.raises(SpeedrunError, match=r"model\.window_extra_keys .* needs a window_pattern"):
        GPTConfig(**{**base, "window_pattern": ""}, window_extra_keys=1)
