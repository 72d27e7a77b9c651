"""The llm.c / modded-nanogpt shard format: byte layout, round trip and header validation."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from speedrun.data.shards import (
    load_shard,
    read_header,
    sha256_file,
    shard_filename,
    write_shard,
)
from speedrun.errors import SpeedrunError


def test_byte_layout(tmp_path):
    path = tmp_path / "x.bin"
    write_shard(path, np.array([50256, 1, 65535], dtype=np.int64))
    raw = path.read_bytes()
    assert len(raw) == 1024 + 6
    assert struct.unpack("<3i", raw[:12]) == (20240520, 1, 3)
    assert raw[12:1024] == bytes(1012)
    assert struct.unpack("<3H", raw[1024:]) == (50256, 1, 65535)


def test_round_trip(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 50257, size=5000).astype(np.uint16)
    path = tmp_path / "s.bin"
    write_shard(path, tokens)
    assert read_header(path) == 5000
    loaded = load_shard(path)
    assert loaded.dtype == np.uint16 and loaded.shape == (5000,)
    assert np.array_equal(loaded, tokens)
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_empty_shard(tmp_path):
    write_shard(tmp_path / "e.bin", np.zeros(0, dtype=np.uint16))
    assert read_header(tmp_path / "e.bin") == 0
    assert load_shard(tmp_path / "e.bin").shape == (0,)


def test_refuses_ids_beyond_uint16(tmp_path):
    with pytest.raises(SpeedrunError, match="65536"):
        write_shard(tmp_path / "big.bin", np.array([1, 65536]))
    assert not (tmp_path / "big.bin").exists()
    assert list(tmp_path.iterdir()) == []


def _write_raw(path, header_values, n_payload_tokens):
    header = np.zeros(256, dtype="<i4")
    header[: len(header_values)] = header_values
    path.write_bytes(header.tobytes() + np.zeros(n_payload_tokens, dtype="<u2").tobytes())


@pytest.mark.parametrize(
    "header,payload,message",
    [
        ([20240521, 1, 4], 4, r"magic 20240521, expected 20240520"),
        ([20240520, 2, 4], 4, r"version 2, expected 1"),
        ([20240520, 1, 5], 4, r"header says 5 tokens, so 1034 bytes, but the file holds 1032 bytes"),
        ([20240520, 1, 3], 4, r"header says 3 tokens"),
    ],
)
def test_bad_header_names_the_file(tmp_path, header, payload, message):
    path = tmp_path / "bad_shard.bin"
    _write_raw(path, header, payload)
    for reader in (read_header, load_shard):
        with pytest.raises(SpeedrunError, match=message) as info:
            reader(path)
        assert str(path) in str(info.value)


def test_truncated_header(tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(b"\x00" * 100)
    with pytest.raises(SpeedrunError, match="short.bin: 100 bytes is shorter"):
        read_header(path)
    with pytest.raises(SpeedrunError, match="not found"):
        read_header(tmp_path / "absent.bin")


def test_shard_filename():
    assert shard_filename("fineweb", 0) == "fineweb_val_000000.bin"
    assert shard_filename("fineweb", 1) == "fineweb_train_000001.bin"
    assert shard_filename("shakespeare", 103) == "shakespeare_train_000103.bin"
