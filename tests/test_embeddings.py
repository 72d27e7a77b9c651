"""Smear, value embeddings, x0 injection and the tied/untied embedding and head, by hand; and a short
training run with every technique switched on."""

from __future__ import annotations

import math

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model.attention import PackedDocuments
from speedrun.model.block import AttentionContext, Block, CausalSelfAttention
from speedrun.model.config import GPTConfig, build_model_config
from speedrun.model.embeddings import Smear, ValueEmbeddings
from speedrun.model.gpt import GPT
from speedrun.optim.groups import OptimConfig, build_optimizers
from speedrun.training.config import TrainConfig
from speedrun.training.loop import run_training
from test_train import QUICK, counting_documents, write_dataset


def test_smear_by_hand():
    smear = Smear(12)
    x = torch.zeros(3, 12, dtype=torch.float64)
    x[:, 0] = torch.tensor([1.0, 2.0, -1.0])
    x[:, 5] = torch.tensor([4.0, 0.0, 3.0])
    with torch.no_grad():
        smear.gate.zero_()
        smear.gate[0, 0] = 0.5
        smear.lambda_.fill_(2.0)
    got = smear.double()(x)
    sig = lambda z: 1.0 / (1.0 + math.exp(-z))                                  # noqa: E731
    expected = x.clone()
    expected[1] += 2.0 * sig(0.5 * 2.0) * x[0]
    expected[2] += 2.0 * sig(0.5 * -1.0) * x[1]
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(Smear(12).double()(x), x, rtol=0, atol=0)       # identity at initialization


def test_value_embedding_is_added_to_the_attention_values():
    """q = k = 0: uniform attention over the visible tokens, so with v = 0 and o = identity the output at
    token t is the mean of the value embeddings of tokens 0..t of its document."""
    cfg = GPTConfig(vocab_size=5, n_layer=1, model_dim=4, n_head=2, head_dim=2, attention_backend="reference")
    attn = CausalSelfAttention(cfg).double()
    ve = ValueEmbeddings(5, 4, (0,)).double()
    with torch.no_grad():
        for lin in (attn.q, attn.k, attn.v):
            lin.weight.zero_()
        attn.o.weight.copy_(torch.eye(4))
        ve.tables[0].weight.copy_(torch.arange(20, dtype=torch.float64).reshape(5, 4))
    tokens = torch.tensor([3, 1, 4])
    (table,) = ve.per_layer(tokens, 1)
    cos, sin = torch.ones(3, 1, dtype=torch.float64), torch.zeros(3, 1, dtype=torch.float64)
    context = AttentionContext(PackedDocuments(torch.tensor([0, 1, 3], dtype=torch.int32), 3), cos, sin, 1.0)
    out = attn(torch.randn(3, 4, dtype=torch.float64), context, None, table)
    rows = torch.arange(20, dtype=torch.float64).reshape(5, 4)
    expected = torch.stack([rows[3], rows[1], (rows[1] + rows[4]) / 2])          # documents [3] and [1, 4]
    torch.testing.assert_close(out, expected)
    assert ve.per_layer(tokens, 3)[1] is None


def test_x0_lambdas_mix_the_embedding_into_each_block():
    cfg = GPTConfig(vocab_size=5, n_layer=1, model_dim=4, n_head=2, head_dim=2, x0_lambdas=True,
                    attention_backend="reference")
    block = Block(cfg).double()                     # zero-initialized output projections: only the mix
    with torch.no_grad():
        block.lambdas.copy_(torch.tensor([0.5, -2.0]))
    x, x0 = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    cos, sin = torch.ones(3, 1, dtype=torch.float64), torch.zeros(3, 1, dtype=torch.float64)
    got = block(x, x0, AttentionContext(PackedDocuments(torch.tensor([0, 3], dtype=torch.int32), 3), cos, sin, 1.0))
    torch.testing.assert_close(got, 0.5 * x - 2.0 * x0)
    assert Block(GPTConfig(n_layer=1, model_dim=4, n_head=2, head_dim=2)).lambdas is None


def test_new_parameters_get_their_optimizer_kinds_and_settings_are_checked():
    model = GPT(build_model_config("tiny", {"n_layer": 2, "x0_lambdas": True, "smear": True,
                                            "value_embed_layers": [1], "tie_embed_head": True}))
    kinds = model.parameter_kinds()
    assert kinds["value_embeds.tables.0.weight"] == "embed"
    assert kinds["embed.weight"] == kinds["lm_head.weight"] == "head"      # tied: the head's Adam settings
    untied = GPT(build_model_config("tiny", {"n_layer": 1}))
    assert untied.parameter_kinds()["embed.weight"] == "embed"
    assert kinds["smear.gate"] == kinds["smear.lambda_"] == kinds["blocks.0.lambdas"] == "scalar"
    assert model.lm_head.weight.std().item() == pytest.approx(0.005, rel=0.05)
    with pytest.raises(SpeedrunError, match="value_embed_layers"):
        build_model_config("tiny", {"value_embed_layers": [3, 1]})
    with pytest.raises(SpeedrunError, match="value_embed_layers"):
        build_model_config("tiny", {"value_embed_layers": [4]})
    with pytest.raises(SpeedrunError, match="untie_step needs"):
        TrainConfig.from_dict({"untie_step": 3})


