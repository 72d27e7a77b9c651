"""The bigram hash embedding with the sign trick (records #62, #83): ids and sign rows by hand, int32
wrap-around against numpy int32 arithmetic (the record's), the fixed sign table, and where the gated
bigram enters the residual stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.model.attention import PackedDocuments
from speedrun.model.bigram import BigramEmbedding, bigram_hash, sign_rows, sign_table
from speedrun.model.config import build_model_config
from speedrun.model.gpt import GPT
from speedrun.model.norm import rms_norm

TOKENS = [50256, 10, 50303, 0, 7]
HEAD_VB = 50304 * 15 // 2


def test_bigram_ids_by_hand():
    # position 0: the reserved id V_b - 1 = 377279; then ((36313·x[t]) XOR (27191·p[t-1])) mod 377279, where
    # p is x with p[0] = 377279 (the records write it in place first): t=1: 363130 XOR (27191·377279 wrapped to
    # int32: 1668658697) = 1668299891 -> 349432 (x[0] = 50256 would give 234224); t=2: 1826652839 XOR 271910 =
    # 1826923649 -> 138731; t=3: 0 XOR 1367788873 -> 152498; t=4: 254191 XOR 0 -> 254191 (below the modulus).
    assert HEAD_VB == 377280
    assert (27191 * 377279) % 2 ** 32 == 1668658697 and (36313 * 10) ^ 1668658697 == 1668299891
    assert 1668299891 % 377279 == 349432
    got = bigram_hash(torch.tensor(TOKENS, dtype=torch.int32), HEAD_VB)
    assert got.tolist() == [377279, 349432, 138731, 152498, 254191]
    assert bigram_hash(torch.tensor([3, 3]), 2).tolist() == [1, 0]                # mod 1: everything is 0


def test_bigram_ids_wrap_like_int32_products():
    """Ids above 2^31/36313 = 59138 overflow int32: numpy int32 arrays wrap in two's complement, as the
    record's int32 tensors do, and numpy's % is floored like torch's."""
    tokens = np.array([65535, 60000, 1, 65535, 59139], dtype=np.int32)
    with np.errstate(over="ignore"):
        previous = np.concatenate(([np.int32(999)], tokens[1:-1]))                 # the reserved id at 0
        mixed = (np.int32(36313) * tokens[1:]) ^ (np.int32(27191) * previous)
    assert (mixed < 0).any()                                                     # the wrap happens
    expected = [999] + (mixed % np.int32(999)).tolist()
    assert bigram_hash(torch.from_numpy(tokens), 1000).tolist() == expected


def test_sign_rows_by_hand_and_the_sign_table_is_fixed():
    assert sign_rows(torch.tensor(TOKENS)).tolist() == [0, (50256 ^ 10) % 8192, (10 ^ 50303) % 8192,
                                                         50303 % 8192, 7]
    assert sign_rows(torch.tensor(TOKENS)).tolist() == [0, 1114, 1141, 1151, 7]
    table = sign_table(8192, 64)
    assert table.shape == (8192, 64) and table.dtype == torch.float32
    assert set(table.unique().tolist()) == {-1.0, 1.0}
    assert abs(table.mean().item()) < 0.01                                      # fair: sd 1/sqrt(524288)
    torch.testing.assert_close(sign_table(8192, 64), table, rtol=0, atol=0)    # same on every call
    assert not torch.equal(sign_table(8192, 64, seed=1), table)


