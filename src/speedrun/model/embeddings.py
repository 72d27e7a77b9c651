"""Input-side techniques of the speedrun GPT: value embeddings (records #14-#17, #63, #65, #70) and smear
(record #34); speedrun-spec.md 2.2. The bigram hash embedding is :mod:`speedrun.model.bigram`.

Shape legend: T tokens, C model_dim, A attn_dim = n_head * head_dim, V vocab_size.
"""

from __future__ import annotations

import torch
from torch import nn

SMEAR_CHANNELS = 12
VALUE_EMBED_STD = 0.01


class ValueEmbeddings(nn.Module):
    """Token-indexed tables (V, A) added to chosen layers' attention values: ``v += table[token]``
    (speedrun-spec.md 2.2 step 3), or mixed in with learned weights (``GPTConfig.value_lambdas``, record #28).

    ``layers``: the layer indices that get a value embedding, in increasing order. ``tables``: 0 for one
    table per layer, or k >= 1 tables shared in turn, the j-th listed layer reading table j mod k (record
    #28: 3 tables over layers 0, 1, 2, 9, 10, 11, "012 ... 012"). ``std``: the tables start N(0, std²):
    0.01 in the current record (speedrun-spec.md 2.2), 1.0 in record #28 (``nn.Embedding``'s default).
    Raises ``ValueError`` for a table count outside 1..len(layers) or std <= 0.
    """

    def __init__(self, vocab_size: int, attn_dim: int, layers: tuple[int, ...], tables: int = 0,
                 std: float = VALUE_EMBED_STD):
        super().__init__()
        count = tables or len(layers)
        if not 1 <= count <= len(layers):
            raise ValueError(f"{tables} value-embedding tables for {len(layers)} layers")
        if not std > 0:
            raise ValueError(f"value-embedding std must be > 0, got {std}")
        self.slot = {layer: j % count for j, layer in enumerate(layers)}
        self.tables = nn.ModuleList(nn.Embedding(vocab_size, attn_dim) for _ in range(count))
        for table in self.tables:
            nn.init.normal_(table.weight, mean=0.0, std=std)

    def per_layer(self, inputs: torch.Tensor, n_layer: int) -> list[torch.Tensor | None]:
        """For each of ``n_layer`` layers, its (T, A) value embedding of ``inputs`` (T,) int, or None. A
        shared table is looked up once."""
        looked_up = [table(inputs) for table in self.tables]
        return [looked_up[self.slot[i]] if i in self.slot else None for i in range(n_layer)]


class Smear(nn.Module):
    """``x[t] += lambda · sigmoid(w · x[t, :12]) · x[t-1]`` for t >= 1 (record #34: a one-token look-back on
    the embeddings, crossing document boundaries). ``gate`` (1, 12) and ``lambda_`` (1,) start at zero, so
    a fresh Smear is the identity. (T, C) -> (T, C), C >= 12."""

    def __init__(self, model_dim: int):
        super().__init__()
        if model_dim < SMEAR_CHANNELS:
            raise ValueError(f"smear reads {SMEAR_CHANNELS} channels, model_dim is {model_dim}")
        self.gate = nn.Parameter(torch.zeros(1, SMEAR_CHANNELS))
        self.lambda_ = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(x[1:, :SMEAR_CHANNELS] @ self.gate.type_as(x).T)        # (T-1, 1)
        shifted = self.lambda_.type_as(x) * gate * x[:-1]                            # (T-1, C)
        return torch.cat((x[:1], x[1:] + shifted), dim=0)
