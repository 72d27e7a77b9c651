"""Our optimizers for record #88 against record #88's own ``NorMuonAndAdam`` and ``TrainingManager``, executed from
../shared/reference-code/record88/train_gpt.py at test time (not a copy), at the tiny shape of
tests/test_record88_model.py, on the CPU.

Both sides start from the same weights (the record's GPT, moved off its initialization, mapped onto ours by
:func:`test_record88_model.parameter_links`) and get the same gradients (random, mapped through the same links,
sparse rows for the embedding tables, nothing on the record's unmapped elements), step after step: the record
through its own ``TrainingManager.step_optimizers`` (its param_table, adam/normuon defaults, lr schedule, momentum
schedule, Adam on odd steps, the tied embed/lm_head and the split step's state copy), ours as the training loop does
it (``_Run.train``'s :func:`prepare_optimizers` and :func:`finish_optimizer_step`; :func:`build_optimizers` from
the ``train`` section of configs/records/record88.yaml, the staged schedule's lr factor and momentum,
``fold_tied_gradients``, Adam every other step on the kept gradients, the untie step with ``copy_state``).
Steps 0-3, then the record's split step S (911) and its neighbours S-1..S+3 (our untie step is S+1). After every
step the test compares every parameter (mapped) and every state: Muon's momentum and NorMuon's second moment,
Adam's moments and step counts; and, per parameter, the hyperparameters that each side uses (lr, betas, eps,
weight decay; Muon's step lr and cautious decay factor against our ``step_factors``), and the lr factor and
momentum of both schedules.

Precision. The direction (momentum -> Polar Express -> NorMuon's variance reduction) and the weight step run in
float64 on both sides: the record's low-precision casts are removed (tests/record_models.py's
``Float64Eager``), ours runs on float64 parameters (working dtype and orthogonalization in float64). Measured: the
Muon-updated weights agree to ~6e-14 of the step, the momentum buffers exactly, the second moments to ~1e-14.
Adam cannot be compared in float64: our :class:`CautiousAdam` keeps its moments in fp32 whatever the parameter's
dtype (as the record does on the GPU), so Adam's steps agree to ~6e-7 of the step, its moments to ~2e-7 (fp32).
The record's bf16 weight step with its 16-bit mantissa (``_cautious_wd_and_update_inplace``, uint16 bit arithmetic)
is tested apart on bf16 weights against ours (``join_bf16`` -> ``apply_update`` -> ``split_fp32_``, the CPU path of
``Muon._update_bank``): bit for bit with factors that make every product exact; one rounding apart with the
record's real factors (the record rounds ``p·wd``, ``·lr`` and ``grad·lr`` to fp32 separately, ours multiplies
the decay factor out in float64 and fuses ``p - lr·u`` in ``add_(alpha=)``: 24% of the fp32 weights differ by
<= 2 ulp, 2e-5 of the bf16 ones by one bf16 ulp). Adam's eps (1e-10, the records' on their summed loss; ours the
same, ``adam_eps_units`` = ``loss_units``) is far below the gradients here (~1e-2): it only matters for the rows
with zero moments (the embedding tables' unseen rows), which both treat alike. Also checked: the record's own bf16
casts of its weights against our ``store_weights`` (the same parameters bf16), and that the parity config trains
with record88.yaml's optimizer settings.

What is changed in the record's code to run it here: ``Float64Eager`` (bf16/fp32 -> float64, CUDA -> CPU); the
``@torch.compile(...)`` decorators are removed (:class:`EagerOptimizer`); its Triton helpers ``XXT``, ``XTX``,
``ba_plus_cAA``, ``transpose_copy``, ``transpose_add`` (triton_kernels.py) are plain torch (:func:`triton_stand_ins`);
``dist`` reports no process group (world size 1: comms "none", no sharding; the banks keep the 8-GPU padding of
the model test); ``args`` is the record's ``Hyperparameters`` with the tiny bigram table; in the float64 run its
``_cautious_wd_and_update_inplace`` (uint16 views, which cannot hold float64) is the same formula on the float64
weights (:func:`float64_weight_step`), and the bf16 test runs the original with ``torch.uint32`` read as
``torch.int32`` (CPU torch has no uint32 shifts; int32 gives the same bits, :class:`Uint32AsInt32`).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import itertools
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from speedrun.model.gpt import GPT
from speedrun.optim.groups import build_optimizers
from speedrun.optim.muon import apply_update, row_blocks, step_factors, step_settings
from speedrun.optim.precision import join_bf16, split_fp32_
from speedrun.training.config import TrainConfig
from speedrun.training.loop import finish_optimizer_step, prepare_optimizers, store_weights

from record_code import OnTheCpu, record_definitions
from record_models import BIGRAM_VOCAB, HEAD_DIM, MODEL_DIM, WORLD_SIZE, Float64Eager, Link, relative_error
from test_record88_model import (BIGRAM_DIM, RECORD, RECORD_NAMES, SEQ_LEN, mapped_model, our_config, parameter_links,
                                 record_model, record_namespace)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "records" / "record88.yaml"
PARITY_CONFIG = ROOT / "benchmarks" / "configs" / "parity-record88.yaml"
OPTIMIZER_NAMES = {"polar_express_coeffs", "polar_express", "_sparse_comms_active", "ParamConfig", "NorMuonAndAdam",
                   "TrainingStage", "TrainingSchedule", "TRAINING_STAGES", "training_schedule", "get_muon_momentum",
                   "TrainingManager"}
EMBEDDING_TABLES = ("embed.weight", "value_embeds", "bigram_embed.weight")      # sparse gradient rows
GRAD_SCALE = 1e-2


# ---- the record's code ------------------------------------------------------------------------------------


def strip_compile(node: ast.FunctionDef) -> int:
    """Remove ``@torch.compile(...)`` from ``node``'s decorators; returns how many were removed."""
    kept = [d for d in node.decorator_list
            if not (isinstance(d, ast.Call) and ast.unparse(d.func) == "torch.compile")]
    removed = len(node.decorator_list) - len(kept)
    node.decorator_list = kept
    return removed


