"""Writing the BOS index of a shard folder: the BOS (token 50256) positions of every shard.

For each shard of the tokenize manifest, the sorted int64 positions of 50256 in its tokens are saved
as ``<shard stem>.npy``, with a ``manifest.json`` listing ``{file, shard, shard_sha256, count}`` per
shard (docs/formats.md), so the training loader plans BOS-aligned batches without scanning shards and
a stale index is detected. modded-nanogpt computes the same index at load time in a background thread
(``Shard``, speedrun-spec.md section 1.3, records #26 and #33); here it is a pipeline stage.

The ``speedrun bos-index`` stage (:mod:`speedrun.bos_index`) is the command line over :func:`build_bos_index`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from speedrun.data.dataset import (
    BOS_INDEX,
    MANIFEST,
    SHARD_ENTRY_KEYS,
    atomic_directory,
    check_splits,
    read_manifest,
)
from speedrun.data.shards import BOS_ID, load_shard, sha256_file
from speedrun.errors import SpeedrunError
from speedrun.support.atomic import write_json


def bos_positions(tokens: np.ndarray) -> np.ndarray:
    """Sorted positions of token 50256 in ``tokens`` ((N,) integer ids): (K,) int64."""
    return np.flatnonzero(np.asarray(tokens) == BOS_ID).astype(np.int64, copy=False)


def index_shard(shard_path: Path, entry: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Check the shard at ``shard_path`` against its tokenize-manifest ``entry`` (sha256, token
    count), write its BOS index into ``out_dir``; return the index's manifest entry.

    Raises :class:`SpeedrunError` for a corrupt header or a sha256 or count that differs from the
    manifest (a stale manifest or a modified shard).
    """
    tokens = load_shard(shard_path)
    digest = sha256_file(shard_path)
    if digest != entry["sha256"]:
        raise SpeedrunError(
            f"{shard_path}: sha256 {digest} differs from {entry['sha256']} in the shard manifest; "
            "the shard or the manifest is stale, rerun `speedrun tokenize`"
        )
    if len(tokens) != entry["tokens"]:
        raise SpeedrunError(
            f"{shard_path}: holds {len(tokens)} tokens, the shard manifest says {entry['tokens']}"
        )
    positions = bos_positions(tokens)
    name = f"{shard_path.stem}.npy"
    np.save(out_dir / name, positions, allow_pickle=False)
    return {"file": name, "shard": shard_path.name, "shard_sha256": digest, "count": len(positions)}


def build_bos_index(shards_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """Write the BOS index of every shard listed in ``shards_dir/manifest.json`` into ``out_dir``
    (as a whole, atomically) and return its manifest. Raises :class:`SpeedrunError` on a missing or
    bad manifest (an entry without ``file``, ``split``, ``tokens`` or ``sha256``; no shards, or no train shard
    after the validation shard: :func:`~speedrun.data.dataset.check_splits`) or shard, and, before
    any work, for an ``out_dir`` that is, contains or lies inside ``shards_dir`` or a shard, or that is
    neither absent, empty nor a previous BOS index (:func:`~speedrun.data.dataset.check_output_directory`)."""
    shards_dir, out_dir = Path(shards_dir), Path(out_dir)
    shards = read_manifest(shards_dir, "shards", SHARD_ENTRY_KEYS, stage="tokenize")
    check_splits(shards_dir, shards["shards"])
    inputs = [shards_dir, *(shards_dir / str(entry["file"]) for entry in shards["shards"])]
    with atomic_directory(out_dir, kind=BOS_INDEX, inputs=inputs) as tmp:
        indices = [index_shard(shards_dir / entry["file"], entry, tmp) for entry in shards["shards"]]
        manifest = {"dataset": shards.get("dataset"), "bos_id": BOS_ID, "shards": indices}
        write_json(tmp / MANIFEST, manifest)
    return manifest
