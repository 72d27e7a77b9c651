"""Model shape and options: :class:`GPTConfig`, the presets and :func:`build_model_config`.

The clean GPT (records #2-#5, #18 of the public speedrun, speedrun-spec.md 2.6): token embedding, pre-norm
blocks of attention (RoPE, QK-norm) and a ReLU² MLP, RMS norms without gain, an untied LM head and an
optional logit softcap. Each later technique is a switch whose default is off (the ``tiny`` preset) and
whose ``gpt124m`` value is the record's: sliding windows in 128-token blocks, long or short per layer
(records #13, #20), half-truncated RoPE (#17), attention scale 0.1 with YaRN on window growth (#31), the
shifted-sigmoid softcap (#54), the bigram hash embedding with the sign trick (#62, #83), the gated 3->6 skip
(#45, #55), the value-embedding gates (#55, #70), the attention output gate (#28), paired-head attention
(#58), FP8 head (#19) and QKV/O projections (2026-06-11), the partial key offset (#49) and backout (#40).
The ``record28`` preset is the 2025-08-23 SparseAttnGate record; ``record88`` record #88's architecture (the
per-sublayer residual form, MUDD #81, XSA #82) and ``record89`` HEAD's (with the MUDD gates and DC, #85, #86);
``record83`` and ``record87`` the architectures of those records' own scripts (the seed experiment).
Modes are ``Literal`` types.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Mapping, get_args

from speedrun.errors import SpeedrunError, did_you_mean, number_text_hint
from speedrun.model.windows import check_window_pattern

RopeMode = Literal["full", "half_truncated"]
AttentionBackend = Literal["reference", "sdpa", "sdpa_docs", "flex", "varlen", "fa3", "fa4", "auto"]
CrossEntropyImpl = Literal["full", "chunked", "fused", "fused_one_sweep"]
SoftcapKind = Literal["tanh", "shifted_sigmoid"]
SkipMode = Literal["none", "unet", "gated"]
ResidualForm = Literal["block", "sublayer"]
XsaForm = Literal["normalized", "projection"]
Fp8AttentionScales = Literal["dynamic", "unit"]
FP8_ATTENTION_SCALES: tuple[str, ...] = get_args(Fp8AttentionScales)
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)
CROSS_ENTROPY_IMPLS: tuple[str, ...] = get_args(CrossEntropyImpl)
SOFTCAP_KINDS: tuple[str, ...] = get_args(SoftcapKind)
MlpKernel = Literal["torch", "triton", "triton_persistent"]
MLP_KERNELS: tuple[str, ...] = get_args(MlpKernel)
RotaryKernel = Literal["torch", "triton"]
ROTARY_KERNELS: tuple[str, ...] = get_args(RotaryKernel)
ROPE_MODES: tuple[str, ...] = get_args(RopeMode)
SKIP_MODES: tuple[str, ...] = get_args(SkipMode)
RESIDUAL_FORMS: tuple[str, ...] = get_args(ResidualForm)
XSA_FORMS: tuple[str, ...] = get_args(XsaForm)
LinearInit = Literal["speedrun", "torch"]
OutputInit = Literal["zero", "uniform"]
PairedLayout = Literal["adjacent", "split"]
LINEAR_INITS: tuple[str, ...] = get_args(LinearInit)
GATE_CHANNELS = 12
VE_GATE_CHANNELS = 6
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
        rotary_positions: rows P of the rotary cos/sin tables the model precomputes (positions 0..P-1; see
            :func:`speedrun.model.rotary.rotary_table`). A packed sequence may hold at most P tokens, P/2 when
            any layer pairs heads (the doubled sequence has positions up to 2T-1); a longer forward pass
            raises ``ValueError``. ``speedrun train`` sizes it to the run unless set
            (:meth:`speedrun.training.config.TrainConfig.model_config`).
        attention_scale: None for 1/sqrt(head_dim), or the scale of q·k (record #31: 0.1).
        yarn: rescale the rotary frequencies and the attention scale whenever the long window grows (YaRN,
            record #31; alpha 1, beta 32, scale x(1 + 0.2 ln(new/old))). Needs a window_pattern.
        window_pattern: "" (no sliding window) or one character per layer, S short / L long / F full
            document (records #13, #20; see :mod:`speedrun.model.windows`).
        window_block_size: tokens per window block (128 in the speedrun).
        window_short_blocks, window_long_blocks: the windows in blocks before any schedule sets them (the
            record's first stage, 1 and 3); short <= long.
        logit_softcap: None, or c > 0: logits ``c * tanh(z / c)`` (Gemma 2; records #9 c=30, #18 c=15) or,
            with ``softcap_kind="shifted_sigmoid"``, ``c * sigmoid((z + 5) / 7.5)`` (record #54, c=23).
        softcap_kind: ``"tanh"`` or ``"shifted_sigmoid"``.
        x0_lambdas: each block mixes in the normalized embedding, x = λ0·x + λ1·x0 with learned per-layer
            λ from (``resid_lambda_init``, 0) (record #9).
        resid_lambda_init: λ0's initial value, finite and > 0 (1.0; the current record's 1.1, record #45: the
            residual stream grows by 1.1 per layer, so an early layer's output reaches the head 1.1^k times
            larger than a late one's; HEAD splits it as √1.1 per sublayer: the sublayer form's resid lambdas
            start at its square root). Needs ``x0_lambdas`` or ``residual_form: sublayer`` when not 1.
        value_embed_layers: layers whose attention values get a token-indexed value embedding added
            (records #14-#17; HEAD: layers 1, 2, 8, 9, 10 of 11).
        value_embed_tables: 0 for one table per value-embedding layer, or k >= 1 tables shared in turn: the
            j-th layer of ``value_embed_layers`` reads table j mod k (record #28: 3 tables on layers 0, 1, 2
            and again 9, 10, 11, the "012 ... 012" layout).
        value_embed_std: the standard deviation of the value-embedding tables at initialization, > 0: 0.01
            in the current record (speedrun-spec.md 2.2), 1.0 in record #28 (``nn.Embedding``'s default N(0, 1)).
        value_lambdas: record #28's learned per-attention-layer pair (λ0, λ1), from (0.5, 0.5): the values are
            ``v = λ0·v + λ1·ve`` in a layer with a value embedding and ``v = λ0·v`` in one without
            (parameter ``value_lambdas`` (2,) of each attention, kind ``scalar``: Adam at ``scalar_lr``, with
            the training's ``adam_weight_decay`` like every scalar; record #28 has no decay). Off: ``v + ve``.
        value_embed_gates: each layer of ``value_embed_layers`` scales its value embedding per head by
            ``2·sigmoid(W_g · [x[:6], ve[:6]])`` (x the attention input) before mixing it into v, W_g (n_head, 12)
            from zero, so the gate starts at 1 (record #55, "VE gates"; tuned in #70; speedrun-spec.md 2.2
            item 8; parameter ``ve_gate`` of each such attention, kind ``scalar``). Needs value_embed_layers,
            model_dim >= 6 and n_head*head_dim >= 6.
        smear: one-token look-back on the embeddings, x[t] += λ·σ(w·x[t,:12])·x[t-1] (record #34).
        tie_embed_head: the embedding reads the head's weight until the training untie step (records #8,
            #51, #53).
        bigram_vocab_size: 0 (off) or V_b >= 2 rows of the bigram hash embedding (records #62, #68, #71;
            HEAD 50304*15//2 = 377,280), see :mod:`speedrun.model.bigram`.
        bigram_dim: None (the table is model_dim wide: HEAD, 377,280 x 768) or D in 1..model_dim: the bigram
            table's rows are D wide and enter the first D channels of the residual stream only (records #83-#88:
            ``bigram_dim`` 192 with 50304·15 = 754,560 rows, their ``x[..., :bigram_dim] += ...``); see
            :mod:`speedrun.model.bigram`. Ignored when bigram_vocab_size is 0.
        bigram_sign_trick: multiply each bigram row by a fixed random ±1 row (record #83); ignored when
            bigram_vocab_size is 0 (as skip_from/skip_to are unless skip_connections is gated).
        skip_connections: ``"none"``, ``"unet"`` (record #11: the first n_layer//2 layers' outputs enter the
            mirrored layers of the second half with learned weights from 1) or ``"gated"`` (records #45, #55:
            one skip from the output of layer ``skip_from`` into the input of layer ``skip_to``, weighted
            sigmoid(λ), λ from -1.5); see :mod:`speedrun.model.skips`.
        skip_from, skip_to: the layers of the gated skip (HEAD: 3 and 6), 0 <= skip_from < skip_to < n_layer.
        attention_gate_layers: layers whose attention output is gated per head by sigmoid(W_g x[:12]),
            W_g (n_head, 12) from zero (record #28, "sparse attention gate"); model_dim >= 12.
        paired_head_layers: layers with paired-head attention (record #58; HEAD 0, 2, 5, 9 of 11); needs an
            even n_head. Their window keeps its value in positions of the doubled sequence, so it spans half
            as many tokens. See :mod:`speedrun.model.paired`.
        paired_head_layout: which heads share a pair: ``"adjacent"`` (heads 2p and 2p+1) or ``"split"``
            (heads p and p + n_head/2, the records' own reshape, records #58-#89; record #88 L1101-1112).
        attention_free_layers: layers without attention, MLP only (record #17 onward: layer 7 of 12 in
            record #28; layer 6 of 11 in HEAD). Such a layer takes no value embedding, gate or pairing.
        key_offset: partial key offset (record #49, speedrun-spec.md 2.3): in every long-window (``L``)
            layer that is neither paired nor attention-free, the keys' stationary dims (those half-truncated
            RoPE leaves unrotated: Dh/2..Dh-1) at position t take the values of position t-1 of the packed
            sequence, across document boundaries as in the record (position 0 keeps its own); one attention
            layer can then match "the token after the previous occurrence" (induction). Needs
            ``rope: half_truncated`` and such a layer. See :func:`speedrun.model.block.offset_keys`.
        backout_layer: None (off) or b with 0 <= b < n_layer - 1 (backout, record #40): the residual stream
            after block b is saved and ``λ · x_b`` subtracted from the last block's output before the final
            norm and the head, λ the parameter ``backout_lambda`` (1,) learned from 0.5 (kind ``scalar``).
            HEAD: layer 7 of 11 (the "2/3-depth" state), since absorbed into its MUDD bias (record #85).
        residual_form: ``"block"`` (each block mixes x0 in before it, ``x0_lambdas``, and adds its sublayers'
            outputs) or ``"sublayer"``, the form of records #81-#88 (:mod:`speedrun.model.residual`): per
            sublayer ``x = resid·x + post·out``, ``resid_lambdas`` (n_layer, 2) from sqrt(resid_lambda_init) and
            ``post_lambdas`` (n_layer, 2) from 1; after the attention sublayer ``+ x0·x0_lambdas[i]`` (from 0) and,
            for i >= 1, the bigram injection (layer 0's enters before the first layer); a layer without
            attention takes only the gated skip. Excludes ``x0_lambdas`` and U-net skips.
        x0_with_bigram: in the sublayer form, the x0 that layers inject (and the skip gate reads) includes
            layer 0's bigram injection, as records #81-#88 have it (their x0 and the stream are one tensor,
            updated in place); HEAD (#85) injects the plain normalized embedding.
        skip_gate: the gated skip's weight is ``sigmoid(λ)·2·sigmoid(W·x0[:12])``, W (1, 12) from zero
            (record #55's "skip gate", in records #55-#88; parameter ``skips.gate``). Needs the gated skip and
            the sublayer form.
        saved_activation_layer: None or k (record #77, "single saved activation"; HEAD 7): the attention of
            every layer after k reads norm(output of layer k) instead of norm(x). Needs the sublayer form.
        sa_lambdas: per attention layer ``sa_lambdas`` (2,) from (0.5, 1.0) scaling the q/k/v product and the
            output projection (record #47; parameter of each attention, kind ``scalar``).
        xsa_layers: layers with learnable XSA (record #82: 1, 3, 4, 7, 8, 10; HEAD 1, 3, 4, 7), attention
            layers that are not paired; see :mod:`speedrun.model.xsa`. Without ``mudd_gates`` each has a
            parameter ``xsa_alpha`` (H,) from 0; with them the strengths are per token, from the gates.
        xsa_form: ``"normalized"`` (record #82) or ``"projection"`` (#86), the same projection computed two ways.
        mudd: MUDD dense connections (record #81, :class:`speedrun.model.mudd.DenseConnections`) at the start of
            ``mudd_layer`` and after the last layer; parameter ``mudd``. Needs the sublayer form,
            model_dim == n_head*head_dim, an even n_head, ``mudd_layer`` in value_embed_layers (MUDD gives its
            value-embedding gate), with attention and not paired.
        mudd_layer, mudd_mid_layer, mudd_early_layer: the MUDD layer (HEAD 10), the layer whose output it
            reads there and after the loop (7), and the one read after the loop only (3);
            0 <= early, mid < mudd_layer.
        mudd_gates: HEAD's MUDD-generated gates (record #85, :class:`speedrun.model.mudd.MuddGates`;
            parameter ``mudd_gates``): a "pre" gate from x0 and a "post" gate at the start of
            ``mudd_gate_layer`` give the XSA strengths, the attention gates of ``attention_gate_layers``
            (linear, from 0.25, instead of sigmoid(W·x)), the x0 and bigram injection gates of every attention
            layer but the MUDD layer (instead of the lambdas), the skip's gate (instead of ``skip_gate``) and
            the DC weights. Needs the sublayer form; excludes ``skip_gate``.
        mudd_gate_layer: where the post gate is computed (HEAD 4); items of earlier layers come from the pre
            gate. 1 <= mudd_gate_layer < n_layer.
        dc_layers: layers with lightweight dynamically composable attention (record #85; HEAD 10):
            :func:`speedrun.model.dc.dc_attention` adds its correction to the attention output, its weights from
            the MUDD gates. Needs ``mudd_gates``; attention layers, not paired.
        dc_window: the keys each DC query mixes over (HEAD 112), >= 1.
        fp8_attention: the training forward of the q, k, v and o projections in FP8 (2026-06-11 record;
            :mod:`speedrun.model.fp8`).
        fp8_attention_scales: how ``fp8_attention`` scales its operands: ``"dynamic"`` (amax/448 per tensor,
            the weight cached once per step; :data:`speedrun.model.fp8.DYNAMIC_SCALES`) or ``"unit"``, record
            #87's own (2026-06-11 RecursiveFromBest, its ``FP8LinearFunction``): x and the weight cast to e4m3
            as they are, scale 1 (:data:`speedrun.model.fp8.UNIT_SCALES`; weights below 2^-6, e4m3's smallest
            normal, fall on its subnormal grid of spacing 2^-9: at a weight std of 0.02 the mean relative error
            is about 1.5 times a dynamic scale's, at 0.01 about 3 times), the weight
            multiplied first by ``sa_lambdas`` (the record pre-multiplies them, which a unit scale does not
            commute with) and cast to bf16 as the record's ``type_as(x)``, quantized at every call (no cache);
            backward in bf16 either way. Values beyond 448 saturate here (the record's cast would give NaN).
            ``"unit"`` needs ``fp8_attention``.
        fp8_head: the training forward of the LM head in FP8 (record #19).
        fp8_mlp: the training forward of the MLP's up projection (record #84) and down projection (#89) in
            FP8, backward in bf16 as in the records. With ``mlp_kernel: torch`` both scales are dynamic
            (amax / 448 per call; :class:`speedrun.model.fp8.FP8Linear`). With ``mlp_kernel: triton`` the
            records' fused FP8 MLP (:mod:`speedrun.model.fp8_mlp`): x per call (amax/448), W1 per step, post
            emitted in e4m3 by the fused kernel with a delayed per-layer scale (previous forward's amax ·
            1.80/448) and W2 with a delayed per-layer scale (1.12/448, bootstrapped for 17 refreshes).
        fp8_mlp_down: with ``fp8_mlp``, the down projection in FP8 too (record #89, the default); false: the up
            projection alone in FP8 and the down product in bf16, as records #84-#88 run it.
        mlp_kernel: ``"torch"`` (two products around relu(.)², the reference) or ``"triton"``, the fused
            ReLU² kernel that stores only relu(pre)² (records #59, #87; :mod:`speedrun.model.mlp`; CUDA and a
            16-bit compute dtype only, the torch path elsewhere); ``"triton_persistent"``, the same with the FP8
            up projection and the backward's product in persistent TMA kernels (record #88's
            ``linear_relu_square_kernel``; with ``fp8_mlp`` and ``fp8_mlp_down`` false only, records #84-#88).
        rotary_kernel: ``"torch"`` (``rms_norm`` then ``apply_rotary`` of q and k, the reference) or
            ``"triton"``, QK-norm and RoPE fused in one kernel forward and one backward
            (:mod:`speedrun.kernels.qk_norm_rotary`; records #2, #5, #17); non-paired layers only, on CUDA
            with bf16/fp16 q and k, the torch path elsewhere.
        attention_backend: a backend of :mod:`speedrun.model.attention` (``reference``, ``sdpa``,
            ``sdpa_docs``, ``flex``, ``varlen``, ``fa3`` FlashAttention 3, ``fa4`` FlashAttention 4), or
            ``"auto"``: the fastest installed on the run's device, on CUDA the first of fa3 (Hopper), fa4
            (Hopper, Blackwell), varlen, flex, and on a CPU sdpa_docs
            (:func:`speedrun.model.attention.resolve_backend`, which says why this order). ``speedrun train``
            resolves it once, before building the model
            (:meth:`speedrun.training.config.TrainConfig.resolved_for`): the log's ``config`` and
            ``attention_backend`` header lines show the backend that ran. A model built directly with
            ``"auto"`` resolves it at each attention call (cached per device; resolve it first when the
            model is compiled), taking its windows as Python numbers as every backend but ``flex`` does.
        cross_entropy: ``"full"`` materializes (T, vocab) logits for autograd; ``"chunked"`` computes loss and
            gradients chunk by chunk; ``"fused"`` computes loss and logit gradients in one pass over bf16
            logits (a Triton kernel on CUDA: the fastest on a GPU; see :mod:`speedrun.model.loss`);
            ``"fused_one_sweep"`` is ``"fused"`` with the one-sweep kernel on CUDA (a softcapped row read once and
            kept on chip, record #88's layout; the same computation as ``"fused"`` elsewhere).
        loss_chunk_tokens: tokens per chunk of the chunked cross-entropy (64 keeps a chunk's (64, 50304)
            fp32 logits in a CPU's cache).
        prefix_token_loss: prefix-token prediction (record #88, speedrun-spec.md 2.5): the model builds the
            GPT-2 prefix-token table (:func:`speedrun.model.prefix.prefix_token_table`) as its non-persistent
            buffer ``prefix_table`` (V,) int64 at construction, and a training forward given a
            ``prefix_weight`` adds ``prefix_weight · CE(logits_t, prefix(target_t))`` to each position's loss
            (:meth:`speedrun.model.gpt.GPT.forward`). The record builds the table inside its timed region
            (a fraction of a second); we build it once, before. Needs vocab_size >= 50257 (the GPT-2 vocabulary).
        mlp_free_layers: layers without an MLP, attention only (record #31, 2025-09-10 YaRN, after PR 120 of
            modded-nanogpt: layer 0 of 12). Such a block is ``x += attn(norm(x))``; a layer may not lack both.
            Block form only (``residual_form: block``).
        value_residual: value residual learning (Zhou et al. 2024, arXiv 2410.17897; record #12, 2024-11-19
            FlexAttention, which has it): every attention layer after layer 0 mixes layer 0's
            values into its own, ``v = (1 - λ)·v + λ·v_0`` with its learned λ (parameter
            ``value_residual_lambda`` (1,) from 0.5, kind ``scalar``); layer 0 keeps its v (the record gives
            it a λ too, whose gradient is identically 0). Needs an attention layer 0, no value embeddings and
            no ``value_lambdas`` (the later records' successors of this switch), the block form and no
            ``sa_lambdas``. See
            :mod:`speedrun.model.value_residual`.
        linear_init: ``"speedrun"`` (q, k, v and the MLP's fc uniform with std 0.5/sqrt(fan_in), record #20's
            init) or ``"torch"`` (``nn.Linear``'s default, uniform on ±1/sqrt(fan_in), std 1/sqrt(3·fan_in):
            record #12, whose ``CastedLinear`` keeps it). The output projections and the head start at zero
            either way. See :func:`speedrun.model.init.init_torch_linear_`.
        attention_output_init: the attention's output projection O at ``"zero"`` (record #5's zero-init
            projections, kept by the records up to the 2026-01-26 one's attention bank) or ``"uniform"`` like
            q, k and v (std 0.5/sqrt(fan_in)), as records #83-#89 and HEAD start their vo_bank (record #88 L1251;
            the MLP's output projection stays at zero there).
        window_extra_keys: keys a sliding window sees beyond its blocks: a window of b blocks spans
            ``b·window_block_size + window_extra_keys`` keys, the query's own included (0, or 1 for record #31,
            2025-09-10 YaRN: its flash-attention call's ``window_size = (b·128, 0)`` reaches back b·128
            positions, b·128 + 1 keys; speedrun.model.windows). YaRN's ratios stay those of the blocks. An
            integer >= 0; needs a window_pattern when not 0.

    Raises :class:`SpeedrunError` (naming the field) on a non-positive size, an odd head_dim, an unknown mode,
    a layer index out of range, or switches that do not fit together (e.g. paired heads with an odd n_head).
    """

    vocab_size: int = 50304
    n_layer: int = 12
    model_dim: int = 768
    n_head: int = 6
    head_dim: int = 128
    mlp_ratio: int = 4
    rope_base: float = 10000.0
    rope: RopeMode = "full"
    rotary_positions: int = 131072
    attention_scale: float | None = None
    yarn: bool = False
    window_pattern: str = ""
    window_block_size: int = 128
    window_short_blocks: int = 1
    window_long_blocks: int = 3
    logit_softcap: float | None = None
    softcap_kind: SoftcapKind = "tanh"
    x0_lambdas: bool = False
    resid_lambda_init: float = 1.0
    value_embed_layers: tuple[int, ...] = ()
    value_embed_tables: int = 0
    value_embed_std: float = 0.01
    value_lambdas: bool = False
    value_embed_gates: bool = False
    smear: bool = False
    tie_embed_head: bool = False
    bigram_vocab_size: int = 0
    bigram_dim: int | None = None
    bigram_sign_trick: bool = False
    skip_connections: SkipMode = "none"
    skip_from: int = 3
    skip_to: int = 6
    attention_gate_layers: tuple[int, ...] = ()
    paired_head_layers: tuple[int, ...] = ()
    paired_head_layout: PairedLayout = "adjacent"
    attention_free_layers: tuple[int, ...] = ()
    key_offset: bool = False
    backout_layer: int | None = None
    residual_form: ResidualForm = "block"
    x0_with_bigram: bool = False
    skip_gate: bool = False
    saved_activation_layer: int | None = None
    sa_lambdas: bool = False
    xsa_layers: tuple[int, ...] = ()
    xsa_form: XsaForm = "projection"
    mudd: bool = False
    mudd_layer: int = 10
    mudd_mid_layer: int = 7
    mudd_early_layer: int = 3
    mudd_gates: bool = False
    mudd_gate_layer: int = 4
    dc_layers: tuple[int, ...] = ()
    dc_window: int = 112
    fp8_attention: bool = False
    fp8_attention_scales: Fp8AttentionScales = "dynamic"
    fp8_head: bool = False
    fp8_mlp: bool = False
    fp8_mlp_down: bool = True
    mlp_kernel: MlpKernel = "torch"
    rotary_kernel: RotaryKernel = "torch"
    attention_backend: AttentionBackend = "sdpa_docs"
    cross_entropy: CrossEntropyImpl = "chunked"
    loss_chunk_tokens: int = 64
    prefix_token_loss: bool = False
    mlp_free_layers: tuple[int, ...] = ()
    value_residual: bool = False
    linear_init: LinearInit = "speedrun"
    attention_output_init: OutputInit = "zero"
    window_extra_keys: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "model_dim", "n_head", "head_dim", "mlp_ratio",
                     "loss_chunk_tokens", "window_block_size", "window_short_blocks", "window_long_blocks",
                     "rotary_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpeedrunError(f"model.{name} must be a positive integer, got {value!r}")
        if self.head_dim % 2:
            raise SpeedrunError(f"model.head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if not isinstance(self.rope_base, (int, float)) or self.rope_base <= 1:
            raise SpeedrunError(f"model.rope_base must be a number > 1, got {self.rope_base!r}"
                                f"{number_text_hint(self.rope_base)}")
        _check_optional_positive("logit_softcap", self.logit_softcap)
        _check_mode("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _check_mode("cross_entropy", self.cross_entropy, CROSS_ENTROPY_IMPLS)
        _check_mode("rope", self.rope, ROPE_MODES)
        _check_mode("softcap_kind", self.softcap_kind, SOFTCAP_KINDS)
        _check_mode("mlp_kernel", self.mlp_kernel, MLP_KERNELS)
        check_mlp_kernel(self.mlp_kernel, self.fp8_mlp, self.fp8_mlp_down)
        _check_mode("rotary_kernel", self.rotary_kernel, ROTARY_KERNELS)
        _check_mode("skip_connections", self.skip_connections, SKIP_MODES)
        _check_mode("residual_form", self.residual_form, RESIDUAL_FORMS)
        _check_mode("xsa_form", self.xsa_form, XSA_FORMS)
        _check_mode("fp8_attention_scales", self.fp8_attention_scales, FP8_ATTENTION_SCALES)
        for name in ("x0_lambdas", "smear", "tie_embed_head", "bigram_sign_trick", "fp8_attention", "fp8_head",
                     "fp8_mlp", "value_lambdas", "value_embed_gates", "x0_with_bigram", "skip_gate", "sa_lambdas",
                     "mudd", "mudd_gates", "fp8_mlp_down"):
            if not isinstance(getattr(self, name), bool):
                raise SpeedrunError(f"model.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("value_embed_layers", "attention_gate_layers", "paired_head_layers", "attention_free_layers",
                     "xsa_layers", "dc_layers"):
            self._check_layers(name)
        self._check_windows_and_rope()
        self._check_embeddings()
        self._check_attention_layers()
        self._check_skips()
        self._check_key_offset_and_backout()
        self._check_prefix_token_loss()
        self._check_sublayer_form()
        self._check_mudd()
        self._check_record12_31_switches()
        if self.fp8_attention_scales == "unit" and not self.fp8_attention:
            raise SpeedrunError("model.fp8_attention_scales unit (record #87) scales the FP8 q/k/v and o "
                                "projections: it needs model.fp8_attention true")

    def _check_sublayer_form(self) -> None:
        """The switches of records #77-#88 (see the field docs)."""
        sublayer = self.residual_form == "sublayer"
        if sublayer and self.x0_lambdas:
            raise SpeedrunError("model.residual_form sublayer has its own x0 lambdas (injected after attention): "
                                "it excludes model.x0_lambdas (the block form's mix before each block)")
        if sublayer and self.skip_connections == "unet":
            raise SpeedrunError("model.residual_form sublayer takes no U-net skips (skip_connections none or gated)")
        for name in ("x0_with_bigram", "skip_gate", "mudd", "mudd_gates"):
            if getattr(self, name) and not sublayer:
                raise SpeedrunError(f"model.{name} belongs to the records' sublayer form: it needs "
                                    "model.residual_form sublayer")
        if self.skip_gate and self.skip_connections != "gated":
            raise SpeedrunError("model.skip_gate gates the gated skip: it needs model.skip_connections gated")
        if self.skip_gate and self.model_dim < GATE_CHANNELS:
            raise SpeedrunError(f"model.skip_gate reads {GATE_CHANNELS} channels; model_dim is {self.model_dim}")
        layer = self.saved_activation_layer
        if layer is not None:
            if not (_is_int(layer) and 0 <= layer < self.n_layer - 1):
                raise SpeedrunError(f"model.saved_activation_layer must be null or a layer index k with 0 <= k < "
                                    f"n_layer - 1 = {self.n_layer - 1}, got {layer!r}")
            if not sublayer:
                raise SpeedrunError("model.saved_activation_layer needs model.residual_form sublayer")
        no_attention = set(self.attention_free_layers) | set(self.paired_head_layers)
        for name in ("xsa_layers", "dc_layers"):
            clash = sorted(no_attention & set(getattr(self, name)))
            if clash:
                raise SpeedrunError(f"model.{name} names layer {clash[0]}, which is paired or without attention "
                                    "(XSA and DC act on non-paired attention layers)")
        if self.dc_layers and not self.mudd_gates:
            raise SpeedrunError("model.dc_layers take their weights from the MUDD gates: they need model.mudd_gates")
        if not _is_int(self.dc_window) or self.dc_window < 1:
            raise SpeedrunError(f"model.dc_window must be a positive integer, got {self.dc_window!r}")

    def _check_mudd(self) -> None:
        if self.mudd:
            m = self.mudd_layer
            if not (_is_int(m) and 0 < m < self.n_layer):
                raise SpeedrunError(f"model.mudd_layer must be a layer index in 1..{self.n_layer - 1}, got {m!r}")
            for name in ("mudd_mid_layer", "mudd_early_layer"):
                value = getattr(self, name)
                if not (_is_int(value) and 0 <= value < m):
                    raise SpeedrunError(f"model.{name} must be a layer index before model.mudd_layer {m}, "
                                        f"got {value!r}")
            if m in self.attention_free_layers or m in self.paired_head_layers:
                raise SpeedrunError(f"model.mudd_layer {m} must be an attention layer that is not paired")
            if m not in self.value_embed_layers:
                raise SpeedrunError(f"model.mudd_layer {m} must be one of model.value_embed_layers (MUDD gates its "
                                    "value embedding)")
            if self.model_dim != self.attn_dim or self.n_head % 2:
                raise SpeedrunError(f"model.mudd adds residual states to the values and gates half the heads per "
                                    f"lane: it needs model_dim == n_head*head_dim and an even n_head, got "
                                    f"{self.model_dim}, {self.n_head} x {self.head_dim}")
        if self.mudd_gates:
            g = self.mudd_gate_layer
            if not (_is_int(g) and 0 < g < self.n_layer):
                raise SpeedrunError(f"model.mudd_gate_layer must be a layer index in 1..{self.n_layer - 1}, "
                                    f"got {g!r}")
            if self.skip_gate:
                raise SpeedrunError("model.mudd_gates generate the skip's gate: they exclude model.skip_gate")
            if 0 in self.attention_free_layers:
                raise SpeedrunError("model.mudd_gates gate layer 0's injections: layer 0 needs attention")

    @property
    def schedule_as_graph_inputs(self) -> bool:
        """Whether a forward pass reads the windows and YaRN's attention scale from tensors (graph inputs
        under torch.compile, :class:`speedrun.model.gpt.GPT`) rather than Python numbers: with the ``flex``
        backend, the one that takes them so."""
        return self.attention_backend == "flex"

    def _check_prefix_token_loss(self) -> None:
        if not isinstance(self.prefix_token_loss, bool):
            raise SpeedrunError(f"model.prefix_token_loss must be true or false, got {self.prefix_token_loss!r}")
        if self.prefix_token_loss and self.vocab_size < GPT2_VOCAB:
            raise SpeedrunError(f"model.prefix_token_loss needs the GPT-2 vocabulary: model.vocab_size >= "
                                f"{GPT2_VOCAB}, got {self.vocab_size}")

    def _check_record12_31_switches(self) -> None:
        """mlp_free_layers and window_extra_keys (record #31), value_residual and linear_init (record #12)."""
        self._check_layers("mlp_free_layers")
        both = sorted(set(self.mlp_free_layers) & set(self.attention_free_layers))
        if both:
            raise SpeedrunError(f"model.mlp_free_layers names layer {both[0]}, which attention_free_layers also "
                                "names: a block needs its attention or its MLP")
        if self.mlp_free_layers and self.residual_form != "block":
            raise SpeedrunError("model.mlp_free_layers (record #31) are blocks of the block form: they need "
                                "model.residual_form block")
        _check_mode("linear_init", self.linear_init, LINEAR_INITS)
        _check_mode("attention_output_init", self.attention_output_init, get_args(OutputInit))
        _check_mode("paired_head_layout", self.paired_head_layout, get_args(PairedLayout))
        if not _is_int(self.window_extra_keys) or self.window_extra_keys < 0:
            raise SpeedrunError(f"model.window_extra_keys must be an integer >= 0, got {self.window_extra_keys!r}")
        if self.window_extra_keys and not self.window_pattern:
            raise SpeedrunError("model.window_extra_keys widens the sliding windows: it needs a window_pattern")
        if not isinstance(self.value_residual, bool):
            raise SpeedrunError(f"model.value_residual must be true or false, got {self.value_residual!r}")
        if not self.value_residual:
            return
        if 0 in self.attention_free_layers:
            raise SpeedrunError("model.value_residual mixes layer 0's values into the later layers: layer 0 "
                                "needs attention (attention_free_layers names it)")
        if self.value_embed_layers or self.value_lambdas:
            raise SpeedrunError("model.value_residual (record #12) and the value embeddings / value_lambdas of "
                                "the later records both mix into v: use one or the other")
        if self.residual_form != "block" or self.sa_lambdas:
            raise SpeedrunError("model.value_residual (record #12) recomputes layer 0's values in the block form "
                                "without q/k/v lambdas: it needs model.residual_form block and no "
                                "model.sa_lambdas")

    def _check_layers(self, name: str) -> None:
        """A per-layer switch: increasing layer indices in 0..n_layer-1 (a list from YAML becomes a tuple)."""
        layers = getattr(self, name)
        if isinstance(layers, list):
            layers = tuple(layers)
            object.__setattr__(self, name, layers)
        if not isinstance(layers, tuple) or any(
                not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.n_layer for i in layers
        ) or list(layers) != sorted(set(layers)):
            raise SpeedrunError(f"model.{name} must be increasing layer indices in 0..{self.n_layer - 1}, "
                                f"got {getattr(self, name)!r}")

    def _check_embeddings(self) -> None:
        tables = self.value_embed_tables
        if not _is_int(tables) or not 0 <= tables <= len(self.value_embed_layers):
            raise SpeedrunError(f"model.value_embed_tables must be an integer in 0..{len(self.value_embed_layers)}"
                                f" (the number of value_embed_layers), got {tables!r}")
        init = self.resid_lambda_init
        if not isinstance(init, (int, float)) or isinstance(init, bool) or not 0 < init < float("inf"):
            raise SpeedrunError(f"model.resid_lambda_init must be a finite number > 0, got {init!r}"
                                f"{number_text_hint(init)}")
        if init != 1.0 and not self.x0_lambdas and self.residual_form != "sublayer":
            raise SpeedrunError(f"model.resid_lambda_init {init} sets the x0 lambdas' λ0: it needs model.x0_lambdas "
                                "(or model.residual_form sublayer, whose resid lambdas start at its square root)")
        std = self.value_embed_std
        if not isinstance(std, (int, float)) or isinstance(std, bool) or not 0 < std < float("inf"):
            raise SpeedrunError(f"model.value_embed_std must be a finite number > 0, got {std!r}"
                                f"{number_text_hint(std)}")
        if self.value_embed_gates and not self.value_embed_layers:
            raise SpeedrunError("model.value_embed_gates gate the value embeddings: it needs non-empty "
                                "model.value_embed_layers")
        if self.value_embed_gates and min(self.model_dim, self.attn_dim) < VE_GATE_CHANNELS:
            raise SpeedrunError(f"model.value_embed_gates read {VE_GATE_CHANNELS} channels of x and of the value "
                                f"embedding; model_dim is {self.model_dim}, n_head*head_dim {self.attn_dim}")
        if self.smear and self.model_dim < GATE_CHANNELS:
            raise SpeedrunError(f"model.smear reads {GATE_CHANNELS} channels; model_dim is {self.model_dim}")
        dim = self.bigram_dim
        if dim is not None and not (_is_int(dim) and 1 <= dim <= self.model_dim):
            raise SpeedrunError(f"model.bigram_dim must be null (model_dim) or an integer in 1..{self.model_dim} "
                                f"(model_dim), got {dim!r}")
        if not _is_int(self.bigram_vocab_size) or self.bigram_vocab_size < 0 or self.bigram_vocab_size == 1:
            raise SpeedrunError(f"model.bigram_vocab_size must be 0 (off) or an integer >= 2, got "
                                f"{self.bigram_vocab_size!r}")

    def _check_attention_layers(self) -> None:
        free = set(self.attention_free_layers)
        for name in ("value_embed_layers", "attention_gate_layers", "paired_head_layers"):
            clash = sorted(free & set(getattr(self, name)))
            if clash:
                raise SpeedrunError(f"model.{name} names layer {clash[0]}, which attention_free_layers leaves "
                                    "without attention")
        if self.paired_head_layers and self.n_head % 2:
            raise SpeedrunError(f"model.paired_head_layers pair the heads: n_head must be even, got {self.n_head}")
        if self.attention_gate_layers and self.model_dim < GATE_CHANNELS:
            raise SpeedrunError(f"model.attention_gate_layers read {GATE_CHANNELS} channels; model_dim is "
                                f"{self.model_dim}")

    def _check_skips(self) -> None:
        if self.skip_connections == "unet" and self.n_layer < 2:
            raise SpeedrunError("model.skip_connections unet needs n_layer >= 2")
        if self.skip_connections != "gated":
            return
        if not (_is_int(self.skip_from) and _is_int(self.skip_to)
                and 0 <= self.skip_from < self.skip_to < self.n_layer):
            raise SpeedrunError(f"model.skip_from and model.skip_to must satisfy 0 <= skip_from < skip_to < "
                                f"n_layer = {self.n_layer}, got {self.skip_from!r} -> {self.skip_to!r}")

    def _check_key_offset_and_backout(self) -> None:
        if not isinstance(self.key_offset, bool):
            raise SpeedrunError(f"model.key_offset must be true or false, got {self.key_offset!r}")
        if self.key_offset:
            if self.rope != "half_truncated":
                raise SpeedrunError(f"model.key_offset shifts the dims that half-truncated RoPE leaves unrotated: "
                                    f"it needs model.rope half_truncated, got {self.rope!r}")
            skipped = set(self.paired_head_layers) | set(self.attention_free_layers)
            if not any(kind == "L" and i not in skipped for i, kind in enumerate(self.window_pattern)):
                raise SpeedrunError("model.key_offset acts on long-window layers: it needs a window_pattern with "
                                    "at least one L layer that is neither paired nor attention-free, got "
                                    f"{self.window_pattern!r}")
        layer = self.backout_layer
        if layer is not None and not (_is_int(layer) and 0 <= layer < self.n_layer - 1):
            raise SpeedrunError(f"model.backout_layer must be null or a layer index b with 0 <= b < n_layer - 1 = "
                                f"{self.n_layer - 1} (a block before the last), got {layer!r}")

    def _check_windows_and_rope(self) -> None:
        if self.rope == "half_truncated" and self.head_dim % 4:
            raise SpeedrunError(f"model.head_dim must be a multiple of 4 for rope half_truncated, got "
                                f"{self.head_dim}")
        _check_optional_positive("attention_scale", self.attention_scale)
        if self.window_short_blocks > self.window_long_blocks:
            raise SpeedrunError(f"model.window_short_blocks {self.window_short_blocks} is longer than "
                                f"model.window_long_blocks {self.window_long_blocks}; expected short <= long")
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


def check_mlp_kernel(kernel: str, fp8_mlp: Any, fp8_mlp_down: Any) -> None:
    """Raise :class:`SpeedrunError` when ``kernel`` is ``"triton_persistent"`` without ``fp8_mlp`` true and
    ``fp8_mlp_down`` false: its persistent kernels run the FP8 up projection alone (records #84-#88) and write
    no e4m3 post for an FP8 down product. The config's check, and the MLP's for a kernel given to it directly."""
    if kernel == "triton_persistent" and not (fp8_mlp is True and fp8_mlp_down is False):
        raise SpeedrunError("model.mlp_kernel 'triton_persistent' needs model.fp8_mlp true and model.fp8_mlp_down "
                            "false (it runs the FP8 up projection without the FP8 down product: its kernels write "
                            f"no e4m3 post), got fp8_mlp {fp8_mlp!r}, fp8_mlp_down {fp8_mlp_down!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_optional_positive(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, (int, float)) or value <= 0):
        raise SpeedrunError(f"model.{name} must be null or a number > 0, got {value!r}{number_text_hint(value)}")


def _check_mode(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpeedrunError(f"model.{name} must be one of {', '.join(allowed)}; got {value!r}")


PRESETS: dict[str, GPTConfig] = {
    # CPU-sized: 4 layers of width 64, 2 heads of 32, the full GPT-2 vocabulary. The (T, 50304) head
    # dominates the cost: about 3,100 train tokens/s on one thread (benchmarks/train_cpu.py); width 96
    # gives about 2,200 and width 128 about 1,850.
    "tiny": GPTConfig(n_layer=4, model_dim=64, n_head=2, head_dim=32, mlp_ratio=4),
    # The public record's shape (speedrun-spec.md 2.1): 11 layers of width 768 with 6 heads of 128, layer 6
    # without attention (#17; the first layer's MLP and attention dropped to reach 11 layers, #30, #35, #49); the
    # fused cross-entropy (records #60, #75, #79: a Triton kernel on CUDA, the same computation on a CPU). Layer
    # indices are HEAD's. Record switches: long windows on layers 3 and 10, short elsewhere, 1/3 blocks at the
    # start (#13, #20, #31); half-truncated RoPE (#17); attention scale 0.1 and YaRN (#31); 23·σ((z+5)/7.5)
    # (#54); x0 lambdas (#9) from λ0 = 1.1 (#45); value embeddings on layers 1, 2, 8, 9, 10, each gated per head
    # by 2·σ(W_g·[x[:6], ve[:6]]) (#55, #70; HEAD's layer 10 takes its VE gate from MUDD instead, which this
    # preset leaves off: see record88); smear (#34); tied embedding and head (#51, untied by the training
    # untie_step, #53);
    # bigram hash embedding of 50304·15//2 rows with the sign trick (#62, #83); the gated skip 3 -> 6 (#45, #55);
    # the attention output gate on every attention layer (#28; the pre-MUDD records gate all attention layers,
    # HEAD's MUDD-generated gates only 3 and 10); paired heads on layers 0, 2, 5, 9 (#58); FP8 head (#19), MLP
    # (#84, #89) and QKV/O (2026-06-11); the partial key offset on the long-window layers, which are not paired,
    # 3 and 10 (#49); backout of the state after layer 7 (#40; HEAD now folds it into its MUDD bias, #85).
    # FlexAttention (the CPU tests override it). Until 2026-11-30 this preset had 12 layers, all with attention
    # (HEAD's layers 7-10 moved to 8-11): docs/benchmarks.md's gpt124m figures before then are of that shape.
    # QK-norm and RoPE in one Triton kernel on a GPU (722 -> 676 ms per record28 step on the H200,
    # docs/benchmarks.md); a CPU takes the PyTorch path.
    "gpt124m": GPTConfig(n_layer=11, model_dim=768, n_head=6, head_dim=128, mlp_ratio=4,
                         rope="half_truncated", attention_scale=0.1, yarn=True,
                         window_pattern="SSSLSSSSSSL", window_short_blocks=1, window_long_blocks=3,
                         logit_softcap=23.0, softcap_kind="shifted_sigmoid", x0_lambdas=True, resid_lambda_init=1.1,
                         value_embed_layers=(1, 2, 8, 9, 10), value_embed_gates=True, smear=True,
                         tie_embed_head=True, bigram_vocab_size=50304 * 15 // 2, bigram_sign_trick=True,
                         skip_connections="gated", skip_from=3, skip_to=6, attention_free_layers=(6,),
                         attention_gate_layers=(0, 1, 2, 3, 4, 5, 7, 8, 9, 10), paired_head_layers=(0, 2, 5, 9),
                         fp8_attention=True, fp8_head=True, fp8_mlp=True, key_offset=True, backout_layer=7,
                         attention_backend="flex", cross_entropy="fused", rotary_kernel="triton"),
    # Record #28, 2025-08-23_SparseAttnGate (speedrun-spec.md 6; its train_gpt.py is in the log): 12 layers,
    # layer 7 without attention (#17); FlexAttention with long windows on layers 0, 4, 7, 11 and short
    # elsewhere (#12, #13, #20; the record's short window is half the long one, grown 1 -> 14 blocks by
    # its schedule); attention scale 0.12 (#20); half-truncated RoPE (#17); three value-embedding tables
    # on layers 0, 1, 2 and again 9, 10, 11 (#14-#17); x0 lambdas (#9); U-net skips (#11); the sparse
    # attention gate on every attention layer (#28); FP8 head (#19); untied embedding and head. Its softcap
    # 30·σ(z/7.5) equals 15·tanh(z/15) + 15, and a constant added to every logit leaves the softmax and
    # the loss unchanged: hence tanh with cap 15. Its loss is F.cross_entropy of the compiled softcap; here
    # the fused cross-entropy, the same function in one pass. Its value-embedding tables start at
    # nn.Embedding's N(0, 1) (value_embed_std 1.0), and its values mix as v = λ0·v + λ1·ve (λ0·v in layers
    # without a value embedding) with learned per-layer λ from (0.5, 0.5) (value_lambdas, its "SA lambdas").
    "record28": GPTConfig(n_layer=12, model_dim=768, n_head=6, head_dim=128, mlp_ratio=4,
                          rope="half_truncated", attention_scale=0.12,
                          window_pattern="LSSSLSSLSSSL", window_short_blocks=1, window_long_blocks=1,
                          logit_softcap=15.0, softcap_kind="tanh", x0_lambdas=True,
                          value_embed_layers=(0, 1, 2, 9, 10, 11), value_embed_tables=3,
                          value_embed_std=1.0, value_lambdas=True, skip_connections="unet",
                          attention_gate_layers=(0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11),
                          attention_free_layers=(7,), fp8_head=True, attention_backend="flex",
                          cross_entropy="fused", rotary_kernel="triton"),
    # Record #88 (2026-07 prefix-token loss; its train_gpt.py in shared/reference-code/record88): the shape and
    # the switches of gpt124m (above) in the residual form of records #81-#88 (speedrun-spec.md 2.2): per-
    # sublayer resid lambdas from √1.1 and post lambdas from 1, x0 and bigram injected after attention, x0
    # holding layer 0's bigram injection as the record's in-place update makes it (x0_with_bigram); the skip
    # 3 -> 6 gated by σ(λ)·2σ(W·x0[:12]) (#55); layers 8-10 attend over norm(output of layer 7) (#77); the
    # q/k/v and output lambdas (#47); learnable per-head XSA on layers 1, 3, 4, 7, 8, 10 (#82); MUDD at the start
    # of layer 10 (reading the outputs of 7) and after the loop (reading 7, 3 and the input of 10), which
    # absorbs backout (#81). Sigmoid attention gates on every attention layer (#28), VE gates on 1, 2, 8, 9
    # (10's from MUDD). FP8 only in the head (#19) and the MLP up-projection (#84, inside the fused ReLU² kernel,
    # #87; the down product in bf16: fp8_mlp_down false); the record's attention products are bf16. The prefix-
    # token loss (#88) builds its table here; its weight and the multi-token weights (#53) are per-step schedule
    # values (speedrun.optim.stages). Attention: the fastest installed backend (auto: FlashAttention 3, as the
    # records since #29, where it is installed). Its bigram table (record88 L1746-1747, as #83's and #87's) has
    # 50304·15 = 754,560 rows of 192 channels, added to the stream's first 192 (bigram_dim; HEAD's is 377,280 x
    # 768; until 2026-12-03 this preset had HEAD's table). Its windows see one key more than their blocks (L1124:
    # FA3's window_size=(bm_size, 0), bm_size = blocks·128 positions back, on the paired layers' doubled
    # sequence too) and its paired layers pair heads p and p + 3 (L1101-1112): window_extra_keys 1 and
    # paired_head_layout "split" (both since 2026-12-06). Its cross-entropy: the one-sweep kernel (a softcapped
    # row read once and kept on chip, as the record's own CUDA kernel keeps it in shared memory): 0.85-0.95 ms
    # against the two-sweep kernel's 1.35 ms a call at its shape on an H100 (docs/benchmarks.md, 2026-12-07).
    "record88": GPTConfig(n_layer=11, model_dim=768, n_head=6, head_dim=128, mlp_ratio=4,
                          rope="half_truncated", attention_scale=0.1, yarn=True,
                          window_pattern="SSSLSSSSSSL", window_short_blocks=1, window_long_blocks=3,
                          logit_softcap=23.0, softcap_kind="shifted_sigmoid", resid_lambda_init=1.1,
                          value_embed_layers=(1, 2, 8, 9, 10), value_embed_gates=True, smear=True,
                          tie_embed_head=True, bigram_vocab_size=50304 * 15, bigram_dim=192, bigram_sign_trick=True,
                          skip_connections="gated", skip_from=3, skip_to=6, skip_gate=True,
                          attention_free_layers=(6,), attention_gate_layers=(0, 1, 2, 3, 4, 5, 7, 8, 9, 10),
                          paired_head_layers=(0, 2, 5, 9), key_offset=True, fp8_head=True,
                          residual_form="sublayer", x0_with_bigram=True, saved_activation_layer=7,
                          sa_lambdas=True, xsa_layers=(1, 3, 4, 7, 8, 10), xsa_form="normalized",
                          mudd=True, mudd_layer=10, mudd_mid_layer=7, mudd_early_layer=3,
                          attention_backend="auto", cross_entropy="fused_one_sweep", rotary_kernel="triton",
                          mlp_kernel="triton", fp8_mlp=True, fp8_mlp_down=False, prefix_token_loss=True,
                          attention_output_init="uniform", window_extra_keys=1, paired_head_layout="split"),
}

# HEAD (record #89 in issue 20's numbering: #85 MUDD gates + DC, #86 XSA rewrite, #87, #88, #89; its train_gpt.py
# in shared/reference-code/head; speedrun-spec.md 2): record88's architecture with HEAD's MUDD gates (#85): a pre
# gate from x0 and a post gate at the start of layer 4 give per-token XSA strengths (layers 1, 3, 4, 7, #86 form),
# linear attention gates on layers 3 and 10 only (from 0.25), the x0/bigram injection gates (instead of the
# lambdas) and the 3 -> 6 skip's gate (from 0.5, instead of the σ(W·x0) gate); lightweight DC on layer 10 over 112
# keys (#85, speedrun.model.dc); x0 without layer 0's bigram injection (HEAD clones it); the MLP's down projection
# in FP8 too, with its delayed input scale (#89); the bigram table 377,280 x 768, all channels (head L1902-1903).
PRESETS["record89"] = dataclasses.replace(
    PRESETS["record88"], bigram_vocab_size=50304 * 15 // 2, bigram_dim=None,
    x0_with_bigram=False, skip_gate=False, xsa_layers=(1, 3, 4, 7), xsa_form="projection",
    attention_gate_layers=(3, 10), mudd_gates=True, mudd_gate_layer=4, dc_layers=(10,), dc_window=112,
    fp8_mlp_down=True)

# Record #83 (2026-05-20 BigramsSignTrick as record #87's PR re-ran it, "baseline_pr299"; its train_gpt.py in
# shared/reference-code/record83), against record #88's script (reference-code/record88, the record88 preset
# above), the two scripts' GPT classes line by line: the same shape and switches (sublayer form, MUDD, XSA on
# 1, 3, 4, 7, 8, 10 in the normalized form, gates, value embeddings, bigram table with the sign trick, the 3 -> 6
# skip with its σ(W·x0) gate, paired heads 0, 2, 5, 9, saved activation 7, key offset, FP8 head, tied embedding
# and head), but:
#   no prefix-token loss (#88 adds build_prefix_table and its loss term): prefix_token_loss false;
#   the MLP up-projection in bf16 (#88 adds quantize_mlp_fp8 and the kernel's FP8 operands): fp8_mlp false.
#   Its fused ReLU² kernel (triton_kernels.py) saves pre and post for the backward, #87's only post (relu(pre)
#   rebuilt as sqrt(post), ours): the same products, bf16 rounding apart in the backward's relu(pre). NOT mapped
#   (a kernel's storage, not a model switch).
#   Multi-token prediction (#53) and its weights per stage: the staged schedule's (record_schedule("record83")).
PRESETS["record83"] = dataclasses.replace(PRESETS["record88"], prefix_token_loss=False, fp8_mlp=False,
                                          fp8_mlp_down=True)
# Record #87 (2026-06-11 RecursiveFromBest, "this_pr", the seed record; reference-code/record87) against record
# #83's script, the GPT classes line by line:
#   paired-head attention on layers 0 and 5 only (#83: 0, 2, 5, 9): paired_head_layers (0, 5);
#   the q/k/v and o products in FP8 in training (its FP8LinearFunction: operands cast to e4m3 at scale 1, the
#   weights pre-multiplied by sa_lambdas and cast to bf16, backward in bf16; evaluation bf16): fp8_attention
#   with fp8_attention_scales "unit";
#   its fused ReLU² kernel keeps only post (ours, mlp_kernel triton); the MLP in bf16 (fp8_mlp false).
#   Everything else as #83. Its optimizer changes (NorMuon Langevin noise, C-Optim Adam on the value and bigram
#   tables, lm_head lr x 0.95, never untied, the lazy final embed.grad.T add) are training settings
#   (configs/records/record87.yaml says which are mapped).
PRESETS["record87"] = dataclasses.replace(PRESETS["record83"], paired_head_layers=(0, 5), fp8_attention=True,
                                          fp8_attention_scales="unit")

# Record #12, 2024-11-19 FlexAttention (../shared/reference-logs/2024-11-19_FlexAttention, its train_gpt.py;
# 1875 steps, val_loss 3.2783). Each element against ours:
#   12 layers of width 768, 6 heads of 128, MLP 4x with ReLU², every block with attention and MLP: the shape.
#   Vocabulary 50304 (50257 padded to a multiple of 128): vocab_size. Embedding N(0, 1) and untied head at
#   zero: our defaults (tie_embed_head off). Input RMS norm of the embedding, pre-norm blocks without gain,
#   final norm: ours always. q, k, v and the MLP's fc initialized as nn.Linear leaves them (uniform on
#   ±1/sqrt(768)), attention and MLP output projections at zero: linear_init "torch".
#   Value residual: v = (1 - λ)·v + λ·v_0, v_0 layer 0's values, λ per layer from 0.5: value_residual.
#   No value embeddings, no attention gate, no smear, no bigram, no FP8, no backout, no key offset.
#   x = λ0·x + λ1·x0 with λ from (1, 0) in every block: x0_lambdas (resid_lambda_init 1).
#   U-net: layers 0-5 save their outputs, layer 6 + i adds skip_weights[i]·(output of 5 - i), weights from 1:
#   skip_connections "unet".
#   QK-norm (rms_norm of q and k): ours always. RoPE base 10000 on all 64 pairs (x[i], x[i + 64]) of a
#   head, positions of the packed sequence: rope "full", rope_base 10000. The record turns by -θ where we
#   turn by +θ and counts positions over the whole 64K sequence where we restart them per document; both
#   leave every score within a document unchanged up to a fixed sign flip of q/k dims 64-127, which the
#   learned W_q, W_k absorb (its cos/sin tables are bf16, ours fp32).
#   Attention scale 1/sqrt(128) (flex_attention's default): attention_scale None, no YaRN.
#   Mask: causal, same document (BOS 50256 starts one), q - k < 1024: every layer a window of exactly 1024
#   keys, itself included, the same at every step: window_pattern all L with 8 blocks of 128 (short 8 too;
#   the training config sets no window schedule). FlexAttention: attention_backend "flex".
#   Logits 30·tanh(z/30) in fp32, mean cross-entropy: logit_softcap 30, softcap_kind "tanh"; the fused
#   cross-entropy computes the same loss.
#   Storage: the record casts the model to bf16 (embedding, λs and skip weights in bf16; the linear
#   weights fp32, cast to bf16 in the product); ours keeps fp32 weights under bf16 autocast. NOT mapped
#   (a training dtype policy, not a model switch).
PRESETS["record12"] = GPTConfig(n_layer=12, model_dim=768, n_head=6, head_dim=128, mlp_ratio=4,
                                rope="full", rope_base=10000.0, attention_scale=None,
                                window_pattern="L" * 12, window_short_blocks=8, window_long_blocks=8,
                                logit_softcap=30.0, softcap_kind="tanh", x0_lambdas=True, skip_connections="unet",
                                value_residual=True, linear_init="torch", attention_backend="flex",
                                cross_entropy="fused", rotary_kernel="triton")
# Record #31, 2025-09-10 YaRN (../shared/reference-logs/2025-09-10_Yarn, its train_gpt.py; 7 runs of 1670
# steps, val_loss 3.2786 ± 0.0010). record28's architecture but: no MLP in layer 0 (PR 120), the 3/7/11 windows,
# attention scale 0.1 with YaRN. Each element against ours:
#   12 layers of width 768, 6 heads of 128, MLP 4x ReLU²; layer 7 without attention, layer 0 without MLP:
#   attention_free_layers (7,), mlp_free_layers (0,). Vocabulary 50257 -> 50304 (next multiple of 128).
#   Embedding and 3 value-embedding tables N(0, 1) (nn.Embedding's default; stored in bf16, ours fp32),
#   laid out 0 1 2 on layers 0, 1, 2 and again on 9, 10, 11: value_embed_layers, value_embed_tables 3,
#   value_embed_std 1.0. Values v = λ0·v + λ1·ve (λ0·v without a value embedding), its "SA lambdas" from
#   (0.5, 0.5): value_lambdas.
#   x0 lambdas from (1, 0): x0_lambdas. U-net skips, 6 weights from 1: skip_connections "unet".
#   Sparse attention gate sigmoid(W x[:12]) per head, W (6, 12) from zero, on every attention layer:
#   attention_gate_layers (its Muon training: train.muon_attention_gates).
#   q, k, v, fc uniform with std 0.5/sqrt(768), o and MLP proj and head at zero: linear_init "speedrun"
#   (our default). Untied embedding and head.
#   QK-norm; half-truncated RoPE, 32 frequencies (1/1024)^linspace(0, 1, 32) and 32 zeros: rope
#   "half_truncated". Its pairs are (x[i], x[i + 64]) turned by -θ, ours (x[2i], x[2i+1]) turned by +θ: a
#   fixed signed permutation of the q/k dims, which W_q, W_k absorb (uniform init, Muon and the QK-norm
#   are invariant under it).
#   Attention scale 0.1, times 1 + 0.2·ln(new/old) and YaRN on the rotary frequencies (alpha 1, beta 32)
#   whenever the long window grows (3 -> 7 -> 11 blocks, then 13 for the final validation): attention_scale
#   0.1, yarn.
#   Windows in 128-token blocks, long on layers 0, 4, 7, 11 and short elsewhere: window_pattern
#   "LSSSLSSLSSSL"; long ws, short ws // 2, ws 3 -> 7 -> 11 over thirds: train.window_schedule
#   [[1, 3], [3, 7], [5, 11]], final (13 // 2, 13) = (6, 13) (train.final_window_short_blocks and
#   final_window_long_blocks). Its FA3 window_size (W, 0) lets a query see W + 1 keys (W = 128·blocks),
#   ours W: window_extra_keys 1. Its stages split step / 1671 into thirds: train.window_stage_span.
#   Logits 30·σ(z/7.5) = 15·tanh(z/15) + 15, the same softmax: logit_softcap 15, "tanh". Its training
#   loss is summed over each rank's tokens (validation: mean): ours is the mean, the same directions for
#   Muon (scale-free) and for Adam with ε divided by the 49,152 tokens per rank (train.adam_eps).
#   FP8 head in training: fp8_head. Its scales x/(√768/448), W/2^-9 and a fixed gradient scale 1/448
#   differ from ours (HEAD's x/(100/448), W/(1.6/448), dynamic e5m2 gradient, speedrun.model.fp8): NOT
#   mapped (the head's scales are constants of the loss, shared by every preset).
#   Flash attention varlen over BOS-aligned documents of at most 2048 tokens: attention_backend "flex"
#   (the same document-causal windowed attention) and train.max_seq_len 2048.
PRESETS["record31"] = GPTConfig(n_layer=12, model_dim=768, n_head=6, head_dim=128, mlp_ratio=4,
                                rope="half_truncated", attention_scale=0.1, yarn=True,
                                window_pattern="LSSSLSSLSSSL", window_short_blocks=1, window_long_blocks=3,
                                logit_softcap=15.0, softcap_kind="tanh", x0_lambdas=True,
                                value_embed_layers=(0, 1, 2, 9, 10, 11), value_embed_tables=3,
                                value_embed_std=1.0, value_lambdas=True, skip_connections="unet",
                                attention_gate_layers=(0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11),
                                attention_free_layers=(7,), mlp_free_layers=(0,), window_extra_keys=1,
                                fp8_head=True, attention_backend="flex", cross_entropy="fused",
                                rotary_kernel="triton")


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
            f"unknown model setting {unknown[0]!r}{did_you_mean(unknown[0], valid)} (model overrides accept "
            f"{', '.join(valid)})"
        )
    return dataclasses.replace(PRESETS[preset], **overrides)