class EagerOptimizer(Float64Eager):
    """``Float64Eager`` (tests/record_models.py) plus: ``@torch.compile(...)`` decorators removed (counted in
    ``compiled``)."""

    def __init__(self):
        super().__init__()
        self.compiled = 0

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self.compiled += strip_compile(node)
        self.generic_visit(node)
        return node


class Uint32AsInt32(OnTheCpu):
    """For the bf16 weight step as written (no float64): ``@torch.compile(...)`` removed and ``torch.uint32`` read as
    ``torch.int32``: CPU torch has no uint32 shifts; in int32, ``(p << 16) | mantissa`` has the same 32 bits (the
    shift wraps), ``>> 16`` then ``.to(torch.uint16)`` keeps the same low 16 bits (sign extension is cut off),
    ``.view(torch.float32)`` reads the same bits."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        strip_compile(node)
        self.generic_visit(node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "torch" and node.attr == "uint32":
            node.attr = "int32"
        return node


def triton_stand_ins() -> dict:
    """The record's Triton helpers (triton_kernels.py) in plain torch, exact: ``XXT`` A Aᵀ, ``XTX`` Aᵀ A,
    ``ba_plus_cAA`` alpha·A Aᵀ + beta·A (A symmetric), ``transpose_copy`` dst = srcᵀ, ``transpose_add``
    dst += srcᵀ."""
    return {"XXT": lambda A, out: out.copy_(A @ A.mT),
            "XTX": lambda A, out: out.copy_(A.mT @ A),
            "ba_plus_cAA": lambda A, alpha, beta, out: out.copy_(alpha * (A @ A.mT) + beta * A),
            "transpose_copy": lambda src, dst: dst.copy_(src.T),
            "transpose_add": lambda src, dst: dst.add_(src.T)}


def record_hyperparameters() -> object:
    """The record's ``Hyperparameters`` (its defaults: 1365 + 10 steps), executed from its script."""
    namespace = record_definitions(RECORD, {"Hyperparameters"}, {"os": os, "uuid": uuid, "dataclass": dataclass})
    return namespace["Hyperparameters"]()


