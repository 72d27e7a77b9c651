"""Tokenizing FineWeb-sized sources: document readers (parquet by row group, JSON Lines, text), the ordered
multi-process encoder, per-file token streams cut into shards, pre-tokenized shards taken as they are, and
the bad inputs of each (issue 3)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hub_server import fineweb_parquet_bytes, shard_bytes

from speedrun.cli import main as cli_main
from speedrun.data.documents import iter_text_batches
from speedrun.data.encode import EncoderPool, encode_texts
from speedrun.data.shard_writer import import_pretokenized, shard_streams, tokenize_documents, tokenize_to_stream
from speedrun.data.tokenizer import gpt2_encoding
from speedrun.errors import SpeedrunError

BOS = 50256
TEXTS = ["Hello world", "a<|endoftext|>b", "naïve café 東京 🙂", " \n\t spaces  ", "x" * 3000, "The end."]


def reference_stream(texts: list[str]) -> list[int]:
    """modded-nanogpt's rule: [50256] + encode_ordinary(text) per document, concatenated."""
    enc = gpt2_encoding()
    return [t for text in texts for t in [BOS, *enc.encode_ordinary(text)]]


def web_texts(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ["The", " mayor", " said", ",", " 2024", ".", "\n", " über", " 🙂", " <|endoftext|>", "  "]
    return ["".join(rng.choice(words, size=rng.integers(1, 200))) for _ in range(count)]


def dir_bytes(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# ---- readers -------------------------------------------------------------------------------------


def test_parquet_is_read_in_order_by_batches(tmp_path):
    texts = web_texts(23, 0)
    path = tmp_path / "000_00000.parquet"
    path.write_bytes(fineweb_parquet_bytes(texts, row_group_size=5))
    batches = list(iter_text_batches(path, rows_per_batch=4))
    assert [len(b) for b in batches] == [4, 4, 4, 4, 4, 3]
    assert [t for b in batches for t in b] == texts


def test_jsonl_and_txt(tmp_path):
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"content": t, "n": i}) for i, t in enumerate(TEXTS))
                                      + "\n\n", encoding="utf-8")
    assert [t for b in iter_text_batches(tmp_path / "d.jsonl", "content", 4) for t in b] == TEXTS
    (tmp_path / "page.txt").write_text(TEXTS[2], encoding="utf-8")
    assert list(iter_text_batches(tmp_path / "page.txt")) == [[TEXTS[2]]]


def test_a_byte_order_mark_is_not_part_of_the_text(tmp_path):
    """UTF-8 files saved by Windows editors start with a BOM (EF BB BF): not a character of the first document
    (tiktoken would make it 3 tokens) and not a JSON error."""
    bom = b"\xef\xbb\xbf"
    (tmp_path / "d.txt").write_bytes(bom + "Hello world".encode())
    (tmp_path / "d.jsonl").write_bytes(bom + b'{"text": "Hello"}\n{"text": "world"}\n')
    assert list(iter_text_batches(tmp_path / "d.txt")) == [["Hello world"]]
    assert list(iter_text_batches(tmp_path / "d.jsonl")) == [["Hello", "world"]]


@pytest.mark.parametrize("content, message", [
    (b'{"text": "ok"}\n{"text": "caf\xe9"}\n', r"d.jsonl: line 2 is not UTF-8"),
    (b'{"text": "ok"}\n{"text": \n', r"d.jsonl: line 2 is not JSON"),
    (b'{"body": "ok"}\n', r"d.jsonl: line 1 has no 'text' field"),
    (b'["ok"]\n', r"d.jsonl: line 1 is a JSON array, expected an object with a 'text' field"),
    (b'{"text": "ok"}\n"ok"\n', r"d.jsonl: line 2 is a JSON string, expected an object"),
    (b'{"text": ""}\n', r"d.jsonl: the text of line 1 is empty"),
    (b'{"text": 7}\n', r"d.jsonl: the text of line 1 is a int"),
    (b'{"text": "a\\ud800b"}\n', r"d.jsonl: the text of line 1 is not valid Unicode"),
])
def test_a_bad_jsonl_line_is_named_with_the_file(tmp_path, content, message):
    assert_refused(tmp_path / "d.jsonl", content, message)


