"""The speedrun GPT: embedding (optionally tied to the head, with smear and value embeddings), pre-norm
blocks (RoPE + QK-norm attention, ReLU² MLP, optional x0 injection), final norm, LM head, mean next-token
cross-entropy.

Sources (speedrun-spec.md 2.2-2.6): rotary embeddings record #2; ReLU², QK-norm, zero-init projections and
the padded 50304 vocabulary record #5; RMS norm without gain throughout; the normalized embedding at the
input; tied embedding and head records #8, #51, untied at a step record #53; x0 shortcut and tanh logit
softcap record #9 (softcap 15 #18); document masking over one packed sequence record #12; sliding windows in
128-token blocks, long or short per layer, records #13 and #20; value embeddings records #14-#17;
half-truncated RoPE record #17; attention scale 0.1 and YaRN on window growth record #31; smear record #34;
shifted-sigmoid softcap record #54.

Shape legend: T tokens of one packed sequence (B = 1), D documents, C model_dim, H n_head,
Dh head_dim, V vocab_size.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.model.block import Block
from speedrun.model.config import GPTConfig
from speedrun.model.embeddings import Smear, ValueEmbeddings
from speedrun.model.init import init_output_
from speedrun.model.loss import linear_cross_entropy
from speedrun.model.norm import rms_norm
from speedrun.model.packing import document_positions
from speedrun.model.rotary import rotary_frequencies, rotary_tables, yarn_attention_scale, yarn_frequencies
from speedrun.model.windows import layer_windows, window_tokens

ParamKind = Literal["embed", "head", "matrix", "scalar"]
TIED_HEAD_STD = 0.005


class GPT(nn.Module):
    """The language model. ``GPT(config)(inputs, targets, cu_seqlens)`` is the mean next-token loss.

    Parameters: ``embed`` (V, C) ~ N(0, 1); ``blocks``; ``lm_head`` (V, C) zero-initialized (so the loss at
    initialization is exactly ln V); with ``config.value_embed_layers``, ``value_embeds``; with
    ``config.smear``, ``smear``. :meth:`parameter_kinds` labels each parameter for the optimizers.

    Tied (``config.tie_embed_head``, records #8, #51): the embedding lookup reads ``lm_head.weight``, which
    starts N(0, 0.005²) (speedrun-spec.md 2.5) and gets both gradients; ``embed.weight`` holds a copy and
    gets none until :meth:`untie_embed_head` (record #53: at 2/3 of training).

    Schedule state (not parameters): ``window_blocks`` (short, long) in blocks, set by
    :meth:`set_window_blocks`; the rotary frequencies (buffer) and ``attention_scale``, which YaRN rescales
    when the long window grows (``config.yarn``).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.model_dim)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.lm_head = nn.Linear(config.model_dim, config.vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, mean=0.0, std=1.0)
        init_output_(self.lm_head.weight)
        self.tied = config.tie_embed_head
        if self.tied:
            with torch.no_grad():
                nn.init.normal_(self.lm_head.weight, mean=0.0, std=TIED_HEAD_STD)
                self.embed.weight.copy_(self.lm_head.weight)
        if config.value_embed_layers:
            self.value_embeds = ValueEmbeddings(config.vocab_size, config.attn_dim, config.value_embed_layers)
        if config.smear:
            self.smear = Smear(config.model_dim)
        self.register_buffer("rotary_frequencies", rotary_frequencies(config.head_dim, config.rope_base,
                                                                      mode=config.rope), persistent=False)
        self.attention_scale = config.attention_scale or config.head_dim ** -0.5
        self.window_blocks = (config.window_short_blocks, config.window_long_blocks)

    @torch.no_grad()
    def set_window_blocks(self, short_blocks: int, long_blocks: int) -> None:
        """Set the short and long windows (blocks of ``config.window_block_size`` tokens). With
        ``config.yarn``, a change of the long window from old to new tokens rescales the rotary frequencies
        and the attention scale (:func:`speedrun.model.rotary.yarn_frequencies`, record #31); growing then
        shrinking back does not restore them exactly. Nothing to do when the windows are unchanged."""
        block = self.config.window_block_size
        old, new = window_tokens(self.window_blocks[1], block), window_tokens(long_blocks, block)
        window_tokens(short_blocks, block)
        if self.config.yarn and new != old:
            self.rotary_frequencies.copy_(yarn_frequencies(self.rotary_frequencies, old, new))
            self.attention_scale = yarn_attention_scale(self.attention_scale, old, new)
        self.window_blocks = (short_blocks, long_blocks)

    @torch.no_grad()
    def untie_embed_head(self) -> None:
        """Copy the shared weight into ``embed.weight`` and train the two apart from now on (record #53).
        Raises ``RuntimeError`` when the model is not tied."""
        if not self.tied:
            raise RuntimeError("untie_embed_head: the embedding and the head are not tied")
        self.embed.weight.copy_(self.lm_head.weight)
        self.tied = False

    def layer_windows(self) -> list[int | None]:
        """Per layer, the current window in tokens (None: whole document), from ``config.window_pattern``."""
        cfg = self.config
        return layer_windows(cfg.window_pattern, cfg.n_layer, *self.window_blocks, cfg.window_block_size)

    def hidden_states(self, inputs: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """The final normalized hidden states (T, C) of ``inputs`` (T,) int32 token ids, documents given by
        ``cu_seqlens`` (D+1,) int32 (0, document starts, T)."""
        positions = document_positions(cu_seqlens, inputs.size(0))                   # (T,)
        cos, sin = rotary_tables(positions, self.rotary_frequencies)                  # (T, R) each
        x = F.embedding(inputs, self.lm_head.weight if self.tied else self.embed.weight)  # (T, C)
        if self.config.smear:
            x = self.smear(x)
        x = x0 = rms_norm(x)
        n_layer = self.config.n_layer
        value_embeds = (self.value_embeds.per_layer(inputs, n_layer) if self.config.value_embed_layers
                        else [None] * n_layer)
        for block, window, ve in zip(self.blocks, self.layer_windows(), value_embeds):
            x = block(x, x0, cu_seqlens, cos, sin, self.attention_scale, window, ve)
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
                                    softcap_kind=cfg.softcap_kind, impl=cfg.cross_entropy,
                                    chunk_tokens=cfg.loss_chunk_tokens, compute_dtype=dtype)

    def parameter_kinds(self) -> dict[str, ParamKind]:
        """Parameter name -> kind: ``embed`` (token and value embeddings), ``head``, ``matrix`` (2-D weights
        inside blocks, for Muon) or ``scalar`` (lower-dimensional parameters inside blocks, and smear's)."""
        kinds: dict[str, ParamKind] = {}
        for name, param in self.named_parameters():
            if name.startswith(("embed.", "value_embeds.")):
                kinds[name] = "embed"
            elif name.startswith("smear."):
                kinds[name] = "scalar"
            elif name.startswith("lm_head."):
                kinds[name] = "head"
            elif name.startswith("blocks."):
                kinds[name] = "matrix" if param.ndim == 2 else "scalar"
            else:
                raise ValueError(f"parameter {name!r} has no optimizer kind")
        return kinds
