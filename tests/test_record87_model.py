"""Our ``record87`` GPT against record #87's own ``GPT`` class (2026-06-11 RecursiveFromBest, the seed record),
executed from ../shared/reference-code/record87/train_gpt.py at test time, at a tiny width in float64 on the CPU:
the proof of tests/test_record88_model.py, for #87.

Both models hold the same weights (the record's, moved off their initialization, copied into ours through
#88's parameter map, :func:`test_record88_model.parameter_links`: #87's parameters are #88's, bank for bank)
and read the same packed batch of four documents; the tests assert that their validation-mode (``eval()``)
losses agree to 1e-12 relative and every parameter's gradient to 1e-9 relative (of its largest element), at
the first window stage (1, 3), after #87's YaRN window change to (3, 7) (its ``TrainingManager.
advance_schedule``: ``Yarn.apply`` on both Yarns) and with the final validation's long window of 20 blocks
(``apply_final_ws_ext``, no YaRN). Every parameter of ours is mapped from exactly one slice of a record
parameter; the record's elements left unmapped (#88's :data:`test_record88_model.UNMAPPED`) are counted and
shown to get no gradient. Measured: losses ~3e-16 relative, the worst gradient ~6e-13 (float64); no difference
found. (The test is sensitive to #87's own changes: ours with #88's paired layers 0, 2, 5, 9 misses the loss by
3e-3 relative and gradients by up to 6x.)

#87's model against #88's (the two scripts' GPT, CausalSelfAttention, Yarn, forward and init, diffed):
  * paired heads on layers 0 and 5 only (#88: 0, 2, 5, 9) -- ours: ``paired_head_layers (0, 5)``;
  * in training, q/k/v and o through its ``FP8LinearFunction`` (e4m3 operands at scale 1, the weights
    pre-multiplied by the sa lambdas; backward bf16), in evaluation bf16 ``F.linear`` as #88 -- ours:
    ``fp8_attention`` with ``fp8_attention_scales "unit"`` (kept on here: eval must ignore it; the product
    itself, the record's function against ours, bit for bit: :func:`test_the_training_fp8_qkvo_product_is_
    the_records_bit_for_bit`);
  * no FP8 MLP up-projection (#88's ``quantize_mlp_fp8``) -- ours: ``fp8_mlp`` false;
  * no prefix-token loss (no ``build_prefix_table``, no ``prefix_weight`` in ForwardScheduleConfig nor in
    the fused cross-entropy) -- ours: ``prefix_token_loss`` false;
  * its fused ReLU² kernel saves only post = relu(pre)² and rebuilds relu(pre) as sqrt(post) in the backward
    (:class:`ReluSquarePostOnly`; the same function);
  * the rest is #88's line for line: Yarn, the key offset, XSA hard-coded on 1, 3, 4, 7, 8, 10 (so #87's
    unpaired layers 2 and 9 have none), gates, value embeddings, bigram, MUDD, the sublayer residual form.
  Its schedule (stage durations 0.36/0.32/0.32, never untied) and optimizer (Langevin noise, C-Optim, the lazy
  final embed.grad.T add) are training settings, outside this test.

What is changed in the record's code to run it here: :class:`record_models.Float64Eager` (bf16/fp32 ->
float64, cuda -> cpu, the key offset's overlapping in-place copy reading a clone, as torch.compile does).
Stand-ins (:func:`record_namespace`): FA3's ``flash_attn_varlen_func`` (:func:`record_models.flash_attn_varlen_func`,
exact softmax attention), #87's ``FusedLinearReLUSquareFunction`` (:class:`ReluSquarePostOnly`), ``args`` (its
Hyperparameters fields the GPT reads), ``dist``, ``os.environ`` with DISABLE_FP8, and the training-only FP8
linear and fused cross-entropy (raising: the eval forward must not reach them).

Mapping notes as for #88 (test_record88_model's docstring): the record's RoPE turns by -θ, ours by +θ, so the
q/k rows of the rotated pairs' second dims are negated (``rope_row_signs``; :func:`test_records_87_and_88_share_
yarn_and_attention` shows #87's Yarn is #88's code, so #88's test of that sign applies); its paired layers' flat
reshape pairs heads p and p + 3 (``paired_head_layout: split``); ours is given the record's float64 rotary
frequencies and bigram sign table.
"""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from record_code import SHARED_CODE, record_definitions
from record_models import MODEL_DIM, ModelParity, executed_record, initialized_record_gpt, tiny_config, tiny_namespace
from test_record88_model import (BIGRAM_DIM, CU_SEQLENS, MAX_SEQ_LEN, SEQ_LEN, UNMAPPED, parameter_links,
                                 record_model)

