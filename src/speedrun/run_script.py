"""Stage ``speedrun run-script``: one run of a script variant, a record's own ``train_gpt.py`` (issue 21, item 2).

``speedrun run-script (--script PATH [--files PATH...] | --log PATH) --shards-dir DIR --run-dir DIR
[--world-size N] --cache-dir DIR [--env NAME=VALUE...] --out FILE``

The command line over :func:`speedrun.training.record_script.run_script` (the run's folder, the shards laid out
as the records read them, the shared compile cache, torchrun, the script's own log copied to ``--out``) and
:func:`~speedrun.training.record_script.script_from_log` (``--log``: the script and companion files taken out
of a record's log). A record script draws its own initialization, so each seed of a script variant is a
replicate.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from speedrun.errors import SpeedrunError
from speedrun.support.arguments import name_value_pairs
from speedrun.training.record_script import run_script, script_from_log


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--script", type=Path, help="the record's train_gpt.py (or any script)")
    source.add_argument("--log", type=Path, help="a record's log: its script and companion files are taken out")
    parser.add_argument("--files", type=Path, nargs="*", default=[], help="companion files copied beside --script")
    parser.add_argument("--shards-dir", type=Path, required=True, help="results/shards/<name> (with manifest)")
    parser.add_argument("--run-dir", type=Path, required=True, help="the script's working directory")
    parser.add_argument("--world-size", type=int, default=1, help="torchrun --nproc_per_node")
    parser.add_argument("--cache-dir", type=Path, required=True, help="Inductor/Triton caches, shared by a variant")
    parser.add_argument("--env", nargs="*", default=[], help="NAME=VALUE settings of the variant")
    parser.add_argument("--out", type=Path, required=True, help="where the script's own log is copied")


def main(args: argparse.Namespace) -> int:
    """``speedrun run-script``: 0 when the script ran and its log is at ``--out``. Raises
    :class:`SpeedrunError` (status 2) as :func:`run_script` and :func:`script_from_log`, and for ``--files``
    beside ``--log``."""
    settings = name_value_pairs(args.env, "--env")
    if args.log is not None:
        if args.files:
            raise SpeedrunError("--files: not with --log (the companion files are taken out of the log)")
        script = script_from_log(args.log, args.run_dir)
    else:
        script = args.script
    run_script(script, args.files, args.shards_dir, args.run_dir, args.world_size, args.cache_dir, settings,
               args.out)
    print(f"wrote {args.out}")
    return 0