def test_bigram_embedding_is_the_signed_table_row():
    torch.manual_seed(0)
    emb = BigramEmbedding(11, 6, n_layer=3, sign_trick=True).double()
    with torch.no_grad():
        emb.table.normal_()
    tokens = torch.tensor([4, 9, 9, 2], dtype=torch.int32)
    ids = [10] + [((36313 * b) ^ (27191 * a)) % 10 for a, b in zip([10, 9, 9], [9, 9, 2])]  # 1 pairs with 10
    rows = [0] + [a ^ b for a, b in zip([4, 9, 9], [9, 9, 2])]
    expected = emb.table[ids] * sign_table(8192, 6).double()[rows]
    torch.testing.assert_close(emb(tokens), expected, rtol=0, atol=0)
    plain = BigramEmbedding(11, 6, n_layer=3, sign_trick=False).double()
    with torch.no_grad():
        plain.table.copy_(emb.table)
    torch.testing.assert_close(plain(tokens), emb.table[ids], rtol=0, atol=0)
    assert emb.gates.tolist() == pytest.approx([0.05] * 3)
    assert BigramEmbedding(11, 6, 3, True).table.abs().sum() == 0                # zero-initialized
    assert "signs" not in emb.state_dict() and "signs" in dict(emb.named_buffers())


def test_the_gated_bigram_enters_at_the_start_and_after_each_attention_sublayer():
    cfg = build_model_config("tiny", {"vocab_size": 64, "n_layer": 2, "model_dim": 16, "n_head": 2,
                                      "head_dim": 8, "bigram_vocab_size": 37, "bigram_sign_trick": True,
                                      "attention_backend": "reference"})
    torch.manual_seed(0)
    model = GPT(cfg).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("bigram.table") or name.endswith(("o.weight", "proj.weight")):
                p.normal_(0, 0.3)
        model.bigram.gates.copy_(torch.tensor([0.7, -1.3], dtype=torch.float64))
    tokens = torch.tensor([5, 1, 60, 60, 3, 0, 9], dtype=torch.int32)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    previous = [36] + tokens[1:-1].tolist()                       # the reserved id before position 1
    ids = [36] + [((36313 * b) ^ (27191 * a)) % 36 for a, b in zip(previous, tokens[1:].tolist())]
    rows = [0] + [a ^ b for a, b in zip(tokens[:-1].tolist(), tokens[1:].tolist())]
    bigram = model.bigram.table[ids] * sign_table(8192, 16).double()[rows]
    context = model.attention_context(PackedDocuments(cu, 7))
    x0 = rms_norm(model.embed.weight[tokens.long()])
    b0, b1 = model.blocks
    x = x0 + 0.7 * bigram
    x = x + b0.attn(rms_norm(x), context)
    x = x + b0.mlp(rms_norm(x))
    x = x + b1.attn(rms_norm(x), context) - 1.3 * bigram
    x = x + b1.mlp(rms_norm(x))
    torch.testing.assert_close(model.hidden_states(tokens, cu), rms_norm(x), rtol=1e-12, atol=1e-12)
    kinds = model.parameter_kinds()
    assert kinds["bigram.table"] == "embed" and kinds["bigram.gates"] == "scalar"


def test_bigram_settings_are_checked():
    with pytest.raises(SpeedrunError, match="bigram_vocab_size"):
        build_model_config("tiny", {"bigram_vocab_size": 1})
    with pytest.raises(SpeedrunError, match="bigram_sign_trick must be true or false"):
        build_model_config("tiny", {"bigram_sign_trick": "yes"})
    with pytest.raises(ValueError, match=">= 2"):
        bigram_hash(torch.tensor([1, 2]), 1)


def test_a_narrow_bigram_table_fills_the_first_bigram_dim_channels_only():
    """bigram_dim D (records #83-#88: 192 of 768): the signed D-wide row, zeros after it."""
    torch.manual_seed(0)
    emb = BigramEmbedding(11, 6, n_layer=3, sign_trick=True, dim=4).double()
    assert emb.table.shape == (11, 4) and emb.signs.shape == (8192, 4)
    with torch.no_grad():
        emb.table.normal_()
    tokens = torch.tensor([4, 9, 9, 2], dtype=torch.int32)
    ids = [10] + [((36313 * b) ^ (27191 * a)) % 10 for a, b in zip([10, 9, 9], [9, 9, 2])]  # 1 pairs with 10
    rows = [0] + [a ^ b for a, b in zip([4, 9, 9], [9, 9, 2])]
    out = emb(tokens)
    assert out.shape == (4, 6) and not out[:, 4:].any()
    torch.testing.assert_close(out[:, :4], emb.table[ids] * sign_table(8192, 4).double()[rows], rtol=0, atol=0)
    out.pow(2).sum().backward()
    assert emb.table.grad.shape == (11, 4) and emb.table.grad[ids].abs().sum() > 0
    with pytest.raises(ValueError, match=r"bigram table's width must be in 1\.\.6"):
        BigramEmbedding(11, 6, 3, True, dim=7)


