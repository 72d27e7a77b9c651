"""`speedrun.training.data.load_training_data`: what training refuses to read, each case with its own message."""

from __future__ import annotations

import json

import pytest

from speedrun.data.bos_index_writer import build_bos_index
from speedrun.errors import SpeedrunError
from speedrun.training.data import load_training_data
from test_bos_index import shards_dir  # noqa: F401  (a pytest fixture: toy shards of real GPT-2 tokens)


def _edit_manifest(path, edit) -> None:
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def test_a_stale_bos_index_is_named_as_stale_with_both_hashes(shards_dir, tmp_path):  # noqa: F811
    build_bos_index(shards_dir, tmp_path / "bos")
    data = load_training_data(shards_dir, tmp_path / "bos")
    assert len(data.train_shards) >= 2
    _edit_manifest(shards_dir / "manifest.json", lambda m: m["shards"][0].update(sha256="f" * 64))
    with pytest.raises(SpeedrunError, match=r"toy_val_000000.bin: its BOS index in .*bos is stale \(made from a "
                                            r"shard of sha256 [0-9a-f]{12}\.\.\., this one is ffffffffffff\.\.\.\)"):
        load_training_data(shards_dir, tmp_path / "bos")


def test_a_shard_of_another_length_and_a_missing_index_say_which(shards_dir, tmp_path):  # noqa: F811
    build_bos_index(shards_dir, tmp_path / "bos")
    _edit_manifest(tmp_path / "bos" / "manifest.json", lambda m: m["shards"].pop())
    with pytest.raises(SpeedrunError, match=r"_train_\d+\.bin: no BOS index in .*bos/manifest.json; run the "
                                            r"bos_index stage"):
        load_training_data(shards_dir, tmp_path / "bos")
    build_bos_index(shards_dir, tmp_path / "bos2")
    tokens = json.loads((shards_dir / "manifest.json").read_text())["shards"][0]["tokens"]
    _edit_manifest(shards_dir / "manifest.json", lambda m: m["shards"][0].update(tokens=tokens + 1))
    with pytest.raises(SpeedrunError, match=rf"toy_val_000000.bin: {tokens} tokens, its manifest says "
                                            rf"{tokens + 1}: the shard changed"):
        load_training_data(shards_dir, tmp_path / "bos2")