RECORD = SHARED_CODE / "record87" / "train_gpt.py"
RECORD88 = SHARED_CODE / "record88" / "train_gpt.py"
RECORD_NAMES = {"norm", "CastedLinearT", "Yarn", "AttnArgs", "CausalSelfAttention", "next_multiple_of_n",
                "ForwardScheduleConfig", "GPT", "get_bigram_hash"}


# ---- the record's code, on the CPU in float64 --------------------------------------------------------------


class ReluSquarePostOnly(torch.autograd.Function):
    """#87's ``FusedLinearReLUSquareFunction`` (its triton_kernels.py) without Triton: forward post =
    relu(x W1ᵀ)², out = post W2 (W1, W2 both (4C, C)), saving only post; backward dW2 = postᵀ g,
    dpre = 2 (g W2ᵀ) · sqrt(post) (relu(pre) rebuilt from post), dW1 = dpreᵀ x, dx = dpre W1."""

    @staticmethod
    def forward(ctx, x, w1, w2):
        post = torch.relu(x.reshape(-1, x.size(-1)) @ w1.T).square()
        ctx.save_for_backward(x, w1, w2, post)
        return (post @ w2).view(x.shape)

    @staticmethod
    def backward(ctx, grad_output):
        x, w1, w2, post = ctx.saved_tensors
        g = grad_output.reshape(-1, grad_output.size(-1))
        dpre = 2 * (g @ w2.T) * post.sqrt()
        return (dpre @ w1).view(x.shape), dpre.T @ x.reshape(-1, x.size(-1)), post.T @ g


def training_only(*_args, **_kwargs):
    """The record's training-only kernels (FP8 q/k/v/o linear, fused cross-entropy): not in eval."""
    raise AssertionError("the record's eval forward reached a training-only kernel")


def record_namespace() -> dict:
    """What #87's GPT reads from its module (:func:`record_models.tiny_namespace`: imports, ``args`` (its
    Hyperparameters fields bigram_vocab_size, bigram_dim, bigram_sign_table_rows, val_batch_size at the tiny
    shape), world size and gradient accumulation, ``dist``, ``os`` (DISABLE_FP8 set), FA3's stand-in), and its
    own stand-ins: the ReLU² kernel, the training-only FP8 linear and fused cross-entropy."""
    return tiny_namespace("record87_train_gpt", BIGRAM_DIM, SEQ_LEN, ReLUSqrdMLP=ReluSquarePostOnly.apply,
                          fp8_linear_fn=training_only, FusedSoftcappedCrossEntropy=SimpleNamespace(apply=training_only))


@pytest.fixture(scope="module")
def record():
    """#87's definitions, executed (skipped where ../shared is absent, as in CI)."""
    return executed_record(RECORD, RECORD_NAMES, record_namespace())


# ---- ours and the map ---------------------------------------------------------------------------------------


def our_config():
    """The record87 preset at the tiny shape, on the CPU paths (reference attention, full cross-entropy); its
    FP8 attention switches are kept (training only: eval must not see them). Its paired heads are #87's."""
    config = tiny_config("record87", bigram_dim=BIGRAM_DIM, rotary_positions=256)
    assert config.paired_head_layers == (0, 5) and config.paired_head_layout == "split"
    return config


# #88's parameter map (test_record88_model.parameter_links) and its unmapped elements, each never read by #87's
# forward either: #87's parameters are #88's, bank for bank (xsa_alphas of layers 0, 2, 5, 6, 9 unmapped: 2 and 9
# are unpaired in #87); #88's batch (SEQ_LEN, CU_SEQLENS); #87's ForwardScheduleConfig has no prefix weight
PARITY = ModelParity(our_config, parameter_links, UNMAPPED, SEQ_LEN, CU_SEQLENS, prefix_weight=False)


