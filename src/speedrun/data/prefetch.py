"""Training batches one step ahead, off the critical path: a background thread plans, copies and pins the
next step's micro-batches while the GPU runs the current one (speedrun-spec.md 1.3: the public loader reads
and indexes the next shard in threads and copies host-to-device with ``non_blocking=True`` from pinned
memory, records #33 and later).

The thread draws steps 0, 1, 2, ... in order from a :class:`speedrun.data.loader.TrainBatches`, each with
the batch shape the schedule gives it, so the token stream is exactly the one the loop would draw itself; the
main thread takes them with :meth:`StepPrefetcher.get` in the same order. An error in the thread (the shards
run out, say) is raised by the ``get`` of the step that hit it.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

import torch

from speedrun.data.loader import DOC_SLOT_MULTIPLE, TrainBatches, host_tensors

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
_DONE = object()


class StepPrefetcher:
    """This rank's micro-batches of each step, prepared ``depth`` steps ahead in a daemon thread.

    Args:
        batches: the loader; only this object's thread draws from it once started.
        steps: steps to prepare (0 .. steps-1).
        shape_at: step -> (micro_batch_tokens T, max_seq_len) of that step (the batch-size schedule).
        micro_batches, rank, world_size: as :meth:`TrainBatches.next_step`.
        device: where :meth:`get` puts the tensors; on CUDA the host copies are pinned and the transfers
            non-blocking.
        depth: steps held ready (>= 1).

    :meth:`get` returns a list of ``(inputs (T,) int32, targets (T,) int64, cu_seqlens (S,) int32)`` on
    ``device`` (cu_seqlens padded as :func:`speedrun.data.loader.to_torch` does). Use as a context manager,
    or call :meth:`close`, to stop the thread.
    """

    def __init__(self, batches: TrainBatches, steps: int, shape_at: Callable[[int], tuple[int, int]],
                 micro_batches: int, rank: int, world_size: int, device: torch.device, depth: int = 2,
                 doc_slot_multiple: int = DOC_SLOT_MULTIPLE):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.device = torch.device(device)
        self._args = (batches, steps, shape_at, micro_batches, rank, world_size, doc_slot_multiple)
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._next = 0
        self._thread = threading.Thread(target=self._work, name="speedrun-prefetch", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        batches, steps, shape_at, micro_batches, rank, world_size, slots = self._args
        pin = self.device.type == "cuda"
        for step in range(steps):
            try:
                shape = shape_at(step)
                if shape != (batches.micro_batch_tokens, batches.max_seq_len):
                    batches.set_batch(*shape)
                mine = batches.next_step(micro_batches, rank, world_size)
                item = [host_tensors(mb, pin, slots) for mb in mine]
            except BaseException as e:          # handed to the main thread, raised by get()
                item = e
            if not self._put((step, item)) or isinstance(item, BaseException):
                return
        self._put((steps, _DONE))

    def _put(self, item: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def get(self, step: int) -> list[Batch]:
        """The micro-batches of ``step`` on the device. Steps must be asked for in order 0, 1, 2, ...
        Raises ``ValueError`` for a step out of order or beyond ``steps``, and re-raises the thread's error
        (e.g. :class:`speedrun.errors.SpeedrunError` when the shards run out)."""
        if step != self._next:
            raise ValueError(f"steps must be taken in order: expected step {self._next}, got {step}")
        got, item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        if item is _DONE:
            raise ValueError(f"step {step} is beyond the {got} steps this prefetcher prepares")
        self._next += 1
        blocking = self.device.type != "cuda"
        return [tuple(t.to(self.device, non_blocking=not blocking) for t in tensors) for tensors in item]

    def close(self) -> None:
        """Stop the thread (it ends at its next queue operation) and wait for it."""
        self._stop.set()
        self._thread.join(timeout=5.0)

    def __enter__(self) -> "StepPrefetcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
