"""Stage ``speedrun tokenize``: GPT-2 tokenize documents into ``.bin`` shards plus ``manifest.json``.

Follows modded-nanogpt ``data/fineweb.py`` (speedrun-spec.md section 1.2; docs/formats.md): every
document becomes ``[50256] + encode_ordinary(text)``; documents are concatenated in row order; a shard
is flushed when it holds exactly ``shard_tokens`` tokens and a document that overflows continues in the
next shard. Shard 0 is the validation shard, shards 1.. are training shards; only the last shard may
be shorter. The ``text`` column is streamed in record batches (never the whole file in memory) and each
batch is tokenized with ``encode_ordinary_batch`` on ``threads`` threads; the bytes written do not
depend on the thread count. The output directory is written as a whole, atomically.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from speedrun.atomic import write_json
from speedrun.data.dataset import MANIFEST, atomic_directory
from speedrun.data.shards import BOS_ID, sha256_file, shard_filename, write_shard
from speedrun.data.tokenizer import gpt2_encoding
from speedrun.errors import SpeedrunError

TOKENIZER = "gpt2 (tiktoken, encode_ordinary, BOS 50256)"
ROWS_PER_BATCH = 1024
_DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def iter_texts(path: Path, rows_per_batch: int = ROWS_PER_BATCH) -> Iterator[list[str]]:
    """The ``text`` column of the parquet file ``path``, ``rows_per_batch`` rows at a time.

    Raises :class:`SpeedrunError` when the file is missing or not parquet, has no string ``text``
    column (the columns found are named), or a text is null or empty (the row is named).
    """
    if not path.is_file():
        raise SpeedrunError(f"{path}: documents file not found")
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise SpeedrunError(f"{path}: not a readable parquet file ({e})") from None
    schema = parquet.schema_arrow
    if "text" not in schema.names:
        raise SpeedrunError(f"{path}: no 'text' column; the columns are {schema.names}")
    text_type = schema.field("text").type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        raise SpeedrunError(f"{path}: column 'text' must hold strings, found {text_type}")
    row = 0
    for batch in parquet.iter_batches(batch_size=rows_per_batch, columns=["text"]):
        texts = batch.column(0).to_pylist()
        for offset, text in enumerate(texts):
            if not text:
                what = "null" if text is None else "empty"
                raise SpeedrunError(
                    f"{path}: the text of row {row + offset} is {what}; every document needs a text"
                )
        row += len(texts)
        yield texts


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


def encode_batch(texts: list[str], threads: int) -> np.ndarray:
    """``[50256] + encode_ordinary(text)`` of every text, concatenated: (n,) uint16."""
    flat: list[int] = []
    for ids in gpt2_encoding().encode_ordinary_batch(texts, num_threads=threads):
        flat.append(BOS_ID)
        flat.extend(ids)
    return np.array(flat, dtype=np.uint16)


def tokenize_documents(documents: str | Path, dataset: str, shard_tokens: int, out_dir: str | Path,
                       threads: int = 1) -> dict[str, Any]:
    """Tokenize the ``text`` column of ``documents`` (parquet) into the shards of ``out_dir``.

    Writes ``{dataset}_val_000000.bin``, ``{dataset}_train_000001.bin``, ... and ``manifest.json``
    (docs/formats.md) into ``out_dir`` as a whole, atomically; returns the manifest. Raises
    :class:`SpeedrunError` on a bad file or column (see :func:`iter_texts`), a bad ``dataset`` name or
    ``shard_tokens``, no document, or fewer tokens than a validation shard plus one train token.
    """
    documents, out_dir = Path(documents), Path(out_dir)
    _check_arguments(dataset, shard_tokens, threads)
    with atomic_directory(out_dir) as tmp:
        writer = ShardWriter(tmp, dataset, shard_tokens)
        count = 0
        for texts in iter_texts(documents):
            writer.add(encode_batch(texts, threads))
            count += len(texts)
        writer.close()
        manifest = _manifest(documents, dataset, shard_tokens, count, writer.entries)
        write_json(tmp / MANIFEST, manifest)
    return manifest


def _check_arguments(dataset: str, shard_tokens: int, threads: int) -> None:
    if not _DATASET_NAME.match(dataset):
        raise SpeedrunError(f"dataset name {dataset!r} must be letters, digits, '_', '.' or '-'")
    if shard_tokens < 1:
        raise SpeedrunError(f"shard_tokens must be a positive number of tokens, got {shard_tokens}")
    if threads < 1:
        raise SpeedrunError(f"threads must be >= 1, got {threads}")


def _manifest(documents: Path, dataset: str, shard_tokens: int, count: int,
              entries: list[dict[str, Any]]) -> dict[str, Any]:
    if count == 0:
        raise SpeedrunError(f"{documents}: no documents")
    total = sum(e["tokens"] for e in entries)
    if len(entries) < 2:
        raise SpeedrunError(
            f"{documents}: {count} documents make {total} tokens, at most one shard of "
            f"shard_tokens={shard_tokens}: no train shard after the validation shard; "
            "lower data.shard_tokens or add documents"
        )
    return {"dataset": dataset, "shard_tokens": shard_tokens, "total_tokens": total,
            "documents": count, "tokenizer": TOKENIZER, "shards": entries}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--documents", type=Path, required=True, help="documents.parquet (a text column)")
    parser.add_argument("--dataset", required=True, help="dataset name: the shard file prefix")
    parser.add_argument("--shard-tokens", type=int, required=True, help="tokens per shard")
    parser.add_argument("--out-dir", type=Path, required=True, help="directory of shards to write")
    parser.add_argument("--threads", type=int, default=1, help="tokenizer threads (default 1)")


def main(args: argparse.Namespace) -> int:
    manifest = tokenize_documents(args.documents, args.dataset, args.shard_tokens, args.out_dir,
                                  args.threads)
    print(f"wrote {len(manifest['shards'])} shards, {manifest['total_tokens']} tokens of "
          f"{manifest['documents']} documents to {args.out_dir}")
    return 0
