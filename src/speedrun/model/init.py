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
