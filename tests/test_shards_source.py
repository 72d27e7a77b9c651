"""`data.source: shards`: a folder of shards already on disk, checked and used where it is (issue 21, item 1).

Shards are written here byte by byte (tests/hub_server.py's `shard_bytes`: the format's header by hand), so
what the listing, the tokenize stage and the workflow see is checked against bytes the package did not write.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cluster_support import copy_workflow, micro_config
from hub_server import random_documents_shard, shard_bytes

from speedrun.data.shard_folder import list_shard_folder
from speedrun.data.shard_writer import import_pretokenized
from speedrun.errors import SpeedrunError

GOOD = {"fineweb_val_000000.bin": random_documents_shard(0, 6000),
        "fineweb_train_000002.bin": random_documents_shard(2, 9000),    # written before 000001: name order decides
        "fineweb_train_000001.bin": random_documents_shard(1, 9000)}
ORDER = ["fineweb_val_000000.bin", "fineweb_train_000001.bin", "fineweb_train_000002.bin"]


def write_folder(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_listing_takes_validation_then_train_in_name_order(tmp_path):
    folder = write_folder(tmp_path / "fineweb10B", {**GOOD, "README.txt": b"not a shard"})
    assert list_shard_folder(folder) == [folder.absolute() / n for n in ORDER]


def test_a_folder_of_links_keeps_the_names_and_order_of_its_links(tmp_path, monkeypatch):
    """modded-nanogpt's data/fineweb10B/ as the Hugging Face cache leaves it: links into blobs/<sha256>, whose
    names sort otherwise (here in reverse). The links' names decide the order and the split, and the manifest
    names the folder's files; the placed shards point at the blobs' bytes."""
    blobs = tmp_path / "hub" / "blobs"
    folder = tmp_path / "hub" / "fineweb10B"
    folder.mkdir(parents=True)
    for rank, name in enumerate(ORDER):
        blob = f"{9 - rank}{hashlib.sha256(GOOD[name]).hexdigest()}"
        write_folder(blobs, {blob: GOOD[name]})
        (folder / name).symlink_to(Path("..") / "blobs" / blob)
    assert sorted(p.name for p in blobs.iterdir())[0].startswith("7")      # the blobs sort train 2, train 1, val
    monkeypatch.chdir(tmp_path / "hub")
    shards = list_shard_folder("fineweb10B")
    assert shards == [folder.absolute() / n for n in ORDER]
    manifest = import_pretokenized(shards, "fw", tmp_path / "out", in_place=True)
    assert [(s["split"], s["source"], s["sha256"]) for s in manifest["shards"]] == [
        ("val" if i == 0 else "train", str(folder / n), hashlib.sha256(GOOD[n]).hexdigest())
        for i, n in enumerate(ORDER)]


@pytest.mark.parametrize("files, message", [
    ({"fineweb_train_000001.bin": GOOD["fineweb_train_000001.bin"]}, "no validation shard (*_val_*.bin)"),
    ({"fineweb_val_000000.bin": GOOD["fineweb_val_000000.bin"]}, "no training shard (*_train_*.bin)"),
    ({**GOOD, "other_val_000000.bin": GOOD["fineweb_val_000000.bin"]}, "2 validation shards"),
    ({**GOOD, "fineweb_train_000003.bin": shard_bytes([50256, 1, 2], magic=20240521)},
     "fineweb_train_000003.bin: not a token shard: header magic 20240521"),
    ({**GOOD, "fineweb_train_000003.bin": shard_bytes([50256, 1, 2], version=7)}, "unsupported shard version 7"),
    ({**GOOD, "fineweb_train_000003.bin": GOOD["fineweb_train_000001.bin"][:-10]},
     "header says 9000 tokens, so 19024 bytes, but the file holds 19014 bytes"),
])
def test_a_bad_folder_is_refused_in_one_line(tmp_path, files, message):
    folder = write_folder(tmp_path / "shards", files)
    with pytest.raises(SpeedrunError) as error:
        list_shard_folder(folder)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_folder_without_shards_says_what_it_holds(tmp_path):
    """The folder above the shards (modded-nanogpt's data/ for data/fineweb10B/) names the subfolder to give;
    another folder lists its entries, an empty one says so."""
    write_folder(tmp_path / "data" / "fineweb10B", GOOD)
    with pytest.raises(SpeedrunError) as error:
        list_shard_folder(tmp_path / "data")
    assert str(error.value) == (f"data.shards.path {tmp_path / 'data'}: no validation shard (*_val_*.bin) in the "
                                f"folder; its subfolder fineweb10B/ holds one: set data.shards.path to "
                                f"{tmp_path / 'data' / 'fineweb10B'}")
    write_folder(tmp_path / "other", {"fineweb_train_000001.bin": GOOD["fineweb_train_000001.bin"], "a.txt": b""})
    with pytest.raises(SpeedrunError, match=r"in the folder \(it holds a.txt, fineweb_train_000001.bin\)$"):
        list_shard_folder(tmp_path / "other")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpeedrunError, match=r"no validation shard \(\*_val_\*.bin\) in the folder \(the folder is "
                                            r"empty\)$"):
        list_shard_folder(tmp_path / "empty")


def test_a_missing_folder_is_refused(tmp_path, monkeypatch):
    with pytest.raises(SpeedrunError, match="not a folder"):
        list_shard_folder(tmp_path / "nowhere")
    monkeypatch.chdir(tmp_path)          # a relative path: the message says what it is relative to
    with pytest.raises(SpeedrunError) as error:
        list_shard_folder("data/nowhere")
    assert str(error.value).startswith(f"data.shards.path data/nowhere (relative to {tmp_path}): not a folder;")


def test_in_place_links_the_shards_and_records_their_sha256(tmp_path):
    folder = write_folder(tmp_path / "fineweb10B", GOOD)
    out = tmp_path / "results/shards/fw"
    manifest = import_pretokenized(list_shard_folder(folder), "fw", out, in_place=True)
    names = ["fw_val_000000.bin", "fw_train_000001.bin", "fw_train_000002.bin"]
    assert sorted(p.name for p in out.glob("*.bin")) == sorted(names)
    for name, source in zip(names, ORDER):
        assert (out / name).is_symlink() and Path(os.readlink(out / name)) == (folder / source).resolve()
    assert [(s["file"], s["split"], s["tokens"], s["sha256"], s["source"]) for s in manifest["shards"]] == [
        (n, "val" if i == 0 else "train", len(GOOD[o]) // 2 - 512, hashlib.sha256(GOOD[o]).hexdigest(),
         str(folder.absolute() / o)) for i, (n, o) in enumerate(zip(names, ORDER))]


def test_in_place_refuses_a_token_outside_gpt2(tmp_path):
    folder = write_folder(tmp_path / "bad", {**GOOD, "fineweb_train_000003.bin": shard_bytes([50256, 7, 50257])})
    with pytest.raises(SpeedrunError, match=r"fineweb_train_000003.bin: token 2 is 50257"):
        import_pretokenized(list_shard_folder(folder), "fw", tmp_path / "out", in_place=True)
    assert not (tmp_path / "out").exists()


def _workflow(tmp_path: Path, shards_path: str) -> Path:
    data = {"source": "shards", "name": "fw", "shards": {"path": shards_path}}
    return copy_workflow(tmp_path / "workflow", micro_config(data=data))


def _snakemake(work: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(work / "src"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYTHONSAFEPATH", None)
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_workflow_uses_the_folder_in_place(tmp_path):
    folder = write_folder(tmp_path / "data/fineweb10B", GOOD)
    work = _workflow(tmp_path, str(folder))
    proc = _snakemake(work, "results/bos_index/fw")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shards = work / "results/shards/fw"
    assert all((shards / n).is_symlink() for n in ("fw_val_000000.bin", "fw_train_000001.bin"))
    manifest = json.loads((shards / "manifest.json").read_text())
    assert [s["sha256"] for s in manifest["shards"]] == [hashlib.sha256(GOOD[o]).hexdigest() for o in ORDER]
    index = np.load(work / "results/bos_index/fw/fw_train_000002.npy")
    tokens = np.frombuffer(GOOD["fineweb_train_000002.bin"][1024:], dtype="<u2")
    assert index.tolist() == np.flatnonzero(tokens == 50256).tolist()
    plan = _snakemake(work, "-n", "report")
    assert plan.returncode == 0 and "rule train:" in plan.stdout, plan.stdout[-3000:] + plan.stderr[-3000:]


@pytest.mark.slow
def test_workflow_refuses_a_folder_without_train_shards(tmp_path):
    folder = write_folder(tmp_path / "only-val", {"fineweb_val_000000.bin": GOOD["fineweb_val_000000.bin"]})
    proc = _snakemake(_workflow(tmp_path, str(folder)), "-n", "report")
    assert proc.returncode != 0
    assert f"data.shards.path {folder}: no training shard (*_train_*.bin) in the folder" in proc.stdout + proc.stderr
