"""GPT-2 encoding of document batches on every core, in document order.

A batch of texts becomes one uint16 array ``[50256] + encode_ordinary(text)`` per text, concatenated: the
token stream of modded-nanogpt ``data/fineweb.py`` (speedrun-spec.md section 1.2). :class:`EncoderPool`
encodes batches on worker processes and yields the arrays in submission order, so the bytes never depend on
the number of workers.

Why processes and ``encode_to_numpy``: tiktoken's ``encode_ordinary_batch`` runs threads, but they hold the
GIL while each token list becomes Python ints, and the public script's pool returns one list per document
through a pipe. Here each worker encodes a whole batch with ``encode_to_numpy(text, disallowed_special=())``
(tiktoken's own equivalence: ``encode_ordinary(text) == encode(text, disallowed_special=())``; special-token
strings inside a text stay plain text) and sends back one array of 2 bytes per token. At most ``2 x workers``
batches are in flight, so memory stays bounded however large the input.

Stopping: the workers ignore SIGINT and SIGTERM, so a Ctrl-C (SIGINT to the whole process group) or a SIGTERM
to every process of a job (Slurm's ``scancel``, a container's stop) leaves them to the parent, whose handler
(:func:`speedrun.support.stopping.stop_on_signals` in ``speedrun tokenize``) stops the run with one line and no worker
traceback. Leaving the pool (``__exit__``, on success, error or stop) closes it: the workers finish the at most
``2 x workers`` batches in flight and exit, so none is killed while it holds the pool's task-queue lock (the
deadlock of ``Pool.terminate`` after a worker died holding it). The two signals are blocked while the workers
start, so none lands between a fork and the worker's own handlers. On Linux a worker dies with its parent
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``, as :func:`speedrun.support.stopping.die_with_parent` for a training run), so a
forced stop (a second Ctrl-C, SIGKILL) leaves no orphan waiting for work; elsewhere such workers may remain.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing as mp
import os
import signal
from multiprocessing.pool import AsyncResult, Pool
from typing import Iterable, Iterator, Sequence

import numpy as np

from speedrun.data.shards import BOS_ID
from speedrun.data.tokenizer import gpt2_encoding
from speedrun.support.stopping import request_parent_death_signal

_BOS = np.array([BOS_ID], dtype=np.uint32)
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def encode_texts(texts: Sequence[str]) -> np.ndarray:
    """``[50256] + encode_ordinary(text)`` for every text, concatenated: (n,) uint16."""
    encoding = gpt2_encoding()
    parts: list[np.ndarray] = []
    for text in texts:
        parts.append(_BOS)
        parts.append(encoding.encode_to_numpy(text, disallowed_special=()))
    if not parts:
        return np.zeros(0, dtype=np.uint16)
    return np.concatenate(parts).astype(np.uint16)


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the platform has one (taskset, Slurm and
    container CPU sets), else ``os.cpu_count()``; at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _start_method() -> str:
    """``fork`` where the platform has it (workers inherit the built encoding), else ``spawn``."""
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread within the block (threads and processes started there inherit
    the mask); one that comes meanwhile is delivered, and its handler run, at the end. A no-op without
    ``signal.pthread_sigmask`` (Windows)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _die_with_parent(parent: int) -> None:
    """Linux: have the kernel SIGKILL this process when the thread that forked it ends
    (:func:`speedrun.support.stopping.request_parent_death_signal`); a parent that ended before the request (the parent
    pid is no longer ``parent``) ends this process now. Elsewhere, or without a usable prctl, nothing."""
    if request_parent_death_signal(signal.SIGKILL) is None and os.getppid() != parent:
        os._exit(1)


def _quiet_worker(parent: int) -> None:
    """Pool initializer: SIGINT and SIGTERM ignored (the parent ``parent`` handles a stop and closes the pool),
    death with the parent (:func:`_die_with_parent`), then the signals the parent blocked while forking are
    unblocked (one that came meanwhile is discarded)."""
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    _die_with_parent(parent)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


class EncoderPool:
    """Encode batches of texts on ``workers`` processes; ``workers == 1`` encodes in this process.

    Use as a context manager, created before any other thread starts (it forks where it can)::

        with EncoderPool(workers) as pool:
            for tokens in pool.map(batches):  # (n_i,) uint16, in the order of `batches`
                ...
    """

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self._pool: Pool | None = None

    def __enter__(self) -> "EncoderPool":
        if self.workers > 1:
            gpt2_encoding()  # built once here, inherited by forked workers
            try:
                with _stop_signals_blocked():
                    self._pool = mp.get_context(_start_method()).Pool(self.workers, initializer=_quiet_worker,
                                                                      initargs=(os.getpid(),))
            except BaseException:       # a stop signal that came while forking, raised once unblocked
                self.__exit__()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the pool: the batches in flight are encoded (and dropped), then the workers exit (module
        docstring, "Stopping": ``Pool.terminate`` could deadlock, and the workers ignore its SIGTERM)."""
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None

    def map(self, batches: Iterable[Sequence[str]]) -> Iterator[np.ndarray]:
        """The encoded token stream of each batch, in order; reads ``batches`` at most 2 x workers ahead."""
        if self._pool is None:
            yield from (encode_texts(batch) for batch in batches)
            return
        pending: collections.deque[AsyncResult] = collections.deque()
        for batch in batches:
            pending.append(self._pool.apply_async(encode_texts, (list(batch),)))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
