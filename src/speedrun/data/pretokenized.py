"""Pre-tokenized shards taken as they are: the GPT-2 shards of ``kjj0/fineweb10B-gpt2`` that modded-nanogpt's
``data/cached_fineweb10B.py`` downloads (speedrun-spec.md sections 1.1-1.2).

Each shard is checked in one pass over its bytes: the header (magic 20240520, version 1, file size = 1024 + 2
x count, header ints 3..255 zero as the format has them: speedrun-spec.md section 1.1, docs/formats.md), every
token id below 50257 (GPT-2's vocabulary; a larger id would index past the embedding), its sha256 and its
number of BOS tokens (50256, one per document start). Every path must be an existing file, given once (the same
file under two names counts as given twice) unless repeats are asked for (a benchmark that reads one train shard
several times over); the first shard given must be the validation shard (``*_val_*``),
the others training shards (``*_train_*``), in order. They enter the dataset folder under the dataset's own
names as hard links (a copy where the file system refuses links), so the 20 GB of FineWeb10B are not written
twice. A damaged shard under ``results/download/`` is moved aside, the message says so, and the workflow's next
call downloads it again (:func:`speedrun.data.integrity.check_download`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from speedrun.data.integrity import check_download
from speedrun.data.shards import BOS_ID, HEADER_BYTES, HEADER_INTS, read_header, shard_filename
from speedrun.data.tokenizer import N_VOCAB
from speedrun.errors import SpeedrunError

CHUNK_TOKENS = 1 << 23
RESERVED_HEADER_INTS = range(3, HEADER_INTS)     # zero in the format (speedrun-spec.md section 1.1)


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


def check_reserved_header(path: str | os.PathLike[str], header: bytes) -> None:
    """Check that ints 3..255 of the shard header ``header`` (the file's first 1024 bytes, 256 little-endian
    int32) are 0, as the format has them (speedrun-spec.md section 1.1: ``header[3..255]`` zero; llm.c and
    modded-nanogpt write zeros). Raises :class:`SpeedrunError` naming the file ``path``, the first non-zero
    int's index and its value."""
    ints = np.frombuffer(header[:HEADER_BYTES], dtype="<i4")
    nonzero = np.flatnonzero(ints[RESERVED_HEADER_INTS.start:])
    if nonzero.size:
        index = RESERVED_HEADER_INTS.start + int(nonzero[0])
        raise SpeedrunError(f"{path}: header int {index} is {int(ints[index])}; expected 0 (ints 3..255 of a shard "
                            "header are reserved and zero: magic, version and token count are ints 0..2)")


def scan_shard(path: Path) -> dict[str, Any]:
    """``{tokens, documents, sha256}`` of the shard at ``path``: token count, BOS count and the file's sha256.

    Raises :class:`SpeedrunError` naming the file for a bad header or size (:func:`read_header`), a non-zero
    reserved header int (:func:`check_reserved_header`) or a token id of 50257 or more (its position is given).
    """
    count = read_header(path)
    digest, documents, offset = hashlib.sha256(), 0, 0
    with open(path, "rb") as f:
        header = f.read(HEADER_BYTES)
        check_reserved_header(path, header)
        digest.update(header)
        while chunk := f.read(2 * CHUNK_TOKENS):
            digest.update(chunk)
            tokens = np.frombuffer(chunk, dtype="<u2")
            check_gpt2_ids(path, tokens, offset)
            documents += int(np.count_nonzero(tokens == BOS_ID))
            offset += tokens.size
    return {"tokens": count, "documents": documents, "sha256": digest.hexdigest()}


def _check_files(shards: list[Path], allow_repeats: bool) -> None:
    """Refuse a path that is not an existing file, and a file given twice (under one name or two: the same
    device and inode), naming the path (and the earlier name of the same file); ``allow_repeats`` lets a train
    shard repeat, never the validation shard (the first: it would be trained on)."""
    seen: dict[tuple[int, int], tuple[int, Path]] = {}
    for number, path in enumerate(shards, start=1):
        if not path.exists():
            raise SpeedrunError(f"{path}: does not exist; expected a pre-tokenized shard file (.bin)")
        if not path.is_file():
            raise SpeedrunError(f"{path}: is not a file; expected a pre-tokenized shard file (.bin)")
        stat = path.stat()
        first = seen.setdefault((stat.st_dev, stat.st_ino), (number, path))
        if first[0] != number and (first[0] == 1 or not allow_repeats):
            same = "" if first[1] == path else f" (as {first[1]})"
            raise SpeedrunError(f"{path}: given twice as a pre-tokenized shard, as shards {first[0]}{same} and "
                                f"{number} of {len(shards)}; give each shard once"
                                + (" (the validation shard is never trained on)" if first[0] == 1 else
                                   " (or pass --allow-repeats to repeat a train shard on purpose)"))


def _check_order(shards: list[Path], allow_repeats: bool) -> None:
    if not shards:
        raise SpeedrunError("no pre-tokenized shards given")
    _check_files(shards, allow_repeats)
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


def symlink_in_place(source: Path, target: Path) -> None:
    """Link ``target`` to ``source``'s absolute path (a symbolic link): the shard stays where it is, never copied
    (``data.source: shards``)."""
    os.symlink(source.resolve(), target)


def add_pretokenized(shards: list[Path], dataset: str, out_dir: Path,
                     allow_repeats: bool = False, in_place: bool = False) -> list[dict[str, Any]]:
    """Check ``shards`` (validation first) and place them in ``out_dir`` as ``{dataset}_val_000000.bin``,
    ``{dataset}_train_000001.bin``, ...; return their manifest entries (``file, split, tokens, sha256,
    documents``). ``allow_repeats``: a train shard may be given more than once (read that many times over);
    ``in_place``: symbolic links to the shards where they are (:func:`symlink_in_place`), not hard links.
    Raises :class:`SpeedrunError` for a missing file, a file given twice (the validation shard: even with
    ``allow_repeats``), a wrong order, a bad shard (see :func:`scan_shard`) or one with no tokens or no BOS."""
    shards = [Path(p) for p in shards]
    _check_order(shards, allow_repeats)
    entries = []
    for index, source in enumerate(shards):
        try:
            scanned = scan_shard(source)
        except SpeedrunError as e:                     # a damaged download is moved aside, to be fetched again
            raise check_download(e, source) from None
        if scanned["tokens"] == 0:
            raise SpeedrunError(f"{source}: holds no tokens (its header says 0); expected a shard of GPT-2 documents")
        if scanned["documents"] == 0:
            raise SpeedrunError(f"{source}: {scanned['tokens']} tokens but no BOS token ({BOS_ID}), so no document "
                                "starts in it; expected documents that each begin with BOS (the BOS-aligned loader "
                                "and validation start sequences there)")
        name = shard_filename(dataset, index)
        (symlink_in_place if in_place else link_or_copy)(source, out_dir / name)
        entries.append({"file": name, "split": "val" if index == 0 else "train", "tokens": scanned["tokens"],
                        "sha256": scanned["sha256"], "documents": scanned["documents"], "source": str(source)})
    return entries
