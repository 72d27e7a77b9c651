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

What is changed in the record's code to run it here (:class:`Float64Eager`, an ``ast.NodeTransformer``):
its deliberate low-precision casts are removed on purpose -- ``torch.bfloat16`` and ``torch.float32`` become
``torch.float64``, ``.bfloat16()`` and ``.float()`` become ``.double()`` -- so that the comparison sees the
function, not bf16 rounding (the numerics are tested elsewhere); ``device="cuda"`` becomes the CPU; and the
partial key offset's ``k[:, 1:, ...] = k[:, :-1, ...]`` reads a clone of its right-hand side, because eager
PyTorch copies overlapping memory forward in place (every row would get row 0) while torch.compile, under
which the record always runs, reads the source before writing. Stand-ins (:func:`record_namespace`):
FA3's ``flash_attn_varlen_func`` (:func:`flash_attn_varlen_func`, exact softmax attention), the fused ReLU²
kernel (:func:`relu_sqrd_mlp`), the prefix table (unused in eval), ``args``, ``dist``, ``os.environ`` with
DISABLE_FP8.

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

import ast
import dataclasses
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from speedrun.model.bigram import bigram_hash
from speedrun.model.config import PRESETS
from speedrun.model.gpt import GPT
from speedrun.model.rotary import apply_rotary, rotary_table

from record_code import SHARED_CODE, OnTheCpu, record_definitions

RECORD = SHARED_CODE / "record88" / "train_gpt.py"
RECORD_NAMES = {"norm", "CastedLinearT", "Yarn", "AttnArgs", "CausalSelfAttention", "next_multiple_of_n",
                "ForwardScheduleConfig", "GPT", "get_bigram_hash"}

# the tiny shape: the record hard-codes 11 layers, 6 heads, 12-channel gates, MUDD width 64
HEADS, HEAD_DIM = 6, 16
MODEL_DIM = HEADS * HEAD_DIM                                    # 96
VOCAB = 50257                                                    # -> 50304 in both
BIGRAM_VOCAB, BIGRAM_DIM, SIGN_ROWS = 127, 24, 8192              # the bigram rows cover the 12 gate channels
WORLD_SIZE = 8                                                   # the record's 8 GPUs: its banks' padding
BLOCK = 4                                                        # tokens per window block (the record's 128)
SEQ_LEN = 96                                                     # T: a multiple of 16 (the record asserts it)
CU_SEQLENS = torch.tensor([0, 20, 55, 83, 96, 96], dtype=torch.int32)     # four documents and a padding slot
BOS = 50256
ROPE_TURNS_OPPOSITE = True                                       # see the module docstring


# ---- the record's code, on the CPU in float64 --------------------------------------------------------------


class Float64Eager(OnTheCpu):
    """Rewrites the record's definitions to run eagerly on the CPU in float64 (module docstring): bf16/fp32
    dtypes and casts -> float64, ``device="cuda"`` -> cpu, ``pin_memory`` off, and the right-hand side of a
    subscript assignment reading the tensor it writes (the key offset) cloned first. ``overlapping`` counts
    the assignments so rewritten."""

    def __init__(self):
        super().__init__()
        self.overlapping = 0

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "torch" and node.attr in ("bfloat16", "float32"):
            return ast.copy_location(ast.Attribute(ast.Name("torch", ast.Load()), "float64", ast.Load()), node)
        return node

    def visit_keyword(self, node: ast.keyword) -> ast.keyword:
        self.generic_visit(node)                                    # dtype=torch.float32 and the like
        return super().visit_keyword(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("bfloat16", "float") and not node.args + node.keywords:
            func.attr = "double"
        return node

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        self.generic_visit(node)
        target, value = node.targets[0], node.value
        if (isinstance(target, ast.Subscript) and isinstance(value, ast.Subscript)
                and isinstance(target.value, ast.Name) and isinstance(value.value, ast.Name)
                and target.value.id == value.value.id):
            node.value = ast.Call(ast.Attribute(value, "clone", ast.Load()), [], [])
            self.overlapping += 1
        return node


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                           softmax_scale=None, window_size=(-1, -1)):
    """FA3's varlen attention, exactly, on (T, H, D): softmax(scale · q kᵀ) v within each document of
    ``cu_seqlens``, causal, a query at t seeing keys t-W..t (W + 1 keys) for ``window_size`` (W, 0) (all its
    document's earlier keys for W = -1). The max_seqlen arguments only size FA3's launch: unused."""
    assert causal and torch.equal(cu_seqlens_q, cu_seqlens_k) and window_size[1] == 0
    tokens = q.size(0)
    pos = torch.arange(tokens)
    doc = torch.bucketize(pos, cu_seqlens_q[1:].long(), right=True)
    offset = pos[:, None] - pos[None, :]
    mask = (doc[:, None] == doc[None, :]) & (offset >= 0)
    if window_size[0] >= 0:
        mask &= offset <= window_size[0]
    scores = torch.einsum("thd,shd->hts", q, k) * softmax_scale
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return torch.einsum("hts,shd->thd", probs, v).contiguous()                      # FA3's output is contiguous


