"""Reading documents from files, streamed: parquet (row group by row group), JSON Lines and plain text.

The texts come out in file order, ``rows_per_batch`` at a time, so a 2 GB FineWeb parquet file
(``HuggingFaceFW/fineweb``, column ``text``) is never held in memory whole. Formats, chosen by file name:

- ``.parquet``: the string column ``text_column`` (FineWeb's ``text``), read with ``pyarrow`` batch by batch;
- ``.jsonl`` / ``.ndjson``: one JSON object per line, its string field ``text_column``;
- ``.txt``: the whole file is one document.

A UTF-8 byte order mark at the start of a ``.txt`` or ``.jsonl`` file (as Windows editors write) is skipped.

Every document must be a non-empty, valid Unicode string: a null, empty or non-string text, a line that is not
JSON, bytes that are not UTF-8, a lone surrogate (``"\\ud800"`` in JSON) or a corrupt or truncated parquet file
raise :class:`~speedrun.errors.SpeedrunError` naming the file and the row (or line).
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Iterator, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from speedrun.errors import SpeedrunError

DocumentFormat = Literal["parquet", "jsonl", "txt"]
ROWS_PER_BATCH = 1024
SUFFIXES: dict[str, DocumentFormat] = {".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl",
                                       ".txt": "txt"}


def document_format(path: str | Path) -> DocumentFormat:
    """The format of the documents file ``path``, from its suffix; :class:`SpeedrunError` for another."""
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise SpeedrunError(f"{path}: unknown documents format {suffix!r}; expected one of {sorted(SUFFIXES)}")
    return SUFFIXES[suffix]


def iter_text_batches(path: str | Path, text_column: str = "text",
                      rows_per_batch: int = ROWS_PER_BATCH) -> Iterator[list[str]]:
    """The documents of ``path`` in file order, as lists of at most ``rows_per_batch`` texts.

    ``text_column`` names the parquet column or JSON field (unused for ``.txt``). Raises
    :class:`SpeedrunError` naming the file for a missing file, an unknown format, a missing column (the
    columns found are named) and a bad document or row (see the module docstring).
    """
    path = Path(path)
    fmt = document_format(path)
    if not path.is_file():
        raise SpeedrunError(f"{path}: documents file not found")
    if fmt == "parquet":
        yield from _parquet_batches(path, text_column, rows_per_batch)
    elif fmt == "jsonl":
        yield from _jsonl_batches(path, text_column, rows_per_batch)
    else:
        yield [_checked(path, _read_utf8(path), "the file")]


def _checked(path: Path, text: object, where: str) -> str:
    """``text`` if it is a non-empty string of valid Unicode, else a :class:`SpeedrunError` naming ``where``."""
    if text is None or text == "":
        raise SpeedrunError(f"{path}: the text of {where} is {'null' if text is None else 'empty'}; "
                            "every document needs a text")
    if not isinstance(text, str):
        raise SpeedrunError(f"{path}: the text of {where} is a {type(text).__name__}, expected a string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SpeedrunError(f"{path}: the text of {where} is not valid Unicode ({e.reason} at character "
                            f"{e.start})") from None
    return text


def _read_utf8(path: Path) -> str:
    """The file's text; a UTF-8 byte order mark at its start (Windows editors write one) is not part of it."""
    data = path.read_bytes()
    skipped = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skipped:].decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpeedrunError(f"{path}: not UTF-8 text (byte {skipped + e.start}: {e.reason})") from None


def _parquet_batches(path: Path, text_column: str, rows_per_batch: int) -> Iterator[list[str]]:
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise SpeedrunError(f"{path}: not a readable parquet file ({e})") from None
    schema = parquet.schema_arrow
    if text_column not in schema.names:
        raise SpeedrunError(f"{path}: no {text_column!r} column; the columns are {schema.names} (set "
                            "data.files.text_column to the one holding the text)")
    text_type = schema.field(text_column).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        raise SpeedrunError(f"{path}: column {text_column!r} must hold strings, found {text_type}")
    row = 0
    batches = parquet.iter_batches(batch_size=rows_per_batch, columns=[text_column], use_threads=False)
    while True:
        try:
            batch = next(batches, None)
            texts = [] if batch is None else batch.column(0).to_pylist()
        except UnicodeDecodeError as e:
            raise SpeedrunError(f"{path}: a text among rows {row}.. is not UTF-8 ({e.reason} at byte "
                                f"{e.start})") from None
        except (pa.ArrowException, OSError) as e:
            raise SpeedrunError(f"{path}: corrupt or truncated parquet data after row {row} ({e})") from None
        if batch is None:
            return
        yield [_checked(path, text, f"row {row + offset}") for offset, text in enumerate(texts)]
        row += len(texts)


def _jsonl_batches(path: Path, text_column: str, rows_per_batch: int) -> Iterator[list[str]]:
    batch: list[str] = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if number == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)   # a byte order mark (Windows editors) is not JSON
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise SpeedrunError(f"{path}: line {number} is not UTF-8 (byte {e.start}: {e.reason})") from None
            except json.JSONDecodeError as e:
                raise SpeedrunError(f"{path}: line {number} is not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise SpeedrunError(f"{path}: line {number} is a JSON {_json_kind(record)}, expected an object "
                                    f"with a {text_column!r} field")
            if text_column not in record:
                raise SpeedrunError(f"{path}: line {number} has no {text_column!r} field (set data.files.text_column "
                                    f"to the field holding the text; this line's fields: {', '.join(record)})")
            batch.append(_checked(path, record[text_column], f"line {number}"))
            if len(batch) == rows_per_batch:
                yield batch
                batch = []
    if batch:
        yield batch


def _json_kind(value: object) -> str:
    """The JSON name of a decoded value's type: array, string, number, boolean or null."""
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"
