"""A folder of shards already on disk (``data.source: shards``): the ``data/fineweb10B/`` that modded-nanogpt's
``data/cached_fineweb10B.py`` leaves, or any folder of shards in the same format (speedrun-spec.md section 1.1).

``*_val_*.bin`` is the validation shard (exactly one), ``*_train_*.bin`` the training shards, in name order.
Listing checks each header and size (magic 20240520, version 1, size = 1024 + 2 x count) without reading the
tokens, so that planning refuses a bad folder at once; the tokenize stage then scans every token
(:func:`speedrun.data.pretokenized.scan_shard`) and links the shards in place (issue 21, item 1).
"""

from __future__ import annotations

import os
from pathlib import Path

from speedrun.data.shards import read_header
from speedrun.errors import SpeedrunError


def list_shard_folder(folder: str | os.PathLike[str]) -> list[Path]:
    """The shards of ``folder``: its one ``*_val_*.bin`` then its ``*_train_*.bin`` in the order of their names in
    the folder (absolute paths in the folder; symbolic links kept as links, so that a modded-nanogpt
    ``data/fineweb10B/`` of links into the Hugging Face cache's hash-named ``blobs/`` keeps the order and the
    names of its shards). Each header and file size is checked (:func:`speedrun.data.shards.read_header`).

    Raises :class:`SpeedrunError` (one line, naming the folder or file) for a missing folder, a folder without a
    validation shard, with more than one, without training shards, and for a bad header or a truncated file.
    """
    path = Path(folder).expanduser()
    if not path.is_dir():
        relative = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
        raise SpeedrunError(f"data.shards.path {folder}{relative}: not a folder; expected a folder of *_val_*.bin "
                            "and *_train_*.bin shards (modded-nanogpt's data/fineweb10B)")
    path = path.absolute()
    val = sorted(path.glob("*_val_*.bin"), key=lambda p: p.name)
    train = sorted(path.glob("*_train_*.bin"), key=lambda p: p.name)
    if not val:
        raise SpeedrunError(f"data.shards.path {folder}: no validation shard (*_val_*.bin) in the folder"
                            f"{_held(path)}")
    if len(val) > 1:
        raise SpeedrunError(f"data.shards.path {folder}: {len(val)} validation shards ({val[0].name}, {val[1].name}"
                            "...); expected one *_val_*.bin")
    if not train:
        raise SpeedrunError(f"data.shards.path {folder}: no training shard (*_train_*.bin) in the folder"
                            f"{_held(path)}")
    shards = val + train
    for shard in shards:
        read_header(shard)
    return shards


def _held(path: Path) -> str:
    """What a folder without the shards holds, for its message: the subfolder that holds a ``*_val_*.bin`` (the
    folder given one level too high, e.g. modded-nanogpt's ``data/`` for ``data/fineweb10B/``), else its
    first entries, or that it is empty."""
    entries = sorted(path.iterdir(), key=lambda p: p.name)
    nested = [p for p in entries if p.is_dir() and any(p.glob("*_val_*.bin"))]
    if nested:
        return f"; its subfolder {nested[0].name}/ holds one: set data.shards.path to {nested[0]}"
    if not entries:
        return " (the folder is empty)"
    names = [p.name + ("/" if p.is_dir() else "") for p in entries]
    return f" (it holds {', '.join(names[:6])}{', ...' if len(names) > 6 else ''})"
