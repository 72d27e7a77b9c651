"""The prefix-token table of prefix-token prediction (record #88, speedrun-spec.md 2.5).

For a token T with byte string b, ``prefix(T)`` is the token whose byte string is the longest proper prefix
of b (non-empty, shorter than b) that is itself a token; -1 when there is none (every single-byte token, for
instance), which switches the prefix term of that position off. The record trains the head to predict
prefix(target_t) at position t as an auxiliary loss (:func:`speedrun.model.loss.linear_cross_entropy`,
``prefix_targets``): e.g. for the target " the" also " th", the token a shorter merge would have produced.

The table depends only on the GPT-2 vocabulary, never on the corpus. Construction: sorted byte strings put
every prefix of b before b and, between the two, only strings that extend that prefix; so while walking the
sorted list, the chain of tokens that are prefixes of the current one is a stack whose top is the answer.
O(V log V) for the sort; 0.2 s for GPT-2's 50,256 tokens on a CPU core, the tokenizer files loaded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NO_PREFIX = -1


def prefix_table_from_bytes(token_bytes: Sequence[bytes | None], vocab_size: int) -> torch.Tensor:
    """The prefix table (vocab_size,) int64 of a vocabulary given as ``token_bytes[i]`` = the byte string of
    token i (None: no such token, e.g. a special token). Entry i: the id of the token whose bytes are the
    longest proper prefix of token i's bytes, or :data:`NO_PREFIX` (-1); ids from ``len(token_bytes)`` to
    ``vocab_size - 1`` (the padding of the vocabulary) get -1.

    Raises ``ValueError`` when ``vocab_size < len(token_bytes)`` or two tokens have the same bytes."""
    if vocab_size < len(token_bytes):
        raise ValueError(f"vocab_size {vocab_size} is smaller than the vocabulary's {len(token_bytes)} tokens")
    entries = sorted((b, i) for i, b in enumerate(token_bytes) if b is not None)
    table = [NO_PREFIX] * vocab_size
    chain: list[tuple[bytes, int]] = []                 # tokens that are prefixes of the current one, nested
    previous = None
    for data, token in entries:
        if data == previous:
            raise ValueError(f"two tokens have the same bytes {data!r}")
        previous = data
        while chain and not data.startswith(chain[-1][0]):
            chain.pop()
        if chain:
            table[token] = chain[-1][1]
        chain.append((data, token))
    return torch.tensor(table, dtype=torch.int64)


def gpt2_token_bytes() -> list[bytes | None]:
    """The byte string of each GPT-2 token id 0..50256 (offline, :func:`speedrun.data.tokenizer.gpt2_encoding`);
    None for ``<|endoftext|>`` (50256), a special token and not a byte string, as in the record's table."""
    from speedrun.data.tokenizer import gpt2_encoding        # tiktoken: imported only when a table is built

    encoding = gpt2_encoding()
    special = {encoding.encode_single_token(s) for s in encoding.special_tokens_set}
    return [None if i in special else encoding.decode_single_token_bytes(i) for i in range(encoding.n_vocab)]


def prefix_token_table(vocab_size: int) -> torch.Tensor:
    """The GPT-2 prefix table (vocab_size,) int64 on the CPU (record #88; see the module docstring):
    ids >= 50257 (the padded vocabulary, e.g. 50304) and ``<|endoftext|>`` get -1.

    Raises ``ValueError`` when ``vocab_size`` < 50257, :class:`speedrun.errors.SpeedrunError` when the
    offline GPT-2 vocabulary files are missing."""
    return prefix_table_from_bytes(gpt2_token_bytes(), vocab_size)
