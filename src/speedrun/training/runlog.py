"""The training log of ``speedrun train`` (docs/formats.md "Training log"; speedrun-spec.md 4.1).

Rank 0 writes, in order: ``key: value`` header lines, a line of exactly 100 ``=``, the step lines
``step:{s}/{N} val_loss:{x:.4f} train_time:{ms:.0f}ms step_avg:{ms/max(s,1):.2f}ms`` and
``step:{s}/{N} train_loss:{x:.4f} train_time:{ms:.0f}ms step_avg:{ms/s:.2f}ms``, then
``peak memory allocated: {MiB} MiB reserved: {MiB} MiB``, the ``phases: ...`` line
(:mod:`speedrun.support.phases`) and, for a run that did not complete, ``run diverged: ...`` or
``run failed: ...`` as the last line.

:class:`RunLog` writes to a temporary file beside the final path (flushed line by line, so it can be
tailed) and renames it to the final path only in :meth:`RunLog.finish`: a file under the final name is
always a whole log. The log of a run stopped by a signal goes to :func:`stopped_path` instead
(``seed0.txt.stopped``): a stopped run is not done, and Snakemake, interrupted with its jobs (Ctrl-C), does not
remove the outputs of the jobs it was running (snakemake/snakemake#1871), so a log under the final name would
stand as the run's result.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, TextIO

import torch

from speedrun.data.shards import sha256_text
from speedrun.errors import SpeedrunError

SEPARATOR = "=" * 100


def val_line(step: int, steps: int, val_loss: float, train_time_ms: float) -> str:
    """``step:s/N val_loss:... train_time:...ms step_avg:...ms``; step_avg = train_time / max(s, 1)."""
    return (f"step:{step}/{steps} val_loss:{val_loss:.4f} train_time:{train_time_ms:.0f}ms "
            f"step_avg:{train_time_ms / max(step, 1):.2f}ms")


def train_line(step: int, steps: int, train_loss: float, train_time_ms: float) -> str:
    """``step:s/N train_loss:... train_time:...ms step_avg:...ms`` for s >= 1; step_avg = train_time / s."""
    return (f"step:{step}/{steps} train_loss:{train_loss:.4f} train_time:{train_time_ms:.0f}ms "
            f"step_avg:{train_time_ms / step:.2f}ms")


def peak_memory_line(allocated_mib: int, reserved_mib: int) -> str:
    """``peak memory allocated: A MiB reserved: R MiB``."""
    return f"peak memory allocated: {allocated_mib} MiB reserved: {reserved_mib} MiB"


def peak_memory_mib(device: torch.device) -> tuple[int, int]:
    """(allocated, reserved) peak MiB: the CUDA caching allocator's peaks on a GPU, the process's peak
    resident set size (twice) on a CPU."""
    if device.type == "cuda":
        return (torch.cuda.max_memory_allocated(device) // 2**20,
                torch.cuda.max_memory_reserved(device) // 2**20)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024   # ru_maxrss is in KiB on Linux
    return rss_mib, rss_mib


def device_description(device: torch.device, world_size: int) -> str:
    """``cpu``, or ``<GPU name> x <world size>`` (the form the log parser reads)."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} x {world_size}"
    return "cpu"


def environment_lines() -> list[str]:
    """``Running Python ...``, ``Running PyTorch ... compiled for CUDA ...`` and, when installed,
    ``Running Triton version ...`` (the public logs' lines)."""
    lines = [f"Running Python {' '.join(sys.version.split())}",
             f"Running PyTorch {torch.__version__} compiled for CUDA {torch.version.cuda}"]
    if importlib.util.find_spec("triton") is not None:
        import triton

        lines.append(f"Running Triton version {triton.__version__}")
    return lines


