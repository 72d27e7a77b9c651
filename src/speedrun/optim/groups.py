"""Assemble the optimizers of a model from its labelled parameters, and apply the schedules.

Each parameter carries a kind (:meth:`speedrun.model.gpt.GPT.parameter_kinds`): ``matrix`` (the 2-D weights
inside the blocks) goes to Muon; ``embed``, ``head`` and ``scalar`` go to AdamW, one parameter group per
kind with its own learning rate (records #3-#10 of the public speedrun: Adam at lr 0.6 for the embedding,
0.008 for the head, 0.04 for scalars; Muon at 0.05). Every parameter lands in exactly one group; anything
else raises. Each group keeps ``kind`` and ``initial_lr`` so that the schedules rescale ``lr`` from it.
The parameters that some settings treat apart from the rest of their kind (the MLP matrices' lr factors, the
attention gates moved to Muon) are found by the roles their modules declare (:mod:`speedrun.model.roles`,
:meth:`speedrun.model.gpt.GPT.parameter_roles`), never by their names.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import torch
from torch import nn

from speedrun.model.roles import PARAM_ROLES
from speedrun.optim.adam import build_adamw, is_adam
from speedrun.optim.langevin import langevin_sigma
from speedrun.optim.muon import Muon
from speedrun.optim.config import ADAM_KINDS  # noqa: F401 (imported from here by callers)
from speedrun.optim.config import ALL_ADAM_KINDS, RECORD_ADAM_KINDS, OptimConfig, ScheduleConfig
from speedrun.optim.schedules import lr_factor, muon_momentum

MUON_KINDS = ("matrix",)


class Optimizers:
    """The model's optimizers, stepped and scheduled together (``optimizers`` list: AdamW, then Muon). Adam
    updates once every ``adam_every`` steps (``OptimConfig.adam_every``; record #39: 2, on odd steps), on the
    gradients kept since its last update; Muon at every step. Raises ``ValueError`` for ``adam_every`` < 1."""

    def __init__(self, optimizers: list[torch.optim.Optimizer], adam_every: int = 1):
        if adam_every < 1:
            raise ValueError(f"Optimizers: adam_every must be >= 1, got {adam_every}")
        self.optimizers = optimizers
        self.adam_every = adam_every
        self._adam_ids = frozenset(id(p) for opt in optimizers if is_adam(opt)
                                   for group in opt.param_groups for p in group["params"])

    def adam_updates_after(self, step: int) -> bool:
        """Whether Adam updates after the 0-based optimizer step ``step``: (step + 1) % adam_every == 0 (with
        2 the odd steps, as the records' ``_is_adam_step``)."""
        return (step + 1) % self.adam_every == 0

    def adam_parameters(self) -> frozenset[int]:
        """The ids of the parameters that Adam updates."""
        return self._adam_ids

    def unreduced_parameters(self, step: int) -> frozenset[int]:
        """The ids of the parameters whose gradients the training loop leaves out of its all-reduce at step
        ``step``: :meth:`self_reduced_parameters` and, when Adam does not update after ``step``, Adam's (kept,
        and averaged with the next steps' at its update)."""
        reduced_later = frozenset() if self.adam_updates_after(step) else self._adam_ids
        return self.self_reduced_parameters() | reduced_later

    def groups(self) -> Iterator[dict]:
        """Every parameter group of every optimizer."""
        for opt in self.optimizers:
            yield from opt.param_groups

    def apply_schedule(self, step: int, schedule: ScheduleConfig) -> None:
        """Set ``lr = initial_lr * lr_factor(step)`` in every group (with the stage multipliers), and the
        Muon momentum (warm-up and cooldown) and Langevin noise σ_t
        (:func:`speedrun.optim.langevin.langevin_sigma`) of ``step`` in Muon's groups."""
        factor = lr_factor(step, schedule.steps, schedule.cooldown_frac, schedule.lr_floor,
                           schedule.lr_stage_multipliers)
        momentum = muon_momentum(step, schedule.momentum_warmup_steps, schedule.momentum_start,
                                 schedule.momentum_end, steps=schedule.steps,
                                 cooldown_steps=schedule.momentum_cooldown_steps)
        self.apply_values(step, factor, momentum, schedule)

    def apply_values(self, step: int, factor: float, momentum: float, schedule: ScheduleConfig) -> None:
        """Set ``lr = initial_lr * factor`` in every group, and ``momentum`` and the Langevin σ of ``step``
        (from ``schedule``) in Muon's groups: :meth:`apply_schedule` with the lr factor and momentum given
        (a staged schedule's, :class:`speedrun.optim.stages.StagedSchedule`)."""
        for group in self.groups():
            group["lr"] = group["initial_lr"] * factor
            if group["kind"] in MUON_KINDS:
                group["momentum"] = momentum
                group["langevin_sigma"] = langevin_sigma(step, schedule.steps, schedule.cooldown_frac,
                                                         group["langevin_noise"],
                                                         warmup_steps=schedule.langevin_warmup_steps,
                                                         end_step=schedule.langevin_end_step)

    def self_reduced_parameters(self) -> frozenset[int]:
        """The ids of the parameters whose gradients the optimizers average over ranks themselves (Muon's,
        when sharded): the training loop must leave them out of its own gradient all-reduce. Empty when
        nothing is sharded (single process, or ``shard_muon`` off)."""
        return frozenset(id(p) for opt in self.optimizers if isinstance(opt, Muon)
                         for p in opt.self_reduced_parameters())

    def copy_state(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Give ``target`` a copy of the optimizer state of ``source`` (e.g. Adam's moments when the
        embedding is untied from the head, record #53; shapes must match). Nothing when source has none."""
        for opt in self.optimizers:
            if source in opt.state:
                opt.state[target] = {k: v.clone() if torch.is_tensor(v) else v
                                     for k, v in opt.state[source].items()}

    def step(self, adam: bool = True) -> None:
        """One update of every optimizer, leaving out the Adams when ``adam`` is false
        (:meth:`adam_updates_after`)."""
        for opt in self.optimizers:
            if adam or not is_adam(opt):
                opt.step()

    def warm_up(self) -> None:
        """Compile what the optimizers compile before the timed run, changing nothing: Muon's bank directions
        (with its ``compile``) and CUDA kernels, cautious Adam's kernels (:meth:`speedrun.optim.muon.Muon.warm_up`,
        :meth:`speedrun.optim.adam.CautiousAdam.warm_up`)."""
        for opt in self.optimizers:
            warm_up = getattr(opt, "warm_up", None)
            if warm_up is not None:
                warm_up()

    def zero_grad(self, adam: bool = True) -> None:
        """Clear the gradients (set to None) of every optimizer's parameters; with ``adam`` false the Adams'
        are kept, to be summed with the next steps' (:meth:`adam_updates_after`)."""
        for opt in self.optimizers:
            if adam or not is_adam(opt):
                opt.zero_grad(set_to_none=True)


def split_parameters(model: nn.Module, kinds: Mapping[str, str]) -> dict[str, list[nn.Parameter]]:
    """Kind -> parameters, checking that ``kinds`` labels every trainable parameter once with a known kind.

    Raises ``ValueError`` naming a parameter without a kind, a kind name that is not a parameter, or an
    unknown kind.
    """
    named = dict(model.named_parameters())
    missing = sorted(n for n, p in named.items() if p.requires_grad and n not in kinds)
    extra = sorted(set(kinds) - set(named))
    if missing or extra:
        raise ValueError(f"parameters without an optimizer kind: {missing}; kinds of no parameter: {extra}")
    out: dict[str, list[nn.Parameter]] = {kind: [] for kind in ALL_ADAM_KINDS + MUON_KINDS}
    for name, kind in kinds.items():
        if kind not in out:
            raise ValueError(f"parameter {name!r} has unknown kind {kind!r}")
        out[kind].append(named[name])
    return out


def model_roles(model: nn.Module) -> dict[str, list[str]]:
    """Role -> parameter names as ``model.parameter_roles()`` gives them (counted there:
    :meth:`speedrun.model.gpt.GPT.parameter_roles`); empty for a model without that method."""
    declare = getattr(model, "parameter_roles", None)
    return {} if declare is None else dict(declare())


def check_roles(model: nn.Module, roles: Mapping[str, Sequence[str]]) -> None:
    """Raise ``ValueError`` when ``roles`` names a role outside :data:`speedrun.model.roles.PARAM_ROLES`, a
    name that is no parameter of ``model``, or one parameter in two roles."""
    unknown = sorted(set(roles) - set(PARAM_ROLES))
    named = dict(model.named_parameters())
    strays = sorted(n for names in roles.values() for n in names if n not in named)
    listed = [n for names in roles.values() for n in names]
    twice = sorted({n for n in listed if listed.count(n) > 1})
    if unknown or strays or twice:
        raise ValueError(f"parameter roles: unknown roles {unknown} (the roles are {', '.join(PARAM_ROLES)}); "
                         f"names of no parameter {strays}; parameters in two roles {twice}")


def muon_param_groups(model: nn.Module, matrices: list[nn.Parameter], config: OptimConfig,
                      roles: Mapping[str, Sequence[str]]) -> list[dict]:
    """Muon's parameter groups, in this order: every other matrix at ``muon_lr``; the MLP input matrices
    (role ``mlp_fc`` in ``roles``, role -> parameter names: :mod:`speedrun.model.roles`) at
    ``muon_lr * mlp_fc_lr_mul`` when that factor is not 1 (record #28, 2025-08-23 SparseAttnGate: 0.5); the
    MLP output matrices (role ``mlp_proj``) at ``muon_lr * mlp_proj_lr_mul`` when that factor is not 1
    (speedrun-spec.md 3.2); with ``muon_qk_block_heads`` h > 0, the attention's q and k matrices (role
    ``attention_qk``) at ``muon_lr`` in blocks of h heads' rows (the group's ``block_rows`` h·head_dim, the
    model's ``config.head_dim``; records #80-#89: head pairs). These are group lrs: Muon multiplies each
    matrix's (block's) step by its shape factor max(1, rows/cols)**0.5 on top
    (:func:`speedrun.optim.muon.muon_lr_multiplier`); each group keeps its factor as ``lr_mul``, which the
    cautious weight decay leaves out of its first lr, as the records do (:func:`speedrun.optim.muon.apply_update`). Empty groups are left out. Raises ``ValueError`` when a
    factor or the blocks apply and a parameter of its role is not among ``matrices``."""
    names = {id(p): n for n, p in model.named_parameters()}
    special: list[tuple[list[nn.Parameter], float, int | None]] = []
    qk_heads = config.muon_qk_block_heads
    qk_rows = qk_heads * model.config.head_dim if qk_heads else None
    for role, mul, block_rows in (("mlp_fc", config.mlp_fc_lr_mul, None),
                                  ("mlp_proj", config.mlp_proj_lr_mul, None), ("attention_qk", 1.0, qk_rows)):
        if mul == 1 and block_rows is None:
            continue
        members = set(roles.get(role, ()))
        chosen = [p for p in matrices if names[id(p)] in members]
        if len(chosen) != len(members):
            outside = sorted(members - {names[id(p)] for p in chosen})
            what = f"its lr factor {mul}" if block_rows is None else f"the blocks of {qk_heads} heads"
            raise ValueError(f"the parameters {outside} of role {role!r} are not Muon matrices, so {what} cannot "
                             f"apply to them")
        special.append((chosen, mul, block_rows))
    taken = {id(p) for ps, _, _ in special for p in ps}
    groups = [([p for p in matrices if id(p) not in taken], 1.0, None)] + special
    return [dict(params=ps, lr=config.muon_lr * mul, initial_lr=config.muon_lr * mul, kind="matrix", lr_mul=mul,
                 **({"block_rows": rows} if rows is not None else {}))
            for ps, mul, rows in groups if ps]


def optimizer_kinds(kinds: Mapping[str, str], config: OptimConfig,
                    roles: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """``kinds`` as the optimizers take them: with ``muon_attention_gates``, every parameter of role
    ``attention_gate`` in ``roles`` (role -> parameter names; the (H, 12) attention output gates, kind
    ``scalar`` or ``gate`` in :meth:`speedrun.model.gpt.GPT.parameter_kinds`) becomes ``matrix``, so that it
    trains with Muon at ``muon_lr`` as record #28's ``dampen`` weight does (2025-08-23 SparseAttnGate, its
    train_gpt.py: every 2-D parameter inside its blocks goes to Muon). Otherwise unchanged (a new dict
    either way). Raises ``ValueError`` when the switch is on and no parameter is an attention gate."""
    if not config.muon_attention_gates:
        return dict(kinds)
    gates = set(roles.get("attention_gate", ()))
    if not gates:
        raise ValueError("muon_attention_gates is on but the model has no attention gate (no parameter of role "
                         "'attention_gate')")
    return {name: "matrix" if name in gates else kind for name, kind in kinds.items()}


def adam_group(kind: str, params: list[nn.Parameter], config: OptimConfig) -> dict:
    """The Adam parameter group of ``kind``: ``lr`` (= ``initial_lr``) ``embed_lr``, ``head_lr``, ``scalar_lr``
    or, for a kind of :data:`speedrun.optim.config.RECORD_ADAM_KINDS`, ``adam_kind_lrs`` or the table's lr;
    ``betas`` ``adam_kind_betas``, else the table's, else ``adam_betas``; with a table kind, ``weight_decay``
    ``adam_weight_decay`` times its ``wd_mul`` (other groups take the optimizer's default), or times the kind's
    ``adam_kind_wd_mul`` where given (any kind); ``coptim`` the kind's ``adam_kind_coptim`` strength where it is
    set and not 0."""
    record = RECORD_ADAM_KINDS.get(kind)
    base = {"embed": config.embed_lr, "head": config.head_lr, "scalar": config.scalar_lr}
    lr = config.adam_kind_lrs.get(kind, record.lr) if record is not None else base[kind]
    betas = config.adam_kind_betas.get(kind, record.betas if record is not None else config.adam_betas)
    group = dict(params=params, lr=lr, initial_lr=lr, kind=kind, betas=tuple(betas))
    if config.adam_kind_coptim.get(kind):
        group["coptim"] = config.adam_kind_coptim[kind]                     # record #87, CautiousAdam
    if kind in config.adam_kind_wd_mul:
        group["weight_decay"] = config.adam_weight_decay * config.adam_kind_wd_mul[kind]
    elif record is not None:
        group["weight_decay"] = config.adam_weight_decay * record.wd_mul
    return group


def build_optimizers(model: nn.Module, kinds: Mapping[str, str], config: OptimConfig,
                     roles: Mapping[str, Sequence[str]] | None = None, compile_muon: bool = False) -> Optimizers:
    """AdamW (decay ``adam_weight_decay``) over the ``embed``/``head``/``scalar`` parameters and Muon (decay
    ``weight_decay``) over the ``matrix`` ones.

    ``kinds``: parameter name -> kind (e.g. ``model.parameter_kinds()``), re-mapped by
    :func:`optimizer_kinds` (``muon_attention_gates``). ``roles``: role -> parameter names, the parameters
    that ``muon_attention_gates``, ``mlp_fc_lr_mul`` and ``mlp_proj_lr_mul`` treat apart (None: the model's own,
    :func:`model_roles`; checked by :func:`check_roles`). Adam's ε is ``adam_eps`` in every Adam group; each
    Adam group's ``betas`` are ``adam_kind_betas[kind]`` where given, else ``adam_betas`` (the record's
    per-kind betas, speedrun-spec.md 3.3); the kinds of records #81-#89 as :func:`adam_group` gives them.
    Empty groups are left out. ``compile_muon``: Muon's bank directions under ``torch.compile`` (its
    ``compile``; the training loop's choice on CUDA with ``compile``; :meth:`Optimizers.warm_up` compiles them).
    Raises ``ValueError`` when a parameter has no kind, lands in no optimizer or in two, or goes to Muon without
    being 2-D.
    """
    roles = model_roles(model) if roles is None else roles
    check_roles(model, roles)
    by_kind = split_parameters(model, optimizer_kinds(kinds, config, roles))
    adam_groups = [adam_group(kind, by_kind[kind], config) for kind in ALL_ADAM_KINDS if by_kind[kind]]
    muon_groups = muon_param_groups(model, by_kind["matrix"], config, roles)
    device = next(model.parameters()).device
    optimizers: list[torch.optim.Optimizer] = []
    if adam_groups:
        optimizers.append(build_adamw(adam_groups, config.adam_betas, config.adam_eps, config.adam_weight_decay,
                                      fused=device.type == "cuda",
                                      cautious_weight_decay=config.cautious_weight_decay))
    if muon_groups:
        optimizers.append(Muon(muon_groups, lr=config.muon_lr, momentum=config.muon_momentum,
                               weight_decay=config.weight_decay, orthogonalizer=config.orthogonalizer,
                               normuon_beta2=config.normuon_beta2,
                               cautious_weight_decay=config.cautious_weight_decay,
                               langevin_noise=config.langevin_noise, langevin_seed=config.langevin_seed,
                               shard=config.shard_muon, momentum_form=config.muon_momentum_form,
                               compile=compile_muon))
    seen = [id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]]
    trainable = [id(p) for p in model.parameters() if p.requires_grad]
    if sorted(seen) != sorted(trainable):
        raise ValueError("every trainable parameter must land in exactly one optimizer group")
    return Optimizers(optimizers, adam_every=config.adam_every)
