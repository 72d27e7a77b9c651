"""The clean speedrun GPT: embedding, pre-norm blocks (RoPE + QK-norm attention, ReLU² MLP), final norm,
untied LM head, mean next-token cross-entropy.

Sources (speedrun-spec.md 2.6): rotary embeddings record #2; ReLU², QK-norm, zero-init projections and
the padded 50304 vocabulary record #5; RMS norm without gain throughout; the normalized embedding at the
input; tanh logit softcap records #9 and #18; document masking over one packed sequence record #12.

Shape legend: T tokens of one packed sequence (B = 1), D documents, C model_dim, H n_head,
Dh head_dim, V vocab_size.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from speedrun.model.attention import attention
from speedrun.model.config import GPTConfig
from speedrun.model.init import init_input_, init_output_
from speedrun.model.loss import linear_cross_entropy
from speedrun.model.mlp import MLP
from speedrun.model.norm import rms_norm
from speedrun.model.packing import document_positions
from speedrun.model.rotary import apply_rotary, rotary_frequencies, rotary_tables

ParamKind = Literal["embed", "head", "matrix", "scalar"]


class CausalSelfAttention(nn.Module):
    """Multi-head document-causal self-attention: (T, C) -> (T, C).

    q, k, v = x Wqᵀ, x Wkᵀ, x Wvᵀ as (T, H, Dh); q and k RMS-normalized over Dh (QK-norm, record #5) and
    rotated (RoPE); scale 1/sqrt(Dh); output projection Wo zero-initialized. Attention runs in the dtype of
    the projections (bf16 under autocast, so that flash kernels apply).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.backend = config.attention_backend
        self.q = nn.Linear(config.model_dim, config.attn_dim, bias=False)
        self.k = nn.Linear(config.model_dim, config.attn_dim, bias=False)
        self.v = nn.Linear(config.model_dim, config.attn_dim, bias=False)
        self.o = nn.Linear(config.attn_dim, config.model_dim, bias=False)
        for linear in (self.q, self.k, self.v):
            init_input_(linear.weight)
        init_output_(self.o.weight)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        """x: (T, C); cu_seqlens: (D+1,) int32; cos, sin: (T, Dh/2) rotary tables. Returns (T, C)."""
        shape = (x.size(0), self.n_head, self.head_dim)
        v = self.v(x).view(shape)                                                     # (T, H, Dh)
        q = apply_rotary(rms_norm(self.q(x).view(shape)), cos, sin).type_as(v)        # (T, H, Dh)
        k = apply_rotary(rms_norm(self.k(x).view(shape)), cos, sin).type_as(v)        # (T, H, Dh)
        y = attention(q, k, v, cu_seqlens, self.head_dim ** -0.5, backend=self.backend)  # in v's dtype
        return self.o(y.reshape(x.size(0), -1))                                      # (T, C)


class Block(nn.Module):
    """Pre-norm transformer block: ``x += attn(norm(x)); x += mlp(norm(x))``. (T, C) -> (T, C)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attn = CausalSelfAttention(config)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(rms_norm(x), cu_seqlens, cos, sin)
        return x + self.mlp(rms_norm(x))


class GPT(nn.Module):
    """The language model. ``GPT(config)(inputs, targets, cu_seqlens)`` is the mean next-token loss.

    Parameters: ``embed`` (V, C) ~ N(0, 1); ``blocks``; ``lm_head`` (V, C) zero-initialized (so the loss at
    initialization is exactly ln V). :meth:`parameter_kinds` labels each parameter for the optimizers.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.model_dim)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.lm_head = nn.Linear(config.model_dim, config.vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, mean=0.0, std=1.0)
        init_output_(self.lm_head.weight)
        self.register_buffer("rotary_frequencies", rotary_frequencies(config.head_dim, config.rope_base),
                             persistent=False)

    def hidden_states(self, inputs: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """The final normalized hidden states (T, C) of ``inputs`` (T,) int32 token ids, documents given by
        ``cu_seqlens`` (D+1,) int32 (0, document starts, T)."""
        positions = document_positions(cu_seqlens, inputs.size(0))                   # (T,)
        cos, sin = rotary_tables(positions, self.rotary_frequencies)                  # (T, Dh/2) each
        x = rms_norm(self.embed(inputs))                                              # (T, C)
        for block in self.blocks:
            x = block(x, cu_seqlens, cos, sin)
        return rms_norm(x)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy (fp32 scalar, nats/token) of predicting ``targets`` (T,) int64 from ``inputs``
        (T,) int32 with documents ``cu_seqlens`` (D+1,) int32. The head's matrix products run in the
        autocast dtype when autocast is on."""
        x = self.hidden_states(inputs, cu_seqlens)                                    # (T, C)
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        cfg = self.config
        return linear_cross_entropy(x, self.lm_head.weight, targets, softcap=cfg.logit_softcap,
                                    impl=cfg.cross_entropy, chunk_tokens=cfg.loss_chunk_tokens,
                                    compute_dtype=dtype)

    def parameter_kinds(self) -> dict[str, ParamKind]:
        """Parameter name -> kind: ``embed``, ``head``, ``matrix`` (2-D weights inside blocks, for Muon) or
        ``scalar`` (lower-dimensional parameters inside blocks)."""
        kinds: dict[str, ParamKind] = {}
        for name, param in self.named_parameters():
            if name.startswith("embed."):
                kinds[name] = "embed"
            elif name.startswith("lm_head."):
                kinds[name] = "head"
            elif name.startswith("blocks."):
                kinds[name] = "matrix" if param.ndim == 2 else "scalar"
            else:
                raise ValueError(f"parameter {name!r} has no optimizer kind")
        return kinds
