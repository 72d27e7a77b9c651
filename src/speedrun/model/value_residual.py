"""Value residual learning (Zhou et al. 2024, "Value Residual Learning For Alleviating Attention
Concentration In Transformers", arXiv 2410.17897), as record #12 (2024-11-19 FlexAttention) runs it: the
values v_0 of the first attention layer are mixed into every later attention layer's values,
``v = (1 - λ)·v + λ·v_0``, with one λ learned per layer from 0.5 (``GPTConfig.value_residual``).

The record passes v_0 out of layer 0's attention along with the residual stream. Here the blocks keep
their interface: :func:`first_layer_values` computes v_0 from the input of block 0 with block 0's own
parameters (its x0 mix, the pre-norm and its value projection), the same function of the same parameters,
so gradients reach block 0's λ and W_v from every later layer as in the record; the product x·W_vᵀ is
evaluated a second time (T·C·H·Dh multiply-adds, a twelfth of one layer's attention projections).

Shape legend: T tokens, C model_dim, H n_head, Dh head_dim, A = H·Dh.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.model.norm import rms_norm

VALUE_RESIDUAL_INIT = 0.5


def first_layer_values(block: nn.Module, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """v_0 (T, A), in the dtype of the products: the values that ``block`` (block 0, a
    :class:`speedrun.model.block.Block` with attention) computes from its input ``x`` (T, C) and the
    normalized embedding ``x0`` (T, C): ``rms_norm(λ0·x + λ1·x0) W_vᵀ`` with the block's x0 lambdas when
    it has them, else ``rms_norm(x) W_vᵀ``. Raises ``ValueError`` for a block without attention."""
    if block.attn is None:
        raise ValueError("value residual: block 0 has no attention, so no values to pass on")
    if block.lambdas is not None:
        lambdas = block.lambdas.type_as(x)
        x = lambdas[0] * x + lambdas[1] * x0
    return F.linear(rms_norm(x), block.attn.v.weight)                                   # (T, A)


def mix_value_residual(v: torch.Tensor, first_values: torch.Tensor, lambda_: torch.Tensor) -> torch.Tensor:
    """``(1 - λ)·v + λ·v_0`` in v's dtype: v (T, H, Dh), first_values v_0 (T, A) (reshaped to v's shape),
    lambda_ (1,) (cast to v's dtype, as the record's bf16 λ)."""
    lam = lambda_.type_as(v)
    return (1 - lam) * v + lam * first_values.view(v.shape).type_as(v)
