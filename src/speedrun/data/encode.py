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
"""

from __future__ import annotations

import collections
import multiprocessing as mp
from multiprocessing.pool import AsyncResult, Pool
from typing import Iterable, Iterator, Sequence

import numpy as np

from speedrun.data.shards import BOS_ID
from speedrun.data.tokenizer import gpt2_encoding

_BOS = np.array([BOS_ID], dtype=np.uint32)


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


def _start_method() -> str:
    """``fork`` where the platform has it (workers inherit the built encoding), else ``spawn``."""
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


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
            self._pool = mp.get_context(_start_method()).Pool(self.workers)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.terminate()
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
