"""Training batches (BOS-aligned, or contiguous as record #12 read them) and contiguous validation batches.

Training (speedrun-spec.md section 1.3; BOS alignment from record #26 ``2025-07-12_BosAlign``, max
document length from record #29): every micro-batch of T tokens starts at a document start (token
50256, "BOS"). Starting at the next unused BOS of the current shard, segments
``[bos, min(next bos, bos + max_seq_len, bos + remaining))`` are appended until exactly T + 1 tokens are
filled; inputs are the first T, targets the last T. A document longer than ``max_seq_len`` is cut (its
tail is dropped) and so is the rest of the last, cut document. When the BOS index of a shard runs out,
the micro-batch is planned again from the first BOS of the next shard (the tail of the old shard and
the head of the new one before its first BOS are skipped).

Micro-batches are planned one at a time in a global order m = 0, 1, ... from one cursor that every
process holds, so the plan does not depend on the world size: a 1-process run with M accumulation
steps sees exactly the micro-batches that an M-process run spreads over its ranks (rank r takes
m = a * world_size + r). Planning needs only the BOS indices and shard lengths; only this rank's
tokens are copied.

Contiguous training batches (``train.train_batches: contiguous``; the loader of the records before #26,
record #12 ``2024-11-19_FlexAttention`` among them): micro-batch m of a shard is the slice
``[m*T, m*T + T + 1)`` of its token stream, wherever documents start and end (none is cut: documents are told
apart by the BOS positions, ``cu_seqlens``); when the rest of a shard holds fewer than T + 1 tokens the next
micro-batch is the first T + 1 tokens of the next shard. The same global order m = a * world_size + r over the
ranks as above gives the record's split: its rank r reads ``[(k*W + r)*T, (k*W + r)*T + T + 1)`` at its k-th
read of W ranks (its DistributedDataLoader.next_batch). At the end of a shard the record differs: it moves on
once a rank's next position plus W*T reaches the shard's end (leaving up to (W+1)*T tokens unread, and its ranks
can move on one read apart), and after its last shard it starts the first again; here every whole micro-batch
of a shard is used and running out is an error, as for BOS-aligned batches.

Validation (speedrun-spec.md section 1.4): contiguous chunks of the validation shard, not
BOS-aligned; chunk c has inputs ``tokens[c*B : c*B+B]`` and targets ``tokens[c*B+1 : c*B+B+1]``.

Shape legend: T tokens per micro-batch (per rank), D documents in a micro-batch, B validation tokens
per chunk (per rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Sequence, get_args

import numpy as np

from speedrun.errors import SpeedrunError

if TYPE_CHECKING:
    import torch

TrainBatchesKind = Literal["bos_aligned", "contiguous"]
TRAIN_BATCHES: tuple[str, ...] = get_args(TrainBatchesKind)


@dataclass(frozen=True)
class MicroBatch:
    """One forward pass of one rank.

    inputs: (T,) int32 token ids. targets: (T,) int64, the inputs shifted left by one token.
    cu_seqlens: (D+1,) int32 cumulative document boundaries in ``inputs``: 0, starts of the documents
    after the first, T. Strictly increasing, not padded.
    """

    inputs: np.ndarray
    targets: np.ndarray
    cu_seqlens: np.ndarray


@dataclass(frozen=True)
class Segment:
    """Tokens ``[start, stop)`` of train shard ``shard``; ``start`` is the position of a BOS."""

    shard: int
    start: int
    stop: int


class _ShardPlan:
    """Prefix sums of the capped document lengths of one shard, for O(log n) micro-batch planning.

    Document k spans ``[bos[k], bos[k+1])`` (the last one runs to the shard end); its usable length is
    capped at ``max_seq_len``. ``prefix[k]`` is the sum of the capped lengths of documents 0..k-1.
    """

    def __init__(self, shard_length: int, bos: np.ndarray, max_seq_len: int):
        self.bos = np.asarray(bos, dtype=np.int64)
        ends = np.append(self.bos[1:], np.int64(shard_length)) if len(self.bos) else self.bos
        capped = np.minimum(ends - self.bos, max_seq_len)
        self.prefix = np.concatenate(([0], np.cumsum(capped, dtype=np.int64)))

    def take(self, cursor: int, need: int) -> tuple[int, int] | None:
        """Documents ``cursor..last`` fill ``need`` tokens; return ``(last, tokens of last)`` or None.

        None means the shard's remaining documents hold fewer than ``need`` tokens.
        """
        target = self.prefix[cursor] + need
        end = int(np.searchsorted(self.prefix, target, side="left"))
        if end >= len(self.prefix):
            return None
        last = end - 1
        return last, int(target - self.prefix[last])


def _check_bos_index(shard: int, bos: np.ndarray, shard_length: int) -> None:
    if bos.ndim != 1:
        raise SpeedrunError(f"the BOS index of train shard {shard} must be 1-D, got shape {bos.shape}")
    if len(bos) and (bos[0] < 0 or bos[-1] >= shard_length or np.any(np.diff(bos) <= 0)):
        raise SpeedrunError(
            f"the BOS index of train shard {shard} must hold increasing positions in "
            f"0..{shard_length - 1}, found {len(bos)} positions from {int(bos[0])} to {int(bos[-1])}"
        )


def _check_positive(name: str, value: int) -> int:
    if int(value) != value or value < 1:
        raise SpeedrunError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class _BatchShape:
    """The batch shape of a planner: T (``micro_batch_tokens``) and ``max_seq_len``, both checked positive."""

    def set_batch(self, micro_batch_tokens: int, max_seq_len: int) -> None:
        self.micro_batch_tokens = _check_positive("micro_batch_tokens", micro_batch_tokens)
        self.max_seq_len = _check_positive("max_seq_len", max_seq_len)


class _Planner(_BatchShape):
    """The shared cursor over the train shards: (shard, next unused BOS), and the batch shape."""

    def __init__(self, shard_lengths: Sequence[int], bos_indices: Sequence[np.ndarray],
                 micro_batch_tokens: int, max_seq_len: int):
        if len(shard_lengths) != len(bos_indices):
            raise SpeedrunError(
                f"got {len(shard_lengths)} train shards but {len(bos_indices)} BOS indices"
            )
        if not shard_lengths:
            raise SpeedrunError("no train shards: at least one is needed for training")
        self.shard_lengths = [int(n) for n in shard_lengths]
        self.bos_indices = [np.asarray(b, dtype=np.int64) for b in bos_indices]
        for shard, (length, bos) in enumerate(zip(self.shard_lengths, self.bos_indices)):
            _check_bos_index(shard, bos, length)
        self.shard = 0
        self.cursor = 0
        self.set_batch(micro_batch_tokens, max_seq_len)

    def set_batch(self, micro_batch_tokens: int, max_seq_len: int) -> None:
        super().set_batch(micro_batch_tokens, max_seq_len)
        self._plans: dict[int, _ShardPlan] = {}             # a new max_seq_len cuts the documents anew

    def _plan_of(self, shard: int) -> _ShardPlan:
        if shard not in self._plans:
            self._plans = {shard: _ShardPlan(self.shard_lengths[shard], self.bos_indices[shard],
                                             self.max_seq_len)}
        return self._plans[shard]

    def next_micro_batch(self) -> list[Segment] | None:
        """Segments of the next micro-batch (T + 1 tokens in all), advancing the cursor; None when
        every train shard is used up (the cursor is then left at the end)."""
        need = self.micro_batch_tokens + 1
        while self.shard < len(self.shard_lengths):
            plan = self._plan_of(self.shard)
            taken = plan.take(self.cursor, need)
            if taken is not None:
                return self._segments(plan, taken)
            self.shard, self.cursor = self.shard + 1, 0
        return None

    def _segments(self, plan: _ShardPlan, taken: tuple[int, int]) -> list[Segment]:
        last, last_tokens = taken
        starts = plan.bos[self.cursor:last + 1]
        lengths = np.diff(plan.prefix[self.cursor:last + 2])
        lengths[-1] = last_tokens
        self.cursor = last + 1
        return [Segment(self.shard, int(s), int(s + n)) for s, n in zip(starts, lengths)]


class _ContiguousPlanner(_BatchShape):
    """The shared cursor of contiguous micro-batches: (shard, next start position), and the batch shape.
    ``max_seq_len`` is kept for the interface only (no document is cut)."""

    def __init__(self, shard_lengths: Sequence[int], micro_batch_tokens: int, max_seq_len: int):
        if not shard_lengths:
            raise SpeedrunError("no train shards: at least one is needed for training")
        self.shard_lengths = [int(n) for n in shard_lengths]
        self.shard = 0
        self.position = 0
        self.set_batch(micro_batch_tokens, max_seq_len)

    def next_micro_batch(self) -> tuple[int, int] | None:
        """(shard, start) of the next micro-batch (tokens ``[start, start + T + 1)`` of that shard), advancing
        the cursor by T; None when no shard has T + 1 tokens left (the cursor is then left at the end)."""
        need = self.micro_batch_tokens + 1
        while self.shard < len(self.shard_lengths):
            if self.position + need <= self.shard_lengths[self.shard]:
                start = self.position
                self.position += self.micro_batch_tokens
                return self.shard, start
            self.shard, self.position = self.shard + 1, 0
        return None


def _materialize(shards: Sequence[np.ndarray], segments: list[Segment]) -> MicroBatch:
    """Copy the tokens of ``segments`` (T + 1 in all) into a :class:`MicroBatch`."""
    buf = np.concatenate([np.asarray(shards[s.shard][s.start:s.stop]) for s in segments])
    tokens = len(buf) - 1
    lengths = np.array([s.stop - s.start for s in segments], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    cu_seqlens = np.append(starts[starts < tokens], tokens).astype(np.int32)
    return MicroBatch(inputs=buf[:-1].astype(np.int32), targets=buf[1:].astype(np.int64),
                      cu_seqlens=cu_seqlens)


class TrainBatches:
    """The training micro-batches of one run, step by step: :class:`BosAlignedBatches` or
    :class:`ContiguousBatches` (:func:`train_batches` builds the one a run's ``train_batches`` names). Every
    process builds the same object and calls :meth:`next_step` with the same arguments; each gets its own
    micro-batches of a plan that does not depend on the world size."""

    _planner: "_Planner | _ContiguousPlanner"
    _shards: Sequence[np.ndarray]

    def __init__(self) -> None:
        self.steps_drawn = 0

    @property
    def micro_batch_tokens(self) -> int:
        """T, tokens per micro-batch (per rank)."""
        return self._planner.micro_batch_tokens

    @property
    def max_seq_len(self) -> int:
        """Longest document span in a micro-batch, in tokens."""
        return self._planner.max_seq_len

    def set_batch(self, micro_batch_tokens: int, max_seq_len: int) -> None:
        """Change T and ``max_seq_len`` for the following steps (batch-size and max_seq_len schedules,
        records #72 and the 2025-11-29 batch-size schedule). Raises :class:`SpeedrunError` if not
        positive."""
        self._planner.set_batch(micro_batch_tokens, max_seq_len)

    def _materialize(self, plan) -> MicroBatch:
        """The :class:`MicroBatch` of ``plan``, one answer of the subclass's planner (its tokens copied)."""
        raise NotImplementedError(f"{type(self).__name__} does not copy micro-batches")

    def next_step(self, micro_batches: int, rank: int, world_size: int) -> list[MicroBatch]:
        """Plan the ``micro_batches`` (M) micro-batches of the next optimizer step, return this rank's.

        Micro-batch m = 0..M-1 of the step goes to rank ``m % world_size``; the returned list holds
        m = a * world_size + rank for a = 0..M/world_size-1, in that order, each a :class:`MicroBatch`
        of T tokens. Raises :class:`SpeedrunError` when ``world_size`` does not divide M, ``rank`` is
        out of range, or the train shards run out ("ran out of training data at step ...").
        """
        _check_step_shape(micro_batches, rank, world_size)
        step = self.steps_drawn + 1
        mine = []
        for m in range(micro_batches):
            plan = self._planner.next_micro_batch()
            if plan is None:
                raise SpeedrunError(
                    f"ran out of training data at step {step}: micro-batch {m + 1} of {micro_batches} "
                    f"needs {self.micro_batch_tokens + 1} tokens, but the {len(self._shards)} train "
                    f"shards ({sum(len(s) for s in self._shards)} tokens) are used up; "
                    "add train shards or lower train.steps or train.tokens_per_step"
                )
            if m % world_size == rank:
                mine.append(self._materialize(plan))
        self.steps_drawn = step
        return mine


class BosAlignedBatches(TrainBatches):
    """BOS-aligned training micro-batches over the train shards (speedrun-spec.md 1.3, record #26).

    ``shards``: the train shards, each (N_i,) uint16 (e.g. :func:`speedrun.data.shards.load_shard`
    memory maps), validation shard excluded. ``bos_indices``: for each shard the sorted int64 positions
    of token 50256. ``micro_batch_tokens``: T, tokens per micro-batch per rank. ``max_seq_len``: the
    longest document span in a micro-batch, in tokens; longer documents are cut.

    Every process builds the same object and calls :meth:`next_step` with the same arguments; each gets
    its own micro-batches of a plan that does not depend on the world size.
    Raises :class:`SpeedrunError` on mismatched inputs or a non-positive size.
    """

    def __init__(self, shards: Sequence[np.ndarray], bos_indices: Sequence[np.ndarray],
                 micro_batch_tokens: int, max_seq_len: int):
        super().__init__()
        self._shards = shards
        self._planner = _Planner([len(s) for s in shards], bos_indices, micro_batch_tokens,
                                 max_seq_len)

    def _materialize(self, plan: list[Segment]) -> MicroBatch:
        return _materialize(self._shards, plan)


class ContiguousBatches(TrainBatches):
    """Contiguous training micro-batches over the train shards (module docstring; the records before #26,
    record #12 ``2024-11-19_FlexAttention`` among them, read their shards so).

    ``shards``: the train shards, each (N_i,) uint16. ``bos_indices``: for each shard the sorted int64
    positions of token 50256, from which each micro-batch's ``cu_seqlens`` is taken: 0, the BOS positions
    inside it but its first token, T (as a validation chunk's). ``micro_batch_tokens``: T, tokens per
    micro-batch per rank. ``max_seq_len``: kept for :meth:`set_batch`'s interface; no document is cut, so
    one can span the whole micro-batch. Raises :class:`SpeedrunError` on mismatched inputs or a
    non-positive size.
    """

    def __init__(self, shards: Sequence[np.ndarray], bos_indices: Sequence[np.ndarray],
                 micro_batch_tokens: int, max_seq_len: int):
        super().__init__()
        if len(shards) != len(bos_indices):
            raise SpeedrunError(f"got {len(shards)} train shards but {len(bos_indices)} BOS indices")
        self._shards = shards
        self._bos = [np.asarray(b, dtype=np.int64) for b in bos_indices]
        for shard, (tokens, bos) in enumerate(zip(shards, self._bos)):
            _check_bos_index(shard, bos, len(tokens))
        self._planner = _ContiguousPlanner([len(s) for s in shards], micro_batch_tokens, max_seq_len)

    def _materialize(self, plan: tuple[int, int]) -> MicroBatch:
        shard, start = plan
        return _contiguous_chunk(self._shards[shard], self._bos[shard], start, self.micro_batch_tokens)


def train_batches(kind: TrainBatchesKind, shards: Sequence[np.ndarray], bos_indices: Sequence[np.ndarray],
                  micro_batch_tokens: int, max_seq_len: int) -> TrainBatches:
    """The loader of ``kind`` (``bos_aligned``: :class:`BosAlignedBatches`, ``contiguous``:
    :class:`ContiguousBatches`) over ``shards``. Raises :class:`SpeedrunError` for another kind."""
    if kind == "bos_aligned":
        return BosAlignedBatches(shards, bos_indices, micro_batch_tokens, max_seq_len)
    if kind == "contiguous":
        return ContiguousBatches(shards, bos_indices, micro_batch_tokens, max_seq_len)
    raise SpeedrunError(f"train_batches must be one of {', '.join(TRAIN_BATCHES)}, got {kind!r}")


def _check_step_shape(micro_batches: int, rank: int, world_size: int) -> None:
    _check_positive("micro_batches", micro_batches)
    _check_rank(rank, world_size)
    if micro_batches % world_size:
        raise SpeedrunError(
            f"micro_batches {micro_batches} is not a multiple of world_size {world_size}"
        )


def _check_rank(rank: int, world_size: int) -> None:
    _check_positive("world_size", world_size)
    if not 0 <= rank < world_size:
        raise SpeedrunError(f"rank {rank} is outside 0..{world_size - 1}")


def steps_available(shard_lengths: Sequence[int], bos_indices: Sequence[np.ndarray],
                    micro_batch_tokens: int, max_seq_len: int, micro_batches: int, steps: int,
                    stages: Sequence[tuple[int, int, int]] = (), kind: TrainBatchesKind = "bos_aligned") -> int:
    """How many of ``steps`` optimizer steps of ``micro_batches`` micro-batches of T tokens the train
    shards can feed, by planning only (no token is read).

    ``stages``: a batch-size schedule as ``(first_step, micro_batch_tokens, max_seq_len)`` in increasing
    first_step (the first at 0); it replaces ``micro_batch_tokens`` and ``max_seq_len`` from each first
    step on. ``kind``: the loader (:func:`train_batches`), whose plan this is, so the answer is exact; cost
    is one binary search per micro-batch (BOS-aligned) or a comparison (contiguous). Raises
    :class:`SpeedrunError` on non-positive sizes or another ``kind``.
    """
    _check_positive("micro_batches", micro_batches)
    if steps < 0:
        raise SpeedrunError(f"steps must be >= 0, got {steps}")
    if kind == "bos_aligned":
        planner: _Planner | _ContiguousPlanner = _Planner(shard_lengths, bos_indices, micro_batch_tokens,
                                                          max_seq_len)
    elif kind == "contiguous":
        planner = _ContiguousPlanner(shard_lengths, micro_batch_tokens, max_seq_len)
    else:
        raise SpeedrunError(f"train_batches must be one of {', '.join(TRAIN_BATCHES)}, got {kind!r}")
    changes = {first: (tokens, seq_len) for first, tokens, seq_len in stages}
    for step in range(steps):
        if step in changes:
            planner.set_batch(*changes[step])
        for _ in range(micro_batches):
            if planner.next_micro_batch() is None:
                return step
    return steps


def validation_batches(tokens: np.ndarray, bos_index: np.ndarray, val_tokens: int,
                       val_batch_tokens: int, rank: int, world_size: int) -> list[MicroBatch]:
    """This rank's validation chunks of the validation shard (speedrun-spec.md 1.4; not BOS-aligned).

    ``tokens``: (N,) uint16 validation shard; ``bos_index``: its sorted int64 BOS positions.
    With B = ``val_batch_tokens`` (tokens per chunk per rank), chunk c = 0..val_tokens/B-1 has inputs
    ``tokens[c*B : c*B+B]`` (int32), targets ``tokens[c*B+1 : c*B+B+1]`` (int64) and cu_seqlens
    ``[0, BOS positions inside the chunk except 0, B]`` (int32); rank r takes c = j*world_size + r.
    So the chunks of all ranks cover inputs 0..val_tokens-1 and targets 1..val_tokens exactly once.
    Raises :class:`SpeedrunError` when ``val_tokens`` is not a multiple of B * world_size or the shard
    holds fewer than ``val_tokens + 1`` tokens.
    """
    _check_positive("val_tokens", val_tokens)
    batch = _check_positive("val_batch_tokens", val_batch_tokens)
    _check_rank(rank, world_size)
    if val_tokens % (batch * world_size):
        raise SpeedrunError(
            f"val_tokens {val_tokens} is not a multiple of val_batch_tokens x world_size = "
            f"{batch} x {world_size} = {batch * world_size}"
        )
    if len(tokens) < val_tokens + 1:
        raise SpeedrunError(
            f"the validation shard holds {len(tokens)} tokens, fewer than val_tokens + 1 = "
            f"{val_tokens + 1}; lower train.val_tokens or use a larger shard"
        )
    bos = np.asarray(bos_index, dtype=np.int64)
    return [_contiguous_chunk(tokens, bos, c * batch, batch)
            for c in range(rank, val_tokens // batch, world_size)]


def _contiguous_chunk(tokens: np.ndarray, bos: np.ndarray, start: int, batch: int) -> MicroBatch:
    """Inputs ``tokens[start : start+batch]``, targets one further, cu_seqlens 0, the BOS positions in
    (start, start+batch) relative to start, batch (a validation chunk, a contiguous training micro-batch)."""
    buf = np.asarray(tokens[start:start + batch + 1])
    lo, hi = np.searchsorted(bos, [start + 1, start + batch])
    inner = (bos[lo:hi] - start).astype(np.int32)
    cu_seqlens = np.concatenate(([0], inner, [batch])).astype(np.int32)
    return MicroBatch(inputs=buf[:-1].astype(np.int32), targets=buf[1:].astype(np.int64),
                      cu_seqlens=cu_seqlens)


DOC_SLOT_MULTIPLE = 128


def padded_cu_seqlens(cu_seqlens: np.ndarray, multiple: int = DOC_SLOT_MULTIPLE) -> np.ndarray:
    """``cu_seqlens`` (D+1,) int32 padded with repeats of T to the next multiple of ``multiple`` slots
    (at least one pad-free multiple): empty documents that every attention backend ignores, so that a
    compiled model sees one shape per micro-batch size instead of one per document count (the public
    speedrun pads to ``max_num_docs``, record #29, tightened by #78). ``multiple`` 1 pads nothing."""
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    slots = -(-len(cu_seqlens) // multiple) * multiple
    return np.pad(cu_seqlens, (0, slots - len(cu_seqlens)), constant_values=cu_seqlens[-1]).astype(np.int32)


def host_tensors(mb: MicroBatch, pin: bool = False, doc_slot_multiple: int = DOC_SLOT_MULTIPLE
                 ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """``(inputs, targets, cu_seqlens)`` of ``mb`` as CPU tensors: (T,) int32, (T,) int64, (S,) int32
    (``cu_seqlens`` padded by :func:`padded_cu_seqlens` to a multiple of ``doc_slot_multiple`` slots), in
    pinned memory with ``pin`` (for non-blocking copies to a GPU)."""
    import torch

    arrays = (mb.inputs, mb.targets, padded_cu_seqlens(mb.cu_seqlens, doc_slot_multiple))
    tensors = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)
    return tuple(t.pin_memory() for t in tensors) if pin else tensors


def to_torch(mb: MicroBatch, device: "torch.device | str", doc_slot_multiple: int = DOC_SLOT_MULTIPLE
             ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """:func:`host_tensors` of ``mb`` on ``device``. Copies are non-blocking from pinned memory when
    ``device`` is CUDA."""
    import torch

    device = torch.device(device)
    cuda = device.type == "cuda"
    return tuple(t.to(device, non_blocking=cuda) for t in host_tensors(mb, cuda, doc_slot_multiple))