def test_untying_copies_the_head_state_to_the_embedding():
    model = GPT(build_model_config("tiny", {"vocab_size": 50, "n_layer": 1, "tie_embed_head": True}))
    opts = build_optimizers(model, model.parameter_kinds(), OptimConfig())
    inputs = torch.randint(0, 50, (20,), dtype=torch.int32)
    model(inputs, torch.randint(0, 50, (20,)), torch.tensor([0, 20], dtype=torch.int32)).backward()
    model.fold_tied_gradients()
    opts.step()
    model.sync_tied_embedding()
    adam = opts.optimizers[0]
    assert model.embed.weight not in adam.state
    model.untie_embed_head()
    opts.copy_state(model.lm_head.weight, model.embed.weight)
    head, embed = adam.state[model.lm_head.weight], adam.state[model.embed.weight]
    torch.testing.assert_close(embed["exp_avg_sq"], head["exp_avg_sq"], rtol=0, atol=0)
    assert embed["exp_avg"].data_ptr() != head["exp_avg"].data_ptr()


def test_a_tied_step_updates_the_embedding_and_head_as_one_shared_weight():
    """Folding the copy's gradient into the head's, stepping and copying back is the update of one weight
    that serves both (autograd summing its two uses); untied, nothing is folded or copied."""
    torch.manual_seed(0)
    model = GPT(build_model_config("tiny", {"vocab_size": 50, "n_layer": 2, "tie_embed_head": True,
                                            "smear": True})).double()
    inputs, targets = torch.randint(0, 50, (24,), dtype=torch.int32), torch.randint(0, 50, (24,))
    cu = torch.tensor([0, 10, 24], dtype=torch.int32)
    shared = model.lm_head.weight.detach().clone().requires_grad_()
    params = {**dict(model.named_parameters()), "embed.weight": shared, "lm_head.weight": shared}
    torch.func.functional_call(model, params, (inputs, targets, cu)).backward()
    model.zero_grad(set_to_none=True)
    model(inputs, targets, cu).backward()
    assert model.embed.weight.grad.abs().sum() > 0                     # the lookup uses the copy
    head_only = model.lm_head.weight.grad.clone()
    model.fold_tied_gradients()
    assert model.embed.weight.grad is None
    torch.testing.assert_close(model.lm_head.weight.grad, shared.grad, rtol=1e-12, atol=1e-15)
    assert (model.lm_head.weight.grad - head_only).abs().max() > 1e-6   # the embedding's part was added
    opts = build_optimizers(model, model.parameter_kinds(), OptimConfig())
    opts.step()
    assert not torch.equal(model.embed.weight, model.lm_head.weight)
    model.sync_tied_embedding()
    torch.testing.assert_close(model.embed.weight, model.lm_head.weight, rtol=0, atol=0)
    model.zero_grad(set_to_none=True)
    model.untie_embed_head()
    model(inputs, targets, cu).backward()
    embed_grad = model.embed.weight.grad.clone()
    model.fold_tied_gradients()
    torch.testing.assert_close(model.embed.weight.grad, embed_grad, rtol=0, atol=0)
    before = model.embed.weight.detach().clone()
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    model.sync_tied_embedding()
    torch.testing.assert_close(model.embed.weight, before, rtol=0, atol=0)


def test_a_short_run_with_every_technique_switched_on_learns(tmp_path):
    shards, bos = write_dataset(tmp_path / "data", counting_documents(300), shard_tokens=16384)
    model = {**QUICK["model"], "rope": "half_truncated", "attention_scale": 0.1, "yarn": True,
             "window_pattern": "SL", "window_block_size": 16, "logit_softcap": 23.0,
             "softcap_kind": "shifted_sigmoid", "x0_lambdas": True, "value_embed_layers": [1], "smear": True,
             "tie_embed_head": True, "bigram_vocab_size": 1000, "bigram_sign_trick": True,
             "skip_connections": "gated", "skip_from": 0, "skip_to": 1, "attention_gate_layers": [0, 1],
             "paired_head_layers": [0]}
    cfg = TrainConfig.from_dict({**QUICK, "model": model, "normuon_beta2": 0.9, "cautious_weight_decay": True,
                                 "weight_decay": 0.5, "window_schedule": [[1, 2], [2, 4]],
                                 "final_window_long_blocks": 8, "untie_step": 4})
    result = run_training(cfg, variant="all", seed=0, shards_dir=shards, bos_dir=bos,
                          log_path=tmp_path / "log.txt", env={})
    assert result.status == "complete"
    val = [loss for _, kind, loss in result.losses if kind == "val"]
    assert all(math.isfinite(v) for v in val) and val[-1] < val[0] - 0.5
