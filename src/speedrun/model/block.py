"""The blocks of the speedrun GPT: document-causal self-attention (RoPE, QK-norm, optional sliding window
and value embedding) and the pre-norm transformer block (optional x0 injection).

Sources (speedrun-spec.md 2.2, 2.3, 2.6): QK-norm and zero-init projections record #5; x0 shortcut with
per-layer lambdas record #9; value embeddings records #14-#17; sliding windows records #13, #20.

Shape legend: T tokens, D documents, C model_dim, H n_head, Dh head_dim.
"""

from __future__ import annotations

import torch
from torch import nn

from speedrun.model.attention import attention
from speedrun.model.config import GPTConfig
from speedrun.model.init import init_input_, init_output_
from speedrun.model.mlp import MLP
from speedrun.model.norm import rms_norm
from speedrun.model.rotary import apply_rotary


class CausalSelfAttention(nn.Module):
    """Multi-head document-causal self-attention: (T, C) -> (T, C).

    q, k, v = x Wqᵀ, x Wkᵀ, x Wvᵀ as (T, H, Dh); q and k RMS-normalized over Dh (QK-norm, record #5) and
    rotated (RoPE, ``config.rope``); the scale and the sliding window come with each call (the model's
    schedule state); output projection Wo zero-initialized. Attention runs in the dtype of the projections
    (bf16 under autocast, so that flash kernels apply).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.backend, self.rope = config.attention_backend, config.rope
        self.q = nn.Linear(config.model_dim, config.attn_dim, bias=False)
        self.k = nn.Linear(config.model_dim, config.attn_dim, bias=False)
        self.v = nn.Linear(config.model_dim, config.attn_dim, bias=False)
        self.o = nn.Linear(config.attn_dim, config.model_dim, bias=False)
        for linear in (self.q, self.k, self.v):
            init_input_(linear.weight)
        init_output_(self.o.weight)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                scale: float, window: int | None = None, value_embed: torch.Tensor | None = None
                ) -> torch.Tensor:
        """x: (T, C); cu_seqlens: (D+1,) int32; cos, sin: (T, R) rotary tables; scale of q·k; window in
        tokens or None; value_embed: None or (T, H*Dh) added to v (records #14-#17). Returns (T, C)."""
        shape = (x.size(0), self.n_head, self.head_dim)
        v = self.v(x)
        if value_embed is not None:
            v = v + value_embed.type_as(v)
        v = v.view(shape)                                                                # (T, H, Dh)
        q = apply_rotary(rms_norm(self.q(x).view(shape)), cos, sin, self.rope).type_as(v)  # (T, H, Dh)
        k = apply_rotary(rms_norm(self.k(x).view(shape)), cos, sin, self.rope).type_as(v)  # (T, H, Dh)
        y = attention(q, k, v, cu_seqlens, scale, window, backend=self.backend)            # in v's dtype
        return self.o(y.reshape(x.size(0), -1))                                         # (T, C)


class Block(nn.Module):
    """Pre-norm transformer block: ``x += attn(norm(x)); x += mlp(norm(x))``. (T, C) -> (T, C).

    With ``config.x0_lambdas`` (record #9, the x0 shortcut), the block first mixes in the normalized input
    embedding x0: ``x = lambdas[0]·x + lambdas[1]·x0``, ``lambdas`` (2,) fp32 learned per layer from (1, 0).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attn = CausalSelfAttention(config)
        self.mlp = MLP(config)
        self.lambdas = nn.Parameter(torch.tensor([1.0, 0.0])) if config.x0_lambdas else None

    def forward(self, x: torch.Tensor, x0: torch.Tensor, cu_seqlens: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, scale: float, window: int | None = None,
                value_embed: torch.Tensor | None = None) -> torch.Tensor:
        """x, x0: (T, C); the rest as for :class:`CausalSelfAttention`. Returns (T, C)."""
        if self.lambdas is not None:
            lambdas = self.lambdas.type_as(x)
            x = lambdas[0] * x + lambdas[1] * x0
        x = x + self.attn(rms_norm(x), cu_seqlens, cos, sin, scale, window, value_embed)
        return x + self.mlp(rms_norm(x))
