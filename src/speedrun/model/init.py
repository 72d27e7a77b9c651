"""Weight initialization shared by the blocks (records #5 and #20 of the public speedrun)."""

from __future__ import annotations

import math

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


INPUT_MATRIX_SUFFIXES = (".attn.q.weight", ".attn.k.weight", ".attn.v.weight", ".mlp.fc.weight")


@torch.no_grad()
def init_torch_linear_(weight: torch.Tensor) -> torch.Tensor:
    """In place: uniform on ±1/sqrt(fan_in) (std 1/sqrt(3·fan_in)), ``nn.Linear``'s default
    (kaiming_uniform with a = sqrt(5)), as record #12 (2024-11-19 FlexAttention) leaves its ``CastedLinear``
    weights (``GPTConfig.linear_init: torch``)."""
    bound = 1.0 / math.sqrt(weight.size(-1))
    return weight.uniform_(-bound, bound)


@torch.no_grad()
def init_torch_linear_inputs_(blocks: torch.nn.Module) -> None:
    """Re-initialize with :func:`init_torch_linear_` every matrix of ``blocks`` that reads the residual stream
    (parameter names ending in :data:`INPUT_MATRIX_SUFFIXES`: q, k, v, MLP fc); the output projections keep
    their zeros."""
    for name, param in blocks.named_parameters():
        if name.endswith(INPUT_MATRIX_SUFFIXES):
            init_torch_linear_(param)
