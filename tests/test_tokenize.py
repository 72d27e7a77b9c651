"""`speedrun tokenize`: shard byte layout, document splitting across shards, manifest, thread-count
invariance, input errors, output folders that are refused (among the inputs, or someone else's), a run stopped by
SIGINT or SIGTERM (a subprocess), and --threads capped at the usable CPUs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import speedrun
from speedrun.cli import main as cli_main
from speedrun.data.encode import EncoderPool
from speedrun.data.shard_writer import tokenize_documents
from speedrun.data.shards import load_shard, write_shard
from speedrun.data.tokenizer import gpt2_encoding
from speedrun.errors import SpeedrunError

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
    tokenize_documents(docs, "toy", 2, out)  # a previous output: 12 tokens in 6 shards
    (out / ".snakemake_timestamp").touch()
    assert "toy_train_000005.bin" in shard_bytes(out)
    tokenize_documents(docs, "toy", 5, out)  # rerun in place, as the workflow does
    assert sorted(shard_bytes(out)) == ["manifest.json", "toy_train_000001.bin", "toy_train_000002.bin",
                                        "toy_val_000000.bin"]
    assert json.loads((out / "manifest.json").read_text())["shard_tokens"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.parquet", "shards"]


def tree(directory):
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("out, message", [
    ("home/mydocs", r"home/mydocs: the output directory contains the input .*home/mydocs/a.txt"),
    ("home/mydocs/a.txt", r"a.txt: the output directory is the input .*home/mydocs/a.txt"),
    ("home/mydocs/a.txt/sub", r"sub: the output directory lies inside the input .*home/mydocs/a.txt"),
    ("home", r"home: the output directory contains the input"),
])
def test_out_dir_among_the_inputs_is_refused(tmp_path, capsys, out, message):
    home = tmp_path / "home" / "mydocs"
    home.mkdir(parents=True)
    (home / "a.txt").write_text("Hello world")
    (home / "b.txt").write_text("Hello world again")
    (home / "notes.md").write_text("mine")
    before = tree(tmp_path)
    args = ["tokenize", "--documents", str(home / "a.txt"), str(home / "b.txt"), "--out-dir", str(tmp_path / out),
            "--dataset", "x", "--shard-tokens", "2"]
    assert cli_main(args) == 2
    assert re.search(message, capsys.readouterr().err)
    assert tree(tmp_path) == before and sorted(p.name for p in home.iterdir()) == ["a.txt", "b.txt", "notes.md"]


def test_out_dir_holding_pretokenized_inputs_is_refused(tmp_path, capsys):
    home = tmp_path / "home3"
    home.mkdir()
    paths = [home / "fw_val_000000.bin", home / "fw_train_000001.bin"]
    for path in paths:
        write_shard(path, np.array([BOS, HELLO, WORLD], dtype=np.uint16))
    before = tree(home)
    assert cli_main(["tokenize", "--pretokenized", *map(str, paths), "--out-dir", str(home), "--dataset", "x"]) == 2
    assert "home3: the output directory contains the input" in capsys.readouterr().err
    assert tree(home) == before


@pytest.mark.parametrize("contents, found", [
    ({"notes.md": b"mine"}, "found notes.md"),
    ({"manifest.json": b'{"shards": [{"file": "other.bin"}]}', "other.bin": b"x"},
     "found manifest.json, other.bin"),  # a manifest without 'tokenizer': not a shard folder
    ({"manifest.json": json.dumps({"tokenizer": "gpt2", "shards": [{"file": "a.bin"}]}).encode(),
      "a.bin": b"x", "notes.md": b"mine"}, "found notes.md"),  # a shard folder plus a file it never holds
])
def test_out_dir_that_is_not_a_previous_output_is_refused(tmp_path, capsys, contents, found):
    docs = write_parquet(tmp_path / "d.parquet", ["Hello world"] * 4)
    out = tmp_path / "out"
    out.mkdir()
    for name, data in contents.items():
        (out / name).write_bytes(data)
    args = ["tokenize", "--documents", str(docs), "--out-dir", str(out), "--dataset", "x", "--shard-tokens", "5"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert "out: not empty and not a previous output of speedrun tokenize" in err and found in err
    assert tree(out) == {name: data for name, data in contents.items()}


def test_stream_with_ids_beyond_gpt2_is_refused(tmp_path, capsys):
    write_shard(tmp_path / "bad.bin", np.array([BOS, HELLO, 60000, WORLD], dtype=np.uint16))
    args = ["tokenize", "--streams", str(tmp_path / "bad.bin"), "--out-dir", str(tmp_path / "shards"),
            "--dataset", "x", "--shard-tokens", "2"]
    assert cli_main(args) == 2
    assert "bad.bin: token 2 is 60000, not a GPT-2 id (expected < 50257)" in capsys.readouterr().err
    assert not (tmp_path / "shards").exists()


def test_shard_tokens_beyond_the_header_is_refused(tmp_path, capsys):
    docs = write_parquet(tmp_path / "d.parquet", ["Hello world"] * 4)
    args = ["tokenize", "--documents", str(docs), "--out-dir", str(tmp_path / "shards"), "--dataset", "x",
            "--shard-tokens", str(2**31)]
    assert cli_main(args) == 2
    assert "shard_tokens 2147483648 exceeds 2147483647" in capsys.readouterr().err
    assert not (tmp_path / "shards").exists()
    schema = yaml.safe_load((Path(__file__).resolve().parents[1] / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["properties"]["data"]["properties"]["shard_tokens"]["maximum"] == 2**31 - 1


def test_errors_leave_nothing_behind(tmp_path):
    docs = write_parquet(tmp_path / "d.parquet", ["Hello world", ""])
    with pytest.raises(SpeedrunError, match=r"d.parquet: the text of row 1 is empty"):
        tokenize_documents(docs, "toy", 2, tmp_path / "shards")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.parquet"]


@pytest.mark.parametrize("texts,message", [
    (["a", None, "b"], "the text of row 1 is null"),
    ([], "no documents"),
    (["Hello world"], r"3 tokens \(1 document\) fill at most one shard.*no train shard"),
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
    (tmp_path / "one.txt").write_text("Hello world " * 5)
    one = ["tokenize", "--documents", str(tmp_path / "one.txt"), "--out-stream", str(tmp_path / "s.bin")]
    assert cli_main(one) == 0
    assert "wrote 12 tokens of 1 document of" in capsys.readouterr().out          # not "1 documents"


# ---- stopping: SIGINT / SIGTERM ---------------------------------------------------------------------------

SRC = Path(speedrun.__file__).resolve().parents[1]              # the code under test, for the subprocess
STOPPED = {signal.SIGINT: "speedrun tokenize: interrupted by SIGINT",
           signal.SIGTERM: "speedrun tokenize: terminated by SIGTERM"}


@pytest.fixture(scope="module")
def big_jsonl(tmp_path_factory):
    """About 60 MB of JSON Lines (24,000 documents, 12M tokens): seconds of encoding on 2 workers, so a run is
    still encoding when signalled (the tests stop it well before the end)."""
    rng = np.random.default_rng(5)
    words = ["The", " mayor", " said", ",", " 2024", ".", "\n", " über", " 🙂", "  ", " Lisbon"]
    lines = [json.dumps({"text": "".join(rng.choice(words, size=500)) + f" {i}"}) + "\n" for i in range(8)]
    path = tmp_path_factory.mktemp("big") / "big.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(3000):
            f.write("".join(lines))
    return path


def _default_signals() -> None:
    """In the child before exec: SIGINT and SIGTERM as a fresh process has them (pytest run from a background
    job would otherwise pass SIGINT on ignored)."""
    for s in STOPPED:
        signal.signal(s, signal.SIG_DFL)


def _wait_until_writing(folder: Path, running, min_bytes: int, timeout: float = 30.0) -> None:
    """Poll ``folder`` until a temporary output (``.tmp-*``) holds at least ``min_bytes``, while ``running()``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert running(), "speedrun tokenize ended before it wrote anything"
        for tmp in folder.glob(".tmp-*"):
            files = [tmp] if tmp.is_file() else list(tmp.iterdir())
            if sum(f.stat().st_size for f in files if f.is_file()) >= min_bytes:
                return
        time.sleep(0.02)
    raise AssertionError(f"no temporary output in {folder} after {timeout} s")


