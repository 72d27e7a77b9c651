"""Our ``record88`` GPT against record #88's own ``GPT`` class, executed from
../shared/reference-code/record88/train_gpt.py at test time (not a copy, not a re-transcription: see
tests/test_record_residual.py for the hand-written one), at a tiny width in float64 on the CPU.

Both models hold the same weights (the record's, moved off their initialization, copied into ours through the
parameter map :func:`parameter_links`) and read the same packed batch of four documents; the test asserts
that their validation-mode (``eval()``) losses agree to 1e-12 relative and the gradients of every parameter
to 1e-9 relative (of the largest element; measured ~1e-15 and ~3e-12), at the first window stage, after a
window change with YaRN and with the final validation's longer window. Every parameter of ours is mapped
from exactly one slice of a record parameter, and the record's elements left unmapped (bank padding, its
unused 5th VE gate, layer 6's sa lambdas, the XSA rows of layers without XSA, the MUDD rows its final mix
does not read) are counted and shown to get no gradient, so nothing is silently left at a default.

What is changed in the record's code to run it here (:class:`record_models.Float64Eager`, an ``ast.NodeTransformer``):
its deliberate low-precision casts are removed on purpose -- ``torch.bfloat16`` and ``torch.float32`` become
``torch.float64``, ``.bfloat16()`` and ``.float()`` become ``.double()`` -- so that the comparison sees the
function, not bf16 rounding (the numerics are tested elsewhere); ``device="cuda"`` becomes the CPU; and the
partial key offset's ``k[:, 1:, ...] = k[:, :-1, ...]`` reads a clone of its right-hand side, because eager
PyTorch copies overlapping memory forward in place (every row would get row 0) while torch.compile, under
which the record always runs, reads the source before writing. Stand-ins (:func:`record_namespace`):
FA3's ``flash_attn_varlen_func`` (:func:`record_models.flash_attn_varlen_func`, exact softmax attention), the
fused ReLU² kernel (:func:`relu_sqrd_mlp`), the prefix table (unused in eval), ``args``, ``dist``,
``os.environ`` with DISABLE_FP8.

Mapping notes (record #88 -> ours): the record's RoPE tables are indexed by the position in the packed
sequence, ours by the position in the document (the same attention: RoPE depends on q/k position
differences only, and the key offset shifts the unrotated dims); its paired layers' flat reshape pairs heads
p and p + 3, which is our ``paired_head_layout: split``, so the q/k/v/o rows map one to one (no permutation);
ours starts from float32-rounded rotary frequencies and is given the record's float64 ones (the schedule
state, :meth:`GPT.restore_schedule_state`); after that our YaRN (:meth:`GPT.set_window_blocks`) must agree
with the record's ``Yarn.apply`` by itself. The bigram sign table is a buffer drawn at random in both (ours
from a fixed seed, the record's from its RNG): ours is given the record's. Our bigram hash is checked
against the record's ``get_bigram_hash``, which the record's forward takes precomputed.

One difference found: the record's RoPE turns each rotated pair by -θ, ours by +θ. That is a
reparametrization, not a different model family -- the record with q/k weights Wq, Wk is ours with S·Wq, S·Wk,
S the sign flip of the second dim of every rotated pair (:func:`rope_row_signs`), which the map applies to the
q and k weights (and their gradients); init, Muon, Adam and weight decay are all symmetric under S, so the
training distributions are the same -- but with the same weights (a record checkpoint, an identical init) the
two compute different functions (loss 12.32 vs 12.24 here without S).
:func:`test_our_rope_turns_the_other_way_than_the_records` pins this; when ours is turned the record's way,
it fails there and ``ROPE_TURNS_OPPOSITE`` goes to False. With S, the losses agree to ~1e-15 and every
gradient to ~3e-12 relative (float64).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from speedrun.model.gpt import GPT
from speedrun.model.rotary import apply_rotary, rotary_table

from record_code import SHARED_CODE
from record_models import (HEAD_DIM, HEADS, MODEL_DIM, ROPE_TURNS_OPPOSITE, Link, ModelParity, bank_links,
                           embedding_links, executed_record, initialized_record_gpt, record_gpt, relative_error, rope_row_signs, tiny_config,
                           tiny_namespace)

RECORD = SHARED_CODE / "record88" / "train_gpt.py"
RECORD_NAMES = {"norm", "CastedLinearT", "Yarn", "AttnArgs", "CausalSelfAttention", "next_multiple_of_n",
                "ForwardScheduleConfig", "GPT", "get_bigram_hash"}

# the tiny shape (record_models: 6 heads of 16, width 96, 127 bigram rows, 4-token window blocks) and:
BIGRAM_DIM = 24                                                  # the bigram rows cover the 12 gate channels
SEQ_LEN = 96                                                     # T: a multiple of 16 (the record asserts it)
CU_SEQLENS = torch.tensor([0, 20, 55, 83, 96, 96], dtype=torch.int32)     # four documents and a padding slot
MAX_SEQ_LEN = 128                                                # the record's RoPE tables: 256 rows >= T


# ---- the record's code, on the CPU in float64 --------------------------------------------------------------


def relu_sqrd_mlp(x, w1, w2):
    """``FusedLinearReLUSquareFunction.apply(x, c_fc, c_proj)`` of the record's triton_kernels.py without FP8:
    ``relu(x c_fcᵀ)² c_proj``, c_fc and c_proj both (4C, C)."""
    return (torch.relu(x.view(-1, x.size(-1)) @ w1.T).square() @ w2).view(x.shape)


def record_namespace() -> dict:
    """What the record's GPT reads from its module (:func:`record_models.tiny_namespace`: imports, ``args``,
    world size and gradient accumulation, ``dist``, ``os`` with DISABLE_FP8, FA3's stand-in) with the fused
    ReLU² kernel's stand-in and the prefix table (unused in eval)."""
    return tiny_namespace("record88_train_gpt", BIGRAM_DIM, SEQ_LEN, ReLUSqrdMLP=relu_sqrd_mlp,
                          build_prefix_table=lambda vocab_size: torch.full((vocab_size,), -1, dtype=torch.int64))


