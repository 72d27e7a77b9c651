"""The ``speedrun`` command: one subcommand per pipeline stage.

Each stage module exposes ``add_arguments(parser)`` and ``main(args) -> int``; this file only
builds the argument parser and dispatches. Stage modules are imported lazily, so ``speedrun stats``
never imports torch. A :class:`~speedrun.errors.SpeedrunError` is printed as one line
(``speedrun <stage>: error: ...``) and the command exits with status 2; so is an :class:`OSError` that names a
path (an output folder that is a file, a read-only file system: the path and the OS's reason). Any other
exception keeps its traceback: it is a bug. A closed stdout (``speedrun stats DIR --json | head -1``) ends the
command quietly with status 141, as a Unix tool ended by SIGPIPE (:func:`closed_stdout`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from pathlib import Path
from typing import Sequence

from speedrun import __version__
from speedrun.errors import SpeedrunError

# subcommand -> (module, one-line help). Order is the pipeline's order.
STAGES: dict[str, tuple[str, str]] = {
    "download": ("speedrun.download", "fetch one file of a Hugging Face dataset (FineWeb parquet or shard), checked"),
    "corpus": ("speedrun.corpus", "write the embedded corpus as documents (parquet, a `text` column)"),
    "tokenize": ("speedrun.tokenize", "GPT-2 tokenize documents into .bin shards (validation shard first)"),
    "bos-index": ("speedrun.bos_index", "write the BOS (token 50256) positions of every shard"),
    "train": ("speedrun.train", "train one (variant, seed) run; launch under torchrun for several processes"),
    "run-script": ("speedrun.run_script", "run a record's own script under torchrun, keep its log"),
    "parse": ("speedrun.parse", "parse a training log (ours or a public record's) into metrics and a result"),
    "stats": ("speedrun.stats", "statistics of groups of runs: t-test against the target, times"),
    "compare": ("speedrun.compare", "baseline against candidate: Welch t-tests, differences with CIs"),
    "bundle": ("speedrun.bundle", "a ready-to-submit record folder: logs, statistics.md per side, README table"),
    "report": ("speedrun.report", "plots and tables of an experiment for results/report/"),
}
ALIASES = {"bos_index": "bos-index"}
# The first line of the module docstring, without its reStructuredText markup (``speedrun``): `--help` is plain text.
DESCRIPTION = __doc__.splitlines()[0].replace("``", "")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="speedrun", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"speedrun {__version__}")
    sub = parser.add_subparsers(dest="stage", metavar="STAGE")
    subparsers = {}
    for name, (_, help_text) in STAGES.items():
        aliases = [a for a, target in ALIASES.items() if target == name]
        subparsers[name] = sub.add_parser(name, help=help_text, description=help_text, aliases=aliases)
    return parser, subparsers


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stage named in ``argv`` (default ``sys.argv[1:]``); return the exit status: the stage's, 2 for
    a :class:`SpeedrunError` or an OS error about a path, 141 when stdout was closed by its reader."""
    try:
        status = _run(argv)
        sys.stdout.flush()              # output to a pipe is buffered: a reader that left shows here, not at exit
        return status
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise                       # a socket or another pipe: a real failure, with its traceback
        return closed_stdout()


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (Linux and macOS report POLLERR on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):   # no poll (Windows), no file descriptor behind stdout
        return False


# 128 + SIGPIPE (13): what a shell reports for a Unix tool (cat, grep) whose reader closed the pipe.
CLOSED_STDOUT_STATUS = 141


def closed_stdout() -> int:
    """Stop writing to a stdout whose reader has gone (``| head``): point stdout at /dev/null, so that the
    interpreter's final flush does not fail again, and return :data:`CLOSED_STDOUT_STATUS` (141, the status of
    a tool killed by SIGPIPE; Python ignores SIGPIPE, hence the error). The recipe of the Python docs, "Note on
    SIGPIPE" (library/signal.html), which exits with 1; 141 lets ``set -o pipefail`` scripts treat speedrun as
    they treat the other tools of a pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return CLOSED_STDOUT_STATUS


def _run(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, subparsers = build_parser()
    # Find the stage first so that only its module (and its imports) are loaded.
    stage = next((a for a in argv if not a.startswith("-")), None)
    stage = ALIASES.get(stage, stage)
    if stage in STAGES:
        module = importlib.import_module(STAGES[stage][0])
        module.add_arguments(subparsers[stage])
    args = parser.parse_args(argv)
    if args.stage is None:
        parser.print_help()
        return 2
    stage = ALIASES.get(args.stage, args.stage)
    try:
        return int(module.main(args) or 0)
    except SpeedrunError as e:
        print(f"speedrun {stage}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.filename is None:       # not about a path the user named: a bug, keep its traceback
            raise
        print(f"speedrun {stage}: error: {os_error_message(e)}", file=sys.stderr)
        return 2


def os_error_message(e: OSError) -> str:
    """One line for an OS error about a path (an output folder that is a file, a read-only file system...):
    the path and the OS's reason, with the file that is in the way when a folder cannot be made."""
    path = os.fsdecode(e.filename)
    reason = e.strerror or str(e)
    if isinstance(e, FileExistsError) and not os.path.isdir(path):
        return f"{path}: exists and is not a folder ({reason})"
    if isinstance(e, NotADirectoryError):
        blocker = next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            return f"{path}: {blocker} is a file, not a folder ({reason})"
    if isinstance(e, IsADirectoryError):
        return f"{path}: is a folder, expected a file name ({reason})"
    return f"{path}: {reason}"