def relu_sqrd_mlp(x, w1, w2):
    """``FusedLinearReLUSquareFunction.apply(x, c_fc, c_proj)`` of the record's triton_kernels.py without FP8:
    ``relu(x c_fcᵀ)² c_proj``, c_fc and c_proj both (4C, C)."""
    return (torch.relu(x.view(-1, x.size(-1)) @ w1.T).square() @ w2).view(x.shape)


def record_namespace() -> dict:
    """What the record's GPT reads from its module: imports, ``args`` (the Hyperparameters fields it uses),
    world size and gradient accumulation, ``dist``, ``os`` (DISABLE_FP8 set), and the stand-ins."""
    args = SimpleNamespace(bigram_vocab_size=BIGRAM_VOCAB, bigram_dim=BIGRAM_DIM, bigram_sign_table_rows=SIGN_ROWS,
                           val_batch_size=SEQ_LEN * WORLD_SIZE)
    return {"__name__": "record88_train_gpt", "torch": torch, "nn": nn, "F": F, "Tensor": torch.Tensor,
            "math": math, "dataclass": dataclass, "os": SimpleNamespace(environ={"DISABLE_FP8": "1"}),
            "dist": SimpleNamespace(get_world_size=lambda: WORLD_SIZE), "args": args, "world_size": WORLD_SIZE,
            "grad_accum_steps": 8 // WORLD_SIZE, "grad_scale": 1.0, "device": torch.device("cpu"),
            "flash_attn_interface": SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func),
            "ReLUSqrdMLP": relu_sqrd_mlp,
            "build_prefix_table": lambda vocab_size: torch.full((vocab_size,), -1, dtype=torch.int64)}


@pytest.fixture(scope="module")
def record():
    """The record's definitions, executed (skipped where ../shared is absent, as in CI)."""
    if not RECORD.exists():
        pytest.skip(f"{RECORD} is not here")
    transformer = Float64Eager()
    namespace = record_definitions(RECORD, RECORD_NAMES, record_namespace(), transformer=transformer)
    assert transformer.overlapping == 1                                     # the key offset, and nothing else
    return SimpleNamespace(**namespace)


def record_model(record, seed: int = 0) -> nn.Module:
    """The record's GPT in float64, eval mode, every parameter moved off its initialization (zero inits
    included, so that a transposed or misplaced zero-initialized weight cannot hide)."""
    torch.manual_seed(seed)
    model = record.GPT(vocab_size=VOCAB, num_layers=11, num_heads=HEADS, head_dim=HEAD_DIM, model_dim=MODEL_DIM,
                       max_seq_len=128).double().eval()                   # RoPE tables of 256 rows >= T
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model


# ---- ours -------------------------------------------------------------------------------------------------


def our_config():
    """The record88 preset at the tiny shape, on the CPU paths (reference attention, full cross-entropy)."""
    return dataclasses.replace(
        PRESETS["record88"], vocab_size=50304, model_dim=MODEL_DIM, n_head=HEADS, head_dim=HEAD_DIM,
        bigram_vocab_size=BIGRAM_VOCAB, bigram_dim=BIGRAM_DIM, window_block_size=BLOCK, rotary_positions=256,
        attention_backend="reference", cross_entropy="full", rotary_kernel="torch", mlp_kernel="torch",
        fp8_head=False, fp8_mlp=False, fp8_attention=False, prefix_token_loss=False)


