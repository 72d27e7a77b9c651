"""The collectives of a sharded Muon update (speedrun-spec.md 3.4; records #6, #24, #36, #48-#61).

With W ranks, a bank of N matrices is padded with zero matrices to ``padded = ceil(N / W) · W``; rank r owns
the matrices ``r·k .. r·k + k - 1`` with ``k = padded / W``. Each step, the stacked gradients (padded, rows,
cols) are reduce-scattered with averaging, so rank r receives the average gradient of its k matrices; it
updates them alone (keeping optimizer state only for them), and the updated matrices are all-gathered back
into every rank's parameters. Every collective is launched asynchronously; :class:`Pending` waits for it.

Backends: NCCL averages in the collective (``ReduceOp.AVG``); other backends sum and divide by W (older gloo
builds have no AVG). Where the backend does not implement the reduce-scatter of one tensor (some gloo
builds), :meth:`Communicator.reduce_scatter_mean` falls back to an all-reduce of the whole stack and takes the
rank's slice: the same result at W times the traffic. Which path a process group takes is probed once, with
a one-element collective on every rank at the same time, and kept. The collectives are torch's
``reduce_scatter_single`` / ``all_gather_single`` where they exist (torch >= 2.13), else their older names
``reduce_scatter_tensor`` / ``all_gather_into_tensor``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist


def _reduce_scatter(output: torch.Tensor, input: torch.Tensor, **kwargs) -> object:
    return getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(output, input, **kwargs)


def _all_gather(output: torch.Tensor, input: torch.Tensor, **kwargs) -> object:
    return getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(output, input, **kwargs)


@dataclass
class Pending:
    """An asynchronous collective: ``wait()`` blocks until it is done and returns its result (after
    ``finish``, e.g. the division by W)."""

    work: object | None
    result: torch.Tensor
    finish: Callable[[torch.Tensor], torch.Tensor] = lambda t: t

    def wait(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
        return self.finish(self.result)


def distributed_world(process_group: object | None = None) -> tuple[int, int]:
    """``(rank, world size)`` in ``process_group`` (the default group when None), or ``(0, 1)`` when
    torch.distributed is unavailable or not initialized."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(process_group), dist.get_world_size(process_group)


def shard_bounds(size: int, world_size: int, rank: int) -> tuple[int, int, int]:
    """``(padded, start, k)`` for a bank of ``size`` matrices over ``world_size`` ranks: the padded bank
    size (a multiple of the world size), the first global index of ``rank``'s slice and its length.
    Raises ``ValueError`` for world_size < 1 or a rank outside it."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    k = -(-size // world_size)
    return k * world_size, rank * k, k


class Communicator:
    """The reduce-scatter and all-gather of banks over ``process_group`` (None: the default group), which
    must be initialized with world size > 1 (else ``ValueError``). ``reduce_scatter``: None probes whether
    the backend has the reduce-scatter of one tensor; False always takes the all-reduce fallback."""

    def __init__(self, process_group: object | None = None, reduce_scatter: bool | None = None):
        self.group = process_group
        self.rank, self.world_size = distributed_world(process_group)
        if self.world_size < 2:
            raise ValueError("a Communicator needs an initialized process group of world size > 1")
        self.backend = dist.get_backend(process_group)
        self._scatter_supported = reduce_scatter

    def _average_op(self) -> tuple[dist.ReduceOp, float]:
        if self.backend == "nccl":
            return dist.ReduceOp.AVG, 1.0
        return dist.ReduceOp.SUM, 1.0 / self.world_size

    def scatter_supported(self, device: torch.device) -> bool:
        """Whether the reduce-scatter of one tensor is used (probed once, collectively, unless set)."""
        if self._scatter_supported is None:
            probe = torch.zeros(self.world_size, dtype=torch.float32, device=device)
            try:
                _reduce_scatter(probe[:1].clone(), probe, group=self.group)
                self._scatter_supported = True
            except (RuntimeError, NotImplementedError, ValueError):
                self._scatter_supported = False
        return self._scatter_supported

    def reduce_scatter_mean(self, stacked: torch.Tensor) -> Pending:
        """Launch the average over ranks of ``stacked`` (padded, ...), of which this rank keeps rows
        ``rank·k .. rank·k + k - 1``; ``wait()`` returns them, (k, ...). ``padded`` must be a multiple of
        the world size (:func:`shard_bounds`)."""
        padded, start, k = shard_bounds(stacked.size(0), self.world_size, self.rank)
        if padded != stacked.size(0):
            raise ValueError(f"bank of {stacked.size(0)} matrices is not padded to a multiple of the world "
                             f"size {self.world_size}")
        op, scale = self._average_op()
        finish = (lambda t: t) if scale == 1.0 else (lambda t: t.mul_(scale))
        if self.scatter_supported(stacked.device):
            out = stacked.new_empty((k, *stacked.shape[1:]))
            work = _reduce_scatter(out, stacked, op=op, group=self.group, async_op=True)
            return Pending(work, out, finish)
        work = dist.all_reduce(stacked, op=op, group=self.group, async_op=True)
        return Pending(work, stacked, lambda t: finish(t[start:start + k]))

    def all_gather(self, local: torch.Tensor) -> Pending:
        """Launch the gathering of every rank's ``local`` (k, ...) into (k · world size, ...), in rank
        order; ``wait()`` returns it."""
        out = local.new_empty((local.size(0) * self.world_size, *local.shape[1:]))
        work = _all_gather(out, local.contiguous(), group=self.group, async_op=True)
        return Pending(work, out)
