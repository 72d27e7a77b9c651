"""Writing a dataset's shard folder: GPT-2 tokenized documents cut into ``.bin`` shards plus ``manifest.json``.

Follows modded-nanogpt ``data/fineweb.py`` (speedrun-spec.md section 1.2; docs/formats.md): every
document becomes ``[50256] + encode_ordinary(text)``; documents are concatenated in dataset order; a shard
is flushed when it holds exactly ``shard_tokens`` tokens and a document that overflows continues in the
next shard. Shard 0 is the validation shard, shards 1.. are training shards; only the last shard may
be shorter. Given the same documents in the same order, the shards are byte-identical to that script's.

Three ways in, one way out (a shard folder written as a whole, atomically, by
:func:`~speedrun.data.dataset.atomic_directory`):

- :func:`tokenize_documents`: documents files (parquet, JSON Lines or text, :mod:`speedrun.data.documents`)
  streamed batch by batch and encoded on worker processes (:class:`~speedrun.data.encode.EncoderPool`), in
  order, so the bytes do not depend on the worker count;
- :func:`tokenize_to_stream` then :func:`shard_streams`: one input file becomes one token stream (the shard
  format, uncut), so a large dataset is tokenized in one job per file; the streams are then cut, in order,
  into shards;
- :func:`import_pretokenized`: shards made elsewhere (``kjj0/fineweb10B-gpt2``), checked and linked in
  (:mod:`speedrun.data.pretokenized`).

A failed write (a full disk) raises :class:`SpeedrunError` naming the output; nothing half written remains.
The ``speedrun tokenize`` stage (:mod:`speedrun.tokenize`) is the command line over these functions.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from speedrun.data.dataset import MANIFEST, SHARDS, atomic_directory
from speedrun.data.documents import iter_text_batches
from speedrun.data.encode import EncoderPool
from speedrun.data.pretokenized import add_pretokenized, check_gpt2_ids, check_reserved_header
from speedrun.data.shards import (
    BOS_ID,
    HEADER_BYTES,
    HEADER_INTS,
    MAGIC,
    VERSION,
    load_shard,
    sha256_file,
    shard_filename,
    write_shard,
)
from speedrun.errors import SpeedrunError
from speedrun.support.atomic import atomic_path, write_json

TOKENIZER = "gpt2 (tiktoken, encode_ordinary, BOS 50256)"
_DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_MAX_STREAM_TOKENS = np.iinfo(np.int32).max


class ShardWriter:
    """Cut a stream of tokens into shards of exactly ``shard_tokens`` tokens written to ``out_dir``.

    :meth:`add` appends tokens (a document overflowing a shard continues in the next one), :meth:`close`
    writes the last, partial shard. ``entries`` lists ``{file, split, tokens, sha256}`` per shard.
    """

    def __init__(self, out_dir: Path, dataset: str, shard_tokens: int):
        self.out_dir, self.dataset = out_dir, dataset
        self.buffer = np.empty(shard_tokens, dtype=np.uint16)
        self.filled = 0
        self.entries: list[dict[str, Any]] = []

    def add(self, tokens: np.ndarray) -> None:
        """Append ``tokens`` ((n,) uint16), flushing every full shard."""
        while len(tokens):
            take = min(len(self.buffer) - self.filled, len(tokens))
            self.buffer[self.filled:self.filled + take] = tokens[:take]
            self.filled += take
            tokens = tokens[take:]
            if self.filled == len(self.buffer):
                self._flush()

    def close(self) -> None:
        """Write the last shard if it holds any token."""
        if self.filled:
            self._flush()

    def _flush(self) -> None:
        index = len(self.entries)
        name = shard_filename(self.dataset, index)
        write_shard(self.out_dir / name, self.buffer[:self.filled])
        self.entries.append({"file": name, "split": "val" if index == 0 else "train",
                             "tokens": self.filled, "sha256": sha256_file(self.out_dir / name)})
        self.filled = 0


@contextlib.contextmanager
def _writing(target: Path) -> Iterator[None]:
    """Turn an OSError while writing ``target`` (a full disk, a permission) into a SpeedrunError naming it."""
    try:
        yield
    except OSError as e:
        raise SpeedrunError(f"{target}: writing failed ({e.strerror or e})") from None


class _Counter:
    """Passes batches of texts through, counting the documents."""

    def __init__(self, batches: Iterable[list[str]]):
        self.batches, self.documents = batches, 0

    def __iter__(self) -> Iterator[list[str]]:
        for batch in self.batches:
            self.documents += len(batch)
            yield batch


def _document_batches(documents: Sequence[Path], text_column: str) -> Iterator[list[str]]:
    for path in documents:
        yield from iter_text_batches(path, text_column)


def _paths(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    return [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]


def tokenize_documents(documents: str | Path | Sequence[str | Path], dataset: str, shard_tokens: int,
                       out_dir: str | Path, threads: int = 1, text_column: str = "text") -> dict[str, Any]:
    """Tokenize the documents of one or more files, in order, into the shards of ``out_dir``.

    ``threads`` worker processes encode; ``text_column`` names the parquet column or JSON field. Writes
    ``{dataset}_val_000000.bin``, ``{dataset}_train_000001.bin``, ... and ``manifest.json`` (docs/formats.md)
    into ``out_dir`` as a whole, atomically; returns the manifest. Raises :class:`SpeedrunError` on a bad file,
    column or document (:mod:`speedrun.data.documents`), a bad ``dataset``, ``shard_tokens`` (1..2**31 - 1, the
    header's int32 count) or ``threads``, no document, fewer tokens than a validation shard plus one train token,
    or a failed write; and, before any work, for an ``out_dir`` that is, contains or lies inside an input, or
    that is neither absent, empty nor a previous shard folder
    (:func:`~speedrun.data.dataset.check_output_directory`).
    """
    documents, out_dir = _paths(documents), Path(out_dir)
    _check_arguments(dataset, shard_tokens, threads)
    with _writing(out_dir), atomic_directory(out_dir, kind=SHARDS, inputs=documents) as tmp, \
            EncoderPool(threads) as pool:
        writer = ShardWriter(tmp, dataset, shard_tokens)
        counter = _Counter(_document_batches(documents, text_column))
        for tokens in pool.map(counter):
            writer.add(tokens)
        writer.close()
        manifest = _manifest(", ".join(map(str, documents)), dataset, shard_tokens, counter.documents,
                             writer.entries)
        write_json(tmp / MANIFEST, manifest)
    return manifest


def tokenize_to_stream(documents: str | Path, out: str | Path, threads: int = 1,
                       text_column: str = "text") -> tuple[int, int]:
    """Encode every document of one file, in order, into the token stream ``out``; return (documents, tokens).

    The stream is a shard file (docs/formats.md header, uint16 tokens) holding the whole file's tokens,
    uncut, written atomically. Raises :class:`SpeedrunError` as :func:`tokenize_documents` does, and when the
    file has no document or more than 2**31 - 1 tokens (the header's int32 count).
    """
    documents, out = Path(documents), Path(out)
    _check_arguments("stream", 1, threads)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    with EncoderPool(threads) as pool, _writing(out), atomic_path(out) as tmp, open(tmp, "wb") as f:
        f.write(header.tobytes())
        counter, total = _Counter(iter_text_batches(documents, text_column)), 0
        for tokens in pool.map(counter):
            f.write(tokens.astype("<u2", copy=False).data)
            total += len(tokens)
        if counter.documents == 0:
            raise SpeedrunError(f"{documents}: no documents")
        if total > _MAX_STREAM_TOKENS:
            raise SpeedrunError(f"{documents}: {total} tokens exceed a stream's int32 count; split the file")
        header[:3] = MAGIC, VERSION, total
        f.seek(0)
        f.write(header.tobytes())
        f.flush()
        os.fsync(f.fileno())
    return counter.documents, total


def shard_streams(streams: Sequence[str | Path], dataset: str, shard_tokens: int, out_dir: str | Path,
                  sources: Sequence[str | Path] | None = None) -> dict[str, Any]:
    """Cut token streams (:func:`tokenize_to_stream`), concatenated in order, into the shards of ``out_dir``.

    ``sources``: the documents file each stream was made from (the workflow's temporary streams stand for the
    user's files), named instead of the streams in the messages about the data as a whole (no documents, too
    few tokens for a train shard); one per stream. The result is byte for byte what :func:`tokenize_documents`
    makes of the same files. Raises :class:`SpeedrunError` for a ``sources`` list of another length, a bad
    stream header (a non-zero reserved int included, :func:`~speedrun.data.pretokenized.check_reserved_header`)
    or a token id of 50257 or more (the file and position are named,
    :func:`~speedrun.data.pretokenized.check_gpt2_ids`) and as :func:`tokenize_documents`.
    """
    streams, out_dir = _paths(streams), Path(out_dir)
    _check_arguments(dataset, shard_tokens, 1)
    if sources is not None and len(sources) != len(streams):
        raise SpeedrunError(f"{len(sources)} stream sources for {len(streams)} token streams (--stream-sources, "
                            "--streams); expected the documents file of each stream, in the same order")
    named = ", ".join(map(str, streams if sources is None else sources))
    with _writing(out_dir), atomic_directory(out_dir, kind=SHARDS, inputs=streams) as tmp:
        writer, documents = ShardWriter(tmp, dataset, shard_tokens), 0
        for path in streams:
            tokens = load_shard(path)
            with open(path, "rb") as f:
                check_reserved_header(path, f.read(HEADER_BYTES))
            if len(tokens) == 0 or int(tokens[0]) != BOS_ID:
                raise SpeedrunError(f"{path}: a token stream must start with a document (token {BOS_ID})")
            check_gpt2_ids(path, tokens)
            documents += int(np.count_nonzero(tokens == BOS_ID))
            writer.add(tokens)
        writer.close()
        manifest = _manifest(named, dataset, shard_tokens, documents, writer.entries)
        write_json(tmp / MANIFEST, manifest)
    return manifest


def import_pretokenized(shards: Sequence[str | Path], dataset: str, out_dir: str | Path,
                        allow_repeats: bool = False, in_place: bool = False) -> dict[str, Any]:
    """Take pre-tokenized shards (validation first) as the dataset ``dataset`` in ``out_dir``, with a manifest.

    ``shard_tokens`` in the manifest is the largest shard's token count; ``allow_repeats`` lets a train shard be
    given more than once; ``in_place``: the shards stay where they are, ``out_dir`` holds symbolic links to them
    (``data.source: shards``; each manifest entry's ``source`` is the absolute path). Raises
    :class:`SpeedrunError` for a missing file, a file given twice, a bad order, header, size or token id
    (:mod:`speedrun.data.pretokenized`), and for an ``out_dir`` refused as in :func:`tokenize_documents`.
    """
    shards, out_dir = _paths(shards), Path(out_dir)
    _check_arguments(dataset, 1, 1)
    with _writing(out_dir), atomic_directory(out_dir, kind=SHARDS, inputs=shards) as tmp:
        entries = add_pretokenized(shards, dataset, tmp, allow_repeats, in_place)
        documents = sum(entry["documents"] for entry in entries)
        shard_entries = [{k: v for k, v in entry.items() if k != "documents"} for entry in entries]
        manifest = {"dataset": dataset, "shard_tokens": max(e["tokens"] for e in entries),
                    "total_tokens": sum(e["tokens"] for e in entries), "documents": documents,
                    "tokenizer": f"{TOKENIZER}, pre-tokenized", "shards": shard_entries}
        write_json(tmp / MANIFEST, manifest)
    return manifest


def _check_arguments(dataset: str, shard_tokens: int, threads: int) -> None:
    if not _DATASET_NAME.match(dataset):
        raise SpeedrunError(f"dataset name {dataset!r} must be letters, digits, '_', '.' or '-'")
    if shard_tokens < 1:
        raise SpeedrunError(f"shard_tokens must be a positive number of tokens, got {shard_tokens}")
    if shard_tokens > _MAX_STREAM_TOKENS:
        raise SpeedrunError(f"shard_tokens {shard_tokens} exceeds {_MAX_STREAM_TOKENS}, the largest token count "
                            "a shard header (int32) can hold")
    if threads < 1:
        raise SpeedrunError(f"threads must be >= 1, got {threads}")


def _manifest(documents: str, dataset: str, shard_tokens: int, count: int,
              entries: list[dict[str, Any]]) -> dict[str, Any]:
    if count == 0:
        raise SpeedrunError(f"{documents}: no documents")
    total = sum(e["tokens"] for e in entries)
    if len(entries) < 2:
        raise SpeedrunError(
            f"{documents}: {total} tokens ({count_of(count, 'document')}) fill at most one shard of "
            f"shard_tokens={shard_tokens}: no train shard after the validation shard; "
            "lower data.shard_tokens or add documents"
        )
    return {"dataset": dataset, "shard_tokens": shard_tokens, "total_tokens": total,
            "documents": count, "tokenizer": TOKENIZER, "shards": entries}


def count_of(n: int, noun: str) -> str:
    """``1 document``, ``3 documents``."""
    return f"{n} {noun}{'s' * (n != 1)}"
