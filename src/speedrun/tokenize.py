"""Stage ``speedrun tokenize``: GPT-2 tokenize documents into ``.bin`` shards plus ``manifest.json``.

The command line over :mod:`speedrun.data.shard_writer` (the shard layout, byte-identical to modded-nanogpt
``data/fineweb.py``; docs/formats.md). Three ways in, one way out (a shard folder written as a whole, atomically):

- ``--documents F...`` (parquet, JSON Lines or text files): encoded on ``--threads`` worker processes, in order,
  so the bytes do not depend on the worker count (:func:`~speedrun.data.shard_writer.tokenize_documents`);
- ``--documents F --out-stream S``: one input file becomes one token stream ``S`` (the shard format, uncut),
  so a large dataset is tokenized in one job per file and an interrupted run resumes at file granularity;
  ``--streams S...`` then cuts the streams, in order, into shards;
- ``--pretokenized F...``: shards made elsewhere (``kjj0/fineweb10B-gpt2``), checked and linked in.

A failed write (a full disk) raises :class:`SpeedrunError` naming the output; nothing half written remains.
SIGINT (Ctrl-C) or SIGTERM stops the command as it stops a training run (:mod:`speedrun.support.stopping`): one line
on stderr (``speedrun tokenize: interrupted by SIGINT``, ``... terminated by SIGTERM``), exit status 130 or
143, no traceback (the encoding workers leave the signal to this process, :mod:`speedrun.data.encode`), and no
``.tmp-*`` file or folder left (the outputs are written through :mod:`speedrun.support.atomic` and
:func:`~speedrun.data.dataset.atomic_directory`, which remove them on any exception).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from speedrun.data.encode import usable_cpus
from speedrun.data.shard_writer import (count_of, import_pretokenized, shard_streams, tokenize_documents,
                                        tokenize_to_stream)
from speedrun.errors import SpeedrunError
from speedrun.support.stopping import run_until_stopped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    inputs = parser.add_mutually_exclusive_group(required=True)
    inputs.add_argument("--documents", type=Path, nargs="+", help="documents files (.parquet, .jsonl, .txt), in order")
    inputs.add_argument("--streams", type=Path, nargs="+", help="token streams of --out-stream, in order")
    inputs.add_argument("--pretokenized", type=Path, nargs="+",
                        help="shards made elsewhere (e.g. kjj0/fineweb10B-gpt2), the validation shard first")
    outputs = parser.add_mutually_exclusive_group(required=True)
    outputs.add_argument("--out-dir", type=Path, help="directory of shards (and manifest.json) to write")
    outputs.add_argument("--out-stream", type=Path, help="with one --documents file: its token stream to write")
    parser.add_argument("--stream-sources", type=Path, nargs="+",
                        help="with --streams: the documents file each stream was made from, in the same order "
                             "(named in messages instead of the streams)")
    parser.add_argument("--allow-repeats", action="store_true",
                        help="with --pretokenized: a train shard may be given more than once (data repeated on "
                             "purpose, e.g. a benchmark that needs more tokens than it has)")
    parser.add_argument("--in-place", action="store_true",
                        help="with --pretokenized: symbolic links to the shards where they are, never a copy")
    parser.add_argument("--dataset", help="dataset name: the shard file prefix (with --out-dir)")
    parser.add_argument("--shard-tokens", type=int, help="tokens per shard (with --documents/--streams --out-dir)")
    parser.add_argument("--text-column", default="text", help="parquet column or JSON field of the text")
    parser.add_argument("--threads", type=int, default=1,
                        help="worker processes that encode (default 1; at most the CPUs this process may use)")


def _capped_threads(threads: int) -> int:
    """``threads``, or the usable CPUs when it asks for more (more encoding processes than CPUs only add
    memory and switching), with a one-line note on stderr. A value below 1 is left to the stage's check."""
    cpus = usable_cpus()
    if threads <= cpus:
        return threads
    print(f"speedrun tokenize: note: --threads {threads} is more than the {cpus} CPUs this process may use; "
          f"using {cpus}", file=sys.stderr)
    return cpus


def main(args: argparse.Namespace) -> int:
    """``speedrun tokenize``: 0 when written; 130 or 143 (:attr:`~speedrun.support.stopping.RunStopped.exit_status`)
    when SIGINT or SIGTERM stopped it, with one line on stderr and nothing half written left (module
    docstring). Raises :class:`SpeedrunError` (``speedrun tokenize: error: ...``, status 2) for a bad argument
    or input."""
    return run_until_stopped("tokenize", lambda: _run(args))


def _check_options(args: argparse.Namespace) -> None:
    if args.stream_sources is not None and args.streams is None:
        raise SpeedrunError("--stream-sources goes with --streams (the documents file of each stream)")
    if args.allow_repeats and args.pretokenized is None:
        raise SpeedrunError("--allow-repeats goes with --pretokenized (a train shard given more than once)")
    if args.in_place and args.pretokenized is None:
        raise SpeedrunError("--in-place goes with --pretokenized (shards linked where they are)")
    if args.out_stream is not None:
        if args.documents is None or len(args.documents) != 1:
            raise SpeedrunError("--out-stream needs exactly one --documents file")
        return
    if args.dataset is None or (args.shard_tokens is None and args.pretokenized is None):
        raise SpeedrunError("--out-dir needs --dataset (and --shard-tokens unless --pretokenized)")
    if args.pretokenized is not None and args.shard_tokens is not None:
        raise SpeedrunError(f"--shard-tokens {args.shard_tokens} does not apply to --pretokenized: those shards are "
                            "taken as they are (the manifest's shard_tokens is the largest one's token count); "
                            "leave --shard-tokens out")


def _run(args: argparse.Namespace) -> None:
    _check_options(args)
    threads = _capped_threads(args.threads) if args.documents is not None else args.threads
    if args.out_stream is not None:
        count, tokens = tokenize_to_stream(args.documents[0], args.out_stream, threads, args.text_column)
        print(f"wrote {tokens} tokens of {count_of(count, 'document')} of {args.documents[0]} to {args.out_stream}")
        return
    if args.documents is not None:
        manifest = tokenize_documents(args.documents, args.dataset, args.shard_tokens, args.out_dir, threads,
                                      args.text_column)
    elif args.streams is not None:
        manifest = shard_streams(args.streams, args.dataset, args.shard_tokens, args.out_dir, args.stream_sources)
    else:
        manifest = import_pretokenized(args.pretokenized, args.dataset, args.out_dir, args.allow_repeats,
                                       args.in_place)
    print(f"wrote {len(manifest['shards'])} shards, {manifest['total_tokens']} tokens of "
          f"{count_of(manifest['documents'], 'document')} to {args.out_dir}")
