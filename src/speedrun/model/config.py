"""Model shape and options: :class:`GPTConfig`, the presets and :func:`build_model_config`.

The clean GPT (records #2-#5, #18 of the public speedrun, speedrun-spec.md 2.6): token embedding, pre-norm
blocks of attention (RoPE, QK-norm) and a ReLU² MLP, RMS norms without gain, an untied LM head and an
optional logit softcap. Each later technique is a switch whose default is off (the ``tiny`` preset) and
whose ``gpt124m`` value is the record's: sliding windows in 128-token blocks, long or short per layer
(records #13, #20), half-truncated RoPE (#17), attention scale 0.1 with YaRN on window growth (#31), the
shifted-sigmoid softcap (#54). Modes are ``Literal`` types.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Mapping, get_args

from speedrun.errors import SpeedrunError
from speedrun.model.windows import check_window_pattern

RopeMode = Literal["full", "half_truncated"]
AttentionBackend = Literal["reference", "sdpa", "sdpa_docs", "flex"]
CrossEntropyImpl = Literal["full", "chunked"]
SoftcapKind = Literal["tanh", "shifted_sigmoid"]
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)
CROSS_ENTROPY_IMPLS: tuple[str, ...] = get_args(CrossEntropyImpl)
SOFTCAP_KINDS: tuple[str, ...] = get_args(SoftcapKind)
ROPE_MODES: tuple[str, ...] = get_args(RopeMode)
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
        rope_base: RoPE base frequency theta (Su et al. 2021; record #2); unused by ``half_truncated``.
        rope: ``"full"`` or ``"half_truncated"`` (32 frequencies on dims 0-63 for head_dim 128, record #17);
            see :mod:`speedrun.model.rotary`.
        attention_scale: None for 1/sqrt(head_dim), or the scale of q·k (record #31: 0.1).
        yarn: rescale the rotary frequencies and the attention scale whenever the long window grows (YaRN,
            record #31; alpha 1, beta 32, scale x(1 + 0.2 ln(new/old))). Needs a window_pattern.
        window_pattern: "" (no sliding window) or one character per layer, S short / L long / F full
            document (records #13, #20; see :mod:`speedrun.model.windows`).
        window_block_size: tokens per window block (128 in the speedrun).
        window_short_blocks, window_long_blocks: the windows in blocks before any schedule sets them (the
            record's first stage, 1 and 3).
        logit_softcap: None, or c > 0: logits ``c * tanh(z / c)`` (Gemma 2; records #9 c=30, #18 c=15) or,
            with ``softcap_kind="shifted_sigmoid"``, ``c * sigmoid((z + 5) / 7.5)`` (record #54, c=23).
        softcap_kind: ``"tanh"`` or ``"shifted_sigmoid"``.
        x0_lambdas: each block mixes in the normalized embedding, x = λ0·x + λ1·x0 with learned per-layer
            λ from (1, 0) (record #9).
        value_embed_layers: layers whose attention values get a token-indexed value embedding added
            (records #14-#17; HEAD: layers 1, 2, 8, 9, 10 of 11).
        smear: one-token look-back on the embeddings, x[t] += λ·σ(w·x[t,:12])·x[t-1] (record #34).
        tie_embed_head: the embedding reads the head's weight until the training untie step (records #8,
            #51, #53).
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
    rope: RopeMode = "full"
    attention_scale: float | None = None
    yarn: bool = False
    window_pattern: str = ""
    window_block_size: int = 128
    window_short_blocks: int = 1
    window_long_blocks: int = 3
    logit_softcap: float | None = None
    softcap_kind: SoftcapKind = "tanh"
    x0_lambdas: bool = False
    value_embed_layers: tuple[int, ...] = ()
    smear: bool = False
    tie_embed_head: bool = False
    attention_backend: AttentionBackend = "sdpa_docs"
    cross_entropy: CrossEntropyImpl = "chunked"
    loss_chunk_tokens: int = 64

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "model_dim", "n_head", "head_dim", "mlp_ratio",
                     "loss_chunk_tokens", "window_block_size", "window_short_blocks", "window_long_blocks"):
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
        _check_mode("rope", self.rope, ROPE_MODES)
        _check_mode("softcap_kind", self.softcap_kind, SOFTCAP_KINDS)
        self._check_windows_and_rope()
        self._check_embeddings()

    def _check_embeddings(self) -> None:
        for name in ("x0_lambdas", "smear", "tie_embed_head"):
            if not isinstance(getattr(self, name), bool):
                raise SpeedrunError(f"model.{name} must be true or false, got {getattr(self, name)!r}")
        layers = self.value_embed_layers
        if isinstance(layers, list):
            layers = tuple(layers)
            object.__setattr__(self, "value_embed_layers", layers)
        if not isinstance(layers, tuple) or any(
                not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.n_layer for i in layers
        ) or list(layers) != sorted(set(layers)):
            raise SpeedrunError(f"model.value_embed_layers must be increasing layer indices in "
                                f"0..{self.n_layer - 1}, got {self.value_embed_layers!r}")
        if self.smear and self.model_dim < 12:
            raise SpeedrunError(f"model.smear reads 12 channels; model_dim is {self.model_dim}")

    def _check_windows_and_rope(self) -> None:
        if self.rope == "half_truncated" and self.head_dim % 4:
            raise SpeedrunError(f"model.head_dim must be a multiple of 4 for rope half_truncated, got "
                                f"{self.head_dim}")
        if self.attention_scale is not None and (
                not isinstance(self.attention_scale, (int, float)) or self.attention_scale <= 0):
            raise SpeedrunError(f"model.attention_scale must be null or a number > 0, got "
                                f"{self.attention_scale!r}")
        if not isinstance(self.window_pattern, str):
            raise SpeedrunError(f"model.window_pattern must be a string, got {self.window_pattern!r}")
        try:
            check_window_pattern(self.window_pattern, self.n_layer)
        except ValueError as e:
            raise SpeedrunError(f"model.{e}") from None
        if not isinstance(self.yarn, bool):
            raise SpeedrunError(f"model.yarn must be true or false, got {self.yarn!r}")
        if self.yarn and "L" not in self.window_pattern:
            raise SpeedrunError("model.yarn rescales on growth of the long window: it needs a window_pattern "
                                "with at least one L layer")

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
    # The public record's width and heads (speedrun-spec.md 2.1) in 12 layers; loss chunks of 8192 tokens
    # suit a GPU (few, large kernels). Record switches: long windows on layer 3 and the last (HEAD's
    # 11-layer pattern, layers 3 and 10, carried to 12 layers), short elsewhere, 1/3 blocks at the start
    # (#13, #20, #31); half-truncated RoPE (#17); attention scale 0.1 and YaRN (#31); 23·σ((z+5)/7.5) (#54);
    # x0 lambdas (#9); value embeddings on layers 1, 2 and the last three (HEAD's 1, 2, 8, 9, 10 of 11);
    # smear (#34); tied embedding and head (#51, untied by the training untie_step, #53).
    "gpt124m": GPTConfig(n_layer=12, model_dim=768, n_head=6, head_dim=128, mlp_ratio=4,
                         rope="half_truncated", attention_scale=0.1, yarn=True,
                         window_pattern="SSSLSSSSSSSL", window_short_blocks=1, window_long_blocks=3,
                         logit_softcap=23.0, softcap_kind="shifted_sigmoid", x0_lambdas=True,
                         value_embed_layers=(1, 2, 9, 10, 11), smear=True, tie_embed_head=True,
                         loss_chunk_tokens=8192),
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
