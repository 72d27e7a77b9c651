"""One run of a script variant: a record's own ``train_gpt.py`` (or any script) under torchrun, its log kept
(issue 21, item 2; the stage ``speedrun run-script``, :mod:`speedrun.run_script`, is its command line).

The script and its companion files (e.g. taken out of a record's log by :func:`script_from_log`, through
:mod:`speedrun.analysis.record_code`) are copied into the run's folder and started there under
``torchrun --standalone --nproc_per_node=<world size>`` (:func:`run_script`), with

- the shards of ``results/shards/<name>/`` (read through its ``manifest.json``) laid out as the records read
  them (:func:`lay_out_shards`): ``<run-dir>/data/fineweb10B/fineweb_val_000000.bin``,
  ``fineweb_train_000001.bin``, ..., symbolic links to our shards, never copies, and ``DATA_PATH`` set to the
  run's folder;
- ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` under the variant's cache folder, shared by the
  variant's runs so that only the first pays the record's compile (:func:`script_environment`);
- the variant's ``NAME=VALUE`` settings.

The script writes its own log, ``logs/<uuid>.txt`` in its working directory (records #1-#89); that file, the
one new ``.txt`` there, is the run's log, copied to the output, where the parse stage reads it as any record's.
A record script draws its own initialization, so each seed of a script variant is a replicate.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from speedrun.analysis.logs import sniff_format
from speedrun.analysis.record_code import MAIN_SCRIPT, record_code
from speedrun.errors import SpeedrunError
from speedrun.support.atomic import write_text
from speedrun.support.stopping import request_parent_death_signal

RECORD_DATA = Path("data/fineweb10B")


def lay_out_shards(shards_dir: str | os.PathLike[str], data_root: str | os.PathLike[str]) -> list[Path]:
    """Link the shards listed in ``shards_dir/manifest.json`` into ``data_root/data/fineweb10B/`` under the
    records' names (``fineweb_val_000000.bin``, then ``fineweb_train_<i:06d>.bin`` from 1, manifest order);
    return the links. Raises :class:`SpeedrunError` for a missing manifest or shard."""
    shards_dir = Path(shards_dir)
    manifest_path = shards_dir / "manifest.json"
    if not manifest_path.is_file():
        raise SpeedrunError(f"{manifest_path}: no shard manifest (the tokenize stage writes it)")
    folder = Path(data_root) / RECORD_DATA
    folder.mkdir(parents=True, exist_ok=True)
    links, train = [], 0
    for entry in json.loads(manifest_path.read_text())["shards"]:
        source = (shards_dir / entry["file"]).resolve()
        if not source.is_file():
            raise SpeedrunError(f"{source}: a shard of {manifest_path} is missing")
        if entry["split"] == "val":
            name = "fineweb_val_000000.bin"
        else:
            train += 1
            name = f"fineweb_train_{train:06d}.bin"
        link = folder / name
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(source, link)
        links.append(link)
    return links


def script_environment(base: Mapping[str, str], run_dir: Path, cache_dir: Path,
                       settings: Mapping[str, str]) -> dict[str, str]:
    """The script's environment: ``base`` with DATA_PATH (the run's folder), the shared Inductor and Triton
    caches under ``cache_dir`` and the variant's ``settings`` (which win)."""
    env = dict(base)
    env.update(DATA_PATH=str(run_dir.resolve()), TORCHINDUCTOR_CACHE_DIR=str((cache_dir / "inductor").resolve()),
               TRITON_CACHE_DIR=str((cache_dir / "triton").resolve()))
    env.update(settings)
    return env


def script_from_log(log: Path, run_dir: Path) -> Path:
    """Write the script and companion files of the record log ``log`` (:func:`~speedrun.analysis.record_code.
    record_code`) into ``run_dir``; return the script's path there. Raises :class:`SpeedrunError` for a
    missing log or one without code."""
    if not log.is_file():
        raise SpeedrunError(f"{log}: a script variant's record log is missing")
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, body in record_code(log.read_text(encoding="utf-8"), str(log)).items():
        write_text(run_dir / name, body)
    return run_dir / MAIN_SCRIPT


def run_script(script: Path, files: Sequence[Path], shards_dir: Path, run_dir: Path, world_size: int,
               cache_dir: Path, settings: Mapping[str, str], out: Path) -> Path:
    """Run ``script`` (with its companion ``files``) as described in the module docstring; copy its log to
    ``out`` and return ``out``. A script already in ``run_dir`` (:func:`script_from_log`) runs where it is.
    Raises :class:`SpeedrunError` for a missing file, a script that exits non-zero (its status and torchrun's
    output file named), one that leaves no new ``logs/*.txt``, or several, or one that is no training log."""
    if world_size < 1:
        raise SpeedrunError(f"world_size must be >= 1, got {world_size}")
    for path in (script, *files):
        if not path.is_file():
            raise SpeedrunError(f"{path}: a script variant's file is missing")
    run_dir.mkdir(parents=True, exist_ok=True)
    for path in (script, *files):
        if path.resolve() != (run_dir / path.name).resolve():
            shutil.copyfile(path, run_dir / path.name)
    lay_out_shards(shards_dir, run_dir)
    (cache_dir / "inductor").mkdir(parents=True, exist_ok=True)
    (cache_dir / "triton").mkdir(parents=True, exist_ok=True)
    logs = run_dir / "logs"
    before = set(logs.glob("*.txt")) if logs.is_dir() else set()
    output = run_dir / "torchrun.out"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
               script.name]
    with open(output, "w") as stream:
        status = subprocess.run(command, cwd=run_dir, env=script_environment(os.environ, run_dir, cache_dir,
                                                                              settings),
                                stdout=stream, stderr=subprocess.STDOUT, preexec_fn=_die_with_this_stage).returncode
    new = sorted(set(logs.glob("*.txt")) - before) if logs.is_dir() else []
    if status != 0:
        child = script_exit_status(output.read_text(encoding="utf-8", errors="replace"))
        which = (f"{script.name} exited with status {child} (torchrun: {status})" if child is not None
                 else f"torchrun exited with status {status} running {script.name}")
        raise SpeedrunError(f"{which} (its output: {output})")
    if len(new) != 1:
        raise SpeedrunError(f"{script.name} left {len(new)} new logs in {logs} (expected one logs/<uuid>.txt)")
    text = new[0].read_text(encoding="utf-8")
    if sniff_format(text.encode("utf-8")) is None:      # as the run's log, parse would refuse it at every call
        raise SpeedrunError(f"{script.name} left {new[0]}, which is not a training log (expected the records' "
                            "format: the code, a line of 100 '=', then step:<s>/<N> lines; speedrun-spec.md section 4)")
    write_text(out, text)
    return out


def script_exit_status(torchrun_output: str) -> int | None:
    """The exit status of the first failed process in torchrun's output (its ``ChildFailedError`` report:
    ``exitcode  : 3 (pid: ...)``; negative for a signal), or None where the output reports none: torchrun itself
    exits with 1 whatever its child's status."""
    found = re.search(r"^\s*exitcode\s*:\s*(-?\d+)", torchrun_output, flags=re.MULTILINE)
    return int(found.group(1)) if found else None


def _die_with_this_stage() -> None:
    """In the torchrun child before it execs: SIGTERM when this stage's process ends (Linux; elsewhere a
    no-op), as the train rule's torchrun dies with its launcher."""
    request_parent_death_signal(signal.SIGTERM)
