"""`speedrun tokenize`: shard byte layout, document splitting across shards, manifest, thread-count
invariance, and input errors."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from speedrun.cli import main as cli_main
from speedrun.data.shards import load_shard
from speedrun.data.tokenizer import gpt2_encoding
from speedrun.errors import SpeedrunError
from speedrun.tokenize import tokenize_documents

BOS, HELLO, WORLD = 50256, 15496, 995  # GPT-2 ids of "Hello" and " world"


def write_parquet(path, texts, **extra_columns):
    columns = {"text": pa.array(texts, type=pa.string()),
               "id": pa.array([str(i) for i in range(len(texts))], type=pa.string())}
    columns.update(extra_columns)
    pq.write_table(pa.table(columns), path, row_group_size=7)
    return path


def shard_bytes(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_layout_val_first_and_split_document(tmp_path):
    docs = write_parquet(tmp_path / "d.parquet", ["Hello world"] * 4)
    manifest = tokenize_documents(docs, "toy", 5, tmp_path / "shards")
    out = tmp_path / "shards"
    # stream: [BOS, Hello, world] x 4 = 12 tokens, cut every 5 tokens
    assert load_shard(out / "toy_val_000000.bin").tolist() == [BOS, HELLO, WORLD, BOS, HELLO]
    assert load_shard(out / "toy_train_000001.bin").tolist() == [WORLD, BOS, HELLO, WORLD, BOS]
    assert load_shard(out / "toy_train_000002.bin").tolist() == [HELLO, WORLD]
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json", "toy_train_000001.bin", "toy_train_000002.bin", "toy_val_000000.bin"]
    assert manifest == json.loads((out / "manifest.json").read_text())
    assert manifest["dataset"] == "toy" and manifest["shard_tokens"] == 5
    assert manifest["documents"] == 4 and manifest["total_tokens"] == 12
    assert [(s["file"], s["split"], s["tokens"]) for s in manifest["shards"]] == [
        ("toy_val_000000.bin", "val", 5), ("toy_train_000001.bin", "train", 5),
        ("toy_train_000002.bin", "train", 2)]
    for s in manifest["shards"]:
        assert s["sha256"] == hashlib.sha256((out / s["file"]).read_bytes()).hexdigest()


def test_stream_equals_concatenated_documents(tmp_path):
    rng = np.random.default_rng(0)
    words = ["thou", "art", " the", "King", "\n\n", "—", "o'er", "1599", "naïve", "  "]
    texts = ["".join(rng.choice(words, size=rng.integers(1, 60))) for _ in range(40)]
    docs = write_parquet(tmp_path / "d.parquet", texts)
    manifest = tokenize_documents(docs, "toy", 97, tmp_path / "shards")
    enc = gpt2_encoding()
    expected = [t for text in texts for t in [BOS, *enc.encode_ordinary(text)]]
    shards = [load_shard(tmp_path / "shards" / s["file"]) for s in manifest["shards"]]
    assert np.concatenate(shards).tolist() == expected
    assert all(len(s) == 97 for s in shards[:-1]) and 0 < len(shards[-1]) <= 97


def test_thread_count_does_not_change_bytes(tmp_path):
    rng = np.random.default_rng(1)
    words = ["Hamlet", " is", " mad", ",", " north-north-west", ".\n", " O", " Horatio"]
    texts = ["".join(rng.choice(words, size=rng.integers(1, 40))) for _ in range(2500)]
    docs = write_parquet(tmp_path / "d.parquet", texts)
    outputs = []
    for threads in (1, 2, 4):
        tokenize_documents(docs, "toy", 4096, tmp_path / f"t{threads}", threads=threads)
        outputs.append(shard_bytes(tmp_path / f"t{threads}"))
    assert len(outputs[0]) > 3
    assert outputs[0] == outputs[1] == outputs[2]


def test_stale_output_is_replaced_atomically(tmp_path):
    docs = write_parquet(tmp_path / "d.parquet", ["Hello world"] * 4)
    out = tmp_path / "shards"
    out.mkdir()
    (out / "toy_train_000099.bin").write_bytes(b"stale")
    tokenize_documents(docs, "toy", 5, out)
    assert "toy_train_000099.bin" not in shard_bytes(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.parquet", "shards"]


def test_errors_leave_nothing_behind(tmp_path):
    docs = write_parquet(tmp_path / "d.parquet", ["Hello world", ""])
    with pytest.raises(SpeedrunError, match=r"d.parquet: the text of row 1 is empty"):
        tokenize_documents(docs, "toy", 2, tmp_path / "shards")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.parquet"]


@pytest.mark.parametrize("texts,message", [
    (["a", None, "b"], "the text of row 1 is null"),
    ([], "no documents"),
    (["Hello world"], r"1 documents make 3 tokens.*no train shard"),
])
def test_bad_documents(tmp_path, texts, message):
    docs = write_parquet(tmp_path / "d.parquet", texts)
    with pytest.raises(SpeedrunError, match=message):
        tokenize_documents(docs, "toy", 3, tmp_path / "shards")


def test_missing_text_column_names_the_columns(tmp_path):
    pq.write_table(pa.table({"content": ["x"], "url": ["u"]}), tmp_path / "d.parquet")
    with pytest.raises(SpeedrunError, match=r"no 'text' column; the columns are \['content', 'url'\]"):
        tokenize_documents(tmp_path / "d.parquet", "toy", 3, tmp_path / "shards")


def test_missing_or_invalid_file(tmp_path):
    with pytest.raises(SpeedrunError, match="absent.parquet: documents file not found"):
        tokenize_documents(tmp_path / "absent.parquet", "toy", 3, tmp_path / "shards")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(SpeedrunError, match="junk.parquet: not a readable parquet file"):
        tokenize_documents(tmp_path / "junk.parquet", "toy", 3, tmp_path / "shards")


def test_cli(tmp_path, capsys):
    docs = write_parquet(tmp_path / "d.parquet", ["Hello world"] * 4)
    out = tmp_path / "shards"
    args = ["tokenize", "--documents", str(docs), "--dataset", "toy", "--shard-tokens", "5",
            "--out-dir", str(out), "--threads", "2"]
    assert cli_main(args) == 0
    assert "3 shards, 12 tokens of 4 documents" in capsys.readouterr().out
    assert cli_main(args[:-4] + ["--out-dir", str(out), "--threads", "0"]) == 2
    assert "threads must be >= 1" in capsys.readouterr().err
