"""Where a training run's wall time goes, from its process's start to its log's end: :class:`RunPhases`, which
measures it, and the log's ``phases:`` line, which records it (docs/formats.md "Training log").

The line, written by ``speedrun train`` after ``peak memory ...`` and before a ``run diverged/failed`` line::

    phases: startup:3.412s device:0.001s data:0.052s process_group:0.000s model:0.031s optimizer:0.004s
    compile:0.000s training:4.218s validation:1.302s teardown:0.001s wall:9.204s validations:4 first_batch:0.012s
    first_step:3.822s

(one line). The phases of :data:`PHASES` are disjoint intervals of the process's life, in seconds:

* ``startup``: from the process's start to the training function's entry: the interpreter, the imports (torch),
  the arguments and the config;
* ``device``: the launch check, the GPU preflight and the device's set-up (CUDA's initialization on a GPU);
* ``data``: the shards and BOS indices (memory maps, manifest checks, the validation shard's sha256), the check
  that they feed the run, the loader's set-up and the validation batches copied to the device;
* ``process_group``: ``init_process_group`` (0 for one process);
* ``model``: the model's build, its move to the device, the rank-0 broadcast and the ``torch.compile`` wrapper;
* ``optimizer``: the optimizers' build;
* ``compile``: the compile and warm-up (the header's ``compile_s``, 0 without compile);
* ``training``: the run's ``train_time`` (the record's metric, its definition unchanged: training wall time with
  the clock stopped around validation);
* ``validation``: every validation of the run together (``validations`` of them), the val line's write included;
* ``teardown``: after the last step: the prefetching thread's stop and ``destroy_process_group``.

``wall`` is the process's age when the line is written; ``wall`` minus the sum of the phases is what no phase
covers (the header's git calls, the log's writes during training; :func:`other_seconds`). Two more items are
not phases: ``first_batch``, the wait for step 0's micro-batches, *inside* ``training``; ``first_step``, the
process's age when the first timed step starts (after the step-0 validation): issue 21 asks it to be at most
``compile`` + 10 s with a warm compile cache. What follows the line (the
log's rename, the interpreter's exit, torchrun's own start and end) is outside ``wall``.

The process's start (:func:`process_start`) is the kernel's start time of the process on Linux
(``/proc/self/stat`` field 22, in clock ticks, 10 ms; for a torchrun worker: the worker's own start, not
torchrun's); elsewhere, or if that cannot be read, the moment this module was imported (first of all by
:mod:`speedrun.train`, before torch), which misses the interpreter's own start and the CLI's parsing.

No torch here: the parser (:mod:`speedrun.analysis.logs`) reads the line with the same module that writes it.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Callable, Iterator, Mapping

# The moment of the import on time.perf_counter's clock: the fallback start (module docstring).
IMPORTED_AT = time.perf_counter()

PHASES: tuple[str, ...] = ("startup", "device", "data", "process_group", "model", "optimizer", "compile",
                           "training", "validation", "teardown")
PREFIX = "phases: "
_ITEM_RE = re.compile(r"([a-z_]+):(\d+(?:\.\d*)?)(s?)")


def process_start(stat_path: str = "/proc/self/stat") -> float:
    """This process's start on ``time.perf_counter``'s clock (seconds; module docstring): from the kernel's
    start time in ``stat_path`` against ``CLOCK_BOOTTIME`` (the clock it is counted on), or
    :data:`IMPORTED_AT` where that is not available or gives an age that is negative or later than the import."""
    now = time.perf_counter()
    try:
        with open(stat_path, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()         # the name, in parentheses, may hold spaces
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, AttributeError):   # no /proc (macOS), no CLOCK_BOOTTIME
        return IMPORTED_AT
    start = now - age
    return start if 0 <= age and start <= IMPORTED_AT else IMPORTED_AT


class RunPhases:
    """The seconds of each phase of :data:`PHASES` of this process, measured with ``time.perf_counter``.

    Built when the training function starts: ``startup`` is then the process's age (``start``, default
    :func:`process_start`). ``sync`` waits for the device's queued work (``torch.cuda.synchronize`` on a GPU,
    set once the device is known) and is called at the end of every :meth:`timed` interval, so that a phase's
    GPU work is not counted in the next one.
    """

    def __init__(self, start: float | None = None, sync: Callable[[], None] = lambda: None):
        self.start = process_start() if start is None else start
        self.sync = sync
        self.seconds: dict[str, float] = {"startup": time.perf_counter() - self.start}
        self.validations = 0
        self.first_batch: float | None = None
        self.first_step: float | None = None

    def mark_first_step(self) -> None:
        """Note the process's age now as ``first_step`` (module docstring), once."""
        if self.first_step is None:
            self.first_step = time.perf_counter() - self.start

    def add(self, phase: str, seconds: float) -> None:
        """Add ``seconds`` to ``phase`` (one of :data:`PHASES`; ValueError otherwise)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; expected one of {', '.join(PHASES)}")
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Count the time inside the ``with`` block (device work included: :attr:`sync`) in ``phase``, also
        when the block raises."""
        begin = time.perf_counter()
        try:
            yield
        finally:
            try:
                self.sync()
            finally:
                self.add(phase, time.perf_counter() - begin)

    def line(self) -> str:
        """The log's ``phases:`` line (module docstring): every phase (0 for one not reached), ``wall`` (the
        process's age now), ``validations`` and, when measured, ``first_batch`` and ``first_step``; seconds to
        the millisecond."""
        wall = time.perf_counter() - self.start
        items = [f"{p}:{self.seconds.get(p, 0.0):.3f}s" for p in PHASES]
        items += [f"wall:{wall:.3f}s", f"validations:{self.validations}"]
        if self.first_batch is not None:
            items.append(f"first_batch:{self.first_batch:.3f}s")
        if self.first_step is not None:
            items.append(f"first_step:{self.first_step:.3f}s")
        return PREFIX + " ".join(items)


def parse_phases(line: str) -> tuple[dict[str, float], int | None]:
    """The seconds (``name`` -> s: the phases, ``wall``, ``first_batch``, ``first_step`` and any other
    ``name:<x>s`` item)
    and the ``validations`` count of a ``phases:`` line (:meth:`RunPhases.line`).

    Raises:
        ValueError: an item that is not ``name:<seconds>s`` or ``validations:<int>``, or a line without ``wall``.
    """
    seconds, count = {}, None
    for item in line.removeprefix(PREFIX).split():
        m = _ITEM_RE.fullmatch(item)
        if m and m.group(1) == "validations" and not m.group(3) and "." not in m.group(2):
            count = int(m.group(2))
        elif m and m.group(3) == "s":
            seconds[m.group(1)] = float(m.group(2))
        else:
            raise ValueError(f"item {item!r}: expected name:<seconds>s (phases, wall, first_batch) or "
                             "validations:<count>")
    if "wall" not in seconds:
        raise ValueError("no wall:<seconds>s item")
    return seconds, count


def other_seconds(seconds: Mapping[str, float]) -> float:
    """``wall`` minus the sum of the phases of :data:`PHASES` (what no phase covers), in seconds."""
    return seconds["wall"] - sum(seconds.get(p, 0.0) for p in PHASES)


def overhead_seconds(seconds: Mapping[str, float]) -> float:
    """A run's overhead: ``wall - training - compile`` (s): what the process spent besides the timed training
    and the compile, i.e. start-up, data, builds, validation and teardown (issue 21)."""
    return seconds["wall"] - seconds.get("training", 0.0) - seconds.get("compile", 0.0)