@pytest.mark.parametrize("name, content, message", [
    ("d.txt", b"\xef\xbb\xbfcaf\xe9", r"d.txt: not UTF-8 text \(byte 6"),
    ("d.txt", b"caf\xe9", r"d.txt: not UTF-8 text \(byte 3"),
    ("d.txt", b"", r"d.txt: the text of the file is empty"),
    ("d.csv", b"text\nx\n", r"d.csv: unknown documents format '.csv'"),
])
def test_bad_documents_name_the_file(tmp_path, name, content, message):
    assert_refused(tmp_path / name, content, message)


def assert_refused(path: Path, content: bytes, message: str) -> None:
    """``path`` written with ``content``: reading its documents raises a SpeedrunError matching ``message``."""
    path.write_bytes(content)
    with pytest.raises(SpeedrunError, match=message):
        list(iter_text_batches(path))


def test_truncated_and_corrupt_parquet(tmp_path):
    texts = [f"document number {i} " * 50 for i in range(200)]
    data = fineweb_parquet_bytes(texts, row_group_size=50)
    (tmp_path / "cut.parquet").write_bytes(data[:len(data) // 2])
    with pytest.raises(SpeedrunError, match="cut.parquet: not a readable parquet file"):
        list(iter_text_batches(tmp_path / "cut.parquet"))
    column = pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(2).column(0)  # rows 100..149
    assert column.has_dictionary_page and column.compression == "SNAPPY"
    start = column.dictionary_page_offset + 200  # inside the compressed texts of row group 2
    corrupt = bytearray(data)
    corrupt[start:start + 200] = bytes(b ^ 0xFF for b in corrupt[start:start + 200])
    (tmp_path / "bad.parquet").write_bytes(bytes(corrupt))
    with pytest.raises(SpeedrunError, match="bad.parquet: corrupt or truncated parquet data after row 100"):
        list(iter_text_batches(tmp_path / "bad.parquet", rows_per_batch=50))


def test_named_text_column(tmp_path):
    pq.write_table(pa.table({"body": TEXTS}), tmp_path / "d.parquet")
    assert [t for b in iter_text_batches(tmp_path / "d.parquet", "body") for t in b] == TEXTS
    with pytest.raises(SpeedrunError, match=r"no 'text' column; the columns are \['body'\]"):
        list(iter_text_batches(tmp_path / "d.parquet"))


# ---- encoding ------------------------------------------------------------------------------------


def test_encode_texts_is_the_public_rule():
    tokens = encode_texts(TEXTS)
    assert tokens.dtype == np.uint16
    assert tokens.tolist() == reference_stream(TEXTS)
    assert encode_texts(["Hello world"]).tolist() == [BOS, 15496, 995]
    assert encode_texts([]).size == 0


@pytest.mark.parametrize("workers", [1, 3])
def test_pool_keeps_the_order(workers):
    batches = [web_texts(n, seed) for seed, n in enumerate([7, 1, 30, 2, 11, 5, 9, 4])]
    with EncoderPool(workers) as pool:
        out = list(pool.map(iter(batches)))
    assert [a.tolist() for a in out] == [reference_stream(b) for b in batches]


# ---- streams, shards, pre-tokenized shards ---------------------------------------------------------


def test_streams_give_the_same_shards_as_one_job(tmp_path):
    files = []
    for i in range(3):
        files.append(tmp_path / f"{i:03d}_00000.parquet")
        files[-1].write_bytes(fineweb_parquet_bytes(web_texts(30, i), row_group_size=7))
    streams = [tmp_path / f"{i:05d}.bin" for i in range(3)]
    for path, stream in zip(files, streams):
        assert tokenize_to_stream(path, stream, threads=2)[0] == 30
    manifest = shard_streams(streams, "fw", 1000, tmp_path / "from-streams")
    tokenize_documents(files, "fw", 1000, tmp_path / "one-job", threads=1)
    assert dir_bytes(tmp_path / "from-streams") == dir_bytes(tmp_path / "one-job")
    expected = reference_stream([t for i in range(3) for t in web_texts(30, i)])
    got = [t for s in manifest["shards"] for t in
           np.frombuffer((tmp_path / "from-streams" / s["file"]).read_bytes()[1024:], "<u2").tolist()]
    assert got == expected and manifest["documents"] == 90
    assert all(s["tokens"] == 1000 for s in manifest["shards"][:-1])


def test_stream_header(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "Hello world"}) + "\n")
    assert tokenize_to_stream(tmp_path / "d.jsonl", tmp_path / "s.bin") == (1, 3)
    assert (tmp_path / "s.bin").read_bytes() == shard_bytes([BOS, 15496, 995])