@pytest.mark.parametrize("signum, output", [(signal.SIGINT, "--out-dir"), (signal.SIGTERM, "--out-dir"),
                                            (signal.SIGINT, "--out-stream")],
                         ids=["SIGINT-shards", "SIGTERM-shards", "SIGINT-stream"])
def test_a_signal_stops_tokenize_with_one_line_and_leaves_nothing(big_jsonl, tmp_path, signum, output):
    """The signal goes to the whole process group, as a terminal's Ctrl-C or a job scheduler's stop does: the
    workers get it too. One line on stderr, status 128 + signal, no traceback, no .tmp-* left, no process left."""
    out = tmp_path / "out"
    out.mkdir()
    target = ["--out-dir", str(out / "shards"), "--dataset", "x", "--shard-tokens", "100000"] \
        if output == "--out-dir" else ["--out-stream", str(out / "s.bin")]
    command = [sys.executable, "-m", "speedrun", "tokenize", "--documents", str(big_jsonl), "--threads", "2", *target]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_default_signals)
    try:
        _wait_until_writing(out, lambda: proc.poll() is None, min_bytes=100_000)   # encoding is under way
        os.killpg(proc.pid, signum)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, stderr
    assert stderr.splitlines() == [STOPPED[signum]], stderr
    assert list(out.iterdir()) == []                                    # no .tmp-* file or folder, no output
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:                                  # the workers went with it
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"processes of the group {proc.pid} outlived speedrun tokenize")


# ---- --threads ------------------------------------------------------------------------------------------


def test_threads_above_the_usable_cpus_are_capped_with_a_note(tmp_path, capsys, monkeypatch):
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = []

    class Recording(EncoderPool):
        def __init__(self, count):
            workers.append(count)
            super().__init__(count)

    monkeypatch.setattr("speedrun.data.shard_writer.EncoderPool", Recording)
    docs = write_parquet(tmp_path / "d.parquet", ["Hello world"] * 4)
    args = ["tokenize", "--documents", str(docs), "--dataset", "toy", "--shard-tokens", "5", "--out-dir",
            str(tmp_path / "shards"), "--threads", str(cpus + 1)]
    assert cli_main(args) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == [f"speedrun tokenize: note: --threads {cpus + 1} is more than the {cpus} CPUs this "
                                f"process may use; using {cpus}"]
    assert workers == [cpus]
    assert load_shard(tmp_path / "shards" / "toy_train_000002.bin").tolist() == [HELLO, WORLD]
    assert cli_main(args[:-4] + ["--out-dir", str(tmp_path / "again"), "--threads", str(cpus)]) == 0
    assert capsys.readouterr().err == "" and workers == [cpus, cpus]
