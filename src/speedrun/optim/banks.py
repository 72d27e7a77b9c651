"""Parameter banks: Muon's batched view of its matrices (records #48, #56, #61; speedrun-spec.md 3.2, 3.4).

Within each parameter group, the 2-D parameters of equal shape, dtype and device that have a gradient form
one bank. The model keeps its separate ``nn.Parameter``s; the optimizer stacks a bank's gradients into one
(N, rows, cols) tensor, updates the stack with batched kernels (momentum, orthogonalization, NorMuon's
normalization, weight decay: the kernel launches of one matrix for N of them) and writes the new values back
into the parameters. Sharded over W ranks (:mod:`speedrun.optim.sharding`), a rank updates a slice of k
matrices of the bank, padded with zero matrices to k·W.

The optimizer state of a rank's slice lives in stacked buffers (:class:`BankState`); each owned parameter's
entry in the optimizer's per-parameter ``state`` holds views of its slot (``momentum_buffer`` (rows, cols),
``second_moment`` (rows, 1) or (1, cols), in the working dtype: fp32, or fp64 for fp64 parameters; for bf16
parameters also ``mantissa`` (rows, cols) int16, the lower 16 bits of each fp32 weight, record #57,
:mod:`speedrun.optim.precision`), so ``state_dict()`` shows the usual per-parameter state.
Should those entries stop being views of the buffers (``load_state_dict``, an edit by hand, a change of bank
membership), the next step stacks them into fresh buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch


@dataclass(frozen=True)
class Bank:
    """The parameters of one bank: equal (rows, cols), dtype and device, all in param group
    ``group_index`` at the places ``param_indices`` of its ``params`` list, in that order."""

    group_index: int
    params: tuple[torch.Tensor, ...]
    param_indices: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) of every matrix in the bank."""
        return tuple(self.params[0].shape)  # type: ignore[return-value]

    @property
    def key(self) -> tuple[int, ...]:
        """Identifies the bank's membership: its group index and its parameters' ids."""
        return (self.group_index, *(id(p) for p in self.params))


def make_banks(param_groups: Sequence[Mapping[str, Any]], every: bool = False) -> list[Bank]:
    """The banks of ``param_groups``: per group, its parameters with a gradient grouped by (shape, dtype,
    device), banks in the order of their first parameter, parameters in group order. A parameter without a
    gradient is in no bank this step (it is not updated, as in ``torch.optim``); with sharding, every rank
    must see the same parameters with gradients. ``every``: every parameter, gradient or not (the banks of a
    step where all have one: for compiling before the first). Raises ``ValueError`` for a parameter that is not
    2-D."""
    banks: list[Bank] = []
    for group_index, group in enumerate(param_groups):
        members: dict[tuple, list[tuple[int, torch.Tensor]]] = {}
        for index, p in enumerate(group["params"]):
            if p.ndim != 2:
                raise ValueError(f"Muon updates 2-D matrices only, got a parameter of shape {tuple(p.shape)}")
            if every or p.grad is not None:
                members.setdefault((tuple(p.shape), p.dtype, p.device), []).append((index, p))
        for entries in members.values():
            banks.append(Bank(group_index, tuple(p for _, p in entries), tuple(i for i, _ in entries)))
    return banks


def stack_padded(tensors: Sequence[torch.Tensor], size: int, shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """(size, *shape) ``dtype`` stack of ``tensors`` (at most ``size``, each of ``shape``; possibly none, for
    a rank whose slice is all padding), zero-filled beyond them: one stacking kernel, plus a fill of the
    padding and a cast where needed."""
    count = len(tensors)
    out = torch.empty((size, *shape), dtype=dtype, device=device)
    if count and tensors[0].dtype == dtype:
        torch.stack(list(tensors), out=out[:count])
    elif count:
        out[:count] = torch.stack(list(tensors))
    if count < size:
        out[count:].zero_()
    return out


def write_back(params: Sequence[torch.Tensor], stacked: torch.Tensor) -> None:
    """Copy ``stacked[i]`` into ``params[i]`` for every parameter (``stacked`` may hold padding beyond
    them), in one multi-tensor kernel where torch has it."""
    sources = list(stacked[:len(params)].unbind(0))
    if hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(list(params), sources)
        return
    for p, source in zip(params, sources):
        p.copy_(source)


@dataclass
class BankState:
    """Muon's state of one rank's slice of a bank: ``momentum`` (k, rows, cols) and NorMuon's
    ``second_moment`` (k, rows, 1) or (k, 1, cols), or (k, blocks, ...) of the blocks of a group with
    ``block_rows`` (None for plain Muon), in the working dtype; for bf16 parameters ``mantissa`` (k, rows,
    cols) int16, the lower 16 bits of their fp32 values (None otherwise); and the per-slot views that the owned
    parameters' state entries hold."""

    momentum: torch.Tensor
    second_moment: torch.Tensor | None
    momentum_views: list[torch.Tensor]
    second_moment_views: list[torch.Tensor]
    mantissa: torch.Tensor | None = None
    mantissa_views: list[torch.Tensor] | None = None

    def is_bound(self, state: Mapping[torch.Tensor, dict], owned: Sequence[torch.Tensor],
                 normuon: bool) -> bool:
        """Whether every owned parameter's state still holds this bank's views (and, with ``normuon``, the
        second moment exists)."""
        if normuon and self.second_moment is None:
            return False
        for j, p in enumerate(owned):
            entry = state.get(p, {})
            if entry.get("momentum_buffer") is not self.momentum_views[j]:
                return False
            if normuon and entry.get("second_moment") is not self.second_moment_views[j]:
                return False
            if self.mantissa_views is not None and entry.get("mantissa") is not self.mantissa_views[j]:
                return False
        return True


def bind_bank_state(state: dict, owned: Sequence[torch.Tensor], slots: int, shape: tuple[int, int],
                    second_moment_shape: tuple[int, ...] | None, dtype: torch.dtype,
                    device: torch.device, mantissa: bool = False) -> BankState:
    """Fresh zero ``dtype`` buffers for ``slots`` matrices of ``shape`` (a second moment of ``second_moment_shape``
    per matrix unless None; with ``mantissa``, an int16 buffer of the weights' lower 16 bits), filled from the
    owned parameters' existing per-parameter state, whose entries then become views of their slots. ``owned``
    are the parameters of the first ``len(owned)`` slots (a weight without a ``mantissa`` entry starts with
    zero lower bits: its fp32 value is its bf16 value)."""
    momentum = torch.zeros((slots, *shape), dtype=dtype, device=device)
    second = (torch.zeros((slots, *second_moment_shape), dtype=dtype, device=device)
              if second_moment_shape is not None else None)
    low = torch.zeros((slots, *shape), dtype=torch.int16, device=device) if mantissa else None
    bound = BankState(momentum, second, list(momentum.unbind(0)),
                      list(second.unbind(0)) if second is not None else [],
                      low, list(low.unbind(0)) if low is not None else None)
    for j, p in enumerate(owned):
        _adopt(state[p], "momentum_buffer", bound.momentum_views[j])
        if second is not None:
            _adopt(state[p], "second_moment", bound.second_moment_views[j])
        if low is not None:
            _adopt(state[p], "mantissa", bound.mantissa_views[j])
    return bound


def _adopt(entry: dict, name: str, slot: torch.Tensor) -> None:
    if name in entry:
        slot.copy_(entry[name])
    entry[name] = slot
