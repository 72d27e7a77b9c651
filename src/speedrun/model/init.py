"""Weight initialization shared by the blocks (records #5 and #20 of the public speedrun)."""

from __future__ import annotations

import math
from typing import Iterable

import torch


@torch.no_grad()
def init_input_(weight: torch.Tensor) -> torch.Tensor:
    """In place: uniform on ±sqrt(3)·0.5/sqrt(fan_in), i.e. std 0.5/sqrt(fan_in), for a (out, in) matrix
    that reads the residual stream (q, k, v, MLP fc)."""
    bound = math.sqrt(3.0) * 0.5 / math.sqrt(weight.size(-1))
    return weight.uniform_(-bound, bound)


@torch.no_grad()
def init_output_(weight: torch.Tensor) -> torch.Tensor:
    """In place: zeros, for a matrix that writes to the residual stream (attention and MLP output
    projections) or the LM head (record #5, "zero-init projections")."""
    return weight.zero_()


@torch.no_grad()
def init_torch_linear_(weight: torch.Tensor) -> torch.Tensor:
    """In place: uniform on ±1/sqrt(fan_in) (std 1/sqrt(3·fan_in)), ``nn.Linear``'s default
    (kaiming_uniform with a = sqrt(5)), as record #12 (2024-11-19 FlexAttention) leaves its ``CastedLinear``
    weights (``GPTConfig.linear_init: torch``)."""
    bound = 1.0 / math.sqrt(weight.size(-1))
    return weight.uniform_(-bound, bound)


@torch.no_grad()
def init_torch_linear_inputs_(model: torch.nn.Module, matrices: Iterable[torch.nn.Parameter]) -> None:
    """Re-initialize with :func:`init_torch_linear_` each of ``matrices``, parameters of ``model`` (record
    #12's matrices that read the residual stream: q, k, v and MLP fc, the roles ``attention_qk``,
    ``attention_value`` and ``mlp_fc`` of :mod:`speedrun.model.roles`), drawn in the order of
    ``model.parameters()`` whatever the order given; the output projections keep their zeros. Raises
    ``ValueError`` when one of ``matrices`` is not a parameter of ``model``."""
    chosen = {id(p) for p in matrices}
    params = list(model.parameters())
    if chosen - {id(p) for p in params}:
        raise ValueError(f"{len(chosen - {id(p) for p in params})} of the matrices to re-initialize are not "
                         f"parameters of the {type(model).__name__}")
    for param in params:
        if id(param) in chosen:
            init_torch_linear_(param)
