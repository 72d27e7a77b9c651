"""A damaged shard is moved aside with a one-line message saying so (speedrun.data.integrity), so that the next
call of the workflow rebuilds it; the train rule runs the check before torchrun."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from speedrun.data.integrity import check_dataset, main, move_aside
from speedrun.errors import SpeedrunError
from synthetic_data import counting_documents, write_dataset

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def dataset(tmp_path):
    return write_dataset(tmp_path, counting_documents(60), shard_tokens=2048)


def _train_shard(shards: Path) -> Path:
    return sorted(shards.glob("*_train_*.bin"))[0]


def test_a_sound_dataset_passes(dataset):
    shards, _ = dataset
    assert check_dataset(shards) == len(list(shards.glob("*.bin")))


@pytest.mark.parametrize("damage, found", [
    (lambda b: b[:-6], r"header says \d+ tokens, so \d+ bytes, but the file holds \d+ bytes"),   # truncated
    (lambda b: b"\x00" + b[1:], r"not a token shard: header magic \d+, expected 20240520"),     # magic
])
def test_a_damaged_shard_moves_the_folder_aside_with_one_line(dataset, capsys, damage, found):
    shards, _ = dataset
    shard = _train_shard(shards)
    shard.write_bytes(damage(shard.read_bytes()))
    assert main([str(shards)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    moved = next(shards.parent.glob("shards.damaged-*"))
    assert re.fullmatch(rf"speedrun train: error: {re.escape(str(shard))}: {found}; moved aside to "
                        rf"{re.escape(str(moved))}: the next call of the workflow rebuilds it \(tokenize, "
                        r"bos_index\)\n", err), err
    assert not shards.exists() and (moved / shard.name).is_file()


def test_a_shard_whose_count_differs_from_the_manifest_is_damaged(dataset):
    shards, _ = dataset
    shard = _train_shard(shards)
    data = bytearray(shard.read_bytes())
    count = int(np.frombuffer(bytes(data[8:12]), dtype=np.int32)[0])
    data[8:12] = np.int32(count - 1).tobytes()
    shard.write_bytes(bytes(data[:-2]))              # a consistent header and size, one token short
    with pytest.raises(SpeedrunError, match=rf"{shard.name}: {count - 1} tokens, its manifest says {count}; moved "
                                            r"aside to "):
        check_dataset(shards)


def test_move_aside_never_overwrites(tmp_path):
    first = move_aside((tmp_path / "a").resolve()) if (tmp_path / "a").mkdir() is None else None
    (tmp_path / "a").mkdir()
    second = move_aside(tmp_path / "a")
    assert first != second and first.is_dir() and second.is_dir() and not (tmp_path / "a").exists()


def test_the_train_rule_checks_the_shards_before_torchrun():
    rule = (ROOT / "workflow/rules/train.smk").read_text()
    shell = rule.split("shell:", 1)[1]
    assert shell.index("{SHARD_CHECK} {input.shards:q} > {log} 2>&1 && ") < shell.index("exec {TRAIN_LAUNCHER}")
    done = subprocess.run([sys.executable, "-m", "speedrun.data.integrity"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("usage:")


def _download(root: Path, name: str, data: bytes) -> Path:
    path = root / "results" / "download" / "kjj0--fineweb10B-gpt2" / "main" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_damaged_download_is_moved_aside_so_that_the_next_call_fetches_it(tmp_path):
    from speedrun.data.shards import BOS_ID, write_shard
    from speedrun.data.shard_writer import import_pretokenized

    good = tmp_path / "good.bin"
    write_shard(good, np.array([BOS_ID, 1, 2, BOS_ID, 3], dtype=np.uint16))
    val = _download(tmp_path, "fineweb_val_000000.bin", good.read_bytes())
    train = _download(tmp_path, "fineweb_train_000001.bin", good.read_bytes()[:-2])      # truncated body
    with pytest.raises(SpeedrunError) as refused:
        import_pretokenized([val, train], "fineweb", tmp_path / "results" / "shards" / "fineweb")
    moved = next(train.parent.glob("fineweb_train_000001.bin.damaged-*"))
    assert str(refused.value) == (f"{train}: header says 5 tokens, so 1034 bytes, but the file holds 1032 bytes; "
                                  f"moved aside to {moved}: the next call of the workflow downloads it again")
    assert not train.exists() and val.exists()


def test_a_damaged_file_of_the_users_stays_where_it_is(tmp_path):
    from speedrun.data.shards import BOS_ID, write_shard
    from speedrun.data.shard_writer import import_pretokenized

    val, train = tmp_path / "mine_val_000000.bin", tmp_path / "mine_train_000001.bin"
    write_shard(val, np.array([BOS_ID, 1, 2], dtype=np.uint16))
    train.write_bytes(b"\x00" + val.read_bytes()[1:])
    with pytest.raises(SpeedrunError, match=r"not a token shard: header magic \d+, expected 20240520$"):
        import_pretokenized([val, train], "mine", tmp_path / "out")
    assert train.exists()
