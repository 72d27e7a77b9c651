"""``speedrun train``: one (variant, seed) training run of the speedrun GPT, with its training log.

The command's arguments and :func:`main`; the run itself is :func:`speedrun.training.loop.run_training`
(standalone, or under ``torchrun --standalone --nproc_per_node=N --no-python speedrun train ...``).

Phases: the log's ``phases:`` line counts from the process's start (the kernel's start time on Linux, else
the import of :mod:`speedrun.support.phases`, imported here before torch; :func:`speedrun.support.phases.process_start`).

Stopping (the command, :func:`main`): a signal or the launcher's end stops the run through
:mod:`speedrun.support.stopping`; the log ends with ``run failed: terminated by SIGTERM`` (or ``interrupted by
SIGINT``) and is renamed to ``<--out>.stopped``, not to ``--out`` (a stopped run is not done: the workflow's
next call runs it again; :func:`speedrun.training.runlog.stopped_path`), and the command exits with 128 + the
signal.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from speedrun.support.stopping import die_with_parent, run_until_stopped  # first: before torch's import
from speedrun.support.phases import IMPORTED_AT  # noqa: F401  (first too: the start where /proc is missing)

import torch

from speedrun.errors import SpeedrunError
from speedrun.training.compile_cache import use_compile_cache
from speedrun.training.config import TrainConfig, load_config_argument
from speedrun.training.loop import run_training
from speedrun.training.preflight import GpuRequirement


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True,
                        help="training settings: a JSON object, or a JSON/YAML file holding one")
    parser.add_argument("--variant", required=True, help="variant name (written to the log header)")
    parser.add_argument("--seed", required=True, type=int, help="seed of the initialization (0 to 2**64 - 1)")
    parser.add_argument("--shards-dir", required=True, help="the tokenize stage's folder (manifest.json)")
    parser.add_argument("--bos-dir", required=True, help="the bos_index stage's folder (one .npy per shard)")
    parser.add_argument("--out", dest="log", required=True,
                        help="the training log to write (written under a temporary name, renamed at the end)")
    parser.add_argument("--gpu-model", default="",
                        help="text every GPU's name must contain (config.yaml cluster.gpu_model; default: any)")
    parser.add_argument("--gpu-memory-gib", type=float, default=0.0,
                        help="least memory per GPU in GiB (config.yaml cluster.gpu_memory_gib; default: any)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads per process (default: torch's, i.e. OMP_NUM_THREADS)")
    parser.add_argument("--compile-cache", type=Path, default=None,
                        help="folder of the persistent Inductor and Triton caches shared by every run (a run "
                             "that compiles the same graphs with the same code and versions reuses them)")



MAX_SEED = 2**64 - 1                      # torch.manual_seed takes 0 .. 2**64 - 1


def main(args: argparse.Namespace) -> int:
    """``speedrun train``: returns 0 for a complete or diverged run, :attr:`RunStopped.exit_status` (143, 130)
    for one stopped by a signal or by its launcher's end (module docstring, "Stopping"). Raises
    :class:`SpeedrunError` (``speedrun train: error: ...``, status 2) for a bad argument, config or data."""
    if not 0 <= args.seed <= MAX_SEED:
        raise SpeedrunError(f"--seed must be from 0 to {MAX_SEED} (2**64 - 1, torch.manual_seed's range), "
                            f"got {args.seed}")
    return run_until_stopped("train", lambda: _train_with_launcher(args))


def _train_with_launcher(args: argparse.Namespace) -> None:
    """:func:`_train`, stopped when the launcher ends (:func:`speedrun.support.stopping.die_with_parent`)."""
    with die_with_parent() as unprotected:
        if unprotected:
            print(f"speedrun train: note: {unprotected}", file=sys.stderr)
        _train(args)


def _train(args: argparse.Namespace) -> None:
    config = TrainConfig.from_dict(load_config_argument(args.config))
    if args.threads is not None:
        if args.threads < 1:
            raise SpeedrunError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.compile_cache is not None:
        use_compile_cache(args.compile_cache, os.environ)
    run_training(config, variant=args.variant, seed=args.seed, shards_dir=args.shards_dir,
                 bos_dir=args.bos_dir, log_path=args.log,
                 gpus=GpuRequirement(args.gpu_model, args.gpu_memory_gib))
