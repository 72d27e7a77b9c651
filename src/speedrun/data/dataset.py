"""A tokenized dataset on disk: the shard and BOS index directories and their manifests.

``results/shards/{dataset}/`` holds the shards and ``manifest.json`` (written by ``speedrun tokenize``);
``results/bos_index/{dataset}/`` holds one ``<shard stem>.npy`` per shard and ``manifest.json`` (written
by ``speedrun bos-index``); docs/formats.md gives both layouts. Both directories are written as a whole:
built in a temporary directory beside the target, then renamed (:func:`atomic_directory`), so a
directory under its final name is always complete. As writing replaces the whole directory, an output
directory is first checked (:func:`check_output_directory`): it must lie apart from the inputs and be
absent, empty, or a previous output of the same stage. Training opens them with
:func:`speedrun.training.data.load_training_data`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from speedrun.errors import SpeedrunError

MANIFEST = "manifest.json"
SHARD_ENTRY_KEYS = ("file", "split", "tokens", "sha256")  # of each shard in the tokenize manifest
BOS_ENTRY_KEYS = ("file", "shard", "shard_sha256", "count")  # of each shard in the bos-index manifest
SNAKEMAKE_TIMESTAMP = ".snakemake_timestamp"  # what Snakemake may touch inside a directory() output


@dataclass(frozen=True)
class OutputKind:
    """The output directory of one stage. ``stage``: the command, for messages; ``marker``: a key that
    the stage's ``manifest.json`` always holds and the other stage's never does."""

    stage: str
    marker: str


SHARDS = OutputKind("speedrun tokenize", "tokenizer")
BOS_INDEX = OutputKind("speedrun bos-index", "bos_id")


def _relation(out: Path, inp: Path) -> str | None:
    if out == inp:
        return "is"
    if out in inp.parents:
        return "contains"
    if inp in out.parents:
        return "lies inside"
    return None


def _check_apart(out: Path, inputs: Iterable[str | os.PathLike[str]]) -> None:
    """Refuse ``out`` when it is, contains or lies inside an input, compared both as written (made
    absolute) and with symbolic links resolved."""
    for inp in map(Path, inputs):
        for a, b in ((Path(os.path.abspath(out)), Path(os.path.abspath(inp))), (out.resolve(), inp.resolve())):
            relation = _relation(a, b)
            if relation is not None:
                raise SpeedrunError(
                    f"{out}: the output directory {relation} the input {inp}; writing it replaces the whole "
                    "directory, so give an output directory apart from the inputs"
                )


def _unexpected_entries(out: Path, kind: OutputKind) -> list[str]:
    """What in the existing directory ``out`` a previous output of ``kind`` would not hold ([] if none):
    everything when its manifest is missing, unreadable or of another stage."""
    names = sorted(p.name for p in out.iterdir())
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        ours = isinstance(manifest, dict) and kind.marker in manifest
        listed = {str(entry["file"]) for entry in manifest["shards"]} if ours else None
    except (OSError, ValueError, TypeError, KeyError):  # missing, not JSON, not a list of {file}
        listed = None
    if listed is None:
        return names
    allowed = listed | {MANIFEST, SNAKEMAKE_TIMESTAMP}
    return [n for n in names if n not in allowed or not (out / n).is_file() or (out / n).is_symlink()]


def check_output_directory(path: str | os.PathLike[str], kind: OutputKind,
                           inputs: Iterable[str | os.PathLike[str]]) -> None:
    """Check that writing the output directory ``path`` of stage ``kind`` (which replaces it whole)
    destroys nothing but a previous output of that stage.

    Refused with a :class:`SpeedrunError` naming ``path``: (a) ``path`` is, contains or lies inside one
    of ``inputs`` (files or directories); (b) ``path`` exists and is not a directory, or is a non-empty
    directory that is not a previous output of ``kind``. The rule for (b): a previous output holds a
    ``manifest.json`` with ``kind.marker`` (``tokenizer`` for shards, ``bos_id`` for BOS indices) and
    otherwise only the plain files its manifest lists under ``shards`` (and Snakemake's
    ``.snakemake_timestamp``); anything else means the directory is someone's, and is not deleted.
    """
    out = Path(path)
    _check_apart(out, inputs)
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise SpeedrunError(f"{out}: exists and is not a directory; expected an output directory of {kind.stage}")
    unexpected = _unexpected_entries(out, kind)
    if unexpected:
        shown = ", ".join(unexpected[:5]) + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else "")
        raise SpeedrunError(
            f"{out}: not empty and not a previous output of {kind.stage} (expected a {MANIFEST} with "
            f"{kind.marker!r} and only the files it lists; found {shown}); refusing to replace it: give a new "
            "or empty output directory"
        )


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str], *, kind: OutputKind,
                     inputs: Iterable[str | os.PathLike[str]]) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; make it ``path`` if the block succeeds.

    First, before anything is written, ``path`` is checked against ``kind`` and ``inputs``
    (:func:`check_output_directory`; raises :class:`SpeedrunError`). A directory already at ``path`` (a
    previous output of the same stage) is replaced: it is moved aside, the new one renamed into place, then
    the old one deleted. On an exception the temporary directory is deleted and ``path`` is untouched.
    """
    check_output_directory(path, kind, inputs)
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


