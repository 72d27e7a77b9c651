"""Our ``record89`` GPT against HEAD's own ``GPT`` class (the current record), executed from
../shared/reference-code/head/train_gpt.py at test time, at a tiny width in float64 on the CPU: the proof of
tests/test_record88_model.py, for HEAD.

Both models hold the same weights (HEAD's, moved off their initialization, copied into ours through the
parameter map :func:`parameter_links`) and read the same packed batch of four documents, one of them longer
than the DC window (130 tokens > 112, so DC's window and its document masking both bind); the tests assert
that their validation-mode (``eval()``) losses agree to 1e-12 relative and every parameter's gradient to 1e-9
relative (of its largest element), at the first window stage (1, 3), after HEAD's YaRN window change to
(3, 7) (``Yarn.apply`` on both Yarns) and with the final validation's long window of 20 blocks (no YaRN).
Every parameter of ours is mapped from exactly one slice of a HEAD parameter; HEAD's elements left unmapped
(:data:`UNMAPPED`) are counted and shown to get no gradient.

HEAD's model against record #88's (the two scripts' GPT, CausalSelfAttention, Yarn and forward, diffed):
  * MUDD gates (record #85): ``mudd_gate_w1`` (2, 64, C), ``mudd_gate_w2`` (2, 41, 64), ``mudd_gate_b2``
    (2, 41) and a learnable 0-d ``_mudd_gate_scale`` (from 0.1); the "pre" gate (26 coefficients) reads x0,
    the "post" gate (41) the un-normalized stream entering layer 4. They give per-token XSA strengths (layers
    1, 3 | 4, 7), linear attention output gates (3 | 10, replacing #88's sigmoid ``attn_gate_bank`` on every
    layer), the x0 and bigram injection gates (0-3 | 4, 5, 7, 8, 9, replacing ``x0_lambdas`` and
    ``bigram_lambdas``), the 3 -> 6 skip's gate (replacing ``skip_gate``: sigmoid(lambda)·gate, no
    2·sigmoid(W·x0)) and layer 10's DC weights -- ours: ``mudd_gates``, ``mudd_gate_layer 4``,
    ``attention_gate_layers (3, 10)``, ``skip_gate false``;
  * XSA on layers 1, 3, 4, 7 only (#88: also 8, 10) in the projection form (#86: dot / max(|v|², 1e-8)),
    ``xsa_alphas`` gone -- ours: ``xsa_layers (1, 3, 4, 7)``, ``xsa_form projection``;
  * lightweight DC (record #85) on layer 10 after FA3, before XSA and the gate: ``dc_gate`` RMS-normalizes w1
    over the heads (eps 1e-6), then ``dc_triton_kernels.py``'s kernel adds w2_h · Σ_s A[t, s] v_h[s], A the
    w1-mixture of the heads' softmaxes over the last 112 keys of the query's document -- ours:
    ``dc_layers (10,)``, ``dc_window 112`` (:mod:`speedrun.model.dc`);
  * x0 is the plain normalized embedding (``x = x0.clone()`` before layer 0's bigram injection; #88's
    in-place update put that injection into x0) -- ours: ``x0_with_bigram false``;
  * the bigram table 50304·15//2 rows of all 768 channels (#88: 50304·15 x 192) -- ours:
    ``bigram_vocab_size 377,280``, ``bigram_dim None`` (here 127 rows of the full width 96);
  * the MLP's down projection in FP8 too, with delayed scales (#89) -- ours: ``fp8_mlp_down``; a training
    path (``use_mlp_fp8 = self.training and not DISABLE_FP8``): not exercised here;
  * the prefix table is built after the clock starts (a -1 table in ``__init__``): no model change.

What is changed in HEAD's code to run it here: :class:`record_models.Float64Eager` (bf16/fp32 ->
float64, cuda -> cpu, the key offset's overlapping in-place copy reading a clone, as torch.compile does).
Stand-ins (:func:`record_namespace`): FA3's ``flash_attn_varlen_func`` and the fused ReLU² kernel without FP8
(#88's test's), the DC Triton kernel (:func:`dc_correction_add_base`, its forward transcribed in float64;
autograd gives the backward: the kernel's own Triton backward is not exercised), ``torch.cuda``'s SM count
(which only sizes an FP8 amax buffer), ``args`` (HEAD's Hyperparameters fields the GPT reads), ``dist``,
``os.environ`` with DISABLE_FP8. dc_triton_kernels.py has no plain-PyTorch reference to check the stand-in
against; :func:`test_dc_stand_in_is_the_dense_formula` checks its blocking against the dense formula.

Mapping notes as for #88 (test_record88_model's docstring): HEAD's RoPE turns by -θ, ours by +θ, so the q/k
rows of the rotated pairs' second dims are negated (``rope_row_signs``; HEAD's Yarn is #88's code); its
paired layers' flat reshape pairs heads p and p + 3 (``paired_head_layout: split``); ours is given HEAD's
float64 rotary frequencies and bigram sign table. The DC kernel reads q and k after RoPE, so it sees the
same scores in both (RoPE's sign convention cancels in q·k once the weights carry S).

Result (float64; 2026-12 HEAD): no functional difference between our record89 and HEAD's eval forward and
backward -- losses agree to ~1e-16 and every gradient to <= ~2e-10 relative (the largest on the sa lambdas and
MUDD biases, sums over many elements). The test does fail when record89 is changed: dc_window 100 (loss
3.6e-4 relative apart), x0_with_bigram true (1.4e-6), window_extra_keys 0 (8.9e-4). Deliberate numerics
differences, invisible in float64: HEAD's ``dc_gate`` rounds the normalized w1 and w2 to bf16 (``type_as(x)``)
before its kernel, ours pass them in fp32 (speedrun.model.dc's docstring says so).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from speedrun.model.dc import dc_attention
from speedrun.model.gpt import GPT

from record_code import SHARED_CODE
from record_models import (HEAD_DIM, HEADS, MODEL_DIM, VOCAB, Link, ModelParity, bank_links, embedding_links,
                           executed_record, initialized_record_gpt, record_gpt, tiny_config, tiny_namespace)
from test_record88_model import relu_sqrd_mlp

RECORD = SHARED_CODE / "head" / "train_gpt.py"
RECORD_NAMES = {"norm", "CastedLinearT", "Yarn", "AttnArgs", "dc_gate", "CausalSelfAttention",
                "next_multiple_of_n", "ForwardScheduleConfig", "GPT", "get_bigram_hash"}

SEQ_LEN = 176                                                    # T: a multiple of 16 (HEAD asserts it)
CU_SEQLENS = torch.tensor([0, 20, 150, 163, 176, 176], dtype=torch.int32)   # doc 1: 130 tokens > DC's 112
DC_WINDOW = 112                                                  # HEAD's literal (CausalSelfAttention.forward)
PRE, POST = 26, 41                                               # HEAD's gate coefficients (of 41 rows)


# ---- HEAD's code, on the CPU in float64 -------------------------------------------------------------------


def dc_correction_add_base(base_out, q, k, v, dc_weights, softmax_lse, scaling, window=None, seq_lens=None,
                           block_m=16, block_n=32):
    """``dc_attention_postonly_nodd_correction_add_base_triton`` of HEAD's dc_triton_kernels.py, its forward
    kernel (``_dc_postonly_corr_fwd_wsmall_cached_kernel``) transcribed block for block in float64: queries in
    blocks of ``block_m`` (16), each block scoring its keys ``k_start .. k_start + block_k - 1`` (k_start =
    q_start - W + 1, clamped at 0) where ``valid`` = key < T, 0 <= t - s < W, and s in the query's document
    (bounds from ``cu_seqlens``); per head the softmax over the valid keys; A = Σ_g w1[t, g] P_g (w1 already
    RMS-normalized by HEAD's ``dc_gate``); out_h = base_h + w2[t, h] · A v_h. q, k, v (1, T, H, D), base_out
    (T, H, D) (FA3's output), w1, w2 (1, T, H). ``block_n`` is unused (as in the kernel's forward)."""
    post_w1, post_w2 = dc_weights
    window = 112 if window is None else int(window)
    assert softmax_lse is None and q.shape[0] == 1 and base_out.shape == q.shape[1:] and 0 < window <= 128
    q, k, v, w1, w2 = q[0], k[0], v[0], post_w1[0], post_w2[0]
    tokens = q.size(0)
    block_m = max(8, min(64, int(block_m)))                                  # _normalize_block_m (16 stays)
    block_k = max(128, 1 << (window + block_m - 2).bit_length())
    cu = seq_lens.long()
    doc = torch.bucketize(torch.arange(tokens), cu[1:], right=True)          # the kernel's binary search
    doc_start, doc_end = cu[doc], cu[doc + 1]
    out = []
    for q_start in range(0, tokens, block_m):
        q_offs = torch.arange(q_start, min(q_start + block_m, tokens))
        k_offs = max(q_start - window + 1, 0) + torch.arange(block_k)
        rel = q_offs[:, None] - k_offs[None, :]
        valid = ((k_offs[None, :] < tokens) & (rel >= 0) & (rel < window)
                 & (k_offs[None, :] >= doc_start[q_offs, None]) & (k_offs[None, :] < doc_end[q_offs, None]))
        keys = k_offs.clamp(max=tokens - 1)                                  # k_load_offs
        scores = torch.einsum("ahd,jhd->haj", q[q_offs], k[keys]) * scaling
        probs = scores.masked_fill(~valid, float("-inf")).softmax(-1)        # (H, block_m, block_k)
        mixed = torch.einsum("ah,haj->aj", w1[q_offs], probs)                # a_acc
        out.append(base_out[q_offs] + w2[q_offs, :, None] * torch.einsum("aj,jhd->ahd", mixed, v[keys]))
    return torch.cat(out)


class TorchWithoutCuda:
    """The ``torch`` HEAD's code sees: the real module, but ``torch.cuda`` answers the one question HEAD's GPT
    asks, the SM count (it sizes ``_mlp_down_partial_amax``, the FP8 down projection's buffer, unused here)."""

    cuda = SimpleNamespace(current_device=lambda: 0,
                           get_device_properties=lambda device: SimpleNamespace(multi_processor_count=4))

    def __getattr__(self, name: str):
        return getattr(torch, name)


def record_namespace() -> dict:
    """What HEAD's GPT reads from its module (:func:`record_models.tiny_namespace`: imports, world size,
    ``dist``, ``os`` with DISABLE_FP8, FA3's stand-in) with HEAD's ``args`` (bigram_dim = the model width: all
    channels, as HEAD's 768 of 768), #88's test's ReLU² stand-in, the DC kernel's stand-in and
    :class:`TorchWithoutCuda`."""
    return tiny_namespace("head_train_gpt", MODEL_DIM, SEQ_LEN, ReLUSqrdMLP=relu_sqrd_mlp, torch=TorchWithoutCuda(),
                          dc_attention_postonly_nodd_correction_add_base_triton=dc_correction_add_base)


@pytest.fixture(scope="module")
def record():
    """HEAD's definitions, executed (skipped where ../shared is absent, as in CI)."""
    return executed_record(RECORD, RECORD_NAMES, record_namespace())


def record_model(record, seed: int = 0) -> nn.Module:
    """HEAD's GPT in float64, eval mode, every parameter moved off its initialization (zero inits included;
    :func:`record_models.record_gpt`); RoPE tables of 2·(T/2) rows = T."""
    return record_gpt(record, max_seq_len=SEQ_LEN // 2, seed=seed)


# ---- ours -------------------------------------------------------------------------------------------------


def our_config():
    """The record89 preset at the tiny shape, on the CPU paths (reference attention, full cross-entropy, no
    FP8; DC on its reference path, float64 here)."""
    return tiny_config("record89", rotary_positions=2 * SEQ_LEN, fp8_mlp=False, fp8_attention=False,
                       prefix_token_loss=False)


def parameter_links(our_model: GPT) -> list[Link]:
    """The parameter map, HEAD -> ours (C model_dim, V vocabulary, a = the attention index of layer i,
    i - (i > 6)); as #88's (test_record88_model.parameter_links) for what the two share:

    * ``embed.weight``; ``lm_head.weight`` (C, V) transposed; ``scalars`` [22] -> ``smear.lambda_``, [23] ->
      ``skips.lambda_``, [2i, 2i+1] -> ``blocks.i.attn.sa_lambdas``; ``smear_gate.weight`` -> ``smear.gate``;
    * ``qk_bank`` groups 6a..6a+2 -> ``q.weight``, 6a+3..6a+5 -> ``k.weight`` (rotated pairs' second rows
      negated), ``vo_bank`` 2a -> ``v.weight``, 2a+1 -> ``o.weight``; ``mlp_bank`` [i, 0] -> ``fc.weight``,
      [i, 1] transposed -> ``proj.weight``; ``ve_gate_bank`` [0..3] -> the VE gates of layers 1, 2, 8, 9;
    * ``value_embeds`` rows jV..(j+1)V -> ``value_embeds.tables.j.weight``; ``bigram_embed.weight`` ->
      ``bigram.table`` (no bigram gates: MUDD's); ``post_lambdas``, ``resid_lambdas`` -> ``residual.*``;
    * ``mudd_w1``, ``mudd_w2``, ``mudd_b2`` [0] -> ``mudd.layer.*``, [1] -> ``mudd.final.*`` (5 of 14 rows);
    * new in HEAD: ``mudd_gate_w1``, ``mudd_gate_w2``, ``mudd_gate_b2`` [0] -> ``mudd_gates.pre.*`` (the first
      26 of 41 rows), [1] -> ``mudd_gates.post.*`` (all 41; the same order of items:
      :func:`test_our_gate_layout_is_heads`), ``_mudd_gate_scale`` -> ``mudd_gates.scale``.
    """
    cfg = our_model.config
    links = embedding_links(cfg) + [Link("mudd_gates.scale", "_mudd_gate_scale", lambda p: p)]
    links += [Link(f"residual.{name}", name, lambda p: p) for name in ("post_lambdas", "resid_lambdas")]
    for ours, theirs, nets in (("mudd", "mudd", (("layer", 14), ("final", 5))),
                               ("mudd_gates", "mudd_gate", (("pre", PRE), ("post", POST)))):
        for m, (net, rows) in enumerate(nets):
            links += [Link(f"{ours}.{net}.w1", f"{theirs}_w1", lambda p, m=m: p[m]),
                      Link(f"{ours}.{net}.w2", f"{theirs}_w2", lambda p, m=m, rows=rows: p[m, :rows]),
                      Link(f"{ours}.{net}.b2", f"{theirs}_b2", lambda p, m=m, rows=rows: p[m, :rows])]
    return links + bank_links(cfg)


# elements of HEAD's parameters that no parameter of ours holds, each never read by its forward
UNMAPPED = {"qk_bank": 4 * 2 * HEAD_DIM * MODEL_DIM,           # padding 60 -> 64 groups
            "vo_bank": 4 * MODEL_DIM * MODEL_DIM,              # padding 20 -> 24
            "mlp_bank": 2 * 4 * MODEL_DIM * MODEL_DIM,         # the padding layer 11
            "ve_gate_bank": HEADS * 12,                        # gate 4: layer 10 takes MUDD's
            "scalars": 2,                                      # layer 6's sa lambdas (no attention)
            "mudd_w2": 9 * 64, "mudd_b2": 9,                   # the final mix reads 5 of 14 coefficients
            "mudd_gate_w2": (POST - PRE) * 64, "mudd_gate_b2": POST - PRE}   # the pre gate reads 26 of 41


PARITY = ModelParity(our_config, parameter_links, UNMAPPED, SEQ_LEN, CU_SEQLENS, label="HEAD")


# ---- the tests --------------------------------------------------------------------------------------------


def test_head_eval_loss_and_gradients_match_heads_own_gpt(record):
    PARITY.assert_match_at_the_first_stage(record, record_model(record))


def test_head_initialization_is_heads(record):
    """Ours fresh from its ``__init__`` draws what HEAD's ``GPT.__init__`` draws, parameter by mapped parameter
    (:meth:`record_models.ModelParity.assert_same_initialization`), MUDD's gate nets and the DC weights included."""
    PARITY.assert_same_initialization(lambda seed: initialized_record_gpt(record, SEQ_LEN // 2, seed))


def test_after_a_yarn_window_change_they_still_match(record):
    """HEAD's second window stage: (1, 3) -> (3, 7) blocks, ``yarn.apply(12, 28)`` on both Yarns
    (TrainingManager.advance_schedule) against our ``set_window_blocks(3, 7)``; then the final validation's
    long window without YaRN (apply_final_ws_ext: ws_long 20 blocks)."""
    PARITY.assert_match_after_a_window_change(record, record_model(record, seed=7))


def test_our_gate_layout_is_heads(record):
    """Our MUDD gate layout (:func:`speedrun.model.mudd.gate_layout`) puts each item where HEAD's
    ``unpack_pre_mudd_gate``/``unpack_post_mudd_gate`` and its DC slice (29:35, 35:41) read it: each column of
    a gate output is tagged with its index and the unpacked slices are compared; and the initial biases (in
    the pre-scaled domain) are HEAD's ``init_mudd_gate``'s."""
    torch.manual_seed(0)
    theirs = record.GPT(vocab_size=VOCAB, num_layers=11, num_heads=HEADS, head_dim=HEAD_DIM, model_dim=MODEL_DIM,
                        max_seq_len=SEQ_LEN // 2)                                   # fresh: HEAD's init
    gates = GPT(our_config()).mudd_gates
    assert gates.scale.item() == pytest.approx(theirs._mudd_gate_scale.item(), rel=1e-7)
    for gate_id, (net, layout, count) in enumerate(((gates.pre, gates.pre_layout, PRE),
                                                    (gates.post, gates.post_layout, POST))):
        tagged = torch.arange(count, dtype=torch.float64).expand(2, count)         # (T = 2, n): column ids
        xsa, attn, x0, bigram = ([None] * 11 for _ in range(4))
        unpack = theirs.unpack_post_mudd_gate if gate_id else theirs.unpack_pre_mudd_gate
        skip = unpack(tagged, xsa, attn, x0, bigram)
        theirs_slices = {(kind, i): t for kind, slots in (("xsa", xsa), ("attn_gate", attn), ("x0", x0),
                                                          ("bigram", bigram))
                         for i, t in enumerate(slots) if t is not None}
        if gate_id:
            theirs_slices |= {("skip", 6): skip, ("dc_w1", 10): tagged[..., 29:35], ("dc_w2", 10): tagged[..., 35:41]}
        ours_slices = {(s.kind, s.layer): tagged[:, s.start:s.start + s.width] for s in layout}
        assert ours_slices.keys() == theirs_slices.keys()
        for key, t in theirs_slices.items():
            assert torch.equal(ours_slices[key], t), key
        torch.testing.assert_close(net.b2.double(), theirs.mudd_gate_b2[gate_id, :count].double(), rtol=1e-6, atol=0)


def test_dc_stand_in_is_the_dense_formula():
    """:func:`dc_correction_add_base` (the kernel's blocking) against the dense formula (one (T, T) mask: same
    document, 0 <= t - s < 112; dc_triton_kernels.py has no PyTorch reference of its own), and our
    :func:`speedrun.model.dc.dc_attention` (which RMS-normalizes w1 itself) against it too, over the documents
    of the batch, :data:`CU_SEQLENS` (one longer than the window)."""
    generator = torch.Generator().manual_seed(5)
    q, k, v, y = (torch.randn(SEQ_LEN, HEADS, HEAD_DIM, generator=generator, dtype=torch.float64) for _ in range(4))
    w1, w2 = (torch.randn(SEQ_LEN, HEADS, generator=generator, dtype=torch.float64) for _ in range(2))
    w1n = F.rms_norm(w1, (HEADS,), eps=1e-6)
    scale = 0.37
    stand_in = dc_correction_add_base(y, q[None], k[None], v[None], (w1n[None], w2[None]), None, scale,
                                      window=DC_WINDOW, seq_lens=CU_SEQLENS)
    pos = torch.arange(SEQ_LEN)
    doc = torch.bucketize(pos, CU_SEQLENS[1:].long(), right=True)
    offset = pos[:, None] - pos[None, :]
    mask = (doc[:, None] == doc[None, :]) & (offset >= 0) & (offset < DC_WINDOW)
    probs = (torch.einsum("thd,shd->hts", q, k) * scale).masked_fill(~mask, float("-inf")).softmax(-1)
    dense = y + w2[..., None] * torch.einsum("ts,shd->thd", torch.einsum("th,hts->ts", w1n, probs), v)
    torch.testing.assert_close(stand_in, dense, rtol=1e-13, atol=1e-13)
    ours = dc_attention(y, q, k, v, w1, w2, CU_SEQLENS, scale, window=DC_WINDOW, impl="reference")
    torch.testing.assert_close(ours, dense, rtol=1e-13, atol=1e-13)
