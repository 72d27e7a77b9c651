"""Stage ``bundle``: a ready-to-submit record folder in the public records' layout.

``speedrun bundle --baseline PATH --candidate PATH --out DIR [--target 3.28] [--alpha 0.01] [--title TEXT]
[--split-code] [--only FILE...]``

The command line over :func:`speedrun.analysis.bundle_folder.build_bundle` (the folder's layout, how the logs
are found and checked, the statistics of the copied logs); the lines of the README that name files left out
of a side's folder are printed.
"""

from __future__ import annotations

import argparse

from speedrun.analysis.bundle_folder import build_bundle
from speedrun.analysis.options import (add_group_test_options, add_side_description_options,
                                      check_group_test_options, code_split, side_descriptions)
from speedrun.support.atomic import printable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", required=True, metavar="PATH",
                        help="baseline runs: a directory of logs or parsed-run .json files, or one file")
    parser.add_argument("--candidate", required=True, metavar="PATH", help="candidate runs, as --baseline")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="the bundle folder to create (must not exist, or be an empty folder)")
    parser.add_argument("--title", help="the README's title (default: '<candidate dir> vs <baseline dir>')")
    add_group_test_options(parser, paths="--baseline and --candidate", sides=True)
    add_side_description_options(parser)


def main(args: argparse.Namespace) -> int:
    check_group_test_options(args)
    out = build_bundle(args.baseline, args.candidate, args.out, target=args.target, alpha=args.alpha,
                       title=args.title, code_split=code_split(args), only=args.only,
                       announce=lambda line: print(printable(line)), sides=side_descriptions(args))
    print(f"bundle written to {out}")
    return 0
