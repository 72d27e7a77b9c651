"""The speedrun GPT: embedding (optionally tied to the head, with smear, value embeddings and a bigram hash
embedding), pre-norm blocks (RoPE + QK-norm attention, ReLU² MLP, optional x0 injection), optional long skips
between blocks, final norm, LM head, mean next-token cross-entropy.

Sources (speedrun-spec.md 2.2-2.6): rotary embeddings record #2; ReLU², QK-norm, zero-init projections and
the padded 50304 vocabulary record #5; RMS norm without gain throughout; the normalized embedding at the
input; tied embedding and head records #8, #51, untied at a step record #53; x0 shortcut and tanh logit
softcap record #9 (softcap 15 #18); document masking over one packed sequence record #12; sliding windows in
128-token blocks, long or short per layer, records #13 and #20; value embeddings records #14-#17;
half-truncated RoPE record #17; attention scale 0.1 and YaRN on window growth record #31; smear record #34;
shifted-sigmoid softcap record #54; U-net skips record #11, the gated skip records #45, #55; sparse attention
gate record #28; paired-head attention record #58; bigram hash embedding records #62, #83; FP8 head record
#19, FP8 QKV/O the 2026-06-11 record; backout record #40; partial key offset record #49; the records'
per-sublayer residual form (records #81-#88, :mod:`speedrun.model.residual`) with the q/k/v lambdas record
#47, the single saved activation record #77, MUDD record #81, XSA records #82, #86, HEAD's MUDD gates and
lightweight DC record #85.

Shape legend: T tokens of one packed sequence (B = 1), D documents, C model_dim, H n_head,
Dh head_dim, V vocab_size.
"""

from __future__ import annotations

from typing import Collection, Literal, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.model.attention import PackedDocuments
from speedrun.model.bigram import BigramEmbedding
from speedrun.model.block import AttentionContext, Block, CausalSelfAttention
from speedrun.model.config import GPTConfig
from speedrun.model.embeddings import Smear, ValueEmbeddings
from speedrun.model.fp8 import HEAD_SCALES, FP8Linear, FP8WeightCache, refresh_caches_
from speedrun.model.init import init_output_, init_torch_linear_inputs_
from speedrun.model.loss import linear_cross_entropy
from speedrun.model.mudd import CoefficientNet, DenseConnections, MuddGates
from speedrun.model.norm import rms_norm
from speedrun.model.packing import document_positions
from speedrun.model.paired import paired_positions
from speedrun.model.prefix import prefix_token_table
from speedrun.model.residual import SublayerResidual, run_sublayers
from speedrun.model.roles import ParamRole, check_role_layers, declared_roles
from speedrun.model.rotary import rotary_frequencies, rotary_table, yarn_attention_scale, yarn_frequencies
from speedrun.model.skips import GatedSkip, UNetSkips
from speedrun.model.value_residual import first_layer_values
from speedrun.model.windows import layer_windows, per_layer, window_tokens

ParamKind = Literal["embed", "head", "matrix", "scalar", "lambda", "resid_lambda", "skip_gate", "gate",
                    "smear_gate", "mudd", "mudd_bias", "mudd_gate", "mudd_gate_bias"]
# the kinds whose parameters stay fp32 under GPT.store_weights (records #57-#89 keep scalars and lambdas fp32)
FP32_KINDS: tuple[str, ...] = ("scalar", "lambda", "resid_lambda")
TIED_HEAD_STD = 0.005
BACKOUT_LAMBDA_INIT = 0.5