@dataclass(frozen=True)
class Link:
    """Our parameter ``ours`` holds ``signs · view(record parameter theirs)``: ``view`` a view of the same shape,
    ``signs`` None or ±1 per row (:func:`rope_row_signs`)."""

    ours: str
    theirs: str
    view: Callable[[torch.Tensor], torch.Tensor]
    signs: torch.Tensor | None = None

    def __call__(self, record_tensor: torch.Tensor) -> torch.Tensor:
        """The record's parameter (or its gradient) as ours."""
        view = self.view(record_tensor)
        return view if self.signs is None else self.signs[:, None] * view


def rope_row_signs(n_head: int, head_dim: int) -> torch.Tensor:
    """(H·Dh,) float64: -1 on the second dim of every rotated pair (dims 2j+1 < Dh/2 of each head), else 1.

    The record's ``Yarn.rotary`` turns each pair (x[2j], x[2j+1]) by -θ ([[cos, sin], [-sin, cos]], its
    ``factor2[..., 1::2] *= -1``), ours (:func:`speedrun.model.rotary.apply_rotary`) by +θ. With S this sign
    flip, R(-θ) = S R(θ) S and QK-norm commutes with S, so the record's attention with weights Wq, Wk is ours
    with S·Wq, S·Wk: the same function up to this reparametrization of the q/k rows
    (:func:`test_our_rope_turns_the_other_way_than_the_records`)."""
    signs = torch.ones(head_dim, dtype=torch.float64)
    signs[1:head_dim // 2:2] = -1
    return signs.repeat(n_head)


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
    C, V = cfg.model_dim, cfg.vocab_size
    flip = rope_row_signs(cfg.n_head, cfg.head_dim) if ROPE_TURNS_OPPOSITE else None
    links = [Link("embed.weight", "embed.weight", lambda p: p),
             Link("lm_head.weight", "lm_head.weight", lambda p: p.T),
             Link("smear.lambda_", "scalars", lambda p: p[22:23]),
             Link("skips.lambda_", "scalars", lambda p: p[23:24]),
             Link("smear.gate", "smear_gate.weight", lambda p: p),
             Link("skips.gate", "skip_gate.weight", lambda p: p),
             Link("bigram.table", "bigram_embed.weight", lambda p: p),
             Link("bigram.gates", "bigram_lambdas", lambda p: p)]
    links += [Link(f"residual.{name}", name, lambda p: p) for name in ("post_lambdas", "resid_lambdas", "x0_lambdas")]
    for j in range(5):
        links.append(Link(f"value_embeds.tables.{j}.weight", "value_embeds", lambda p, j=j: p[j * V:(j + 1) * V]))
    for net, m, rows in (("layer", 0, 14), ("final", 1, 5)):
        links += [Link(f"mudd.{net}.w1", "mudd_w1", lambda p, m=m: p[m]),
                  Link(f"mudd.{net}.w2", "mudd_w2", lambda p, m=m, rows=rows: p[m, :rows]),
                  Link(f"mudd.{net}.b2", "mudd_b2", lambda p, m=m, rows=rows: p[m, :rows])]
    ve_gate_layers = [i for i in cfg.value_embed_layers if i != cfg.mudd_layer]               # 1, 2, 8, 9
    for i in range(cfg.n_layer):
        block = f"blocks.{i}"
        links += [Link(f"{block}.mlp.fc.weight", "mlp_bank", lambda p, i=i: p[i, 0]),
                  Link(f"{block}.mlp.proj.weight", "mlp_bank", lambda p, i=i: p[i, 1].T)]
        if i in cfg.attention_free_layers:
            continue
        a = i - (i > 6)
        links += [Link(f"{block}.attn.q.weight", "qk_bank", lambda p, a=a: p[6 * a:6 * a + 3].reshape(C, C), flip),
                  Link(f"{block}.attn.k.weight", "qk_bank", lambda p, a=a: p[6 * a + 3:6 * a + 6].reshape(C, C), flip),
                  Link(f"{block}.attn.v.weight", "vo_bank", lambda p, a=a: p[2 * a]),
                  Link(f"{block}.attn.o.weight", "vo_bank", lambda p, a=a: p[2 * a + 1]),
                  Link(f"{block}.attn.gate.weight", "attn_gate_bank", lambda p, a=a: p[a]),
                  Link(f"{block}.attn.sa_lambdas", "scalars", lambda p, i=i: p[2 * i:2 * i + 2])]
        if i in ve_gate_layers:
            g = ve_gate_layers.index(i)
            links.append(Link(f"{block}.attn.ve_gate.weight", "ve_gate_bank", lambda p, g=g: p[g]))
        if i in cfg.xsa_layers:
            links.append(Link(f"{block}.attn.xsa_alpha", "xsa_alphas", lambda p, i=i: p[i]))
    return links


# elements of the record's parameters that no parameter of ours holds, each never read by its forward
UNMAPPED = {"qk_bank": 4 * 2 * HEAD_DIM * MODEL_DIM,           # padding 60 -> 64 groups
            "vo_bank": 4 * MODEL_DIM * MODEL_DIM,              # padding 20 -> 24
            "mlp_bank": 2 * 4 * MODEL_DIM * MODEL_DIM,         # the padding layer 11
            "ve_gate_bank": HEADS * 12,                        # gate 4: layer 10 takes MUDD's
            "scalars": 2,                                      # layer 6's sa lambdas (no attention)
            "xsa_alphas": 5 * HEADS,                           # layers 0, 2, 5, 6, 9
            "mudd_w2": 9 * 64, "mudd_b2": 9}                   # the final mix reads 5 of 14 coefficients


def check_coverage(links: list[Link], theirs: nn.Module, ours: GPT) -> dict[str, torch.Tensor]:
    """Assert the map is complete: each of our parameters in exactly one link, of its full shape; each
    record element in at most one; the record's unmapped elements exactly :data:`UNMAPPED`. Returns per
    record parameter the bool mask of its unmapped elements."""
    our_params = dict(ours.named_parameters())
    their_params = dict(theirs.named_parameters())
    names = [link.ours for link in links]
    assert sorted(names) == sorted(our_params), "our parameters mapped not exactly once"
    counts = {name: torch.zeros(p.shape, dtype=torch.int64) for name, p in their_params.items()}
    for link in links:
        view = link.view(counts[link.theirs])
        assert view.shape == our_params[link.ours].shape, link
        view.add_(1)
    assert max(int(c.max()) for c in counts.values()) == 1, "a record element mapped twice"
    unmapped = {name: int((c == 0).sum()) for name, c in counts.items() if (c == 0).any()}
    assert unmapped == UNMAPPED
    assert sum(p.numel() for p in our_params.values()) + sum(UNMAPPED.values()) == sum(
        p.numel() for p in their_params.values())
    return {name: c == 0 for name, c in counts.items()}


def mapped_model(theirs: nn.Module) -> tuple[GPT, list[Link], dict[str, torch.Tensor]]:
    """Our tiny record88 in float64 and eval mode with the record model's weights, sign table and rotary
    frequencies; the links and the record's unmapped-element masks (:func:`check_coverage`)."""
    ours = GPT(our_config()).double().eval()
    links = parameter_links(ours)
    unmapped = check_coverage(links, theirs, ours)
    our_params, their_params = dict(ours.named_parameters()), dict(theirs.named_parameters())
    with torch.no_grad():
        for link in links:
            our_params[link.ours].copy_(link(their_params[link.theirs]))
        ours.bigram.signs = theirs.bigram_sign_table.clone()
        frequencies = theirs.yarn.angular_freq[:2 * (HEAD_DIM // 4):2]            # each repeated twice, then 0s
        torch.testing.assert_close(frequencies, ours.rotary_frequencies, rtol=1e-7, atol=0)   # fp32 rounding
        ours.restore_schedule_state((ours.window_blocks, frequencies.clone(), theirs.yarn.attn_scale))
    return ours, links, unmapped


# ---- the batch and the comparison -------------------------------------------------------------------------


def batch(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs (T,) int32, targets (T,) int64): random GPT-2 tokens, BOS at every document start."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, VOCAB - 1, (SEQ_LEN,), generator=generator, dtype=torch.int32)
    inputs[CU_SEQLENS[:-2].long()] = BOS
    targets = torch.randint(0, VOCAB, (SEQ_LEN,), generator=generator)
    return inputs, targets


def schedule(record, short_blocks: int, long_blocks: int):
    """The record's ForwardScheduleConfig for windows of these many blocks (its ws_* in tokens)."""
    return record.ForwardScheduleConfig(mtp_weights=torch.ones(1, dtype=torch.float64),
                                        prefix_weight=torch.zeros(1, dtype=torch.float64),
                                        ws_short=short_blocks * BLOCK, ws_long=long_blocks * BLOCK,
                                        train_max_seq_len=SEQ_LEN)


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |ours - theirs| / max |theirs| (0 when both are 0)."""
    scale = theirs.abs().max().item()
    diff = (ours - theirs).abs().max().item()
    return diff / scale if scale else diff


def compare(record, theirs: nn.Module, ours: GPT, links: list[Link], unmapped: dict[str, torch.Tensor],
            windows: tuple[int, int]) -> dict[str, float]:
    """Eval losses and every parameter's gradient of both models on :func:`batch`, compared; returns the
    relative errors (key ``loss`` and our parameter names)."""
    inputs, targets = batch()
    bigram_inputs = record.get_bigram_hash(inputs)
    assert torch.equal(bigram_inputs.long(), bigram_hash(inputs, BIGRAM_VOCAB))
    theirs.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    their_loss = theirs(inputs, targets, CU_SEQLENS, bigram_inputs, schedule(record, *windows)).mean()
    our_loss = ours(inputs, targets, CU_SEQLENS)
    their_loss.backward()
    our_loss.backward()
    errors = {"loss": relative_error(our_loss.detach(), their_loss.detach())}
    our_params, their_params = dict(ours.named_parameters()), dict(theirs.named_parameters())
    for link in links:
        their_grad = link(their_params[link.theirs].grad)
        our_grad = our_params[link.ours].grad
        assert our_grad is not None, link.ours
        errors[link.ours] = relative_error(our_grad, their_grad)
    for name, mask in unmapped.items():
        grad = their_params[name].grad
        assert grad is None or not grad[mask].any(), f"the record reads unmapped elements of {name}"
    return errors


def assert_small(errors: dict[str, float]) -> None:
    assert errors["loss"] < 1e-12, errors["loss"]
    worst = {name: e for name, e in errors.items() if e > 1e-9}
    assert not worst, worst


def test_record88_eval_loss_and_gradients_match_the_records_own_gpt(record):
    theirs = record_model(record)
    ours, links, unmapped = mapped_model(theirs)
    assert ours.window_blocks == (1, 3)
    errors = compare(record, theirs, ours, links, unmapped, windows=(1, 3))
    assert_small(errors)


def test_after_a_yarn_window_change_they_still_match(record):
    """The record's second window stage: (1, 3) -> (3, 7) blocks, its ``yarn.apply(12, 28)`` on both Yarns
    (TrainingManager.advance_schedule) against our ``set_window_blocks(3, 7)``; then the final validation's
    long window extension without YaRN (apply_final_ws_ext: ws_long 20 blocks)."""
    theirs = record_model(record, seed=7)
    ours, links, unmapped = mapped_model(theirs)
    with torch.no_grad():
        for yarn in (theirs.yarn, theirs.yarn_paired_head):
            yarn.apply(3 * BLOCK, 7 * BLOCK)
    ours.set_window_blocks(3, 7)
    torch.testing.assert_close(ours.rotary_frequencies, theirs.yarn.angular_freq[:2 * (HEAD_DIM // 4):2],
                               rtol=1e-14, atol=0)
    assert ours.attention_scale == pytest.approx(theirs.yarn.attn_scale, rel=1e-14)
    assert_small(compare(record, theirs, ours, links, unmapped, windows=(3, 7)))
    ours.set_window_blocks(3, 20, rescale=False)
    assert_small(compare(record, theirs, ours, links, unmapped, windows=(3, 20)))


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