@pytest.fixture(scope="module")
def record():
    """The record's definitions, executed (skipped where ../shared is absent, as in CI)."""
    return executed_record(RECORD, RECORD_NAMES, record_namespace())


def record_model(record, seed: int = 0) -> nn.Module:
    """The record's GPT in float64, eval mode, every parameter moved off its initialization
    (:func:`record_models.record_gpt`); RoPE tables of 256 rows >= T."""
    return record_gpt(record, max_seq_len=MAX_SEQ_LEN, seed=seed)


# ---- ours -------------------------------------------------------------------------------------------------


def our_config():
    """The record88 preset at the tiny shape, on the CPU paths (reference attention, full cross-entropy)."""
    return tiny_config("record88", bigram_dim=BIGRAM_DIM, rotary_positions=256, fp8_mlp=False, fp8_attention=False,
                       prefix_token_loss=False)


def parameter_links(our_model: GPT) -> list[Link]:
    """The parameter map, record #88 -> ours (C model_dim, V vocabulary, a = the attention index of layer i,
    i - (i > 6), layer 6 having none):

    * ``embed.weight`` -> ``embed.weight``; ``lm_head.weight`` (C, V) -> ``lm_head.weight`` (V, C), transposed;
    * ``qk_bank`` (60 + 4 padding, 2·Dh, C), six head-pair groups per layer, q then k: groups 6a..6a+2 ->
      ``blocks.i.attn.q.weight``, 6a+3..6a+5 -> ``k.weight`` (head-major rows, as ours), the rows of the
      rotated pairs' second dims negated (:func:`rope_row_signs`);
      ``vo_bank`` (20 + 4, C, C): 2a -> ``v.weight``, 2a+1 -> ``o.weight``;
    * ``mlp_bank`` (11 + 1, 2, 4C, C): [i, 0] -> ``blocks.i.mlp.fc.weight``, [i, 1] (c_proj, used as
      ``post @ c_proj``) -> ``proj.weight`` transposed;
    * ``attn_gate_bank`` [a] -> ``blocks.i.attn.gate.weight``; ``ve_gate_bank`` [0..3] -> the VE gates of
      layers 1, 2, 8, 9 (the 5th is unused: layer 10's gate comes from MUDD);
    * ``scalars``: [2i, 2i+1] -> ``blocks.i.attn.sa_lambdas``, [22] -> ``smear.lambda_``, [23] ->
      ``skips.lambda_``; ``smear_gate.weight`` -> ``smear.gate``; ``skip_gate.weight`` -> ``skips.gate``;
    * ``value_embeds`` (5V, C): rows jV..(j+1)V -> ``value_embeds.tables.j.weight`` (layers 1, 2, 8, 9, 10);
    * ``bigram_embed.weight`` -> ``bigram.table``; ``bigram_lambdas`` -> ``bigram.gates``;
      ``post_lambdas``, ``resid_lambdas``, ``x0_lambdas`` -> ``residual.*``; ``xsa_alphas`` [i] ->
      ``blocks.i.attn.xsa_alpha`` (layers 1, 3, 4, 7, 8, 10);
    * ``mudd_w1``, ``mudd_w2``, ``mudd_b2`` [0] -> ``mudd.layer.*`` (14 coefficients), [1] -> ``mudd.final.*``
      (the first 5 of 14 rows); both store b2 divided by the scale 0.1 and multiply by 0.1.
    """
    cfg = our_model.config
    links = embedding_links(cfg) + [Link("skips.gate", "skip_gate.weight", lambda p: p),
                                    Link("bigram.gates", "bigram_lambdas", lambda p: p)]
    links += [Link(f"residual.{name}", name, lambda p: p) for name in ("post_lambdas", "resid_lambdas", "x0_lambdas")]
    for net, m, rows in (("layer", 0, 14), ("final", 1, 5)):
        links += [Link(f"mudd.{net}.w1", "mudd_w1", lambda p, m=m: p[m]),
                  Link(f"mudd.{net}.w2", "mudd_w2", lambda p, m=m, rows=rows: p[m, :rows]),
                  Link(f"mudd.{net}.b2", "mudd_b2", lambda p, m=m, rows=rows: p[m, :rows])]
    return links + bank_links(cfg, gate_bank="attn_gate_bank", xsa_bank="xsa_alphas")