@dataclass
class WeightSteps:
    """The calls of the record's ``_cautious_wd_and_update_inplace`` in one ``step``: per bank label, one
    (eff_wd, eff_lr) per call (one call per bank; per matrix for ``mlp_bank``)."""

    calls: dict[str, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)
    label: str | None = None


def float64_weight_step(log: WeightSteps):
    """The record's ``_cautious_wd_and_update_inplace(p, mantissa, grad, wd, lr)`` on float64 weights, which its
    caller passes as ``p.view(torch.uint16)``: ``p - p·[grad·p >= 0]·wd·lr - grad·lr``, its formula, without the
    fp32 bf16+mantissa split (tested apart). Logs (wd, lr) in ``log``."""

    def step(p, mantissa, grad, wd_tensor, lr_tensor):
        log.calls.setdefault(log.label, []).append((float(wd_tensor), float(lr_tensor)))
        p = p.view(torch.float64)
        mask = (grad * p) >= 0
        p.copy_(p - (p * mask * wd_tensor * lr_tensor) - (grad * lr_tensor))

    return staticmethod(step)


def record_code(record_args) -> SimpleNamespace:
    """The record's model and optimizer definitions in float64 (module docstring), with a :class:`WeightSteps`
    log ``weight_steps`` of its Muon weight steps."""
    namespace = record_namespace()
    namespace.update(triton_stand_ins())
    namespace.update(np=np, copy=copy, accumulate=itertools.accumulate, pairwise=itertools.pairwise,
                     dist=SimpleNamespace(get_world_size=lambda: WORLD_SIZE, is_initialized=lambda: False),
                     args=record_args)
    transformer = EagerOptimizer()
    record_definitions(RECORD, RECORD_NAMES | OPTIMIZER_NAMES, namespace, transformer=transformer)
    assert transformer.overlapping == 1                            # the key offset (model), nothing in the optimizer
    assert transformer.compiled == 4                               # polar_express and three NorMuonAndAdam steps
    log = WeightSteps()
    optimizer = namespace["NorMuonAndAdam"]
    normuon_update = optimizer._normuon_update

    def labelled(self, param, grad_chunk, p_cfg, rank):
        log.label = p_cfg.label
        return normuon_update(self, param, grad_chunk, p_cfg, rank)

    optimizer._normuon_update = labelled
    optimizer._cautious_wd_and_update_inplace = float64_weight_step(log)
    return SimpleNamespace(**namespace, weight_steps=log, globals=namespace)


# ---- gradients, states, comparisons -----------------------------------------------------------------------


