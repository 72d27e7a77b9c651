"""Prefix-token prediction (record #88; speedrun-spec.md 2.5): the prefix table
(:mod:`speedrun.model.prefix`) against a hand-made vocabulary and, on the real GPT-2 vocabulary, against a
brute force that probes every shorter length of each token's bytes, plus tokens checked by decoding; the
loss term ``w_p · CE(z_t, prefix(target_t))`` against a V = 5, T = 4 case by hand and float64 autograd in
every impl; the model switch (buffer, training and eval forward, errors); on CUDA (``gpu`` mark) the
model's training forward with the fused FP8 head against the chunked bf16 loss.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from speedrun.data.tokenizer import gpt2_encoding
from speedrun.errors import SpeedrunError
from speedrun.model.config import build_model_config
from speedrun.model.gpt import GPT
from speedrun.model.loss import linear_cross_entropy, softcap_logits
from speedrun.model.prefix import gpt2_token_bytes, prefix_table_from_bytes, prefix_token_table

IMPLS = ("full", "chunked", "fused")


# ---------------------------------------------------------------- the table


def test_prefix_table_of_a_hand_made_vocabulary():
    vocab = [b"a", b"ab", b"abc", b"abd", b"b", b"abcd", b"x", None, b"ba", b"abdz", b"ac"]
    table = prefix_table_from_bytes(vocab, 14)
    #        a   ab  abc abd b   abcd x   -   ba  abdz ac  (padding)
    want = [-1, 0, 1, 1, -1, 2, -1, -1, 4, 3, 0, -1, -1, -1]
    assert table.dtype == torch.int64 and table.tolist() == want


def test_prefix_table_errors():
    with pytest.raises(ValueError, match="same bytes"):
        prefix_table_from_bytes([b"a", b"b", b"a"], 3)
    with pytest.raises(ValueError, match="smaller"):
        prefix_table_from_bytes([b"a", b"b"], 1)


@pytest.fixture(scope="module")
def gpt2_table() -> torch.Tensor:
    return prefix_token_table(50304)


def test_gpt2_table_equals_brute_force(gpt2_table):
    token_bytes = gpt2_token_bytes()
    ids = {b: i for i, b in enumerate(token_bytes) if b is not None}
    want = [-1] * 50304
    for i, data in enumerate(token_bytes):
        if data is None:
            continue
        for length in range(len(data) - 1, 0, -1):                # the longest proper prefix first
            if data[:length] in ids:
                want[i] = ids[data[:length]]
                break
    assert gpt2_table.shape == (50304,) and gpt2_table.tolist() == want


def test_gpt2_token_bytes_are_the_mergeable_ranks():
    """The bytes per id equal the BPE ranks tiktoken builds from the vocabulary files (id = rank in GPT-2)."""
    import tiktoken.load

    from speedrun.data.tokenizer import VOCAB_FILES, vocab_file

    bpe, encoder = (str(vocab_file(name)) for name in VOCAB_FILES)
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=bpe, encoder_json_file=encoder)
    token_bytes = gpt2_token_bytes()
    assert len(token_bytes) == 50257 and token_bytes[50256] is None
    assert {b: i for i, b in enumerate(token_bytes) if b is not None} == ranks


@pytest.mark.parametrize("text, prefix", [(" the", " th"), (" hello", " hell"), ("Hello", "Hell"), ("ing", "in"),
                                          (" and", " an"), (" th", " t")])
def test_gpt2_prefix_tokens_by_decoding(gpt2_table, text, prefix):
    encoding = gpt2_encoding()
    (token,) = encoding.encode_ordinary(text)
    (expected,) = encoding.encode_ordinary(prefix)
    found = gpt2_table[token].item()
    assert found == expected and encoding.decode_single_token_bytes(found) == prefix.encode()


def test_gpt2_tokens_without_a_prefix(gpt2_table):
    encoding = gpt2_encoding()
    for text in ("a", " ", "!"):                                  # one byte: no proper non-empty prefix
        (token,) = encoding.encode_ordinary(text)
        assert gpt2_table[token].item() == -1
    assert gpt2_table[50256:].eq(-1).all()                        # <|endoftext|> and the padding
    assert not gpt2_table.eq(50256).any()
    assert int(gpt2_table.ge(0).sum()) > 40000                    # most multi-byte tokens have one
    for token in torch.nonzero(gpt2_table >= 0)[:, 0][::997].tolist():   # every found prefix is a prefix
        whole = encoding.decode_single_token_bytes(token)
        part = encoding.decode_single_token_bytes(gpt2_table[token].item())
        assert whole.startswith(part) and len(part) < len(whole)


def test_prefix_token_table_needs_the_whole_vocabulary():
    with pytest.raises(ValueError, match="smaller"):
        prefix_token_table(50000)


# ---------------------------------------------------------------- the loss term

LOGITS = [[0.0, 1.0, 2.0, 0.0, -1.0],
          [1.0, 0.0, 0.0, 3.0, 0.0],
          [-2.0, 0.5, 0.0, 1.0, 1.0],
          [0.0, 0.0, 0.0, 0.0, 2.0]]
TARGETS = [1, 3, 4, 0]
PREFIXES = [2, -1, 4, 3]          # position 1 has none; position 2's prefix is its own target's column


def hand_ce(t: int, j: int) -> float:
    return math.log(sum(math.exp(v) for v in LOGITS[t])) - LOGITS[t][j]


def hand_softmax(t: int) -> list[float]:
    total = sum(math.exp(v) for v in LOGITS[t])
    return [math.exp(v) / total for v in LOGITS[t]]


@pytest.mark.parametrize("impl", IMPLS)
def test_prefix_loss_by_hand(impl):
    x = torch.tensor(LOGITS, dtype=torch.float64, requires_grad=True)          # W = I: z = x
    loss = linear_cross_entropy(x, torch.eye(5, dtype=torch.float64), torch.tensor(TARGETS), impl=impl,
                                mtp_weights=torch.tensor([1.0, 0.5]), prefix_targets=torch.tensor(PREFIXES),
                                prefix_weight=torch.tensor(0.25))
    y0, y1, y2, y3 = TARGETS
    per_position = [hand_ce(0, y0) + 0.5 * hand_ce(0, y1) + 0.25 * hand_ce(0, 2),
                    hand_ce(1, y1) + 0.5 * hand_ce(1, y2),
                    hand_ce(2, y2) + 0.5 * hand_ce(2, y3) + 0.25 * hand_ce(2, 4),
                    hand_ce(3, y3) + 0.25 * hand_ce(3, 3)]
    assert loss.item() == pytest.approx(sum(per_position) / 4, rel=1e-13)
    (grad,) = torch.autograd.grad(loss, x)
    # position 2: weights 1 + 0.5 + 0.25 on the softmax; column 4 takes the target's 1 and the prefix's 0.25
    row2 = [1.75 * p for p in hand_softmax(2)]
    row2[4] -= 1.25
    row2[y3] -= 0.5
    row1 = [1.5 * p for p in hand_softmax(1)]                   # no prefix term at position 1
    row1[y1] -= 1.0
    row1[y2] -= 0.5
    torch.testing.assert_close(grad[2], torch.tensor(row2, dtype=torch.float64) / 4, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad[1], torch.tensor(row1, dtype=torch.float64) / 4, rtol=1e-12, atol=1e-14)


def reference_loss(x, w, targets, prefix_targets, prefix_weight, softcap):
    """mean_t [CE(z_t, targets[t]) + w_p · CE(z_t, prefix[t]) where prefix[t] >= 0], float64, by masking."""
    logits = softcap_logits(x.double() @ w.double().T, *softcap)
    main = F.cross_entropy(logits, targets, reduction="none")
    aux = F.cross_entropy(logits, prefix_targets.clamp_min(0), reduction="none") * (prefix_targets >= 0)
    return (main + prefix_weight * aux).mean()


@pytest.mark.parametrize("softcap", [(4.0, "tanh"), (23.0, "shifted_sigmoid")])
@pytest.mark.parametrize("impl,chunk", [("full", 0), ("chunked", 3), ("fused", 0)])
def test_prefix_loss_matches_float64_autograd(softcap, impl, chunk):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(10, 6, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(29, 6, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 29, (10,), generator=g)
    prefixes = torch.randint(-1, 29, (10,), generator=g)
    prefixes[:3] = torch.tensor([-1, targets[1], targets[2]])
    weight = torch.tensor(0.4)                                    # fp32: 0.4000000059604645
    want = reference_loss(x, w, targets, prefixes, weight.item(), softcap)
    want_x, want_w = torch.autograd.grad(want, (x, w))
    got = linear_cross_entropy(x, w, targets, softcap=softcap[0], softcap_kind=softcap[1], impl=impl,
                               chunk_tokens=chunk, prefix_targets=prefixes, prefix_weight=weight)
    got_x, got_w = torch.autograd.grad(got, (x, w))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_x, want_x, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got_w, want_w, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- the model switch

TINY = dict(vocab_size=50304, n_layer=1, model_dim=16, n_head=2, head_dim=8, mlp_ratio=1,
            attention_backend="reference", logit_softcap=23.0, softcap_kind="shifted_sigmoid")


@pytest.fixture(scope="module")
def prefix_model() -> GPT:
    torch.manual_seed(0)
    model = GPT(build_model_config("tiny", {**TINY, "prefix_token_loss": True})).double()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.1)
    return model


def model_batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, 50257, (12,), generator=g, dtype=torch.int32)
    return inputs, torch.randint(0, 50257, (12,), generator=g), torch.tensor([0, 5, 12], dtype=torch.int32)


def test_the_model_builds_the_table_as_a_buffer_outside_the_state_dict(prefix_model, gpt2_table):
    assert torch.equal(prefix_model.prefix_table, gpt2_table)
    assert "prefix_table" not in prefix_model.state_dict()
    plain = GPT(build_model_config("tiny", TINY))
    assert not hasattr(plain, "prefix_table") and set(plain.state_dict()) == set(prefix_model.state_dict())


def test_training_forward_adds_the_terms_and_eval_forward_does_not(prefix_model, gpt2_table):
    inputs, targets, cu = model_batch()
    mtp, pw = torch.tensor([1.0, 0.5, 0.25]), torch.tensor(0.25)
    prefix_model.train()
    x = prefix_model.hidden_states(inputs, cu).detach()
    head = prefix_model.lm_head.weight.detach()
    got = prefix_model(inputs, targets, cu, mtp_weights=mtp, prefix_weight=pw)
    want = linear_cross_entropy(x, head, targets, softcap=23.0, softcap_kind="shifted_sigmoid", impl="full",
                                mtp_weights=mtp, prefix_targets=gpt2_table[targets], prefix_weight=pw)
    plain = linear_cross_entropy(x, head, targets, softcap=23.0, softcap_kind="shifted_sigmoid", impl="full")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert got.item() > plain.item() + 0.1                       # the extra terms are there
    prefix_model.eval()
    with torch.no_grad():
        evaluated = prefix_model(inputs, targets, cu, mtp_weights=mtp, prefix_weight=pw)
    prefix_model.train()
    torch.testing.assert_close(evaluated, plain, rtol=1e-12, atol=1e-12)


def test_prefix_weight_without_the_switch_and_the_switch_with_a_small_vocabulary_raise():
    model = GPT(build_model_config("tiny", {**TINY, "vocab_size": 64}))
    inputs, targets, cu = model_batch()
    with pytest.raises(ValueError, match="prefix_token_loss"):
        model(inputs % 64, targets % 64, cu, prefix_weight=torch.tensor(0.25))
    with pytest.raises(SpeedrunError, match="model.prefix_token_loss"):
        build_model_config("tiny", {**TINY, "vocab_size": 320, "prefix_token_loss": True})
    with pytest.raises(SpeedrunError, match="model.prefix_token_loss"):
        build_model_config("tiny", {**TINY, "prefix_token_loss": "yes"})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_training_forward_with_the_fused_fp8_head_matches_chunked_bfloat16():
    torch.manual_seed(0)
    config = {**TINY, "model_dim": 128, "head_dim": 64, "prefix_token_loss": True, "cross_entropy": "fused",
              "fp8_head": True}
    model = GPT(build_model_config("tiny", config)).cuda()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.02)
    g = torch.Generator().manual_seed(3)
    inputs = torch.randint(0, 50257, (1024,), generator=g, dtype=torch.int32).cuda()
    targets = torch.randint(0, 50257, (1024,), generator=g).cuda()
    cu = torch.tensor([0, 300, 1024], dtype=torch.int32).cuda()
    mtp, pw = torch.tensor([1.0, 0.5, 0.25]).cuda(), torch.tensor(0.25).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fused = model(inputs, targets, cu, mtp_weights=mtp, prefix_weight=pw)
        x = model.hidden_states(inputs, cu).detach()
    want = linear_cross_entropy(x.float(), model.lm_head.weight.detach(), targets, softcap=23.0,
                                softcap_kind="shifted_sigmoid", impl="chunked", compute_dtype=torch.bfloat16,
                                mtp_weights=mtp, prefix_targets=model.prefix_table[targets], prefix_weight=pw)
    assert fused.item() == pytest.approx(want.item(), rel=3e-3)
    fused.backward()
    assert torch.isfinite(model.lm_head.weight.grad).all() and model.lm_head.weight.grad.abs().sum() > 0