class GPT(nn.Module):
    """The language model. ``GPT(config)(inputs, targets, cu_seqlens)`` is the mean next-token loss.

    Parameters: ``embed`` (V, C) ~ N(0, 1); ``blocks``; ``lm_head`` (V, C) zero-initialized (so the loss at
    initialization is exactly ln V); with ``config.value_embed_layers``, ``value_embeds``; with
    ``config.smear``, ``smear``; with ``config.bigram_vocab_size``, ``bigram``
    (:class:`speedrun.model.bigram.BigramEmbedding`); with ``config.skip_connections``, ``skips``
    (:mod:`speedrun.model.skips`); with ``config.backout_layer``, ``backout_lambda`` (1,) fp32 from 0.5
    (backout, record #40: see :meth:`_run_blocks`); with ``config.residual_form`` sublayer, ``residual``
    (:class:`speedrun.model.residual.SublayerResidual`; the forward of :func:`speedrun.model.residual.run_sublayers`);
    with ``config.mudd``, ``mudd`` (:class:`speedrun.model.mudd.DenseConnections`, record #81); with
    ``config.mudd_gates``, ``mudd_gates`` (:class:`speedrun.model.mudd.MuddGates`, record #85).
    :meth:`parameter_kinds` labels each parameter for the optimizers; :meth:`parameter_roles` names those they
    (and record #12's initialization) treat apart from the rest of their kind (:mod:`speedrun.model.roles`).

    Tied (``config.tie_embed_head``, records #8, #51): one weight, ``lm_head.weight``, N(0, 0.005²) at
    initialization (speedrun-spec.md 2.5), serves the embedding and the head until :meth:`untie_embed_head`
    (record #53: at 2/3 of training). The embedding lookup always reads ``embed.weight``, which holds a copy:
    :meth:`fold_tied_gradients` (after the backward pass) adds its gradient into the head's and
    :meth:`sync_tied_embedding` (after the optimizer step) copies the updated head back, so the update is
    that of one shared weight while the forward pass is the same tied or untied, and torch.compile's graphs
    serve both tie states (two graphs fewer for the H200 race of docs/benchmarks.md).

    Schedule state (not parameters): ``window_blocks`` (short, long) in blocks, set by
    :meth:`set_window_blocks`; the rotary frequencies (buffer ``rotary_frequencies`` (R,)) and
    ``attention_scale``, which YaRN rescales when the long window grows (``config.yarn``). With the
    ``"flex"`` backend a forward pass reads the windows from the buffer ``window_sizes`` ((2,) int32 tokens,
    short and long) and, with YaRN, the scale from ``attention_scale_buffer`` (0-d, fp32, float64 in a
    ``.double()`` model), both kept equal to that state: under torch.compile they are graph inputs, so one
    graph serves every window stage and the final validation window (each window stage recompiled the model
    otherwise: eight graphs for the H200 race of docs/benchmarks.md; two now, with the tie state above).
    Other backends take them as Python numbers (``varlen`` needs an int).

    Rotary tables: non-persistent buffers ``rotary_cos``, ``rotary_sin`` (P, R), P =
    ``config.rotary_positions``, the cos and sin of ``p * rotary_frequencies`` for p = 0..P-1
    (:func:`speedrun.model.rotary.rotary_table`; the records' ``Rotary.cos``/``.sin`` buffers, record #17).
    A forward pass gathers its rows instead of evaluating cos and sin in every layer (under torch.compile,
    Inductor would recompute them inside each consumer kernel). YaRN rewrites them in place (same storage);
    moving or casting the model (``.to``, ``.double()``) rebuilds them from the moved frequencies, so they
    always equal :func:`speedrun.model.rotary.rotary_tables` computed on the model's device.

    Prefix table (``config.prefix_token_loss``, record #88): the non-persistent buffer ``prefix_table``
    (V,) int64, each token's prefix token or -1 (:func:`speedrun.model.prefix.prefix_token_table`), built
    once here (the record builds it inside its timed region); :meth:`forward` looks the targets up in it.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.model_dim)
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layer))
        self.lm_head = nn.Linear(config.model_dim, config.vocab_size, bias=False)
        self.head_fp8 = FP8WeightCache(HEAD_SCALES) if config.fp8_head else None      # see use_fp8_weight_cache
        nn.init.normal_(self.embed.weight, mean=0.0, std=1.0)
        init_output_(self.lm_head.weight)
        if config.linear_init == "torch":                                      # record #12's nn.Linear init
            roles = self.role_parameters()
            init_torch_linear_inputs_(self, roles["attention_qk"] + roles["attention_value"] + roles["mlp_fc"])
        self.tied = config.tie_embed_head
        if self.tied:
            with torch.no_grad():
                nn.init.normal_(self.lm_head.weight, mean=0.0, std=TIED_HEAD_STD)
                self.embed.weight.copy_(self.lm_head.weight)
        if config.value_embed_layers:
            self.value_embeds = ValueEmbeddings(config.vocab_size, config.attn_dim, config.value_embed_layers,
                                                config.value_embed_tables, config.value_embed_std)
        if config.smear:
            self.smear = Smear(config.model_dim)
        if config.bigram_vocab_size:
            self.bigram = BigramEmbedding(config.bigram_vocab_size, config.model_dim, config.n_layer,
                                          config.bigram_sign_trick, gates=not config.mudd_gates,
                                          dim=config.bigram_dim)
        if config.skip_connections == "unet":
            self.skips = UNetSkips(config.n_layer)
        elif config.skip_connections == "gated":
            self.skips = GatedSkip(config.skip_from, config.skip_to, gate=config.skip_gate)
        if config.backout_layer is not None:
            self.backout_lambda = nn.Parameter(torch.tensor([BACKOUT_LAMBDA_INIT]))
        if config.residual_form == "sublayer":
            self.residual = SublayerResidual(config.n_layer, config.resid_lambda_init, x0_lambdas=not config.mudd_gates)
        if config.mudd:
            self.mudd = DenseConnections(config.model_dim, config.n_head, config.resid_lambda_init)
        if config.mudd_gates:
            self.mudd_gates = MuddGates(config)
        self.register_buffer("rotary_frequencies", rotary_frequencies(config.head_dim, config.rope_base,
                                                                      mode=config.rope), persistent=False)
        cos, sin = rotary_table(self.rotary_frequencies, config.rotary_positions)           # (P, R) each
        self.register_buffer("rotary_cos", cos, persistent=False)
        self.register_buffer("rotary_sin", sin, persistent=False)
        self.attention_scale = config.attention_scale or config.head_dim ** -0.5
        self.window_blocks = (config.window_short_blocks, config.window_long_blocks)
        self.register_buffer("window_sizes", torch.zeros(2, dtype=torch.int32), persistent=False)
        self.register_buffer("attention_scale_buffer", torch.zeros(()), persistent=False)
        self._write_schedule_buffers()
        if config.prefix_token_loss:
            self.register_buffer("prefix_table", prefix_token_table(config.vocab_size), persistent=False)

    @torch.no_grad()
    def set_window_blocks(self, short_blocks: int, long_blocks: int, rescale: bool = True) -> None:
        """Set the short and long windows (blocks of ``config.window_block_size`` tokens). With
        ``config.yarn`` and ``rescale``, a change of the long window from old to new tokens rescales the
        rotary frequencies and the attention scale (:func:`speedrun.model.rotary.yarn_frequencies`, record
        #31); growing then shrinking back does not restore them exactly. ``rescale`` False: the windows alone
        (the records' final validation extends the long window without YaRN, HEAD's ws_post_yarn_ext).
        Nothing to do when the windows are unchanged."""
        block = self.config.window_block_size
        old, new = window_tokens(self.window_blocks[1], block), window_tokens(long_blocks, block)
        window_tokens(short_blocks, block)
        if (short_blocks, long_blocks) == self.window_blocks:
            return
        if self.config.yarn and rescale and new != old:
            self.rotary_frequencies.copy_(yarn_frequencies(self.rotary_frequencies, old, new))
            self._rebuild_rotary_tables()
            self.attention_scale = yarn_attention_scale(self.attention_scale, old, new)
        self.window_blocks = (short_blocks, long_blocks)
        self._write_schedule_buffers()

    @torch.no_grad()
    def _write_schedule_buffers(self) -> None:
        """Write the windows (in tokens) and the attention scale into ``window_sizes`` and
        ``attention_scale_buffer`` in place (a compiled graph holds their storage), by fills: on a GPU no
        copy from host memory, so no wait for the queued work."""
        block = self.config.window_block_size
        for slot, blocks in enumerate(self.window_blocks):
            self.window_sizes[slot].fill_(window_tokens(blocks, block) + self.config.window_extra_keys)
        self.attention_scale_buffer.fill_(self.attention_scale)

    def schedule_state(self) -> tuple:
        """A snapshot of the schedule state (windows, rotary frequencies, attention scale) for
        :meth:`restore_schedule_state` (the compiled warm-up replays the schedule, then puts it back)."""
        return self.window_blocks, self.rotary_frequencies.clone(), self.attention_scale

    @torch.no_grad()
    def restore_schedule_state(self, state: tuple) -> None:
        """Put back a :meth:`schedule_state` snapshot: windows, rotary frequencies and tables, attention
        scale (and their buffers)."""
        self.window_blocks, frequencies, self.attention_scale = state
        self.rotary_frequencies.copy_(frequencies)
        self._rebuild_rotary_tables()
        self._write_schedule_buffers()

    @torch.no_grad()
    def _rebuild_rotary_tables(self) -> None:
        """Recompute ``rotary_cos``/``rotary_sin`` from ``rotary_frequencies``: in place (same storage, as a
        compiled graph or CUDA graph holds it) when dtype and device are unchanged, else as new buffers."""
        cos, sin = rotary_table(self.rotary_frequencies, self.config.rotary_positions)
        for name, table in (("rotary_cos", cos), ("rotary_sin", sin)):
            buffer = getattr(self, name)
            if buffer.dtype == table.dtype and buffer.device == table.device:
                buffer.copy_(table)
            else:
                setattr(self, name, table)

    def _apply(self, fn, recurse=True):
        """``nn.Module._apply`` (behind ``.to``, ``.cuda``, ``.double()``), then the rotary tables rebuilt
        from the converted frequencies: a cast float32 table would differ from cos/sin evaluated in float64
        or on the GPU."""
        super()._apply(fn, recurse)
        self._rebuild_rotary_tables()
        if self.attention_scale_buffer.dtype in (torch.bfloat16, torch.float16):     # a 16-bit cast model
            self.attention_scale_buffer = self.attention_scale_buffer.float()        # keeps an fp32 scale
        self._write_schedule_buffers()                           # from the float, not a cast of it
        return self

    @torch.no_grad()
    def store_weights(self, dtype: torch.dtype, kinds: Collection[str] | None = None) -> "GPT":
        """Store the weights in ``dtype`` (in place; returns the model), as records #57-#89 and HEAD store
        theirs in bf16 (speedrun-spec.md 2.1, "param dtypes"): every parameter of at least one dimension whose
        kind (:meth:`parameter_kinds`) is not one of :data:`FP32_KINDS` (the block matrices, the embedding
        tables and head, the gates, MUDD's weights and biases), and the bigram sign table (±1, exact in bf16).
        The scalars and lambdas and every 0-dim parameter stay fp32, as in the records. ``kinds``: only the
        parameters of these kinds instead (``("embed",)``: the embedding tables, as records #12 and #31 store
        them in bf16, the token embedding among them unless it is tied to the head). In bf16 the embedding
        lookups, and so the residual stream, are bf16, and the gradients of those weights are bf16 (they
        accumulate in bf16 over micro-batches, as the records' do); Muon keeps the lower 16 bits of each fp32
        weight in its state (:mod:`speedrun.optim.muon`). Call before building the optimizers. Raises
        ``ValueError`` for a dtype that is not floating point."""
        if not dtype.is_floating_point:
            raise ValueError(f"store_weights: expected a floating-point dtype, got {dtype}")
        of_kind = self.parameter_kinds()
        for name, p in self.named_parameters():
            chosen = of_kind[name] not in FP32_KINDS if kinds is None else of_kind[name] in kinds
            if p.ndim >= 1 and chosen:
                p.data = p.data.to(dtype)
        bigram = getattr(self, "bigram", None)
        if bigram is not None and getattr(bigram, "signs", None) is not None:
            bigram.signs = bigram.signs.to(dtype)
        return self

    @torch.no_grad()
    def untie_embed_head(self) -> None:
        """Copy the shared weight into ``embed.weight`` and train the two apart from now on (record #53).
        Raises ``RuntimeError`` when the model is not tied."""
        if not self.tied:
            raise RuntimeError("untie_embed_head: the embedding and the head are not tied")
        self.embed.weight.copy_(self.lm_head.weight)
        self.tied = False

    @torch.no_grad()
    def fold_tied_gradients(self) -> None:
        """While tied, add ``embed.weight.grad`` into ``lm_head.weight.grad`` and drop it (set to None), so
        the head's gradient is that of the one shared weight (both (V, C), the weights' dtype) and the
        optimizer leaves the copy alone. Call after the backward pass(es) of a step, before averaging over
        ranks (one (V, C) gradient to reduce, not two). Nothing when untied or when the embedding has no
        gradient."""
        grad = self.embed.weight.grad
        if not self.tied or grad is None:
            return
        head = self.lm_head.weight
        head.grad = grad if head.grad is None else head.grad.add_(grad)
        self.embed.weight.grad = None

    @torch.no_grad()
    def sync_tied_embedding(self) -> None:
        """While tied, copy ``lm_head.weight`` into ``embed.weight`` (after each optimizer step, so that the
        next lookup reads the updated shared weight). Nothing when untied."""
        if self.tied:
            self.embed.weight.copy_(self.lm_head.weight)

    def use_fp8_weight_cache(self, on: bool = True) -> None:
        """Switch every FP8 weight cache of the model on (or off): the QKV, O and MLP projections'
        (:class:`speedrun.model.fp8.FP8WeightCache`, dynamic scales, bf16 backward) and, with
        ``config.fp8_head``, the head's (``head_fp8``: the records' fixed scale, records #19, #51, and the
        transposed e4m3 layout of its FP8 backward). While on, the training forward multiplies the weights
        as last quantized by :meth:`quantize_fp8_weights`, once per optimizer step instead of once per
        micro-batch (issue 6; the FP8 QKV/O of the 2026-06-11 RecursiveFromBest record): the caller must
        refresh them after every change of the weights, and a cache never filled raises ``RuntimeError`` in
        the forward. Off (the default): every call quantizes its weight. Evaluation is bf16 either way.

        Memory while filled: per cached weight of N·K elements, N·K bytes of e4m3 plus 2·N·K bytes of bf16
        (the QKV/O/MLP backward) or N·K bytes of transposed e4m3 (the head): e.g. 85M QKV/O/MLP weights,
        85 MB e4m3 + 170 MB bf16; a 50304 x 768 head, 77 MB."""
        for module in self.modules():
            if isinstance(module, FP8WeightCache):
                module.enabled = on

    @torch.no_grad()
    def quantize_fp8_weights(self) -> None:
        """Refresh every FP8 weight cache from the current weights (in place once filled, so compiled graphs
        read the new values): the stacked QKV of each FP8 attention layer, every cached
        :class:`speedrun.model.fp8.FP8Linear` (O, the MLP's two) and the head's (``config.fp8_head``). Call
        after every optimizer step (after :meth:`sync_tied_embedding`) and before the first while
        :meth:`use_fp8_weight_cache` is on. Nothing without FP8 paths."""
        pairs = [pair for module in self._fp8_modules()[0] for pair in module.weight_cache_pairs()]
        if self.head_fp8 is not None:
            pairs.append((self.head_fp8, self.lm_head.weight))
        refresh_caches_(pairs)                          # the MLP's input weights in one batch (about ten launches)

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """What the weights' copies need after every optimizer step, in order: :meth:`sync_tied_embedding`
        (while tied), then :meth:`quantize_fp8_weights` (while :meth:`use_fp8_weight_cache` is on). Every
        loop that steps the optimizers calls this (the train stage, the benchmarks)."""
        self.sync_tied_embedding()
        if any(m.enabled for m in self._fp8_modules()[1]):
            self.quantize_fp8_weights()

    def _fp8_modules(self) -> tuple[list[nn.Module], list[FP8WeightCache]]:
        """(cache owners, caches), found on the first call (the modules are fixed at construction; the first
        call is the refresh before the compile) and kept: the step's refresh does not walk the module tree."""
        if "_fp8_module_lists" not in self.__dict__:
            self._fp8_module_lists = (
                [m for m in self.modules() if isinstance(m, (FP8Linear, CausalSelfAttention))],
                [m for m in self.modules() if isinstance(m, FP8WeightCache)])
        return self._fp8_module_lists

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict``, then the FP8 weight caches refreshed from the loaded weights when
        any was filled (else a filled cache would keep multiplying the weights from before the load)."""
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        if any(m.w8.numel() for m in self._fp8_modules()[1]):
            self.quantize_fp8_weights()
        return result

    def _head_fp8_weight(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The head's cached FP8 operands (w8 (V, C), w_scale (), w8ᵀ (C, V)) while its cache is on, else
        None (the loss quantizes the weight itself). ``RuntimeError`` when on but never filled."""
        if self.head_fp8 is None or not self.head_fp8.enabled:
            return None
        return self.head_fp8.operands(self.lm_head.weight)

    def layer_windows(self) -> list[int | None]:
        """Per layer, the current window in tokens (None: whole document), from ``config.window_pattern``:
        blocks x ``window_block_size`` plus ``config.window_extra_keys`` (record #31's FA3 window)."""
        cfg = self.config
        windows = layer_windows(cfg.window_pattern, cfg.n_layer, *self.window_blocks, cfg.window_block_size)
        return [w if w is None else w + cfg.window_extra_keys for w in windows]

    def _forward_windows(self) -> list[int | torch.Tensor | None]:
        """:meth:`layer_windows` as a forward pass uses them: with ``config.schedule_as_graph_inputs``, one
        0-d int32 tensor per window kind (the same object for every layer of that kind, so that they share a
        block mask)."""
        cfg = self.config
        if not cfg.schedule_as_graph_inputs:
            return self.layer_windows()
        return per_layer(cfg.window_pattern, cfg.n_layer, *self.window_sizes.unbind())   # () tokens each

    def hidden_states(self, inputs: torch.Tensor, cu_seqlens: torch.Tensor,
                      max_seqlen: int | None = None) -> torch.Tensor:
        """The final normalized hidden states (T, C) of ``inputs`` (T,) int32 token ids, documents given by
        ``cu_seqlens`` (S,) int32 (0, document starts, T, possibly T repeated as padding); ``max_seqlen``:
        a bound on a document's length in tokens, or None (see :class:`PackedDocuments`)."""
        cfg = self.config
        context = self.attention_context(PackedDocuments(cu_seqlens, inputs.size(0), max_seqlen))
        x = F.embedding(inputs, self.embed.weight)                                        # (T, C)
        if cfg.smear:
            x = self.smear(x)
        x0 = rms_norm(x)
        none = [None] * cfg.n_layer
        value_embeds = self.value_embeds.per_layer(inputs, cfg.n_layer) if cfg.value_embed_layers else none
        if cfg.residual_form == "sublayer":                      # records #81-#88, HEAD: speedrun.model.residual
            bigram = self.bigram(inputs) if cfg.bigram_vocab_size else None
            return rms_norm(run_sublayers(self, x0, context, self._forward_windows(), value_embeds, bigram))
        bigrams = self.bigram.per_layer(inputs) if cfg.bigram_vocab_size else none
        return rms_norm(self._run_blocks(x0, context, value_embeds, bigrams))

    def _run_blocks(self, x0: torch.Tensor, context: AttentionContext, value_embeds: list[torch.Tensor | None],
                    bigrams: list[torch.Tensor | None]) -> torch.Tensor:
        """The residual stream (T, C) after the last block, from x0 (T, C) and the per-layer value
        embeddings and gated bigram injections; layer 0's bigram enters before the first block, the long
        skips (``skips``) between blocks. With ``config.backout_layer`` b (backout, record #40): the output
        x_b (T, C) of block b is saved and ``backout_lambda · x_b`` subtracted from the last block's output,
        which the final norm then reads (the record: the early layers' contributions serve later layers'
        context, not the prediction itself)."""
        x = x0 if bigrams[0] is None else x0 + bigrams[0].type_as(x0)
        if self.config.value_residual:                   # record #12: layer 0's values into every later layer
            value_embeds = [None] + [first_layer_values(self.blocks[0], x, x0)] * (len(self.blocks) - 1)
        skips = self.skips if self.config.skip_connections != "none" else None
        backout_layer, saved = self.config.backout_layer, None
        outputs: dict[int, torch.Tensor] = {}
        layers = zip(self.blocks, self._forward_windows(), value_embeds, [None] + bigrams[1:])
        for i, (block, window, ve, bigram) in enumerate(layers):
            if skips is not None:
                x = skips(i, x, outputs)
            x = block(x, x0, context, window, ve, bigram)
            if skips is not None and skips.keeps(i):
                outputs[i] = x
            if i == backout_layer:
                saved = x                                                             # (T, C)
        if saved is not None:
            x = x - self.backout_lambda.type_as(x) * saved
        return x

    def attention_context(self, docs: PackedDocuments) -> AttentionContext:
        """The rotary tables of the documents' positions (and of the doubled sequence when a layer pairs its
        heads) and the current attention scale, for every layer of one forward pass."""
        self._check_rotary_positions(docs.num_tokens)
        positions = document_positions(docs.cu_seqlens, docs.num_tokens)                # (T,)
        cos, sin = self.rotary_cos[positions], self.rotary_sin[positions]                  # (T, R) each
        paired_cos = paired_sin = None
        if self.config.paired_head_layers:
            doubled = paired_positions(positions)                                           # (2T,)
            paired_cos, paired_sin = self.rotary_cos[doubled], self.rotary_sin[doubled]     # (2T, R) each
        dynamic_scale = self.config.schedule_as_graph_inputs and self.config.yarn   # rescaled during training
        scale = self.attention_scale_buffer if dynamic_scale else self.attention_scale
        return AttentionContext(docs, cos, sin, scale, paired_cos, paired_sin)

    def _check_rotary_positions(self, num_tokens: int) -> None:
        """Raise ``ValueError`` when a packed sequence of ``num_tokens`` tokens (a Python int, also under
        torch.compile with static shapes: no graph break) may need positions beyond the rotary tables: up to
        T-1, or 2T-1 in the doubled sequence of paired heads."""
        paired = bool(self.config.paired_head_layers)
        needed = 2 * num_tokens if paired else num_tokens
        if needed > self.config.rotary_positions:
            why = f"2 x {num_tokens} tokens (paired heads)" if paired else f"{num_tokens} tokens"
            raise ValueError(f"model.rotary_positions = {self.config.rotary_positions} rows of rotary tables, but "
                             f"this forward pass needs {needed} positions ({why}): raise model.rotary_positions")

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor, cu_seqlens: torch.Tensor,
                max_seqlen: int | None = None, *, mtp_weights: torch.Tensor | None = None,
                prefix_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Mean cross-entropy (fp32 scalar, nats/token) of predicting ``targets`` (T,) int64 from ``inputs``
        (T,) int32 with documents ``cu_seqlens`` (S,) int32 (see :meth:`hidden_states`). The head's matrix
        products run in the autocast dtype when autocast is on; the logits' product in FP8 in training with
        ``config.fp8_head`` (record #19), from the head's weight cache while it is on
        (:meth:`use_fp8_weight_cache`).

        The records' training loss (speedrun-spec.md 2.5), in training mode only: ``mtp_weights`` (K,) fp32
        (None: [1.]) adds multi-token prediction with the shared head (record #53), ``prefix_weight`` (0-d
        fp32; needs ``config.prefix_token_loss``; None: no prefix term) prefix-token prediction (record #88,
        the targets' prefixes from ``prefix_table``): the mean over the T positions of ``Σ_k w_k ·
        CE(logits_t, targets[t+k]) + prefix_weight · CE(logits_t, prefix(targets[t]))`` (terms past the end
        of the sequence dropped; :func:`speedrun.model.loss.linear_cross_entropy`). Tensors, so that one
        compiled graph serves the record's per-step weights. In eval mode the loss is the plain next-token
        cross-entropy whatever they are, as in the records' validation. Raises ``ValueError`` for a
        ``prefix_weight`` without ``config.prefix_token_loss``."""
        cfg = self.config
        if prefix_weight is not None and not cfg.prefix_token_loss:
            raise ValueError("GPT.forward: prefix_weight needs model.prefix_token_loss (the prefix-token table)")
        x = self.hidden_states(inputs, cu_seqlens, max_seqlen)                        # (T, C)
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        fp8 = self.training and cfg.fp8_head
        auxiliary = {}
        if self.training:
            auxiliary["mtp_weights"] = mtp_weights
            if prefix_weight is not None:
                auxiliary.update(prefix_targets=self.prefix_table[targets], prefix_weight=prefix_weight)  # (T,)
        return linear_cross_entropy(x, self.lm_head.weight, targets, softcap=cfg.logit_softcap,
                                    softcap_kind=cfg.softcap_kind, impl=cfg.cross_entropy,
                                    chunk_tokens=cfg.loss_chunk_tokens, compute_dtype=dtype,
                                    fp8=fp8, fp8_weight=self._head_fp8_weight() if fp8 else None, **auxiliary)

    def parameter_kinds(self) -> dict[str, ParamKind]:
        """Parameter name -> kind: ``embed`` (token, value and bigram embeddings), ``head``, ``matrix`` (the
        2-D projection weights inside blocks, for Muon) or ``scalar`` (everything else: lower-dimensional
        parameters inside blocks, the attention gates' and value-embedding gates' (H, 12) weights, smear, the
        bigram gates, the skip weights and ``backout_lambda``). With ``config.tie_embed_head`` the token
        embedding is of kind ``head``: it starts as the head's copy and, once untied, trains with the head's
        Adam settings, as in the record (speedrun-spec.md 3.3: embed and lm_head share lr 0.008 and betas;
        value and bigram tables 75x that lr). The parameters of records #47-#89 take the Adam kinds of
        :data:`speedrun.optim.config.RECORD_ADAM_KINDS` (speedrun-spec.md 3.3, record #88's table): the sublayer
        form's ``resid_lambdas`` are ``resid_lambda``; its post and x0 lambdas, the bigram lambdas in that form
        and the XSA strengths ``lambda``; the skip gate's W ``skip_gate``; MUDD's w1, w2 / b2 ``mudd`` /
        ``mudd_bias``; the MUDD gates' w1, w2 / b2 and their shared scale ``mudd_gate`` / ``mudd_gate_bias``; in
        the sublayer form the attention and value-embedding gates are ``gate`` and the smear gate
        ``smear_gate`` (the block form keeps them ``scalar``: gpt124m unchanged); the attention's
        ``sa_lambdas`` are ``scalar``. Kinds are chosen by the modules that hold the parameters, not by their
        names, and counted: raises ``ValueError`` for a parameter given no kind or two."""
        sublayer = self.config.residual_form == "sublayer"
        gate_kind = "gate" if sublayer else "scalar"
        chosen: list[tuple[ParamKind, nn.Parameter]] = [
            ("head" if self.config.tie_embed_head else "embed", self.embed.weight), ("head", self.lm_head.weight)]
        optional = {name: getattr(self, name, None)
                    for name in ("value_embeds", "bigram", "smear", "skips", "residual", "mudd", "mudd_gates")}
        if optional["value_embeds"] is not None:
            chosen += [("embed", p) for p in optional["value_embeds"].parameters()]
        if optional["bigram"] is not None:
            chosen += _kinds(optional["bigram"], {"table": "embed", "gates": "lambda" if sublayer else "scalar"})
        if optional["smear"] is not None:
            chosen += _kinds(optional["smear"], {"gate": "smear_gate" if sublayer else "scalar"}, "scalar")
        if optional["skips"] is not None:
            chosen += _kinds(optional["skips"], {"gate": "skip_gate"}, "scalar")
        if optional["residual"] is not None:
            chosen += _kinds(optional["residual"], {"resid_lambdas": "resid_lambda"}, "lambda")
        if optional["mudd"] is not None:
            chosen += _coefficient_kinds((optional["mudd"].layer, optional["mudd"].final), "mudd", "mudd_bias")
        if optional["mudd_gates"] is not None:
            gates = optional["mudd_gates"]
            chosen += _coefficient_kinds((gates.pre, gates.post), "mudd_gate", "mudd_gate_bias")
            chosen.append(("mudd_gate_bias", gates.scale))
        if getattr(self, "backout_lambda", None) is not None:
            chosen.append(("scalar", self.backout_lambda))
        for block in self.blocks:
            chosen += _block_kinds(block, gate_kind)
        names = {id(p): name for name, p in self.named_parameters()}
        kinds: dict[str, ParamKind] = {}
        for kind, param in chosen:
            name = names[id(param)]
            if name in kinds:
                raise ValueError(f"parameter {name!r} has two optimizer kinds ({kinds[name]}, {kind})")
            kinds[name] = kind
        missing = [name for name in names.values() if name not in kinds]
        if missing:
            raise ValueError(f"parameters {missing} have no optimizer kind")
        return {name: kinds[name] for name in names.values()}

    def parameter_roles(self) -> dict[ParamRole, list[str]]:
        """Role -> the names of its parameters: :meth:`role_parameters` by name (counted there)."""
        names = {id(p): name for name, p in self.named_parameters()}
        return {role: [names[id(p)] for p in params] for role, params in self.role_parameters().items()}

    def role_parameters(self) -> dict[ParamRole, list[nn.Parameter]]:
        """Role -> its parameters (every role of :data:`speedrun.model.roles.PARAM_ROLES`, in the order of
        ``named_parameters()``), as the modules declare them (:func:`speedrun.model.roles.declared_roles`):
        ``mlp_fc`` / ``mlp_proj`` the fc / proj weight of each block's MLP, ``attention_qk`` the q and k and
        ``attention_value`` the v weight of each block's attention, ``attention_gate`` the output gate's weight
        of each gated attention. Counted against the config: one parameter of each MLP role on every layer not
        in ``mlp_free_layers``, two ``attention_qk`` and one ``attention_value`` on every layer not in
        ``attention_free_layers``, one ``attention_gate`` on every layer of ``attention_gate_layers`` (none with
        ``mudd_gates``, whose gates are not parameters of the attention); raises ``ValueError`` naming the role
        and the layers missing or extra (:func:`speedrun.model.roles.check_role_layers`)."""
        cfg = self.config
        declared = declared_roles(self)
        names = {id(p): name for name, p in self.named_parameters()}
        layer_of = {id(p): i for i, block in enumerate(self.blocks) for p in block.parameters()}
        mlp_layers = [i for i in range(cfg.n_layer) if i not in cfg.mlp_free_layers]
        attention_layers = [i for i in range(cfg.n_layer) if i not in cfg.attention_free_layers]
        gate_layers = [] if cfg.mudd_gates else list(cfg.attention_gate_layers)
        check_role_layers({role: [layer_of.get(id(p)) for p in params] for role, params in declared.items()},
                          {"mlp_fc": mlp_layers, "mlp_proj": mlp_layers, "attention_gate": gate_layers,
                           "attention_qk": [i for i in attention_layers for _ in range(2)],
                           "attention_value": attention_layers},
                          {role: [names[id(p)] for p in params] for role, params in declared.items()})
        return declared

def _kinds(module: nn.Module, by_name: Mapping[str, ParamKind],
           other: ParamKind | None = None) -> list[tuple[ParamKind, nn.Parameter]]:
    """(kind, parameter) for the direct parameters of ``module``: ``by_name[name]``, else ``other`` (a name in
    neither is left without a kind, which :meth:`GPT.parameter_kinds` then refuses)."""
    return [(by_name.get(name, other), p) for name, p in module.named_parameters(recurse=False)
            if by_name.get(name, other) is not None]


def _coefficient_kinds(nets: tuple[CoefficientNet, ...], weight: ParamKind,
                       bias: ParamKind) -> list[tuple[ParamKind, nn.Parameter]]:
    """(kind, parameter) for MUDD coefficient networks: their w1 and w2 ``weight``, their b2 ``bias``."""
    return [pair for net in nets for pair in ((weight, net.w1), (weight, net.w2), (bias, net.b2))]


def _block_kinds(block: nn.Module, gate_kind: ParamKind) -> list[tuple[ParamKind, nn.Parameter]]:
    """(kind, parameter) for a block: the attention's output and value-embedding gates' (H, 12) weights
    ``gate_kind`` (Adam), its XSA strengths ``lambda``, its other 2-D weights ``matrix`` (Muon) and the rest
    (lambdas, ``sa_lambdas``) ``scalar``."""
    attn = block.attn
    special: dict[int, ParamKind] = {}
    for gate in (getattr(attn, "gate", None), getattr(attn, "ve_gate", None)):
        if isinstance(gate, nn.Module):
            special.update({id(p): gate_kind for p in gate.parameters()})
    xsa = getattr(attn, "xsa_alpha", None)
    if isinstance(xsa, nn.Parameter):
        special[id(xsa)] = "lambda"
    return [(special.get(id(p), "matrix" if p.ndim == 2 else "scalar"), p) for p in block.parameters()]
