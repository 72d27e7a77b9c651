"""Stage ``speedrun bos-index``: the BOS (token 50256) positions of every shard of a tokenized dataset.

The command line over :func:`speedrun.data.bos_index_writer.build_bos_index` (layout: docs/formats.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from speedrun.data.bos_index_writer import build_bos_index


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shards-dir", type=Path, required=True,
                        help="directory of shards with the manifest.json of `speedrun tokenize`")
    parser.add_argument("--out-dir", type=Path, required=True, help="directory of BOS indices to write")


def main(args: argparse.Namespace) -> int:
    manifest = build_bos_index(args.shards_dir, args.out_dir)
    documents = sum(entry["count"] for entry in manifest["shards"])
    print(f"wrote the BOS index of {len(manifest['shards'])} shards ({documents} BOS) to {args.out_dir}")
    return 0
