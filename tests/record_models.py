"""The machinery of the record-model tests (tests/test_record88_model.py, test_record87_model.py,
test_head_model.py): a record's own ``GPT`` class, executed from ../shared/reference-code/<record>/train_gpt.py
(:mod:`record_code`) in float64 on the CPU at a tiny width, against our preset holding the same weights.

What a record's test keeps for itself: its script and the names it executes, its namespace (``args`` and the
stand-ins its GPT calls), our config, the parameter map (a list of :class:`Link`) with the record's unmapped
elements, the batch's length and documents, and its ForwardScheduleConfig's fields; :class:`ModelParity` bundles
what differs and does the rest (coverage of the map, our mapped model, the batch, the comparison of losses and
gradients, the YaRN window change). Nothing here reads ../shared at import: only :func:`executed_record`, which
skips where the script is absent (as in CI).
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from speedrun.model.bigram import bigram_hash
from speedrun.model.config import PRESETS, GPTConfig
from speedrun.model.gpt import GPT

from record_code import OnTheCpu, record_definitions

# the tiny shape: the records hard-code 11 layers, 6 heads, 12-channel gates, MUDD width 64
HEADS, HEAD_DIM = 6, 16
MODEL_DIM = HEADS * HEAD_DIM                                    # 96
VOCAB = 50257                                                    # -> 50304 in both
BIGRAM_VOCAB, SIGN_ROWS = 127, 8192                              # bigram table rows, sign table rows
WORLD_SIZE = 8                                                   # the records' 8 GPUs: their banks' padding
BLOCK = 4                                                        # tokens per window block (the records' 128)
BOS = 50256
# the records' RoPE turns each rotated pair by -θ, ours by +θ (test_record88_model's docstring); pinned by
# test_record88_model.test_our_rope_turns_the_other_way_than_the_records, False once ours turns the records' way
ROPE_TURNS_OPPOSITE = True


# ---- a record's code, on the CPU in float64 ----------------------------------------------------------------


class Float64Eager(OnTheCpu):
    """Rewrites the record's definitions to run eagerly on the CPU in float64 (test_record88_model's docstring):
    bf16/fp32 dtypes and casts -> float64, ``device="cuda"`` -> cpu, ``pin_memory`` off, and the right-hand side
    of a subscript assignment reading the tensor it writes (the key offset) cloned first. ``overlapping`` counts
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


def tiny_namespace(module_name: str, bigram_dim: int, seq_len: int, **stand_ins) -> dict:
    """What a record's GPT reads from its module at the tiny shape: imports, ``args`` (the Hyperparameters
    fields its GPT uses: bigram_vocab_size, bigram_dim, bigram_sign_table_rows, val_batch_size = ``seq_len``
    per GPU), world size and gradient accumulation, ``dist``, ``os`` (DISABLE_FP8 set), FA3's stand-in
    (:func:`flash_attn_varlen_func`); then ``stand_ins`` (the record's kernels and the like), which may replace
    any of these."""
    args = SimpleNamespace(bigram_vocab_size=BIGRAM_VOCAB, bigram_dim=bigram_dim, bigram_sign_table_rows=SIGN_ROWS,
                           val_batch_size=seq_len * WORLD_SIZE)
    namespace = {"__name__": module_name, "torch": torch, "nn": nn, "F": F, "Tensor": torch.Tensor,
                 "math": math, "dataclass": dataclass, "os": SimpleNamespace(environ={"DISABLE_FP8": "1"}),
                 "dist": SimpleNamespace(get_world_size=lambda: WORLD_SIZE), "args": args, "world_size": WORLD_SIZE,
                 "grad_accum_steps": 8 // WORLD_SIZE, "grad_scale": 1.0, "device": torch.device("cpu"),
                 "flash_attn_interface": SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func)}
    namespace.update(stand_ins)
    return namespace


def executed_record(script: Path, names: set[str], namespace: dict) -> SimpleNamespace:
    """The record's definitions ``names`` of ``script``, rewritten by :class:`Float64Eager` (which must find the
    key offset's overlapping copy and nothing else) and executed in ``namespace``; skips the test where the
    script is absent (../shared is not here, as in CI)."""
    if not script.exists():
        pytest.skip(f"{script} is not here")
    transformer = Float64Eager()
    namespace = record_definitions(script, names, namespace, transformer=transformer)
    assert transformer.overlapping == 1                                     # the key offset, and nothing else
    return SimpleNamespace(**namespace)