def test_bad_stream_is_named(tmp_path):
    (tmp_path / "s.bin").write_bytes(shard_bytes([BOS, 1, 2], version=2))
    with pytest.raises(SpeedrunError, match=r"s.bin: unsupported shard version 2"):
        shard_streams([tmp_path / "s.bin"], "fw", 2, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_full_disk_leaves_nothing(tmp_path, monkeypatch):
    (tmp_path / "d.txt").write_text("Hello world")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("speedrun.data.shard_writer.os.fsync", full)
    with pytest.raises(SpeedrunError, match=r"s.bin: writing failed \(No space left on device\)"):
        tokenize_to_stream(tmp_path / "d.txt", tmp_path / "s.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.txt"]


def gpt2_files(tmp_path, **bad):
    files = {"fineweb_val_000000.bin": shard_bytes([BOS, 1, 2, BOS, 3]),
             "fineweb_train_000001.bin": shard_bytes([BOS, 4, 5, 6, BOS, 7, BOS]),
             "fineweb_train_000002.bin": shard_bytes([8, BOS, 9])}
    files.update(bad)
    paths = []
    for name, data in files.items():
        paths.append(tmp_path / "dl" / name)
        paths[-1].parent.mkdir(exist_ok=True)
        paths[-1].write_bytes(data)
    return paths


def test_pretokenized_shards_are_taken_as_they_are(tmp_path):
    paths = gpt2_files(tmp_path)
    manifest = import_pretokenized(paths, "fineweb", tmp_path / "shards")
    out = dir_bytes(tmp_path / "shards")
    for path in paths:
        assert out[path.name] == path.read_bytes()
    assert [(s["file"], s["split"], s["tokens"], s["sha256"]) for s in manifest["shards"]] == [
        (p.name, "val" if i == 0 else "train", (len(p.read_bytes()) - 1024) // 2,
         hashlib.sha256(p.read_bytes()).hexdigest()) for i, p in enumerate(paths)]
    assert manifest["documents"] == 6 and manifest["total_tokens"] == 15 and manifest["shard_tokens"] == 7
    renamed = import_pretokenized(paths, "mine", tmp_path / "mine")
    assert [s["file"] for s in renamed["shards"]] == ["mine_val_000000.bin", "mine_train_000001.bin",
                                                      "mine_train_000002.bin"]


@pytest.mark.parametrize("bad, message", [
    ({"fineweb_train_000001.bin": shard_bytes([BOS, 1], count=5)}, r"header says 5 tokens, so 1034 bytes"),
    ({"fineweb_train_000002.bin": shard_bytes([BOS, 50257, 1])}, r"train_000002.bin: token 1 is 50257"),
    ({"fineweb_train_000002.bin": b"\x00" * 100}, r"shorter than the 1024-byte shard header"),
    ({"fineweb_train_000002.bin": shard_bytes([])}, r"train_000002.bin: holds no tokens \(its header says 0\)"),
    ({"fineweb_train_000002.bin": shard_bytes([1, 2, 3])},
     r"train_000002.bin: 3 tokens but no BOS token \(50256\), so no document starts in it"),
    ({"fineweb_train_000002.bin": shard_bytes([BOS], count=-5)},
     r"train_000002.bin: header token count is -5; expected a count of 0 or more"),
])
def test_bad_pretokenized_shard(tmp_path, bad, message):
    with pytest.raises(SpeedrunError, match=message):
        import_pretokenized(gpt2_files(tmp_path, **bad), "fineweb", tmp_path / "shards")
    assert not (tmp_path / "shards").exists()


def test_pretokenized_order(tmp_path):
    paths = gpt2_files(tmp_path)
    with pytest.raises(SpeedrunError, match="first pre-tokenized shard must be the validation shard"):
        import_pretokenized(paths[1:], "fineweb", tmp_path / "shards")
    with pytest.raises(SpeedrunError, match="at least one training shard"):
        import_pretokenized(paths[:1], "fineweb", tmp_path / "shards")


def test_cli_modes(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("Hello world " * 20)
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": "Hello world"}) + "\n")
    assert cli_main(["tokenize", "--documents", str(tmp_path / "a.txt"), "--out-stream", str(tmp_path / "a.bin")]) == 0
    assert cli_main(["tokenize", "--documents", str(tmp_path / "b.jsonl"), "--text-column", "body",
                     "--out-stream", str(tmp_path / "b.bin")]) == 0
    assert cli_main(["tokenize", "--streams", str(tmp_path / "a.bin"), str(tmp_path / "b.bin"), "--dataset", "t",
                     "--shard-tokens", "30", "--out-dir", str(tmp_path / "shards")]) == 0
    tokens = len(reference_stream(["Hello world " * 20, "Hello world"]))
    assert f"2 shards, {tokens} tokens of 2 documents" in capsys.readouterr().out
    assert cli_main(["tokenize", "--streams", str(tmp_path / "a.bin"), "--out-dir", str(tmp_path / "x")]) == 2
    assert "--out-dir needs --dataset" in capsys.readouterr().err


def test_pretokenized_shard_given_twice_is_refused_unless_repeats_are_asked_for(tmp_path, capsys):
    val, train, _ = gpt2_files(tmp_path)
    with pytest.raises(SpeedrunError, match=r"fineweb_train_000001.bin: given twice as a pre-tokenized shard, as "
                                            r"shards 2 and 3 of 3; give each shard once \(or pass --allow-repeats"):
        import_pretokenized([val, train, train], "fineweb", tmp_path / "shards")
    alias = tmp_path / "dl" / "sub" / ".." / train.name                    # the same file under another name
    (tmp_path / "dl" / "sub").mkdir()
    with pytest.raises(SpeedrunError, match=rf"given twice as a pre-tokenized shard, as shards 2 \(as {train}\) "
                                            r"and 3 of 3"):
        import_pretokenized([val, train, alias], "fineweb", tmp_path / "shards")
    renamed = tmp_path / "dl" / "fineweb_train_000007.bin"                  # the validation shard as a train shard
    renamed.hardlink_to(val)
    with pytest.raises(SpeedrunError, match=rf"fineweb_train_000007.bin: given twice .* shards 1 \(as {val}\) and "
                                            r"3 of 3; give each shard once \(the validation shard is never trained"):
        import_pretokenized([val, train, renamed], "fineweb", tmp_path / "shards", allow_repeats=True)
    assert not (tmp_path / "shards").exists()
    args = ["tokenize", "--pretokenized", str(val), str(train), str(train), "--dataset", "fineweb", "--out-dir",
            str(tmp_path / "shards")]
    assert cli_main(args) == 2
    assert "give each shard once" in capsys.readouterr().err
    assert cli_main([*args, "--allow-repeats"]) == 0                       # on purpose: the train shard twice
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert [(s["file"], s["sha256"]) for s in manifest["shards"]] == [
        ("fineweb_val_000000.bin", hashlib.sha256(val.read_bytes()).hexdigest()),
        ("fineweb_train_000001.bin", hashlib.sha256(train.read_bytes()).hexdigest()),
        ("fineweb_train_000002.bin", hashlib.sha256(train.read_bytes()).hexdigest())]
    assert cli_main(["tokenize", "--documents", str(val), "--out-stream", str(tmp_path / "x.bin"),
                     "--allow-repeats"]) == 2
    assert "--allow-repeats goes with --pretokenized" in capsys.readouterr().err


def test_missing_pretokenized_shard_is_named_as_missing(tmp_path):
    val, train, _ = gpt2_files(tmp_path)
    typo = tmp_path / "dl" / "fineweb_va_000000.bin"                     # not the "must be the validation shard"
    with pytest.raises(SpeedrunError, match=rf"^{typo}: does not exist; expected a pre-tokenized shard file"):
        import_pretokenized([typo, train], "fineweb", tmp_path / "shards")
    gone = tmp_path / "dl" / "fineweb_train_000009.bin"
    with pytest.raises(SpeedrunError, match=rf"^{gone}: does not exist"):
        import_pretokenized([val, gone], "fineweb", tmp_path / "shards")
    with pytest.raises(SpeedrunError, match=r"dl: is not a file; expected a pre-tokenized shard file"):
        import_pretokenized([val, tmp_path / "dl"], "fineweb", tmp_path / "shards")
    assert not (tmp_path / "shards").exists()


def reserved_set(tokens: list[int], index: int, value: int) -> bytes:
    """A shard whose header int ``index`` (3..255: reserved, zero in the format) is ``value``."""
    raw = bytearray(shard_bytes(tokens))
    raw[4 * index:4 * index + 4] = value.to_bytes(4, "little", signed=True)
    return bytes(raw)


@pytest.mark.parametrize("index, value", [(3, 1), (255, -7)])
def test_nonzero_reserved_header_int_is_refused(tmp_path, index, value):
    """speedrun-spec.md section 1.1: header[3..255] are zero."""
    bad = {"fineweb_train_000002.bin": reserved_set([8, BOS, 9], index, value)}
    with pytest.raises(SpeedrunError, match=rf"train_000002.bin: header int {index} is {value}; expected 0"):
        import_pretokenized(gpt2_files(tmp_path, **bad), "fineweb", tmp_path / "shards")
    assert not (tmp_path / "shards").exists()
    (tmp_path / "s.bin").write_bytes(reserved_set([BOS, 1, 2], index, value))       # a token stream too
    with pytest.raises(SpeedrunError, match=rf"s.bin: header int {index} is {value}; expected 0"):
        shard_streams([tmp_path / "s.bin"], "fw", 2, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_shard_tokens_with_pretokenized_is_refused(tmp_path, capsys):
    paths = gpt2_files(tmp_path)
    args = ["tokenize", "--pretokenized", *map(str, paths), "--dataset", "fineweb", "--out-dir",
            str(tmp_path / "shards")]
    assert cli_main([*args, "--shard-tokens", "4096"]) == 2
    assert capsys.readouterr().err == ("speedrun tokenize: error: --shard-tokens 4096 does not apply to "
                                       "--pretokenized: those shards are taken as they are (the manifest's "
                                       "shard_tokens is the largest one's token count); leave --shard-tokens out\n")
    assert not (tmp_path / "shards").exists()
    assert cli_main(args) == 0                                            # without it: the shards are taken
    assert json.loads((tmp_path / "shards" / "manifest.json").read_text())["shard_tokens"] == 7


def test_too_few_tokens_name_the_documents_of_the_streams(tmp_path, capsys):
    """The workflow tokenizes the user's files into temporary streams: the message names the user's files."""
    files = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for path in files:
        path.write_text("Hello world")
        tokenize_to_stream(path, tmp_path / f"{path.stem}.bin")
    streams = [str(tmp_path / "a.bin"), str(tmp_path / "b.bin")]
    base = ["tokenize", "--streams", *streams, "--dataset", "t", "--shard-tokens", "10", "--out-dir",
            str(tmp_path / "shards")]
    assert cli_main([*base, "--stream-sources", *map(str, files)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"speedrun tokenize: error: {files[0]}, {files[1]}: 6 tokens (2 documents) fill at most "
                          "one shard of shard_tokens=10: no train shard after the validation shard")
    assert "a.bin" not in err
    assert cli_main(base) == 2                                            # without the sources: the streams
    err = capsys.readouterr().err
    assert f"error: {streams[0]}, {streams[1]}: 6 tokens (2 documents) fill at most one shard" in err
    assert cli_main([*base, "--stream-sources", str(files[0])]) == 2
    assert ("1 stream sources for 2 token streams (--stream-sources, --streams); expected the documents file of "
            "each stream") in capsys.readouterr().err
    assert cli_main(["tokenize", "--documents", str(files[0]), "--out-stream", str(tmp_path / "c.bin"),
                     "--stream-sources", str(files[0])]) == 2
    assert "--stream-sources goes with --streams" in capsys.readouterr().err
    assert not (tmp_path / "shards").exists() and not (tmp_path / "c.bin").exists()


def test_workflow_passes_the_documents_files_and_no_shard_tokens_for_pretokenized(tmp_path):
    """The options workflow/rules/tokenize.smk gives `speedrun tokenize` per data source: its functions (the
    text before the first rule) run on a stub config, as Snakemake runs them after common.smk."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a b.txt").write_text("Hello world")
    (tmp_path / "in" / "c.jsonl").write_text(json.dumps({"text": "Hello"}) + "\n")
    text = (Path(__file__).resolve().parents[1] / "workflow/rules/tokenize.smk").read_text()
    functions = compile(text.split("\nrule ", 1)[0], "tokenize.smk", "exec")
    patterns = [str(tmp_path / "in" / "*.txt"), str(tmp_path / "in" / "*.jsonl")]
    sources = f"'{tmp_path}/in/a b.txt' {tmp_path}/in/c.jsonl"
    for source, expected in [("embedded", "--shard-tokens 4096"), ("fineweb-gpt2", ""),
                             ("files", f"--shard-tokens 4096 --stream-sources {sources}")]:
        config = {"data": {"source": source, "shard_tokens": 4096, "files": {"paths": patterns}}}
        namespace = {"config": config, "os": os, "CONFIG_FILES": "config.yaml", "SpeedrunError": SpeedrunError}
        exec(functions, namespace)
        assert namespace["get_tokenize_options"](None) == expected, source
