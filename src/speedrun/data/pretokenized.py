"""Pre-tokenized shards taken as they are: the GPT-2 shards of ``kjj0/fineweb10B-gpt2`` that modded-nanogpt's
``data/cached_fineweb10B.py`` downloads (speedrun-spec.md sections 1.1-1.2).

Each shard is checked in one pass over its bytes: the header (magic 20240520, version 1, file size = 1024 + 2
x count), every token id below 50257 (GPT-2's vocabulary; a larger id would index past the embedding), its
sha256 and its number of BOS tokens (50256, one per document start). The first shard given must be the
validation shard (``*_val_*``), the others training shards (``*_train_*``), in order. They enter the dataset
folder under the dataset's own names as hard links (a copy where the file system refuses links), so the 20 GB
of FineWeb10B are not written twice.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from speedrun.data.shards import BOS_ID, HEADER_BYTES, read_header, shard_filename
from speedrun.data.tokenizer import N_VOCAB
from speedrun.errors import SpeedrunError

CHUNK_TOKENS = 1 << 23


def check_gpt2_ids(path: str | os.PathLike[str], tokens: np.ndarray, offset: int = 0) -> None:
    """Check that every id of ``tokens`` ((N,) uint16, memory-mapped or not; at position ``offset`` in the
    file ``path``) is below 50257, GPT-2's vocabulary: a larger id would index past the embedding.

    Read in chunks of ``CHUNK_TOKENS``. Raises :class:`SpeedrunError` naming the file, the first bad
    position and its id.
    """
    for start in range(0, len(tokens), CHUNK_TOKENS):
        chunk = np.asarray(tokens[start:start + CHUNK_TOKENS])
        if int(chunk.max()) >= N_VOCAB:
            bad = int(np.flatnonzero(chunk >= N_VOCAB)[0])
            raise SpeedrunError(f"{path}: token {offset + start + bad} is {int(chunk[bad])}, not a GPT-2 id "
                                f"(expected < {N_VOCAB})")


def scan_shard(path: Path) -> dict[str, Any]:
    """``{tokens, documents, sha256}`` of the shard at ``path``: token count, BOS count and the file's sha256.

    Raises :class:`SpeedrunError` naming the file for a bad header or size (:func:`read_header`) or a token id
    of 50257 or more (its position is given).
    """
    count = read_header(path)
    digest, documents, offset = hashlib.sha256(), 0, 0
    with open(path, "rb") as f:
        digest.update(f.read(HEADER_BYTES))
        while chunk := f.read(2 * CHUNK_TOKENS):
            digest.update(chunk)
            tokens = np.frombuffer(chunk, dtype="<u2")
            check_gpt2_ids(path, tokens, offset)
            documents += int(np.count_nonzero(tokens == BOS_ID))
            offset += tokens.size
    return {"tokens": count, "documents": documents, "sha256": digest.hexdigest()}


def _check_order(shards: list[Path]) -> None:
    if not shards:
        raise SpeedrunError("no pre-tokenized shards given")
    if "_val_" not in shards[0].name:
        raise SpeedrunError(f"{shards[0]}: the first pre-tokenized shard must be the validation shard (*_val_*)")
    for path in shards[1:]:
        if "_train_" not in path.name:
            raise SpeedrunError(f"{path}: expected a training shard (*_train_*) after the validation shard")
    if len(shards) < 2:
        raise SpeedrunError(f"{shards[0]}: a validation shard alone; at least one training shard is needed")


def link_or_copy(source: Path, target: Path) -> None:
    """Hard-link ``source`` as ``target``, or copy it where the file system cannot link."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def add_pretokenized(shards: list[Path], dataset: str, out_dir: Path) -> list[dict[str, Any]]:
    """Check ``shards`` (validation first) and place them in ``out_dir`` as ``{dataset}_val_000000.bin``,
    ``{dataset}_train_000001.bin``, ...; return their manifest entries (``file, split, tokens, sha256,
    documents``). Raises :class:`SpeedrunError` for a wrong order or a bad shard (see :func:`scan_shard`)."""
    shards = [Path(p) for p in shards]
    _check_order(shards)
    entries = []
    for index, source in enumerate(shards):
        scanned = scan_shard(source)
        name = shard_filename(dataset, index)
        link_or_copy(source, out_dir / name)
        entries.append({"file": name, "split": "val" if index == 0 else "train", "tokens": scanned["tokens"],
                        "sha256": scanned["sha256"], "documents": scanned["documents"], "source": str(source)})
    return entries
