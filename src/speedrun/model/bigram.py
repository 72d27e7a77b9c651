"""Bigram hash embedding with the sign trick (records #62, #68, #71, #83; speedrun-spec.md 2.2 step 2).

Each position t of the packed sequence gets a row of a (V_b, C) table indexed by a hash of the bigram
(x[t-1], x[t]): ``((36313·x[t]) XOR (27191·x[t-1])) mod (V_b - 1)`` in int32 arithmetic, with the reserved
row V_b - 1 at position 0 (:func:`bigram_hash`; the record's ``get_bigram_hash``, computed there on the CPU
with torch int32 tensors). The hash crosses document boundaries by design: a document's first token hashes
with the last token of the previous document ("masking this ran slower and showed no improvement").

Sign trick (record #83, modded-nanogpt PR 299): bigrams that collide on one row are told apart by a fixed
random ±1 row (8192, C) picked by ``(x[t-1] XOR x[t]) mod 8192`` (row 0 at t = 0): the looked-up row is
multiplied by it element-wise (:func:`sign_rows`, :func:`sign_table`). The table here is drawn from a
fixed seed, so that every rank and every run hold the same one (the record broadcasts rank 0's).

The result enters the residual stream with a learned per-layer gate from 0.05 (records #62, #83):
``x = x0 + g_0·bigram`` at the start, and ``x += g_i·bigram`` after the attention sublayer of each layer
i >= 1 (:class:`BigramEmbedding`). The record's table is zero-initialized, so a fresh model ignores it.

The table may be narrower than the stream (``GPTConfig.bigram_dim`` D < C, records #83-#88: 754,560 rows of
192, added to the first 192 channels; HEAD: 377,280 rows of 768): its rows, and the sign rows, are D wide, and
:meth:`BigramEmbedding.forward` returns them padded with zeros to C, so every injection ``x += g·bigram`` adds
to channels 0..D-1 only, as the records' ``x[..., :bigram_dim] += ...``.

Shape legend: T tokens, C model_dim, D the table's width (C unless narrower), V_b bigram_vocab_size.
"""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

HASH_CURRENT = 36313
HASH_PREVIOUS = 27191
SIGN_TABLE_ROWS = 8192
SIGN_TABLE_SEED = 83
BIGRAM_GATE_INIT = 0.05
_INT32_SPAN = 2 ** 32
_INT32_MIN = -(2 ** 31)


def _wrap_int32(values: torch.Tensor) -> torch.Tensor:
    """int64 values reduced to the int32 they wrap to in two's complement (what an int32 product gives)."""
    return (values - _INT32_MIN) % _INT32_SPAN + _INT32_MIN


def bigram_hash(inputs: torch.Tensor, bigram_vocab_size: int) -> torch.Tensor:
    """(T,) int64 bigram ids in 0..V_b-1 of the token ids ``inputs`` (T,) (any integer dtype, >= 0).

    Position 0: V_b - 1. Position t >= 1: ``((36313·x[t]) XOR (27191·p[t-1])) mod (V_b - 1)`` with p the
    ids after position 0 is set: p[0] = V_b - 1, p[t] = x[t] (records #83-#89 ``get_bigram_hash`` write the
    reserved id in place before hashing, so position 1 pairs with it, not with x[0]); the products wrapped
    to int32 as the record's int32 tensors do (no wrap for ids below 2^31/36313 = 59,138, so never for the
    GPT-2 vocabulary, but 27191·(V_b - 1) wraps) and ``mod`` the floored one (non-negative). Computed on
    ``inputs``' device.
    """
    if bigram_vocab_size < 2:
        raise ValueError(f"bigram_vocab_size must be >= 2, got {bigram_vocab_size}")
    x = inputs.to(torch.int64)
    mod = bigram_vocab_size - 1
    previous = torch.cat((x.new_full((1,), mod), x[1:-1]))               # p[0..T-2], p[0] the reserved id
    mixed = torch.bitwise_xor(_wrap_int32(HASH_CURRENT * x[1:]), _wrap_int32(HASH_PREVIOUS * previous))
    return torch.cat((x.new_full((1,), mod), mixed % mod))


def sign_rows(inputs: torch.Tensor, rows: int = SIGN_TABLE_ROWS) -> torch.Tensor:
    """(T,) int64 row of the sign table per position: ``(x[t-1] XOR x[t]) mod rows``, 0 at t = 0."""
    x = inputs.to(torch.int64)
    return torch.cat((x.new_zeros(1), torch.bitwise_xor(x[:-1], x[1:]) % rows))


def sign_table(rows: int, dim: int, seed: int = SIGN_TABLE_SEED) -> torch.Tensor:
    """(rows, dim) float32 of independent fair ±1 draws from a CPU generator seeded with ``seed``: the same
    table on every machine and every run."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    bits = torch.randint(0, 2, (rows, dim), generator=generator, device="cpu")
    return (2 * bits - 1).to(torch.float32)


class BigramEmbedding(nn.Module):
    """The bigram hash embedding and its per-layer gates. ``forward(inputs)`` (T,) int -> (T, C).

    Parameters: ``table`` (V_b, D) zero-initialized (an ``embed``-kind Adam parameter, spec 3.3); ``gates``
    (n_layer,) from 0.05 (``scalar`` kind; None with ``gates`` False, when HEAD's MUDD gates give them, record
    #85). Buffer (not a parameter): ``signs`` (8192, D) ±1 with
    ``sign_trick``, built from :data:`SIGN_TABLE_SEED` and not saved in checkpoints. ``dim``: D, None for
    ``model_dim``; 1 <= D <= model_dim (``ValueError`` otherwise). ``forward`` returns (T, C), the columns from D
    on zero (see the module docstring).
    """

    def __init__(self, bigram_vocab_size: int, model_dim: int, n_layer: int, sign_trick: bool, gates: bool = True,
                 dim: int | None = None):
        super().__init__()
        dim = model_dim if dim is None else dim
        if not 1 <= dim <= model_dim:
            raise ValueError(f"the bigram table's width must be in 1..{model_dim} (model_dim), got {dim}")
        self.bigram_vocab_size, self.model_dim = bigram_vocab_size, model_dim
        self.table = nn.Parameter(torch.zeros(bigram_vocab_size, dim))
        self.gates = nn.Parameter(torch.full((n_layer,), BIGRAM_GATE_INIT)) if gates else None
        self.sign_trick = sign_trick
        if sign_trick:
            self.register_buffer("signs", sign_table(SIGN_TABLE_ROWS, dim), persistent=False)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(bigram_hash(inputs, self.bigram_vocab_size), self.table)       # (T, D)
        if self.sign_trick:
            rows = rows * self.signs[sign_rows(inputs, self.signs.size(0))].type_as(rows)
        width = self.table.size(1)
        return rows if width == self.model_dim else F.pad(rows, (0, self.model_dim - width))   # (T, C)

    def per_layer(self, inputs: torch.Tensor) -> list[torch.Tensor]:
        """For each layer i, ``gates[i] · forward(inputs)`` (T, C): layer 0's is added to the residual stream
        at the start, layer i >= 1's after that layer's attention sublayer."""
        bigram = self(inputs)
        return [gate * bigram for gate in self.gates.type_as(bigram).unbind(0)]