def read_manifest(directory: str | os.PathLike[str], list_key: str,
                  entry_keys: Sequence[str] = (), stage: str | None = None) -> dict[str, Any]:
    """The ``manifest.json`` of ``directory``, checked to hold a list under ``list_key`` whose entries
    are objects holding every key of ``entry_keys``.

    Raises :class:`SpeedrunError` naming the file when it is missing (``stage``: the stage that writes it,
    named in the message: ``not found (run the tokenize stage first)``), not JSON, lacks the list, or an
    entry is not an object or lacks a key (the entry's index and the key are named).
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise SpeedrunError(f"{path}: not found" + (f" (run the {stage} stage first)" if stage else ""))
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SpeedrunError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get(list_key), list):
        raise SpeedrunError(f"{path}: expected an object with a list {list_key!r}")
    for index, entry in enumerate(manifest[list_key]):
        if not isinstance(entry, dict):
            raise SpeedrunError(f"{path}: {list_key}[{index}] is not an object")
        missing = [key for key in entry_keys if key not in entry]
        if missing:
            raise SpeedrunError(f"{path}: {list_key}[{index}] has no key {missing[0]!r} "
                                f"(expected {', '.join(entry_keys)})")
    return manifest


def check_splits(directory: str | os.PathLike[str], shards: Sequence[dict[str, Any]]) -> None:
    """Check that the entries ``shards`` of the tokenize manifest of ``directory`` (each with ``file`` and
    ``split``, :func:`read_manifest`) are a validation shard (split ``val``) then at least one train shard (split
    ``train``): what training reads (shard 0 validates, the rest train; docs/formats.md).

    Raises :class:`SpeedrunError` naming the manifest file and what is missing or out of place.
    """
    path = Path(directory) / MANIFEST
    if not shards:
        raise SpeedrunError(f"{path}: lists no shards; expected a validation shard (split 'val') then at least one "
                            "train shard (split 'train'): rerun `speedrun tokenize`")
    if shards[0]["split"] != "val":
        raise SpeedrunError(f"{path}: the first shard, {shards[0]['file']}, has split {shards[0]['split']!r}; "
                            "expected the validation shard (split 'val') first")
    if len(shards) == 1:
        raise SpeedrunError(f"{path}: lists only the validation shard {shards[0]['file']} and no train shard; "
                            "training needs at least one (split 'train'): add documents or lower shard_tokens")
    for entry in shards[1:]:
        if entry["split"] != "train":
            raise SpeedrunError(f"{path}: shard {entry['file']} has split {entry['split']!r}; expected 'train' "
                                "after the validation shard")