def record_gradients(theirs: nn.Module, unmapped: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A gradient per record parameter: N(0, GRAD_SCALE²), zero on its unmapped elements; the embedding tables'
    only on 64 random rows (a batch's tokens)."""
    generator = torch.Generator().manual_seed(seed)
    grads = {}
    for name, p in theirs.named_parameters():
        if name in EMBEDDING_TABLES:
            grad = torch.zeros_like(p)
            rows = torch.randperm(p.size(0), generator=generator)[:64]
            grad[rows] = GRAD_SCALE * torch.randn((64, *p.shape[1:]), generator=generator, dtype=p.dtype)
        else:
            grad = GRAD_SCALE * torch.randn(p.shape, generator=generator, dtype=p.dtype)
        if name in unmapped:
            grad[unmapped[name]] = 0
        grads[name] = grad
    return grads


def accumulate(p: torch.Tensor, grad: torch.Tensor) -> None:
    """``p.grad += grad`` as a backward pass does (a new contiguous tensor when there is none)."""
    if p.grad is None:
        p.grad = grad.clone(memory_format=torch.contiguous_format)
    else:
        p.grad.add_(grad)


def bank_indices(link: Link, param: torch.Tensor, reshape: tuple[int, ...]) -> list[int]:
    """The matrices of a NorMuon bank (its ``reshape``'s first dimension) that our parameter of ``link`` holds."""
    index = torch.arange(reshape[0]).view(-1, *[1] * (len(reshape) - 1)).expand(reshape).reshape(param.shape)
    return sorted(set(link.view(index).unique().tolist()))


def full_second_moment(second_moment: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A reduced second moment ((rows, 1), (1, cols) or per block (blocks, b or 1, cols or 1)) broadcast to the
    weight's ``shape`` (..., rows, cols), so that layouts (the record's (4C, C) c_proj, ours (C, 4C)) compare."""
    if second_moment.dim() == len(shape) + 1:                        # ours, in blocks of rows
        rows, cols = shape
        blocks = second_moment.size(0)
        return second_moment.expand(blocks, rows // blocks, cols).reshape(rows, cols)
    return second_moment.expand(shape)


@dataclass
class Run:
    """Both sides after each step: ``errors[step][what]`` the differences (parameters: relative to the largest step
    the parameter has taken so far, the exact difference while it has never moved; states: relative to their largest
    element); per Muon link ``factors[step]`` the record's (eff_wd, eff_lr) of its weight step and our (lr_eff,
    decay, shrink) (:func:`step_factors`), ``settings[step]`` our group's (lr, weight decay, cautious, decay lr) and
    block rows; per link ``hyper[step]`` the record's and our (lr, betas, eps, weight decay) for Adam, (momentum,
    beta2) for Muon; ``schedules[step]`` the record's and our (lr factor, momentum); ``shapes`` our parameters'."""

    errors: dict[int, dict[str, float]]
    factors: dict[int, dict[str, tuple[tuple[float, float], tuple[float, float, float]]]]
    settings: dict[int, dict[str, tuple[tuple, int]]]
    hyper: dict[int, dict[str, tuple[tuple, tuple]]]
    schedules: dict[int, tuple[tuple[float, float], tuple[float, float]]]
    split_step: int
    untie_step: int
    record: SimpleNamespace
    muon_links: list[Link]
    shapes: dict[str, tuple[int, ...]]


def our_group(optimizers, param: torch.Tensor) -> tuple[torch.optim.Optimizer, dict]:
    """The optimizer and parameter group that hold ``param``."""
    for opt in optimizers.optimizers:
        for group in opt.param_groups:
            if any(p is param for p in group["params"]):
                return opt, group
    raise KeyError("parameter in no group")


def our_muon_settings(group: dict, param: torch.Tensor) -> tuple[tuple, int]:
    """The settings of our Muon step on ``param`` as ``Muon._update_bank`` passes them to ``apply_update``
    (lr, weight decay, cautious, the decay's lr), and the rows of its blocks."""
    return step_settings(group), group.get("block_rows") or param.size(0)


def train_config(path: Path) -> TrainConfig:
    """The ``train`` section of a config file, as the workflow builds it."""
    return TrainConfig.from_dict(yaml.safe_load(path.read_text())["train"])


# ---- the run ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run() -> Run:
    """Both optimizers over steps 0-3 and S-1..S+3 (S the record's split step), compared after each step."""
    if not RECORD.exists():
        pytest.skip(f"{RECORD} is not here")
    hp = record_hyperparameters()
    record_args = SimpleNamespace(bigram_vocab_size=BIGRAM_VOCAB, bigram_dim=BIGRAM_DIM, bigram_sign_table_rows=8192,
                                  val_batch_size=SEQ_LEN * WORLD_SIZE,
                                  num_scheduled_iterations=hp.num_scheduled_iterations,
                                  num_extension_iterations=hp.num_extension_iterations)
    record = record_code(record_args)
    theirs = record_model(record, seed=11)
    with torch.no_grad():                      # tied, as the record's init leaves them (record_model moved both)
        theirs.embed.weight.copy_(theirs.lm_head.weight.T)
    ours, links, unmapped = mapped_model(theirs)
    record.globals["world_size"] = 1                # the model keeps its 8-GPU bank padding; the optimizer: 1 GPU
    manager = record.TrainingManager(theirs)
    optimizer = manager.optimizer
    assert optimizer.world_size == 1 and all(c.comms == "none" for c in optimizer.param_cfgs.values())

    cfg = train_config(CONFIG)
    assert cfg.preset == "record88" and ours.tied
    optimizers = build_optimizers(ours, ours.parameter_kinds(), dataclasses.replace(cfg.optimizer, langevin_seed=0))
    staged = cfg.schedule.staged_schedule
    split = manager.split_step
    steps = [0, 1, 2, 3, split - 1, split, split + 1, split + 2, split + 3]

    our_params, their_params = dict(ours.named_parameters()), dict(theirs.named_parameters())
    muon_links = [link for link in links if optimizer.param_cfgs[their_params[link.theirs]].optim == "normuon"]
    result = Run({}, {}, {}, {}, {}, split, cfg.untie_step(), record, muon_links,
                 {name: tuple(p.shape) for name, p in our_params.items()})
    largest_step = {link.ours: 0.0 for link in links}
    for step in steps:
        # the record: its training loop's backward (gradients accumulate) and TrainingManager.step_optimizers
        grads = record_gradients(theirs, unmapped, seed=step)
        before = {link.ours: link(their_params[link.theirs]).detach().clone() for link in links}
        for name, p in theirs.named_parameters():
            accumulate(p, grads[name])
        record.weight_steps.calls.clear()
        manager.step_optimizers(step)
        # ours: the training loop's optimizer side (src/speedrun/training/loop.py), with the same gradients
        adam = prepare_optimizers(cfg, optimizers, ours, step)
        for link in links:
            accumulate(our_params[link.ours], link(grads[link.theirs]))
        ours.fold_tied_gradients()                     # as train_step does after the backward passes
        finish_optimizer_step(optimizers, ours, adam)

        qk_cfg = optimizer.param_cfgs[their_params["qk_bank"]]
        result.schedules[step] = ((qk_cfg.lr / qk_cfg.initial_lr, qk_cfg.momentum),
                                  (staged.lr_factor(step), staged.muon_momentum(step)))
        errors, factors, settings, hyper = {}, {}, {}, {}
        for link in links:
            param, theirs_p = our_params[link.ours], their_params[link.theirs]
            moved = (link(theirs_p) - before[link.ours]).abs().max().item()
            largest_step[link.ours] = scale = max(largest_step[link.ours], moved)
            diff = (param - link(theirs_p)).abs().max().item()
            errors[f"param {link.ours}"] = diff / scale if scale else diff
            p_cfg = optimizer.param_cfgs[theirs_p]
            their_state, (opt, group) = optimizer.param_states[theirs_p], our_group(optimizers, param)
            state = opt.state.get(param, {})
            if p_cfg.optim == "normuon":
                shape = p_cfg.reshape
                buf = their_state["momentum_buffer"].view(theirs_p.shape)
                errors[f"momentum {link.ours}"] = relative_error(state["momentum_buffer"], link(buf))
                second = their_state["second_momentum_buffer"].expand(*shape[:-2], *shape[-2:])
                second = link.view(second.reshape(theirs_p.shape))
                errors[f"second moment {link.ours}"] = relative_error(
                    full_second_moment(state["second_moment"], tuple(param.shape)), second)
                calls = record.weight_steps.calls[p_cfg.label]
                indices = bank_indices(link, theirs_p, shape)
                their_factors = {calls[i if len(calls) > 1 else 0] for i in indices}
                assert len(their_factors) == 1, (link.ours, their_factors)
                settings[link.ours] = (our_settings, block) = our_muon_settings(group, param)
                rows, cols = param.shape
                factors[link.ours] = (their_factors.pop(), step_factors((rows // block, block, cols), *our_settings))
                hyper[link.ours] = ((p_cfg.momentum, p_cfg.beta2), (group["momentum"], group["normuon_beta2"]))
            else:
                hyper[link.ours] = ((p_cfg.lr * p_cfg.lr_mul, p_cfg.adam_betas, p_cfg.eps,
                                     p_cfg.weight_decay * p_cfg.wd_mul),
                                    (group["lr"], group["betas"], group["eps"], group["weight_decay"]))
                if not state:             # before the first Adam step, and our tied embedding (the head's copy)
                    copied = link.ours == "embed.weight" and step == split     # the record's copy: after step S,
                    assert copied or their_state["step"] == 0, (step, link.ours)  # ours: before step S + 1
                    continue
                assert state["step"] == their_state["step"], (link.ours, state["step"], their_state["step"])
                errors[f"exp_avg {link.ours}"] = relative_error(state["exp_avg"], link(their_state["exp_avg"]))
                errors[f"exp_avg_sq {link.ours}"] = relative_error(state["exp_avg_sq"],
                                                                   link.view(their_state["exp_avg_sq"]))
        result.errors[step], result.factors[step], result.hyper[step] = errors, factors, hyper
        result.settings[step] = settings
    return result


# ---- the tests --------------------------------------------------------------------------------------------


def test_both_schedules_give_the_same_lr_factor_and_momentum(run):
    for step, ((their_lr, their_momentum), (our_lr, our_momentum)) in run.schedules.items():
        assert our_lr == pytest.approx(their_lr, rel=1e-14), step
        assert our_momentum == pytest.approx(their_momentum, rel=1e-14), step
    assert run.untie_step == run.split_step + 1                  # the first step trained untied


def test_every_parameter_gets_the_records_hyperparameters(run):
    """Adam: lr (the scheduled base lr times lr_mul), betas, eps, weight decay (times wd_mul); Muon: momentum,
    beta2, the step's lr (lr · lr_mul · the shape factor · c_proj's 2) and the cautious decay's factor
    (wd · lr · that step lr), against our ``step_factors`` (no decoupled shrink)."""
    for step in run.hyper:
        for name, (theirs, ours) in run.hyper[step].items():
            assert ours[0] == pytest.approx(theirs[0], rel=1e-12), (step, name, theirs, ours)
            for their_value, our_value in zip(theirs[1:], ours[1:]):
                assert our_value == pytest.approx(their_value, rel=1e-12), (step, name, theirs, ours)
        for name, ((wd, lr), (our_lr, our_decay, shrink)) in run.factors[step].items():
            decay = wd * lr                                       # the record: p·mask·wd·lr
            assert our_lr == pytest.approx(lr, rel=1e-12) and our_decay == pytest.approx(decay, rel=1e-12), (
                step, name, (lr, decay), (our_lr, our_decay))
            assert shrink == 1.0


def test_muon_weights_and_states_match_the_records_in_float64(run):
    worst = {}
    for step, errors in run.errors.items():
        for what, error in errors.items():
            name = what.split(" ")[-1]
            if any(link.ours == name for link in run.muon_links):
                kind = what.rsplit(" ", 1)[0]
                worst[kind] = max(worst.get(kind, 0.0), error)
                assert error < 1e-11, (step, what, error)
    assert set(worst) == {"param", "momentum", "second moment"}, worst


def test_adam_weights_and_states_match_the_records_to_fp32(run):
    """Our Adam's moments are fp32 (the record's too, on the GPU), so float64 agreement is out of reach: the step
    taken agrees to fp32 precision, relative to the step; the moments relative to their largest element. On even
    steps the Adam parameters do not move on either side (the difference is then exactly 0 relative to 0)."""
    muon = {link.ours for link in run.muon_links}
    for step, errors in run.errors.items():
        for what, error in errors.items():
            if what.split(" ")[-1] not in muon:
                assert error < 1e-5, (step, what, error)


def record_weight_step():
    """The record's ``NorMuonAndAdam._cautious_wd_and_update_inplace`` as written, uncompiled, uint32 read as int32
    (:class:`Uint32AsInt32`)."""
    namespace = record_definitions(RECORD, {"ParamConfig", "NorMuonAndAdam"},
                                   {"torch": torch, "nn": nn, "Tensor": torch.Tensor, "dataclass": dataclass},
                                   transformer=Uint32AsInt32())
    return namespace["NorMuonAndAdam"]._cautious_wd_and_update_inplace


def bf16_case(shape: tuple[int, int], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bf16 weights, int16 lower halves, fp32 update direction of bf16 values, as NorMuon's output on the GPU):
    random, with exact zeros in weights and direction (the cautious mask's ``>= 0`` boundary)."""
    generator = torch.Generator().manual_seed(seed)
    weights = (0.05 * torch.randn(shape, generator=generator)).bfloat16()
    weights.view(-1)[::17] = 0
    mantissa = torch.randint(-2 ** 15, 2 ** 15, shape, generator=generator, dtype=torch.int16)
    mantissa.view(-1)[::17] = 0                                   # the zero weights' fp32 value: exactly 0
    update = torch.randn(shape, generator=generator).bfloat16().float()
    update.view(-1)[::13] = 0
    return weights, mantissa, update


def bf16_steps(their_step, link: Link, shape: tuple[int, ...], seed: int, their_factors: tuple[float, float],
               settings: tuple, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The record's and our weight step on the same :func:`bf16_case`: (initial fp32 weights, the fp32 step
    ``lr·update`` as the record scales it, the record's new fp32 weights, ours), each fp32 weight joined from its
    bf16 upper and 16-bit lower half. The record: its function, with 0-d fp32 (eff_wd, eff_lr) as its caller fills
    them; ours: the CPU path of ``Muon._update_bank`` (``join_bf16`` -> ``apply_update`` on the blocks ->
    ``split_fp32_``) with our group's settings. Elementwise, so both run on our layout."""
    weights, mantissa, update = bf16_case(shape, seed)
    wd, lr = (torch.tensor(0.0, dtype=torch.float32).fill_(f) for f in their_factors)
    theirs_w, theirs_m = weights.clone(), mantissa.clone()
    their_step(theirs_w.view(torch.uint16), theirs_m.view(torch.uint16), update, wd, lr)
    ours_w, ours_m = weights.clone(), mantissa.clone()
    precise = join_bf16(ours_w, ours_m)
    apply_update(row_blocks(precise, block), row_blocks(update, block), *settings)
    split_fp32_(precise, ours_w, ours_m)
    assert torch.equal(join_bf16(ours_w, ours_m), precise)
    return join_bf16(weights, mantissa), update * lr, join_bf16(theirs_w, theirs_m), precise


def test_the_bf16_weight_step_with_its_mantissa_is_the_records_bit_for_bit(run):
    """With factors that make every product exact (powers of two: the step lr 2^-6 and the record's eff_wd 2^-4,
    i.e. our lr 2^-6 / the shape factor, decay lr 2^-3, weight decay 2^-1), rounding order cannot matter: the new
    bf16 weights and mantissas are the record's bit for bit, for every Muon parameter (its blocks, its shape factor,
    the mask's ``>= 0`` on zero weights and zero updates, the truncation to bf16, the mantissa's bits)."""
    their_step = record_weight_step()
    for i, link in enumerate(run.muon_links):
        shape = run.shapes[link.ours]
        _, block = run.settings[run.split_step + 2][link.ours]
        rows, cols = shape
        lr_eff = 2.0 ** -6
        settings = (lr_eff / max(1.0, block / cols) ** 0.5, 2.0 ** -1, True, 2.0 ** -3)
        assert step_factors((rows // block, block, cols), *settings) == (lr_eff, 2.0 ** -4 * lr_eff, 1.0)
        initial, _, theirs, ours = bf16_steps(their_step, link, shape, i, (2.0 ** -4, lr_eff), settings, block)
        assert not torch.equal(theirs, initial)
        assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32)), link.ours


def test_the_bf16_weight_step_with_the_records_factors_is_one_rounding_apart(run):
    """With the factors of step S + 2 (the record's eff_wd, eff_lr from the float64 run; our group's settings): the
    record computes ``p - p·mask·wd·lr - grad·lr`` with every product rounded to fp32, ours pre-multiplies the
    decay factor in float64 (one rounding of ``p·decay``) and takes the step as ``add_(update, alpha=-lr)``, which
    CPU torch fuses (one rounding of ``p - lr·update``). So the fp32 weights differ in the last bit here and there
    (measured: 24% of them, by at most 2 ulp of the largest of weight, step and result, i.e. ~1e-7 of the step),
    and the bf16 weights that the forward reads only where such a bit crosses a bf16 truncation boundary
    (measured: 22 of 1,179,648, by one bf16 ulp)."""
    their_step = record_weight_step()
    step = run.split_step + 2
    differing = bf16_differing = total = 0
    for i, link in enumerate(run.muon_links):
        settings, block = run.settings[step][link.ours]
        their_factors, _ = run.factors[step][link.ours]
        initial, scaled_step, theirs, ours = bf16_steps(their_step, link, run.shapes[link.ours], i, their_factors,
                                                        settings, block)
        scale = torch.maximum(torch.maximum(initial.abs(), scaled_step.abs()), theirs.abs())
        ulp = torch.where(scale > 0, torch.exp2(torch.floor(torch.log2(scale)) - 23), torch.zeros_like(scale))
        assert ((ours - theirs).abs() <= 2 * ulp).all(), link.ours
        differing += int((ours != theirs).sum())
        bf16_differing += int(((ours.view(torch.int32) >> 16) != (theirs.view(torch.int32) >> 16)).sum())
        total += ours.numel()
    assert differing < 0.3 * total and bf16_differing < 1e-4 * total, (differing, bf16_differing, total)


def record_weight_casts(script: Path) -> list[ast.stmt]:
    """The record's top-level statements that store its model's weights in bf16 after building it (the loop over
    ``model.modules()`` casting nn.Embedding and nn.Linear weights, and ``model.X.data = model.X.data.bfloat16()``)."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    casts = [node for node in tree.body if isinstance(node, (ast.For, ast.Assign))
             and ".bfloat16()" in ast.unparse(node) and ast.unparse(node).startswith(("model.", "for m in model."))]
    assert len(casts) == 9, [ast.unparse(node) for node in casts]
    return casts


def test_the_same_parameters_are_stored_in_bf16():
    """The optimizers' precision depends on the weights' dtype (Adam rounds its step to a bf16 weight; Muon keeps a
    mantissa for bf16 weights only): the record's own casts after building its model (:func:`record_weight_casts`)
    against our loop's ``store_weights`` with the config's ``weight_dtype``, parameter by parameter through the
    links: bf16 the banks, embeddings, value embeddings, bigram table, lm_head, the gates and MUDD's weights; fp32
    the scalars, the lambdas and the XSA strengths. The record's definitions as written here (no float64)."""
    if not RECORD.exists():
        pytest.skip(f"{RECORD} is not here")
    record = record_definitions(RECORD, RECORD_NAMES, record_namespace(), transformer=OnTheCpu())  # its dtypes
    theirs = record["GPT"](vocab_size=50257, num_layers=11, num_heads=6, head_dim=HEAD_DIM, model_dim=MODEL_DIM,
                           max_seq_len=128)
    module = ast.Module(body=record_weight_casts(RECORD), type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), str(RECORD), "exec"), {"model": theirs, "nn": nn})
    ours = GPT(our_config())
    store_weights(ours, train_config(CONFIG).compute.weight_dtype)
    our_params, their_params = dict(ours.named_parameters()), dict(theirs.named_parameters())
    bf16 = {link.ours: (our_params[link.ours].dtype == torch.bfloat16,
                        their_params[link.theirs].dtype == torch.bfloat16) for link in parameter_links(ours)}
    assert {name: pair for name, pair in bf16.items() if pair[0] != pair[1]} == {}
    assert not bf16["residual.resid_lambdas"][1] and bf16["lm_head.weight"][1] and bf16["smear.gate"][1]


def test_the_parity_config_trains_with_the_same_optimizer_settings():
    """benchmarks/configs/parity-record88.yaml (the GPU parity run) has the optimizer settings and weight dtype of
    configs/records/record88.yaml, which the tests above check against the record's code."""
    record, parity = train_config(CONFIG), train_config(PARITY_CONFIG)
    assert parity.optimizer == record.optimizer
    assert parity.compute.weight_dtype == record.compute.weight_dtype == "bfloat16"
    assert parity.preset == record.preset