# elements of the record's parameters that no parameter of ours holds, each never read by its forward
UNMAPPED = {"qk_bank": 4 * 2 * HEAD_DIM * MODEL_DIM,           # padding 60 -> 64 groups
            "vo_bank": 4 * MODEL_DIM * MODEL_DIM,              # padding 20 -> 24
            "mlp_bank": 2 * 4 * MODEL_DIM * MODEL_DIM,         # the padding layer 11
            "ve_gate_bank": HEADS * 12,                        # gate 4: layer 10 takes MUDD's
            "scalars": 2,                                      # layer 6's sa lambdas (no attention)
            "xsa_alphas": 5 * HEADS,                           # layers 0, 2, 5, 6, 9
            "mudd_w2": 9 * 64, "mudd_b2": 9}                   # the final mix reads 5 of 14 coefficients


PARITY = ModelParity(our_config, parameter_links, UNMAPPED, SEQ_LEN, CU_SEQLENS)
mapped_model = PARITY.mapped_model            # (theirs) -> (ours, links, unmapped masks); test_record88_optimizer's


def test_record88_eval_loss_and_gradients_match_the_records_own_gpt(record):
    PARITY.assert_match_at_the_first_stage(record, record_model(record))


def test_record88_initialization_is_the_records(record):
    """Ours fresh from its ``__init__`` draws what the record's ``GPT.__init__`` draws, parameter by mapped
    parameter (:meth:`record_models.ModelParity.assert_same_initialization`), the tied embedding included."""
    PARITY.assert_same_initialization(lambda seed: initialized_record_gpt(record, MAX_SEQ_LEN, seed))


def test_after_a_yarn_window_change_they_still_match(record):
    """The record's second window stage: (1, 3) -> (3, 7) blocks, its ``yarn.apply(12, 28)`` on both Yarns
    (TrainingManager.advance_schedule) against our ``set_window_blocks(3, 7)``; then the final validation's
    long window extension without YaRN (apply_final_ws_ext: ws_long 20 blocks)."""
    PARITY.assert_match_after_a_window_change(record, record_model(record, seed=7))


def test_our_rope_turns_the_other_way_than_the_records(record):
    """The record's ``Yarn.rotary`` (non-paired, float64 here) is our :func:`apply_rotary` with sin negated,
    i.e. R(-θ) where ours is R(+θ), and equals ours conjugated by the row signs S of :func:`rope_row_signs`
    (S R(θ) S = R(-θ)), which :func:`parameter_links` applies to q and k."""
    positions = 64
    yarn = record.Yarn(HEAD_DIM, positions)
    frequencies = yarn.angular_freq[:2 * (HEAD_DIM // 4):2]
    cos, sin = rotary_table(frequencies, positions)
    x = torch.randn(positions, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    theirs = yarn.rotary(x[None])[0]
    ours = apply_rotary(x, cos, sin, "half_truncated")
    assert (relative_error(ours, theirs) > 0.1) == ROPE_TURNS_OPPOSITE
    if ROPE_TURNS_OPPOSITE:
        torch.testing.assert_close(apply_rotary(x, cos, -sin, "half_truncated"), theirs, rtol=1e-14, atol=1e-14)
        signs = rope_row_signs(HEADS, HEAD_DIM).view(HEADS, HEAD_DIM)
        torch.testing.assert_close(signs * apply_rotary(signs * x, cos, sin, "half_truncated"), theirs,
                                   rtol=1e-14, atol=1e-14)
    else:
        torch.testing.assert_close(ours, theirs, rtol=1e-14, atol=1e-14)
