"""The token shard file format of llm.c and modded-nanogpt (``*.bin``).

A shard is a header of 256 little-endian int32 (``[0]`` magic 20240520, ``[1]`` version 1, ``[2]`` token
count N, the rest 0), then N little-endian uint16 GPT-2 token ids starting at byte 1024. The file is
therefore exactly ``1024 + 2 * N`` bytes. Shard 0 of a dataset is the validation shard
(``{dataset}_val_000000.bin``), shards 1.. are training shards (``{dataset}_train_%06d.bin``).

Source: llm.c ``dev/data/data_common.py`` and modded-nanogpt ``data/fineweb.py`` (writer) and
``train_gpt.py`` ``_load_data_shard`` (reader); speedrun-spec.md section 1.1; docs/formats.md.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from speedrun.errors import SpeedrunError
from speedrun.support.atomic import atomic_path

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
BOS_ID = 50256
MAX_TOKEN_ID = np.iinfo(np.uint16).max

_HEADER_DTYPE = np.dtype("<i4")
_TOKEN_DTYPE = np.dtype("<u2")


def shard_filename(dataset: str, index: int) -> str:
    """File name of shard ``index`` of ``dataset``: ``{dataset}_val_000000.bin`` for 0, else train.

    Raises ``ValueError`` for a negative index.
    """
    if index < 0:
        raise ValueError(f"shard index must be >= 0, got {index}")
    split = "val" if index == 0 else "train"
    return f"{dataset}_{split}_{index:06d}.bin"


def write_shard(path: str | os.PathLike[str], tokens: np.ndarray) -> None:
    """Write ``tokens`` (1-D integer array of GPT-2 ids) as a shard at ``path``, atomically.

    Raises :class:`SpeedrunError` when an id is negative or above 65535 (uint16 cannot hold it) or when
    ``tokens`` is not 1-D.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise SpeedrunError(f"{path}: shard tokens must be a 1-D array, got shape {tokens.shape}")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) > MAX_TOKEN_ID):
        raise SpeedrunError(
            f"{path}: token ids must lie in 0..{MAX_TOKEN_ID} to fit uint16, "
            f"found {int(tokens.min())}..{int(tokens.max())}"
        )
    header = np.zeros(HEADER_INTS, dtype=_HEADER_DTYPE)
    header[0], header[1], header[2] = MAGIC, VERSION, tokens.size
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(tokens.astype(_TOKEN_DTYPE, copy=False).tobytes())
            f.flush()
            os.fsync(f.fileno())


def read_header(path: str | os.PathLike[str]) -> int:
    """Validate the shard at ``path`` and return its token count N.

    Checks magic 20240520, version 1 and file size == 1024 + 2 * N. Raises :class:`SpeedrunError`
    naming the file and what was found against what was expected.
    """
    path = Path(path)
    if not path.is_file():
        raise SpeedrunError(f"{path}: shard file not found")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise SpeedrunError(f"{path}: {size} bytes is shorter than the {HEADER_BYTES}-byte shard header")
    header = np.fromfile(path, dtype=_HEADER_DTYPE, count=HEADER_INTS)
    magic, version, count = (int(v) for v in header[:3])
    if magic != MAGIC:
        raise SpeedrunError(f"{path}: not a token shard: header magic {magic}, expected {MAGIC}")
    if version != VERSION:
        raise SpeedrunError(f"{path}: unsupported shard version {version}, expected {VERSION}")
    if count < 0:
        raise SpeedrunError(f"{path}: header token count is {count}; expected a count of 0 or more")
    expected = HEADER_BYTES + 2 * count
    if size != expected:
        raise SpeedrunError(
            f"{path}: header says {count} tokens, so {expected} bytes, but the file holds {size} bytes"
        )
    return count


def load_shard(path: str | os.PathLike[str]) -> np.ndarray:
    """Memory-map the tokens of the shard at ``path``: shape (N,), dtype uint16, read-only.

    The header is validated first (:func:`read_header`); raises :class:`SpeedrunError` on a bad shard.
    """
    count = read_header(path)
    if count == 0:
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype=_TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(count,))


def sha256_text(text: str) -> str:
    """Hex sha256 of ``text`` (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_file(path: str | os.PathLike[str], chunk_bytes: int = 1 << 22) -> str:
    """Hex sha256 of the file at ``path``, read in chunks of ``chunk_bytes``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()
