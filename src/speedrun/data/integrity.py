"""A damaged input is moved aside, so that the workflow's next call makes it again (:func:`move_aside`; a
damaged download: :func:`check_download`, called by :mod:`speedrun.data.pretokenized`), and
the train rule's check of a dataset folder before training starts (:func:`check_dataset`, run as ``python -m
speedrun.data.integrity SHARDS_DIR`` ahead of torchrun, so that a damaged shard ends the job with one line in
its log and no torchrun traceback).

What is checked per shard: its header and size (:func:`speedrun.data.shards.read_header`: magic, version,
size = 1024 + 2 x count) and its token count against the tokenize stage's manifest. Not its sha256: hashing runs
at about 1 s per GB on this project's 2-core machine (docs/benchmarks.md, "sha256 of the train shards"), not
under the second per GB that a check before every run may cost; the tokenize and download stages hash what
they write.

Only numpy and the standard library: the check starts in a fraction of a second, without torch.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Sequence

from speedrun.data.dataset import SHARD_ENTRY_KEYS, check_splits, read_manifest
from speedrun.data.shards import read_header
from speedrun.errors import SpeedrunError


def move_aside(path: str | os.PathLike[str]) -> Path:
    """Rename the file or folder ``path`` to ``<path>.damaged-<UTC time>`` (``-2``, ``-3``... when taken)
    beside it and return the new path; the original path is then free for the stage that makes it."""
    path = Path(path)
    stem = f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    target, n = path.with_name(stem), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{stem}-{n}")
    os.replace(path, target)
    return target


def damaged(error: SpeedrunError, path: str | os.PathLike[str], remakes: str) -> SpeedrunError:
    """``error`` with ``path`` moved aside (:func:`move_aside`) and the message saying so: ``<error>; moved
    aside to <new path>: <remakes>`` (``remakes``: what the next call does, e.g. ``the next call rebuilds
    it``)."""
    moved = move_aside(path)
    return SpeedrunError(f"{error}; moved aside to {moved}: {remakes}")


def is_download(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file of the download stage: it lies under ``results/download/`` (of any folder),
    where the workflow's next call downloads again what is missing. A file of the user's elsewhere is never
    moved."""
    parts = Path(os.path.abspath(path)).parts
    return any(parts[i:i + 2] == ("results", "download") for i in range(len(parts) - 1))


def check_download(error: SpeedrunError, path: str | os.PathLike[str]) -> SpeedrunError:
    """The error for a damaged file ``path``: a download (:func:`is_download`) is moved aside and the message
    says that the next call downloads it again; any other file stays, and ``error`` is returned as it is."""
    if not is_download(path):
        return error
    return damaged(error, path, "the next call of the workflow downloads it again")


def check_dataset(shards_dir: str | os.PathLike[str]) -> int:
    """Check every shard that ``shards_dir/manifest.json`` lists (module docstring) and return their count.
    A damaged shard moves the whole folder aside (the tokenize stage's one output), so that the next call
    rebuilds it, and raises :class:`SpeedrunError` saying so. A missing or malformed manifest raises as
    :func:`speedrun.data.dataset.read_manifest` does, nothing moved."""
    shards_dir = Path(shards_dir)
    entries = read_manifest(shards_dir, "shards", SHARD_ENTRY_KEYS, stage="tokenize")["shards"]
    check_splits(shards_dir, entries)
    for entry in entries:
        path = shards_dir / entry["file"]
        try:
            count = read_header(path)
            if count != entry["tokens"]:
                raise SpeedrunError(f"{path}: {count} tokens, its manifest says {entry['tokens']}")
        except SpeedrunError as e:
            raise damaged(e, shards_dir, "the next call of the workflow rebuilds it (tokenize, bos_index)") from None
    return len(entries)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m speedrun.data.integrity SHARDS_DIR``: 0 when every shard is sound, else 2 after one line on
    stderr (``speedrun train: error: ...``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m speedrun.data.integrity SHARDS_DIR", file=sys.stderr)
        return 2
    try:
        check_dataset(args[0])
    except SpeedrunError as e:
        print(f"speedrun train: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
