"""A tokenized dataset on disk: the shard and BOS index directories, their manifests, and opening them.

``results/shards/{dataset}/`` holds the shards and ``manifest.json`` (written by ``speedrun tokenize``);
``results/bos_index/{dataset}/`` holds one ``<shard stem>.npy`` per shard and ``manifest.json`` (written
by ``speedrun bos-index``); docs/formats.md gives both layouts. Both directories are written as a whole:
built in a temporary directory beside the target, then renamed (:func:`atomic_directory`), so a
directory under its final name is always complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from speedrun.data.shards import load_shard
from speedrun.errors import SpeedrunError

MANIFEST = "manifest.json"


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; make it ``path`` if the block succeeds.

    A directory already at ``path`` (a stale output) is replaced: it is moved aside, the new one renamed
    into place, then the old one deleted. On an exception the temporary directory is deleted and
    ``path`` is untouched.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}.", dir=final.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes 0700; the output is an ordinary, readable directory
        yield tmp
        stale = None
        if final.exists():
            stale = Path(tempfile.mkdtemp(prefix=f".tmp-stale-{final.name}.", dir=final.parent))
            os.replace(final, stale / final.name)
        os.replace(tmp, final)
        if stale is not None:
            shutil.rmtree(stale)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_manifest(directory: str | os.PathLike[str], list_key: str) -> dict[str, Any]:
    """The ``manifest.json`` of ``directory``, checked to hold a list under ``list_key``.

    Raises :class:`SpeedrunError` when it is missing, not JSON, or lacks the list.
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise SpeedrunError(f"{path}: manifest not found")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SpeedrunError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get(list_key), list):
        raise SpeedrunError(f"{path}: expected an object with a list {list_key!r}")
    return manifest


@dataclass(frozen=True)
class TokenData:
    """An opened dataset: the validation shard and the train shards with their BOS indices.

    val_tokens: (N_0,) uint16 memory map of shard 0; val_bos: its sorted int64 BOS positions.
    train_shards: the (N_i,) uint16 memory maps of shards 1.., train_bos: their BOS positions.
    """

    val_tokens: np.ndarray
    val_bos: np.ndarray
    train_shards: list[np.ndarray]
    train_bos: list[np.ndarray]


def open_dataset(shards_dir: str | os.PathLike[str], bos_dir: str | os.PathLike[str]) -> TokenData:
    """Open the shards of ``shards_dir`` and the BOS indices of ``bos_dir`` (memory-mapped).

    Every shard header is validated; the BOS manifest must name the same shards with the same sha256
    as the shard manifest (a stale index is refused) and each index must hold its listed count.
    Raises :class:`SpeedrunError` otherwise, or when there is no train shard.
    """
    shards = read_manifest(shards_dir, "shards")["shards"]
    indices = read_manifest(bos_dir, "shards")["shards"]
    splits = [shard["split"] for shard in shards]
    if len(splits) < 2 or splits[0] != "val" or set(splits[1:]) != {"train"}:
        raise SpeedrunError(
            f"{Path(shards_dir) / MANIFEST}: expected a val shard then train shards, found {splits}"
        )
    by_shard = {entry["shard"]: entry for entry in indices}
    tokens, bos = [], []
    for shard in shards:
        entry = by_shard.get(shard["file"])
        if entry is None or entry["shard_sha256"] != shard["sha256"]:
            raise SpeedrunError(
                f"{Path(bos_dir) / MANIFEST}: no BOS index for {shard['file']} with sha256 "
                f"{shard['sha256']}; the index is stale, rerun `speedrun bos-index`"
            )
        tokens.append(load_shard(Path(shards_dir) / shard["file"]))
        if len(tokens[-1]) != shard["tokens"]:
            raise SpeedrunError(
                f"{Path(shards_dir) / shard['file']}: holds {len(tokens[-1])} tokens, the manifest "
                f"says {shard['tokens']}; rerun `speedrun tokenize`"
            )
        positions = np.load(Path(bos_dir) / entry["file"], mmap_mode="r")
        if positions.dtype != np.int64 or positions.shape != (entry["count"],):
            raise SpeedrunError(
                f"{Path(bos_dir) / entry['file']}: expected {entry['count']} int64 positions, found "
                f"shape {positions.shape} of {positions.dtype}"
            )
        bos.append(positions)
    return TokenData(val_tokens=tokens[0], val_bos=bos[0], train_shards=tokens[1:],
                     train_bos=bos[1:])