@pytest.mark.parametrize("preset", ["record88", "record89"])
def test_a_narrow_bigram_model_equals_a_full_width_one_with_zero_columns(preset):
    """In the records' sublayer form (record88: lambdas; record89: MUDD gates, without DC here), a model with
    bigram_dim 8 of 24 computes the same loss and table gradient as the full-width model whose table and sign rows
    hold its columns and zeros beyond them."""
    small = {"vocab_size": 64, "n_layer": 11, "model_dim": 24, "n_head": 6, "head_dim": 4, "bigram_vocab_size": 37,
             "window_block_size": 2, "rotary_positions": 64, "attention_backend": "reference",
             "cross_entropy": "full", "rotary_kernel": "torch", "mlp_kernel": "torch", "fp8_head": False,
             "fp8_mlp": False, "prefix_token_loss": False, "dc_layers": ()}
    narrow_cfg = build_model_config(preset, {**small, "bigram_dim": 8})
    full_cfg = build_model_config(preset, {**small, "bigram_dim": None})
    torch.manual_seed(0)
    narrow = GPT(narrow_cfg).double()
    with torch.no_grad():
        for p in narrow.parameters():
            p.normal_(0, 0.1)
    full = GPT(full_cfg).double()
    state = dict(narrow.state_dict())
    state["bigram.table"] = torch.cat((state["bigram.table"], torch.zeros(37, 16, dtype=torch.float64)), 1)
    full.load_state_dict(state)
    with torch.no_grad():
        full.bigram.signs[:, :8] = narrow.bigram.signs
    inputs = torch.tensor([3, 7, 1, 0, 9, 12, 3, 7, 5, 33, 2, 8, 8, 1, 39, 4])
    cu = torch.tensor([0, 7, 16], dtype=torch.int32)
    losses = [model(inputs, torch.roll(inputs, -1), cu) for model in (narrow, full)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(narrow.bigram.table.grad, full.bigram.table.grad[:, :8], rtol=1e-9, atol=1e-12)
    assert narrow.bigram.table.grad.abs().sum() > 0


def test_bigram_dim_must_fit_the_stream():
    assert build_model_config("record88").bigram_dim == 192 and build_model_config("record89").bigram_dim is None
    with pytest.raises(SpeedrunError, match=r"model\.bigram_dim must be null \(model_dim\) or an integer in 1\.\.64"):
        build_model_config("tiny", {"bigram_dim": 65})


@pytest.mark.parametrize("record", ["record83", "record87", "record88", "head"])
def test_bigram_ids_equal_the_records_own_get_bigram_hash(record):
    """Each record's ``get_bigram_hash``, read from ../shared/reference-code at test time (its pinned host
    buffer made a plain one: this machine has no CUDA), against ours on tokens of the whole GPT-2 range (int32
    wrap included); skipped where ../shared is absent."""
    from types import SimpleNamespace

    from record_code import SHARED_CODE, OnTheCpu, record_definitions

    script = SHARED_CODE / record / "train_gpt.py"
    if not script.is_file():
        pytest.skip(f"{script} is not here")
    vocab = (50304 * 15 // 2) if record == "head" else 50304 * 15
    namespace = record_definitions(script, {"get_bigram_hash"}, {"torch": torch, "args": SimpleNamespace(
        bigram_vocab_size=vocab)}, transformer=OnTheCpu())
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 65536, (4096,), generator=g, dtype=torch.int32)
    tokens[:3] = torch.tensor([50256, 65535, 7], dtype=torch.int32)
    torch.testing.assert_close(bigram_hash(tokens, vocab), namespace["get_bigram_hash"](tokens).long(), rtol=0, atol=0)