def test_record87_eval_loss_and_gradients_match_the_records_own_gpt(record):
    theirs = record_model(record)
    assert theirs.paired_head_layers == [0, 5]
    PARITY.assert_match_at_the_first_stage(record, theirs)


def test_record87_initialization_is_the_records(record):
    """Ours fresh from its ``__init__`` draws what #87's ``GPT.__init__`` draws, parameter by mapped parameter
    (:meth:`record_models.ModelParity.assert_same_initialization`)."""
    PARITY.assert_same_initialization(lambda seed: initialized_record_gpt(record, MAX_SEQ_LEN, seed))


def test_after_a_yarn_window_change_they_still_match(record):
    """#87's second stage: (1, 3) -> (3, 7) blocks, its ``yarn.apply(12, 28)`` on both Yarns
    (TrainingManager.advance_schedule) against our ``set_window_blocks(3, 7)``; then the final validation's
    long window without YaRN (apply_final_ws_ext: ws_post_yarn_ext 20 blocks)."""
    PARITY.assert_match_after_a_window_change(record, record_model(record, seed=7))


def test_records_87_and_88_share_yarn_and_attention():
    """#87's Yarn is #88's code, and its CausalSelfAttention differs only in the training-only FP8 branches
    (``if self.training: ... fp8_linear_fn ... else: <#88's line>``): #88's RoPE sign finding holds for #87."""
    if not (RECORD.exists() and RECORD88.exists()):
        pytest.skip("../shared is not here")

    def classes(script):
        tree = ast.parse(script.read_text(encoding="utf-8"))
        return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    classes87, classes88 = classes(RECORD), classes(RECORD88)
    assert ast.dump(classes87["Yarn"]) == ast.dump(classes88["Yarn"])

    class EvalBranch(ast.NodeTransformer):
        """``if self.training: A else: B`` -> B."""

        def visit_If(self, node):
            self.generic_visit(node)
            if ast.unparse(node.test) == "self.training" and node.orelse:
                return node.orelse
            return node

    attention87 = EvalBranch().visit(classes87["CausalSelfAttention"])
    assert ast.dump(attention87) == ast.dump(classes88["CausalSelfAttention"])


def test_the_training_fp8_qkvo_product_is_the_records_bit_for_bit():
    """#87's one model difference this file's eval tests cannot see: its training-mode ``FP8LinearFunction``
    (x and the λ-scaled bf16 weight cast to e4m3 at scale 1, ``_scaled_mm`` to bf16; backward in bf16),
    executed from the script as it is, against ours (``fp8_linear`` with ``UNIT_SCALES``, what
    ``fp8_attention_scales "unit"`` runs): forward and both gradients equal bit for bit on the CPU."""
    if not RECORD.exists():
        pytest.skip(f"{RECORD} is not here")
    from speedrun.model.fp8 import UNIT_SCALES, fp8_linear
    fp8_linear_fn = record_definitions(RECORD, {"FP8LinearFunction", "fp8_linear_fn"}, {"torch": torch})[
        "fp8_linear_fn"]
    generator = torch.Generator().manual_seed(0)
    x = F.rms_norm(torch.randn(64, MODEL_DIM, generator=generator), (MODEL_DIM,)).bfloat16().requires_grad_()
    w = (0.05 * torch.randn(3 * MODEL_DIM, MODEL_DIM, generator=generator)).bfloat16().requires_grad_()
    try:          # the forward's _scaled_mm as torch emulates it, which ours computes on a CPU (fp8.scaled_mm)
        with torch.backends.mkldnn.flags(enabled=False):
            theirs = fp8_linear_fn(x, w)
    except (RuntimeError, NotImplementedError) as error:                # a torch without CPU float8 products
        pytest.skip(f"torch._scaled_mm on the CPU: {error}")
    ours = fp8_linear(x, w, UNIT_SCALES)
    assert ours.dtype == theirs.dtype == torch.bfloat16 and torch.equal(ours, theirs)
    grad_out = torch.randn(theirs.shape, generator=generator).bfloat16()
    for a, b in zip(torch.autograd.grad(theirs, (x, w), grad_out), torch.autograd.grad(ours, (x, w), grad_out)):
        assert a.dtype == b.dtype and torch.equal(a, b)
