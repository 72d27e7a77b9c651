"""Model shape and options: :class:`GPTConfig`, the presets and :func:`build_model_config`.

The clean GPT (records #2-#5, #18 of the public speedrun, speedrun-spec.md 2.6): token embedding, pre-norm
blocks of attention (RoPE, QK-norm) and a ReLU² MLP, RMS norms without gain, an untied LM head and an
optional tanh logit softcap. Modes are ``Literal`` types so that a later backend (FlexAttention, varlen
flash) or loss only adds a name and its implementation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Mapping, get_args

from speedrun.errors import SpeedrunError

AttentionBackend = Literal["reference", "sdpa", "sdpa_docs"]
CrossEntropyImpl = Literal["full", "chunked"]
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)
CROSS_ENTROPY_IMPLS: tuple[str, ...] = get_args(CrossEntropyImpl)
GPT2_VOCAB = 50257


@dataclass(frozen=True)
class GPTConfig:
    """Shape and options of :class:`speedrun.model.gpt.GPT`.

    Fields:
        vocab_size: rows of the embedding and the head; 50304 = GPT-2's 50257 padded to a multiple of 128
            (record #5). Token ids must be < vocab_size.
        n_layer: transformer blocks.
        model_dim: width of the residual stream.
        n_head, head_dim: attention heads and their width (even, for RoPE); q/k/v are n_head*head_dim wide.
        mlp_ratio: MLP hidden width = mlp_ratio * model_dim.
        rope_base: RoPE base frequency theta (Su et al. 2021; record #2).
        logit_softcap: None, or c > 0 for logits ``c * tanh(z / c)`` (Gemma 2; records #9 c=30, #18 c=15).
        attention_backend: see :mod:`speedrun.model.attention`.
        cross_entropy: ``"full"`` materializes (T, vocab) logits for autograd; ``"chunked"`` computes loss and
            gradients chunk by chunk (see :mod:`speedrun.model.loss`).
        loss_chunk_tokens: tokens per chunk of the chunked cross-entropy (64 keeps a chunk's (64, 50304)
            fp32 logits in a CPU's cache).

    Raises :class:`SpeedrunError` (naming the field) on a non-positive size, an odd head_dim, an unknown mode.
    """

    vocab_size: int = 50304
    n_layer: int = 12
    model_dim: int = 768
    n_head: int = 6
    head_dim: int = 128
    mlp_ratio: int = 4
    rope_base: float = 10000.0
    logit_softcap: float | None = None
    attention_backend: AttentionBackend = "sdpa_docs"
    cross_entropy: CrossEntropyImpl = "chunked"
    loss_chunk_tokens: int = 64

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "model_dim", "n_head", "head_dim", "mlp_ratio",
                     "loss_chunk_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpeedrunError(f"model.{name} must be a positive integer, got {value!r}")
        if self.head_dim % 2:
            raise SpeedrunError(f"model.head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if not isinstance(self.rope_base, (int, float)) or self.rope_base <= 1:
            raise SpeedrunError(f"model.rope_base must be a number > 1, got {self.rope_base!r}")
        if self.logit_softcap is not None and (
                not isinstance(self.logit_softcap, (int, float)) or self.logit_softcap <= 0):
            raise SpeedrunError(f"model.logit_softcap must be null or a number > 0, got {self.logit_softcap!r}")
        _check_mode("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _check_mode("cross_entropy", self.cross_entropy, CROSS_ENTROPY_IMPLS)

    @property
    def attn_dim(self) -> int:
        """Width of q, k and v: n_head * head_dim."""
        return self.n_head * self.head_dim

    @property
    def mlp_hidden(self) -> int:
        """Hidden width of the MLP: mlp_ratio * model_dim."""
        return self.mlp_ratio * self.model_dim


def _check_mode(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpeedrunError(f"model.{name} must be one of {', '.join(allowed)}; got {value!r}")


PRESETS: dict[str, GPTConfig] = {
    # CPU-sized: 4 layers of width 64, 2 heads of 32, the full GPT-2 vocabulary. The (T, 50304) head
    # dominates the cost: about 3,100 train tokens/s on one thread (benchmarks/train_cpu.py); width 96
    # gives about 2,200 and width 128 about 1,850.
    "tiny": GPTConfig(n_layer=4, model_dim=64, n_head=2, head_dim=32, mlp_ratio=4),
    # The public record's width and heads (speedrun-spec.md 2.1) in 12 plain GPT-2 layers; loss chunks of
    # 8192 tokens suit a GPU (few, large kernels).
    "gpt124m": GPTConfig(n_layer=12, model_dim=768, n_head=6, head_dim=128, mlp_ratio=4,
                         logit_softcap=15.0, loss_chunk_tokens=8192),
}


def build_model_config(preset: str, overrides: Mapping[str, Any] | None = None) -> GPTConfig:
    """The preset ``preset`` with ``overrides`` (GPTConfig field -> value) applied.

    Raises :class:`SpeedrunError` for an unknown preset, an unknown override key (named, with the valid
    keys) or an invalid value.
    """
    if preset not in PRESETS:
        raise SpeedrunError(f"unknown model preset {preset!r}; expected one of {', '.join(PRESETS)}")
    overrides = dict(overrides or {})
    valid = [f.name for f in dataclasses.fields(GPTConfig)]
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise SpeedrunError(
            f"unknown model setting {unknown[0]!r} (model overrides accept {', '.join(valid)})"
        )
    return dataclasses.replace(PRESETS[preset], **overrides)