def initialized_record_gpt(record, max_seq_len: int, seed: int = 0) -> nn.Module:
    """The record's GPT at the tiny shape (11 layers) in float64 and eval mode, as its own ``__init__`` leaves
    it (torch's global RNG seeded with ``seed``); ``max_seq_len`` sizes its RoPE tables (2 · max_seq_len rows,
    at least T)."""
    torch.manual_seed(seed)
    return record.GPT(vocab_size=VOCAB, num_layers=11, num_heads=HEADS, head_dim=HEAD_DIM, model_dim=MODEL_DIM,
                      max_seq_len=max_seq_len).double().eval()


def record_gpt(record, max_seq_len: int, seed: int = 0) -> nn.Module:
    """:func:`initialized_record_gpt` with every parameter moved off its initialization (zero inits included,
    so that a transposed or misplaced zero-initialized weight cannot hide)."""
    model = initialized_record_gpt(record, max_seq_len, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model


# ---- ours and the map -------------------------------------------------------------------------------------


def tiny_config(preset: str, **changes) -> GPTConfig:
    """Our ``preset`` at the tiny shape (vocabulary 50304, :data:`MODEL_DIM` = :data:`HEADS` x :data:`HEAD_DIM`,
    :data:`BIGRAM_VOCAB` bigram rows, :data:`BLOCK`-token window blocks) on the CPU paths (reference attention,
    full cross-entropy, torch rotary and MLP, no FP8 head), with ``changes`` (the record's own)."""
    return dataclasses.replace(
        PRESETS[preset], vocab_size=50304, model_dim=MODEL_DIM, n_head=HEADS, head_dim=HEAD_DIM,
        bigram_vocab_size=BIGRAM_VOCAB, window_block_size=BLOCK, attention_backend="reference",
        cross_entropy="full", rotary_kernel="torch", mlp_kernel="torch", fp8_head=False, **changes)


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
    (:func:`test_record88_model.test_our_rope_turns_the_other_way_than_the_records`)."""
    signs = torch.ones(head_dim, dtype=torch.float64)
    signs[1:head_dim // 2:2] = -1
    return signs.repeat(n_head)


def embedding_links(config: GPTConfig) -> list[Link]:
    """The links of the embeddings and the smear and skip lambdas the records #87, #88 and HEAD share:
    ``embed.weight``; ``lm_head.weight`` (C, V) transposed; ``scalars`` [22] -> ``smear.lambda_``, [23] ->
    ``skips.lambda_``; ``smear_gate.weight`` -> ``smear.gate``; ``bigram_embed.weight`` -> ``bigram.table``;
    ``value_embeds`` (5V, C) rows jV..(j+1)V -> ``value_embeds.tables.j.weight``."""
    V = config.vocab_size
    return [Link("embed.weight", "embed.weight", lambda p: p),
            Link("lm_head.weight", "lm_head.weight", lambda p: p.T),
            Link("smear.lambda_", "scalars", lambda p: p[22:23]),
            Link("skips.lambda_", "scalars", lambda p: p[23:24]),
            Link("smear.gate", "smear_gate.weight", lambda p: p),
            Link("bigram.table", "bigram_embed.weight", lambda p: p),
            *(Link(f"value_embeds.tables.{j}.weight", "value_embeds", lambda p, j=j: p[j * V:(j + 1) * V])
              for j in range(5))]


def bank_links(config: GPTConfig, gate_bank: str | None = None, xsa_bank: str | None = None) -> list[Link]:
    """The per-layer links of the banks the records #87, #88 and HEAD share (C model_dim, a = the attention index
    of layer i, i - (i > 6), layer 6 having none), in this order per layer: ``mlp_bank`` [i, 0] ->
    ``blocks.i.mlp.fc.weight`` and [i, 1] (c_proj, used as ``post @ c_proj``) transposed -> ``proj.weight``;
    ``qk_bank`` groups 6a..6a+2 -> ``attn.q.weight`` and 6a+3..6a+5 -> ``k.weight`` (head-major rows, the
    rotated pairs' second rows negated: :func:`rope_row_signs`); ``vo_bank`` 2a -> ``v.weight``, 2a+1 ->
    ``o.weight``; ``gate_bank`` [a] -> ``attn.gate.weight`` (where given); ``scalars`` [2i, 2i+1] ->
    ``attn.sa_lambdas``; ``ve_gate_bank`` [0..3] -> the VE gates of the value-embedding layers other than MUDD's
    (1, 2, 8, 9); ``xsa_bank`` [i] -> ``attn.xsa_alpha`` of the XSA layers (where given)."""
    C = config.model_dim
    flip = rope_row_signs(config.n_head, config.head_dim) if ROPE_TURNS_OPPOSITE else None
    links = []
    ve_gate_layers = [i for i in config.value_embed_layers if i != config.mudd_layer]          # 1, 2, 8, 9
    for i in range(config.n_layer):
        block = f"blocks.{i}"
        links += [Link(f"{block}.mlp.fc.weight", "mlp_bank", lambda p, i=i: p[i, 0]),
                  Link(f"{block}.mlp.proj.weight", "mlp_bank", lambda p, i=i: p[i, 1].T)]
        if i in config.attention_free_layers:
            continue
        a = i - (i > 6)
        links += [Link(f"{block}.attn.q.weight", "qk_bank", lambda p, a=a: p[6 * a:6 * a + 3].reshape(C, C), flip),
                  Link(f"{block}.attn.k.weight", "qk_bank", lambda p, a=a: p[6 * a + 3:6 * a + 6].reshape(C, C), flip),
                  Link(f"{block}.attn.v.weight", "vo_bank", lambda p, a=a: p[2 * a]),
                  Link(f"{block}.attn.o.weight", "vo_bank", lambda p, a=a: p[2 * a + 1])]
        if gate_bank is not None:
            links.append(Link(f"{block}.attn.gate.weight", gate_bank, lambda p, a=a: p[a]))
        links.append(Link(f"{block}.attn.sa_lambdas", "scalars", lambda p, i=i: p[2 * i:2 * i + 2]))
        if i in ve_gate_layers:
            g = ve_gate_layers.index(i)
            links.append(Link(f"{block}.attn.ve_gate.weight", "ve_gate_bank", lambda p, g=g: p[g]))
        if xsa_bank is not None and i in config.xsa_layers:
            links.append(Link(f"{block}.attn.xsa_alpha", xsa_bank, lambda p, i=i: p[i]))
    return links


# ---- the comparison ---------------------------------------------------------------------------------------


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |ours - theirs| / max |theirs| (0 when both are 0)."""
    scale = theirs.abs().max().item()
    diff = (ours - theirs).abs().max().item()
    return diff / scale if scale else diff


def assert_small(errors: dict[str, float]) -> None:
    """The loss within 1e-12 and every gradient within 1e-9 relative (of :meth:`ModelParity.compare`)."""
    assert errors["loss"] < 1e-12, errors["loss"]
    worst = {name: e for name, e in errors.items() if e > 1e-9}
    assert not worst, worst


@dataclass(frozen=True)
class ModelParity:
    """One record's model test: what differs between the records, and the comparison built on it.

    ``config`` makes our preset at the tiny shape; ``links`` gives the parameter map of our model (record ->
    ours, :class:`Link`); ``unmapped`` counts per record parameter its elements that no parameter of ours
    holds (each never read by the record's forward); the packed batch has ``seq_len`` tokens T and documents
    ``cu_seqlens`` (int32, the last slot padding); ``prefix_weight`` says whether the record's
    ForwardScheduleConfig has that field (#87's does not); ``label`` names the record in messages."""

    config: Callable[[], GPTConfig]
    links: Callable[[GPT], list[Link]]
    unmapped: dict[str, int]
    seq_len: int
    cu_seqlens: torch.Tensor
    prefix_weight: bool = True
    label: str = "the record"

    def check_coverage(self, links: list[Link], theirs: nn.Module, ours: GPT) -> dict[str, torch.Tensor]:
        """Assert the map is complete: each of our parameters in exactly one link, of its full shape; each
        record element in at most one; the record's unmapped elements exactly :attr:`unmapped`. Returns per
        record parameter the bool mask of its unmapped elements."""
        our_params, their_params = dict(ours.named_parameters()), dict(theirs.named_parameters())
        assert sorted(link.ours for link in links) == sorted(our_params), "our parameters mapped not exactly once"
        counts = {name: torch.zeros(p.shape, dtype=torch.int64) for name, p in their_params.items()}
        for link in links:
            view = link.view(counts[link.theirs])
            assert view.shape == our_params[link.ours].shape, link
            view.add_(1)
        assert max(int(c.max()) for c in counts.values()) == 1, f"an element of {self.label} mapped twice"
        assert {name: int((c == 0).sum()) for name, c in counts.items() if (c == 0).any()} == self.unmapped
        assert sum(p.numel() for p in our_params.values()) + sum(self.unmapped.values()) == sum(
            p.numel() for p in their_params.values())
        return {name: c == 0 for name, c in counts.items()}

    def assert_same_initialization(self, record_model: Callable[[int], nn.Module]) -> None:
        """Our tiny model as our ``__init__`` leaves it has the record's initialization, parameter by mapped
        parameter: ``record_model(seed)`` is the record's GPT fresh from its own ``__init__``
        (:func:`initialized_record_gpt`), built for two seeds, as ours. An element equal under both seeds is
        deterministic, and the same elements must be so in ours, equal to the record's (fp32 rounding: ours is
        built in float32); the others are drawn, and per parameter ours must draw the same distribution: the
        mean within 5 standard errors, the standard deviation within 2 % + 4 of its standard errors, and
        max |x| / std (uniform √3, normal about 4-5 at these sizes) within 10 %. Parameters drawn equal in the
        record (the tied embedding and head) are equal in ours, and only those."""
        theirs = [dict(record_model(seed).named_parameters()) for seed in (0, 1)]
        models = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            models.append(GPT(self.config()).double())
        ours = [dict(model.named_parameters()) for model in models]
        links = self.links(models[0])
        drawn = {}
        for link in links:
            their_a, their_b = (link(params[link.theirs]).detach() for params in theirs)
            our_a, our_b = (params[link.ours].detach() for params in ours)
            fixed = their_a == their_b
            assert torch.equal(our_a == our_b, fixed), f"{link.ours}: drawn elements other than {self.label}'s"
            torch.testing.assert_close(our_a[fixed], their_a[fixed], rtol=1e-6, atol=0, msg=link.ours)
            if fixed.all():
                continue
            mine, record = our_a[~fixed], their_a[~fixed]
            n, std = record.numel(), record.std().item()
            assert abs(mine.mean().item() - record.mean().item()) < 5 * std / math.sqrt(n), link.ours
            assert abs(mine.std().item() / std - 1) < 0.02 + 4 / math.sqrt(2 * n), (link.ours, mine.std(), std)
            shape_ratio = (mine.abs().max() / mine.std()) / (record.abs().max() / std)
            assert abs(shape_ratio.item() - 1) < 0.10, (link.ours, shape_ratio)
            drawn[link.ours] = (our_a, their_a)
        tied = lambda x, y: x.shape == y.shape and torch.allclose(x, y, rtol=1e-6, atol=0)   # fp32 rounding
        for a, b in itertools.combinations(drawn, 2):
            (our_a, their_a), (our_b, their_b) = drawn[a], drawn[b]
            assert tied(our_a, our_b) == tied(their_a, their_b), f"{a} and {b}: tied in one model only"

    def mapped_model(self, theirs: nn.Module) -> tuple[GPT, list[Link], dict[str, torch.Tensor]]:
        """Our tiny model (:attr:`config`) in float64 and eval mode with the record model's weights, bigram
        sign table and rotary frequencies; the links and the record's unmapped-element masks
        (:meth:`check_coverage`)."""
        ours = GPT(self.config()).double().eval()
        links = self.links(ours)
        unmapped = self.check_coverage(links, theirs, ours)
        our_params, their_params = dict(ours.named_parameters()), dict(theirs.named_parameters())
        with torch.no_grad():
            for link in links:
                our_params[link.ours].copy_(link(their_params[link.theirs]))
            ours.bigram.signs = theirs.bigram_sign_table.clone()
            frequencies = theirs.yarn.angular_freq[:2 * (HEAD_DIM // 4):2]        # each repeated twice, then 0s
            torch.testing.assert_close(frequencies, ours.rotary_frequencies, rtol=1e-7, atol=0)  # fp32 rounding
            ours.restore_schedule_state((ours.window_blocks, frequencies.clone(), theirs.yarn.attn_scale))
        return ours, links, unmapped

    def batch(self, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs (T,) int32, targets (T,) int64): random GPT-2 tokens, BOS at every document start."""
        generator = torch.Generator().manual_seed(seed)
        inputs = torch.randint(0, VOCAB - 1, (self.seq_len,), generator=generator, dtype=torch.int32)
        inputs[self.cu_seqlens[:-2].long()] = BOS
        targets = torch.randint(0, VOCAB, (self.seq_len,), generator=generator)
        return inputs, targets

    def schedule(self, record, windows: tuple[int, int]):
        """The record's ForwardScheduleConfig for windows (short, long) of these many blocks (its ws_* in
        tokens): one MTP weight, no prefix weight (zero, where the record has the field)."""
        prefix = {"prefix_weight": torch.zeros(1, dtype=torch.float64)} if self.prefix_weight else {}
        return record.ForwardScheduleConfig(mtp_weights=torch.ones(1, dtype=torch.float64), **prefix,
                                            ws_short=windows[0] * BLOCK, ws_long=windows[1] * BLOCK,
                                            train_max_seq_len=self.seq_len)

    def compare(self, record, theirs: nn.Module, ours: GPT, links: list[Link], unmapped: dict[str, torch.Tensor],
                windows: tuple[int, int]) -> dict[str, float]:
        """Eval losses and every parameter's gradient of both models on :meth:`batch` with windows (short,
        long) in blocks, compared; returns the relative errors (key ``loss`` and our parameter names)."""
        inputs, targets = self.batch()
        bigram_inputs = record.get_bigram_hash(inputs)
        assert torch.equal(bigram_inputs.long(), bigram_hash(inputs, BIGRAM_VOCAB))
        theirs.zero_grad(set_to_none=True)
        ours.zero_grad(set_to_none=True)
        their_loss = theirs(inputs, targets, self.cu_seqlens, bigram_inputs, self.schedule(record, windows)).mean()
        our_loss = ours(inputs, targets, self.cu_seqlens)
        their_loss.backward()
        our_loss.backward()
        errors = {"loss": relative_error(our_loss.detach(), their_loss.detach())}
        our_params, their_params = dict(ours.named_parameters()), dict(theirs.named_parameters())
        for link in links:
            our_grad = our_params[link.ours].grad
            assert our_grad is not None, link.ours
            errors[link.ours] = relative_error(our_grad, link(their_params[link.theirs].grad))
        for name, mask in unmapped.items():
            grad = their_params[name].grad
            assert grad is None or not grad[mask].any(), f"{self.label} reads unmapped elements of {name}"
        return errors

    def assert_match_at_the_first_stage(self, record, theirs: nn.Module) -> None:
        """Ours mapped from ``theirs`` (:meth:`mapped_model`) starts at the first window stage (1, 3) blocks,
        where both agree (:meth:`compare`, :func:`assert_small`)."""
        ours, links, unmapped = self.mapped_model(theirs)
        assert ours.window_blocks == (1, 3)
        assert_small(self.compare(record, theirs, ours, links, unmapped, windows=(1, 3)))

    def assert_match_after_a_window_change(self, record, theirs: nn.Module) -> None:
        """The record's second window stage: (1, 3) -> (3, 7) blocks, its ``yarn.apply(12, 28)`` on both of
        ``theirs``' Yarns (TrainingManager.advance_schedule) against our ``set_window_blocks(3, 7)`` on ours
        mapped from it: the same rotary frequencies and attention scale (1e-14), then both compared
        (:meth:`compare`, :func:`assert_small`); then the final validation's long window of 20 blocks without
        YaRN (apply_final_ws_ext; ours ``rescale=False``), compared again."""
        ours, links, unmapped = self.mapped_model(theirs)
        with torch.no_grad():
            for yarn in (theirs.yarn, theirs.yarn_paired_head):
                yarn.apply(3 * BLOCK, 7 * BLOCK)
        ours.set_window_blocks(3, 7)
        torch.testing.assert_close(ours.rotary_frequencies, theirs.yarn.angular_freq[:2 * (HEAD_DIM // 4):2],
                                   rtol=1e-14, atol=0)
        assert ours.attention_scale == pytest.approx(theirs.yarn.attn_scale, rel=1e-14)
        assert_small(self.compare(record, theirs, ours, links, unmapped, windows=(3, 7)))
        ours.set_window_blocks(3, 20, rescale=False)
        assert_small(self.compare(record, theirs, ours, links, unmapped, windows=(3, 20)))
