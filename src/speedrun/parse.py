"""Stage ``parse``: one training log (ours or a public record's) into per-step metrics and a result record.

``speedrun parse LOG [--csv OUT.csv] [--json OUT.json] [--seed N]`` writes docs/formats.md's "Parsed run" files
atomically (:func:`speedrun.analysis.parsed_files.parse_to_files`); with neither option it prints the record as
JSON. The parser is :func:`speedrun.analysis.logs.parse_log`.
"""

from __future__ import annotations

import argparse
import sys

from speedrun.analysis.parsed_files import parse_to_files


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", metavar="LOG", help="a training log of any era (ours, modded-nanogpt, llm.c)")
    parser.add_argument("--csv", metavar="OUT.csv", help="write the per-step metrics here")
    parser.add_argument("--json", metavar="OUT.json", help="write the result record here")
    parser.add_argument("--seed", type=int, metavar="N",
                        help="the run's seed, recorded where the log names none (a record script's log: the "
                             "workflow's seed numbers a script variant's replicates); a log naming another is refused")


def main(args: argparse.Namespace) -> int:
    text = parse_to_files(args.log, args.csv, args.json, args.seed)
    if not (args.csv or args.json):
        sys.stdout.write(text)
    return 0
