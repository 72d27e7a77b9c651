"""`speedrun.training.data.load_training_data`: what training refuses to read, each case with its own message;
`check_data_feeds` with the loader a config names (`train.train_batches`)."""

from __future__ import annotations

import json

import pytest

from speedrun.data.bos_index_writer import build_bos_index
from speedrun.errors import SpeedrunError
from speedrun.training.config import TrainConfig
from speedrun.training.data import check_data_feeds, load_training_data
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


def test_the_data_check_counts_the_loader_the_config_names(shards_dir, tmp_path):  # noqa: F811
    """check_data_feeds counts contiguous batches (record #12's) as whole slices of T + 1 tokens of each train
    shard, (n - 1) // T per shard of n tokens; one step more is refused with the BOS-aligned hint left out."""
    build_bos_index(shards_dir, tmp_path / "bos")
    data = load_training_data(shards_dir, tmp_path / "bos")
    T, micro_batches = 64, 2
    fed = sum((len(s) - 1) // T for s in data.train_shards) // micro_batches
    assert fed >= 2

    def config(steps: int, kind: str) -> TrainConfig:
        return TrainConfig.from_dict({"steps": steps, "tokens_per_step": T * micro_batches,
                                      "micro_batches": micro_batches, "max_seq_len": T, "val_tokens": 64,
                                      "val_batch_tokens": 64, "train_batches": kind})

    check_data_feeds(config(fed, "contiguous"), data)                       # raises nothing
    with pytest.raises(SpeedrunError, match=rf"^the train shards feed {fed} steps of 128 tokens, fewer than "
                                            rf"train.steps = {fed + 1}; add shards or lower steps.$"):
        check_data_feeds(config(fed + 1, "contiguous"), data)
    with pytest.raises(SpeedrunError, match=r"the train shards feed \d+ steps"):
        check_data_feeds(config(fed, "bos_aligned"), data)                  # cut documents: fewer steps


def test_contiguous_batches_need_max_seq_len_of_a_whole_micro_batch():
    base = {"steps": 4, "tokens_per_step": 256, "micro_batches": 2, "max_seq_len": 128}
    assert TrainConfig.from_dict({**base, "train_batches": "contiguous"}).train_batches == "contiguous"
    assert TrainConfig.from_dict(base).train_batches == "bos_aligned"
    with pytest.raises(SpeedrunError, match=r"train.train_batches contiguous reads whole micro-batches of 128 "
                                            r"tokens \(from step 0\) with no document cut, so train.max_seq_len "
                                            r"must be at least that, got 64"):
        TrainConfig.from_dict({**base, "max_seq_len": 64, "train_batches": "contiguous"})
    with pytest.raises(SpeedrunError, match=r"train.train_batches must be one of bos_aligned, contiguous; got "
                                            r"'shuffled'"):
        TrainConfig.from_dict({**base, "train_batches": "shuffled"})
