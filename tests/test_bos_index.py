"""`speedrun bos-index`: positions against a naive scan, manifest, stale and corrupt shards, refused output
folders; and opening a tokenized dataset for training (`speedrun.training.data.load_training_data`)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from speedrun.cli import main as cli_main
from speedrun.data.bos_index_writer import bos_positions, build_bos_index
from speedrun.data.shard_writer import tokenize_documents
from speedrun.data.shards import load_shard
from speedrun.errors import SpeedrunError
from speedrun.training.data import load_training_data

BOS = 50256


def naive_scan(tokens) -> list[int]:
    return [p for p in range(len(tokens)) if int(tokens[p]) == BOS]


@pytest.fixture()
def shards_dir(tmp_path):
    rng = np.random.default_rng(0)
    words = ["To", " be", ",", " or", " not", " to", " be", "\n"]
    texts = ["".join(rng.choice(words, size=rng.integers(1, 80))) for _ in range(200)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "d.parquet")
    tokenize_documents(tmp_path / "d.parquet", "toy", 1000, tmp_path / "shards")
    return tmp_path / "shards"


def test_bos_positions_matches_naive_scan():
    rng = np.random.default_rng(3)
    tokens = rng.integers(50250, 50258, size=3000).astype(np.uint16)
    positions = bos_positions(tokens)
    assert positions.dtype == np.int64
    assert positions.tolist() == naive_scan(tokens)
    assert bos_positions(np.zeros(0, dtype=np.uint16)).tolist() == []


def test_index_of_every_shard(shards_dir, tmp_path):
    manifest = build_bos_index(shards_dir, tmp_path / "bos")
    shards = json.loads((shards_dir / "manifest.json").read_text())["shards"]
    assert [e["shard"] for e in manifest["shards"]] == [s["file"] for s in shards]
    assert len(shards) >= 3
    total = 0
    for entry, shard in zip(manifest["shards"], shards):
        assert entry["file"] == shard["file"].replace(".bin", ".npy")
        assert entry["shard_sha256"] == shard["sha256"]
        positions = np.load(tmp_path / "bos" / entry["file"])
        assert positions.dtype == np.int64
        assert positions.tolist() == naive_scan(load_shard(shards_dir / shard["file"]))
        assert entry["count"] == len(positions)
        total += len(positions)
    assert total == 200  # one BOS per document
    assert json.loads((tmp_path / "bos" / "manifest.json").read_text()) == manifest


def test_stale_sha_is_rejected(shards_dir, tmp_path):
    path = shards_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["shards"][1]["sha256"] = "0" * 64
    path.write_text(json.dumps(manifest))
    with pytest.raises(SpeedrunError, match=r"toy_train_000001.bin: sha256 .* differs from 0000"):
        build_bos_index(shards_dir, tmp_path / "bos")
    assert not (tmp_path / "bos").exists()


def test_corrupt_shard_is_named(shards_dir, tmp_path):
    shard = shards_dir / "toy_train_000002.bin"
    raw = bytearray(shard.read_bytes())
    raw[0] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(SpeedrunError, match=r"toy_train_000002.bin: not a token shard"):
        build_bos_index(shards_dir, tmp_path / "bos")


def test_load_training_data(shards_dir, tmp_path):
    build_bos_index(shards_dir, tmp_path / "bos")
    data = load_training_data(shards_dir, tmp_path / "bos")
    assert data.val_tokens.tolist() == load_shard(shards_dir / "toy_val_000000.bin").tolist()
    assert data.val_bos.tolist() == naive_scan(data.val_tokens)
    assert len(data.train_shards) == len(data.train_bos) >= 2
    for tokens, bos in zip(data.train_shards, data.train_bos):
        assert bos.dtype == np.int64 and bos.tolist() == naive_scan(tokens)


def test_load_training_data_refuses_a_bos_index_of_another_length(shards_dir, tmp_path):
    build_bos_index(shards_dir, tmp_path / "bos")
    index = next((tmp_path / "bos").glob("toy_train_*.npy"))
    np.save(index, np.load(index)[:-1])
    with pytest.raises(SpeedrunError, match=rf"{index.name}: expected \d+ int64 positions, found shape"):
        load_training_data(shards_dir, tmp_path / "bos")


def test_load_training_data_names_the_stage_of_a_missing_manifest(shards_dir, tmp_path):
    with pytest.raises(SpeedrunError, match=r"bos/manifest.json: not found \(run the bos_index stage first\)"):
        load_training_data(shards_dir, tmp_path / "bos")


def tree(directory):
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("out, message", [
    (".", "the output directory is the input"),
    ("..", "the output directory contains the input"),
    ("bos", "the output directory lies inside the input"),
])
def test_out_dir_among_the_inputs_is_refused(shards_dir, capsys, out, message):
    (shards_dir.parent / "README").write_text("mine")
    before = tree(shards_dir.parent)
    assert len([name for name in before if name.endswith(".bin")]) >= 3
    args = ["bos-index", "--shards-dir", str(shards_dir), "--out-dir", str(shards_dir / out)]
    assert cli_main(args) == 2
    assert message in capsys.readouterr().err
    assert tree(shards_dir.parent) == before


def test_out_dir_that_is_not_a_previous_index_is_refused(shards_dir, tmp_path, capsys):
    other = tmp_path / "other"
    tokenize_documents(tmp_path / "d.parquet", "toy", 3000, other)  # a shard folder is not a BOS index
    before = tree(other)
    assert cli_main(["bos-index", "--shards-dir", str(shards_dir), "--out-dir", str(other)]) == 2
    err = capsys.readouterr().err
    assert "other: not empty and not a previous output of speedrun bos-index" in err
    assert "found manifest.json, toy_train_000001.bin" in err
    assert tree(other) == before
    build_bos_index(shards_dir, tmp_path / "bos")  # a previous BOS index is replaced in place
    again = build_bos_index(shards_dir, tmp_path / "bos")
    assert json.loads((tmp_path / "bos" / "manifest.json").read_text()) == again


def test_manifest_entry_without_sha256_is_named(shards_dir, tmp_path):
    path = shards_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["shards"][1]["sha256"]
    path.write_text(json.dumps(manifest))
    with pytest.raises(SpeedrunError, match=r"shards/manifest.json: shards\[1\] has no key 'sha256'"):
        build_bos_index(shards_dir, tmp_path / "bos")
    assert not (tmp_path / "bos").exists()


@pytest.mark.parametrize("keep, message", [
    (0, "lists no shards; expected a validation shard (split 'val') then at least one train shard (split 'train')"),
    (1, "lists only the validation shard toy_val_000000.bin and no train shard; training needs at least one "
        "(split 'train')"),
])
def test_manifest_without_a_train_shard_is_refused(shards_dir, tmp_path, capsys, keep, message):
    path = shards_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["shards"] = manifest["shards"][:keep]
    path.write_text(json.dumps(manifest))
    assert cli_main(["bos-index", "--shards-dir", str(shards_dir), "--out-dir", str(tmp_path / "bos")]) == 2
    assert capsys.readouterr().err.startswith(f"speedrun bos-index: error: {path}: {message}")
    assert not (tmp_path / "bos").exists()


def test_manifest_with_splits_out_of_order_is_refused(shards_dir, tmp_path):
    path = shards_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["shards"][0]["split"], manifest["shards"][2]["split"] = "train", "val"
    path.write_text(json.dumps(manifest))
    with pytest.raises(SpeedrunError, match=r"manifest.json: the first shard, toy_val_000000.bin, has split 'train'; "
                                            r"expected the validation shard \(split 'val'\) first"):
        build_bos_index(shards_dir, tmp_path / "bos")
    manifest["shards"][0]["split"] = "val"
    path.write_text(json.dumps(manifest))
    with pytest.raises(SpeedrunError, match=r"manifest.json: shard toy_train_000002.bin has split 'val'; expected "
                                            r"'train' after the validation shard"):
        build_bos_index(shards_dir, tmp_path / "bos")
    assert not (tmp_path / "bos").exists()