def code_version(source: Path | None = None) -> dict[str, str]:
    """``git_commit`` (HEAD) and ``git_dirty`` (``true``/``false``: uncommitted changes) of the git work tree
    holding ``source`` (default: this package's source); empty when it is not in a work tree with a commit
    or git is missing (the log then simply lacks these lines).

    Dirty means a tracked file differs from HEAD (staged or not, deleted included): ``git status --porcelain
    --untracked-files=no``. Untracked files (a symlinked ``.venv``, a user's own config file) do not change the
    committed code, so they do not make the tree dirty; an untracked source file the run imports is not seen.
    """
    source = source or Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=30)
        if commit.returncode != 0:
            return {}
        status = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    dirty = "true" if status.returncode != 0 or status.stdout.strip() else "false"
    return {"git_commit": commit.stdout.strip(), "git_dirty": dirty}


def header_lines(fields: Mapping[str, Any]) -> list[str]:
    """``key: value`` lines in the order of ``fields``; a value must fit on one line."""
    lines = []
    for key, value in fields.items():
        text = str(value)
        if "\n" in text:
            raise ValueError(f"header value of {key!r} spans several lines")
        lines.append(f"{key}: {text}")
    return lines


def stopped_path(path: str | os.PathLike[str]) -> Path:
    """Where the log of a run stopped by a signal goes instead of ``path``: ``<path>.stopped`` (the final name
    with ``.stopped`` appended), beside it. The next run of ``path`` removes it."""
    path = Path(path)
    return path.with_name(path.name + ".stopped")


class RunLog:
    """Rank 0's log file: lines go to a temporary file beside ``path`` (and, with ``echo``, to stdout),
    flushed as they are written; :meth:`finish` renames it to ``path``. With ``path`` None nothing is
    written (the other ranks). The temporary logs that earlier runs of ``path`` left behind (``.tmp-<name>.*``:
    a run killed with SIGKILL, a lost machine) and the log of a stopped run (:func:`stopped_path`) are removed
    first: one run writes a path at a time (Snakemake locks its outputs), so a second run started by hand on the
    same ``--out`` takes the first one's away.
    """

    def __init__(self, path: str | os.PathLike[str] | None, echo: bool = True):
        self.path = Path(path) if path is not None else None
        self.echo = echo
        self._file: TextIO | None = None
        self.tmp_path: Path | None = None
        if self.path is not None:
            if self.path.is_dir():       # found now, not when the finished run's log is renamed
                raise SpeedrunError(f"{self.path}: is a folder; expected the training log's file name "
                                    "(results/train/<variant>/seed<N>.txt)")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for stale in self.path.parent.glob(f".tmp-{glob.escape(self.path.name)}.*"):
                stale.unlink(missing_ok=True)
            stopped_path(self.path).unlink(missing_ok=True)
            fd, name = tempfile.mkstemp(prefix=f".tmp-{self.path.name}.", dir=self.path.parent)
            self.tmp_path = Path(name)
            self._file = os.fdopen(fd, "w", encoding="utf-8")

    def write(self, line: str) -> None:
        """Append one line (no newline inside) and flush it."""
        if self._file is None:
            return
        self._file.write(line + "\n")
        self._file.flush()
        if self.echo:
            print(line, flush=True)

    def finish(self, stopped: bool = False) -> None:
        """Close the file, fsync it and rename it to the final path, or, with ``stopped`` (a run stopped by a
        signal), to :func:`stopped_path` of it. Raises :class:`SpeedrunError` naming the path when the rename
        fails (the temporary log is removed)."""
        if self._file is None:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        final = stopped_path(self.path) if stopped else self.path
        umask = os.umask(0)
        os.umask(umask)
        try:
            os.chmod(self.tmp_path, 0o666 & ~umask)            # mkstemp makes 0600
            os.replace(self.tmp_path, final)
        except OSError as e:                                   # no temporary log left behind
            self.tmp_path.unlink(missing_ok=True)
            raise SpeedrunError(f"{final}: cannot write the training log ({e.strerror or e})") from None
