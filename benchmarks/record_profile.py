"""Profile a record's own train_gpt.py the way ``gpu_speedrun.py --profile`` profiles ours (issue 20: where the
step-time gap between our record preset and the record's code lies, kernel by kernel).

Two parts:

    python benchmarks/record_profile.py patch SRC/train_gpt.py DST/train_gpt.py
        copies a record's script (already through ../shared/reference-code/tools/patch_schedule.py, or not)
        with one line added as the first statement of its training loop, ``for step in range(train_steps +
        1):`` (records #83-#89 and HEAD): ``__import__("record_profile").at_step(step)``. Nothing else changes.
        Fails, naming the file, when the loop is not there exactly once.

    RECORD_PROFILE_STEPS=FIRST,COUNT RECORD_PROFILE_OUT=PREFIX  (environment of the patched script's run, with
    this folder and ../src on PYTHONPATH)
        :func:`at_step` starts torch.profiler (CPU and CUDA) at the top of step FIRST and stops it at the top of
        step FIRST + COUNT, CUDA-synchronized at both ends, so that the trace holds COUNT whole training steps
        (micro-batches, backward, optimizer step, the record's FP8 weight refresh) and no validation when no
        multiple of the record's val_loss_every lies in between. It writes ``PREFIX.txt`` (the operator
        table), ``PREFIX.kernels.md`` (:func:`gpu_speedrun.kernel_summary`: kernels per step, GPU busy time,
        time by kernel kind, the top kernels) and ``PREFIX.trace.json.gz``: the same files, in the same
        format, as our ``<name>.profile.*``. Unset, it does nothing. Only rank 0 profiles.

``bash benchmarks/parity.sh reference-profile RECORD`` runs it on the parity schedule (steps 3 and 4 of the
first stage by default).
"""

from __future__ import annotations

import functools
import gzip
import os
import re
import shutil
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

LOOP = re.compile(r"^(?P<indent>[ \t]*)for step in range\(train_steps \+ 1\):[ \t]*$", re.M)
HOOK = '__import__("record_profile").at_step(step)'


def patch(src: Path, dst: Path) -> None:
    """Write ``src`` to ``dst`` with :data:`HOOK` as the first statement of the training loop. Raises
    ``SystemExit`` naming ``src`` unless the loop's line occurs exactly once."""
    text = src.read_text(encoding="utf-8")
    loops = list(LOOP.finditer(text))
    if len(loops) != 1:
        raise SystemExit(f"{src}: expected one line 'for step in range(train_steps + 1):', found {len(loops)}")
    loop = loops[0]
    body_indent = re.match(r"[ \t]*", text[loop.end() + 1:]).group(0)
    patched = text[:loop.end() + 1] + f"{body_indent}{HOOK}\n" + text[loop.end() + 1:]
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(patched, encoding="utf-8")


class _Profile:
    """The profiler between steps ``first`` and ``first + count`` of one run."""

    def __init__(self, first: int, count: int, prefix: Path):
        self.first, self.count, self.prefix = first, count, prefix
        self.cuda = torch.cuda.is_available()
        self.prof = None
        self.start = 0.0

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def at_step(self, step: int) -> None:
        if step == self.first:
            self._sync()
            self.prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else []))
            self.prof.__enter__()
            self.start = time.perf_counter()
        elif step == self.first + self.count and self.prof is not None:
            self._sync()
            wall_ms = (time.perf_counter() - self.start) * 1000
            self.prof.__exit__(None, None, None)
            self._write(wall_ms)
            self.prof = None

    def _write(self, wall_ms: float) -> None:
        from gpu_speedrun import kernel_summary          # on the run's PYTHONPATH (benchmarks/), see the docstring

        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{self.prefix}.txt").write_text(self.prof.key_averages().table(
            sort_by="cuda_time_total" if self.cuda else "cpu_time_total", row_limit=40, max_name_column_width=80))
        trace = Path(f"{self.prefix}.trace.json")
        self.prof.export_chrome_trace(str(trace))
        summary = kernel_summary(trace, wall_ms, self.count)
        Path(f"{self.prefix}.kernels.md").write_text(summary)
        print(summary, flush=True)
        with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()


@functools.cache
def _from_environment() -> _Profile | None:
    """The profile that RECORD_PROFILE_STEPS and RECORD_PROFILE_OUT ask for on this rank, or None (one per
    process: cached). Raises ``SystemExit`` on a malformed RECORD_PROFILE_STEPS."""
    steps = os.environ.get("RECORD_PROFILE_STEPS")
    if not steps or int(os.environ.get("RANK", "0")) != 0:
        return None
    match = re.fullmatch(r"(\d+),(\d+)", steps)
    if not match or int(match.group(2)) < 1:
        raise SystemExit(f"RECORD_PROFILE_STEPS must be FIRST,COUNT with COUNT >= 1, got {steps!r}")
    prefix = Path(os.environ.get("RECORD_PROFILE_OUT", "record.profile"))
    return _Profile(int(match.group(1)), int(match.group(2)), prefix)


def at_step(step: int) -> None:
    """The hook the patched script calls at the top of every step (see the module docstring); the environment
    is read at the first call."""
    prof = _from_environment()
    if prof is not None:
        prof.at_step(step)


def main(argv: list[str]) -> None:
    if len(argv) != 3 or argv[0] != "patch":
        raise SystemExit("usage: record_profile.py patch SRC/train_gpt.py DST/train_gpt.py")
    patch(Path(argv[1]), Path(argv[2]))


if __name__ == "__main__":
    main(sys.argv[1:])
