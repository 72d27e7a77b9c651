"""The optimizers' settings as plain data (no torch import, so that the workflow can check a config at
planning time): :class:`OptimConfig`, :class:`LrMomentumSchedule`, :class:`ScheduleConfig` and the
orthogonalizer names.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, Mapping, get_args

Orthogonalizer = Literal["newton_schulz", "polar_express"]
ORTHOGONALIZERS: tuple[str, ...] = get_args(Orthogonalizer)
MomentumForm = Literal["ema", "sgd"]
MOMENTUM_FORMS: tuple[str, ...] = get_args(MomentumForm)
# The units of a gradient: of our mean loss, or of the records' loss summed over a micro-batch's tokens
# (OptimConfig.loss_units, OptimConfig.adam_eps_units).
LossUnits = Literal["mean_loss", "micro_batch_sum"]
LOSS_UNITS: tuple[str, ...] = get_args(LossUnits)
AdamEpsUnits = LossUnits
ADAM_EPS_UNITS = LOSS_UNITS


@dataclass(frozen=True)
class AdamKind:
    """The Adam settings of one parameter kind of records #81-#89: ``lr`` (record #88's base 0.008 times the
    parameter's lr_mul), ``betas``, ``wd_mul`` (times ``adam_weight_decay``)."""

    lr: float
    betas: tuple[float, float]
    wd_mul: float


# Record #88's param_table and HEAD's (speedrun-spec.md 3.3): "lambda" its post_lambdas, x0_lambdas,
# bigram_lambdas and xsa_alphas; "resid_lambda" its resid_lambdas; "skip_gate" record #88's skip_gate;
# "gate" its attn_gate_bank and ve_gate_bank; "smear_gate" its smear_gate; "mudd"/"mudd_bias" its mudd_w1,
# mudd_w2 / mudd_b2; "mudd_gate"/"mudd_gate_bias" HEAD's mudd_gate_w1, mudd_gate_w2 / mudd_gate_b2,
# _mudd_gate_scale.
RECORD_ADAM_KINDS: dict[str, AdamKind] = {
    "gate": AdamKind(0.008, (0.9, 0.99), 1.0),
    "smear_gate": AdamKind(0.00008, (0.9, 0.99), 0.0),
    "lambda": AdamKind(0.008, (0.9, 0.95), 0.0),
    "resid_lambda": AdamKind(0.04, (0.9, 0.95), 0.0),
    "skip_gate": AdamKind(0.0004, (0.9, 0.99), 0.0),
    "mudd": AdamKind(0.002, (0.9, 0.99), 1.0),
    "mudd_bias": AdamKind(0.002, (0.9, 0.99), 0.0),
    "mudd_gate": AdamKind(0.0008, (0.9, 0.99), 1.0),
    "mudd_gate_bias": AdamKind(0.0008, (0.9, 0.99), 0.0),
}
# the parameter kinds that train with Adam whose settings a training config names (lrs, betas), and all of them
ADAM_KINDS: tuple[str, ...] = ("embed", "head", "scalar")
ALL_ADAM_KINDS: tuple[str, ...] = (*ADAM_KINDS, *RECORD_ADAM_KINDS)


@dataclass(frozen=True)
class OptimConfig:
    """Learning rates and hyperparameters of both optimizers (see :mod:`speedrun.optim.muon`): Adam for the
    embeddings, the head and the scalars (by parameter kind, :data:`ADAM_KINDS`), Muon for the hidden matrices.
    These are the training settings of the same names (config.yaml ``train``; ``langevin_seed`` is set per run).
    """

    embed_lr: float = 0.6
    """Adam lr of kind ``embed``: the value embeddings, the bigram table, the token embedding once untied."""
    head_lr: float = 0.008
    """Adam lr of kind ``head``: lm_head and the token embedding while tied."""
    scalar_lr: float = 0.04
    """Adam lr of kind ``scalar``: the scalars and gates."""
    adam_betas: tuple[float, float] = (0.8, 0.95)
    """Adam's (β1, β2), each in [0, 1), for every kind that ``adam_kind_betas`` does not name."""
    adam_eps: float = 1e-10
    """Adam's ε (> 0), in the units of the gradients, i.e. of the mean loss (nats/token). Record #28 has ε
    1e-10 on a loss summed over each rank's micro-batches and averaged over the ranks: on W GPUs of its
    393,216-token steps the same ε here is 1e-10·W/393216 (2.54e-16 on one GPU with 8 accumulation steps, as
    the one-H200 race; 2.03e-15 on its 8 GPUs)."""
    adam_eps_units: AdamEpsUnits = "mean_loss"
    """What ``adam_eps`` is measured against. ``"mean_loss"``: the gradient of our mean loss over the step's
    tokens. ``"micro_batch_sum"``: the records' gradient, of their loss summed over one micro-batch's tokens
    (records #83-#89 and HEAD: ``loss.sum() * grad_scale``, 1/8 of 8 micro-batches on 8 GPUs or on one;
    ``adam_eps`` then takes their 1e-10 as written). Where these units are not ``loss_units`` the training loop
    converts ε at every step s (:meth:`speedrun.training.config.TrainConfig.adam_eps_at`): with ``loss_units``
    mean_loss, ε is ``adam_eps · micro_batches / tokens_per_step(s)``, so one value covers every stage of a
    batch-size schedule (1e-10 is 6.1e-15 on 131,072-token steps, 3.05e-15 on 262,144, 2.03e-15 on 393,216 of
    8 micro-batches). Every Adam group of those records has the same ε (their ``adam_defaults``; no per-kind
    ε), as here."""
    loss_units: LossUnits = "mean_loss"
    """What the backward pass differentiates, and so the units of every gradient the optimizers see (the
    logged loss is the mean either way). ``"mean_loss"``: the mean loss over the step's tokens.
    ``"micro_batch_sum"``: the records' objective (records #83-#89 and HEAD: ``model(...).sum() * grad_scale``,
    each micro-batch's loss summed over its tokens, divided by the micro-batches of the step), whose gradients
    are ``tokens_per_step(s) / micro_batches`` times ours. The two train alike while the micro-batch keeps
    its size; where a batch-size stage grows it (records #83-#89: 131,072 -> 262,144 -> 393,216 tokens per
    step), the records' gradients grow with it: Adam's first moment catches up within about 1 / (1 - β1) of
    its updates and its second within about 1 / (1 - β2), so its steps are larger for a while after each stage
    start (the scalars' β2 0.99: about 100 updates); Muon's momentum weighs the two stages' gradients by their
    size; and Adam's gradients kept over ``adam_every`` steps are weighted by those steps' tokens (a stage that
    starts on a step without an Adam update). Only the training loop reads it
    (:meth:`speedrun.training.config.TrainConfig.loss_scale_at`)."""
    adam_every: int = 1
    """Adam updates once every ``adam_every`` optimizer steps (>= 1): after the 0-based steps s with
    (s + 1) % adam_every == 0, on the sum of the gradients of the steps since its last update (they are kept,
    not cleared, in between, and averaged over the ranks only when Adam updates); Muon updates at every step.
    Adam's step count (its bias correction) counts its updates. Record #39 and every record since (through HEAD,
    speedrun-spec.md 3.3: "Adam params are stepped only on odd steps"): 2. 1: every step. Where the tokens per
    step change between the kept steps (a stage start on an odd step), the records' summed loss weighs their
    gradients by their steps' tokens: so does ``loss_units`` micro_batch_sum; mean_loss weighs them alike."""
    adam_kind_betas: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """Adam kind (:data:`ADAM_KINDS`) -> its group's (β1, β2), in place of ``adam_betas``; empty:
    ``adam_betas`` everywhere. The current record (speedrun-spec.md 3.3, its per-parameter table) maps to
    ``{head: (0.5, 0.95), embed: (0.75, 0.95), scalar: (0.9, 0.99)}``: its lm_head and token embedding have
    (0.5, 0.95) (ours, while tied and after the untie step, is of kind ``head``; untied from the start it is of
    kind ``embed`` and gets the value and bigram tables' (0.75, 0.95)); its resid and post lambdas have (0.9,
    0.95), ours share the scalar group."""
    adam_kind_wd_mul: Mapping[str, float] = field(default_factory=dict)
    """Adam kind (:data:`ALL_ADAM_KINDS`) -> weight-decay multiplier >= 0: the group's decay is ``adam_weight_decay``
    times it, in place of :data:`RECORD_ADAM_KINDS`' ``wd_mul`` (and of 1 for ``embed``, ``head``, ``scalar``).
    Records #83-#89's param_table: lm_head and embed 150 (our ``head``: the head and the tied or untied token
    embedding), value and bigram tables 5 (``embed``), scalars 0 (``scalar``)."""
    adam_kind_coptim: Mapping[str, float] = field(default_factory=dict)
    """Adam kind (:data:`ALL_ADAM_KINDS`) -> C-Optim strength s in [0, 1] (record #87, 2026-06-11
    RecursiveFromBest: 0.5 on its value-embedding and bigram tables, our kind ``embed``, which it never unties
    from the head); absent: 0. Adam's step u of such a group becomes ``(1 - s)·u + s·u·keep / mean(keep)``,
    keep = [u·g > 0] the coordinates where the step agrees in sign with the gradient and the mean over the
    whole tensor (clamped to >= 1e-3), before the cautious decay's mask (:class:`speedrun.optim.adam.
    CautiousAdam`; the record takes the mean over each GPU's shard of the tensor). Needs
    ``cautious_weight_decay``."""
    adam_kind_lrs: Mapping[str, float] = field(default_factory=dict)
    """Adam kind -> lr, for the kinds of :data:`RECORD_ADAM_KINDS` (the records' sublayer-form lambdas, gates and
    MUDD weights; their lr in that table when not given); ``embed``, ``head``, ``scalar`` take ``embed_lr``,
    ``head_lr``, ``scalar_lr``. Those kinds' betas default to the table's (``adam_kind_betas`` overrides them too)
    and their weight decay is ``adam_weight_decay`` times the table's ``wd_mul`` (1 for the other kinds)."""
    muon_lr: float = 0.05
    """Muon's lr of the hidden matrices."""
    muon_momentum: float = 0.95
    """Muon's momentum, in [0, 1), reached after the schedule's warm-up from 0.85 (speedrun-spec.md 3.5)."""
    weight_decay: float = 0.0
    """Muon's weight decay (speedrun-spec.md 3.2: 1.2), scaled with the group lr."""
    adam_weight_decay: float = 0.0
    """Adam's weight decay (speedrun-spec.md 3.3: 0.005), separate since both are tuned apart."""
    orthogonalizer: Orthogonalizer = "polar_express"
    """How Muon orthogonalizes its update (:mod:`speedrun.optim.orthogonalize`)."""
    normuon_beta2: float | None = None
    """None for plain Muon, else NorMuon's variance normalization, in [0, 1) (records #41-#48: 0.9)."""
    cautious_weight_decay: bool = False
    """Cautious decay in Muon (record #43) and Adam (record #50) instead of decoupled decay."""
    langevin_noise: float = 0.0
    """σ of Muon's annealed Langevin noise (record 2026-06-11; 0 is off; :mod:`speedrun.optim.langevin`)."""
    langevin_warmup_steps: int = 0
    """Steps over which the Langevin σ_t is also multiplied by step / langevin_warmup_steps (record #87's
    ``NORMUON_NOISE_WARMUP``: 50; 0: none)."""
    langevin_end_frac: float | None = None
    """Where σ_t reaches 0: null, at the lr cooldown's start (ours); a fraction f in (0, 1], at step
    int(f · scheduled steps), a staged schedule's ``scheduled_steps`` or else ``steps`` (record #87's
    ``NORMUON_NOISE_END_FRAC``: 0.25 of its 1387, step 346)."""
    langevin_seed: int = 0
    """Seed of the Langevin noise: each seed of a multi-seed run gets its own (``speedrun train``: the run's
    seed). Not a training setting."""
    shard_muon: bool = True
    """Shard Muon's update over the ranks when torch.distributed runs with world size > 1 (speedrun-spec.md
    3.4: reduce-scatter, update, all-gather); Muon then averages its gradients itself
    (:meth:`speedrun.optim.groups.Optimizers.self_reduced_parameters`)."""
    mlp_proj_lr_mul: float = 1.0
    """Muon's lr of the MLP output matrices is ``muon_lr`` times this (the record: 4, speedrun-spec.md 3.2: it
    stores them as (4C, C), shape factor 2, and doubles that; ours are (C, 4C), shape factor 1)."""
    mlp_fc_lr_mul: float = 1.0
    """The same for the MLP input matrices: their group lr is ``muon_lr`` times this, and Muon's shape factor
    max(1, rows/cols)**0.5 still applies on top (2 for our (4C, C) nn.Linear layout). Record #28 (2025-08-23
    SparseAttnGate, its train_gpt.py) stores c_fc as (C, 4C), shape factor 1: 0.5 reproduces its step. Muon's
    decoupled weight decay scales with the group lr too (record #28 has none)."""
    muon_attention_gates: bool = False
    """The attention output gates' (H, 12) weights (kind ``scalar``) go to Muon at ``muon_lr`` instead of
    Adam's scalar group, as record #28's ``dampen`` (a 2-D weight inside its blocks, hence Muon's); needs a
    model with attention gates."""
    muon_qk_block_heads: int = 0
    """Muon updates each attention's q and k matrices (H·Dh, C) in blocks of this many heads' rows, each
    block orthogonalized, normalized (NorMuon) and decayed on its own (the group's ``block_rows``,
    :mod:`speedrun.optim.muon`); 0: whole matrices. Record #80 and every record since (#83-#89, HEAD: their
    ``qk_bank`` of (256, 768) head-pair blocks, speedrun-spec.md 3.2 "Groups"): 2. Must divide n_head."""
    muon_momentum_form: MomentumForm = "ema"
    """Muon's momentum buffer: ``"ema"`` (buf = β·buf + (1-β)·G, Nesterov direction lerp(G, buf, β): the
    records since #17) or ``"sgd"`` (buf = β·buf + G, Nesterov direction G + β·buf: record #12, 2024-11-19
    FlexAttention, and the records before it; :func:`speedrun.optim.muon.sgd_momentum`). With a constant β
    the two directions differ by the factor 1-β, which the orthogonalization removes; while β warms up they
    weigh past gradients differently."""


@dataclass(frozen=True)
class LrMomentumSchedule:
    """The shape of the lr factor and of Muon's momentum over the steps (:func:`speedrun.optim.schedules.lr_factor`,
    :func:`~speedrun.optim.schedules.muon_momentum`), as a training config sets them: the one declaration of
    these settings, extended by the training's schedule section
    (:class:`speedrun.training.config.ScheduleSettings`) and by a run's :class:`ScheduleConfig`."""

    lr_stage_multipliers: tuple[float, ...] = ()
    """Every base lr times the multiplier of its equal stage of the steps (the record's 1.0, 1.52, 1.73 with
    its three batch-size stages, speedrun-spec.md 3.5; empty: 1.0 throughout), until the cooldown."""
    cooldown_frac: float = 0.4
    """Over the last ``cooldown_frac`` of the steps the lr goes linearly from the stage's multiplier down to
    ``lr_floor`` (the record: 0.6)."""
    lr_floor: float = 0.0
    """The lr factor at the end of the cooldown, absolute, not scaled by the stage (the record: 0.15)."""
    momentum_warmup_steps: int = 300
    """Steps over which Muon's momentum rises from 0.85 to ``muon_momentum`` (the record: 300)."""
    momentum_cooldown_steps: int = 0
    """Last steps over which Muon's momentum falls back to 0.85 (the record: 50; 0: no cooldown)."""


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig(LrMomentumSchedule):
    """The step schedules of one run (see :mod:`speedrun.optim.schedules`): the settings of
    :class:`LrMomentumSchedule` over the run's ``steps``, Muon's momentum going from ``momentum_start`` to
    ``momentum_end`` and back, and the Langevin noise's warm-up ``langevin_warmup_steps`` and the step
    ``langevin_end_step`` where it reaches 0 (None: the cooldown's start;
    :func:`speedrun.optim.langevin.langevin_sigma`). :meth:`of` builds it from a config's settings."""

    steps: int
    """The run's optimizer steps."""
    momentum_start: float = 0.85
    """Muon's momentum at step 0 and at the end of its cooldown."""
    momentum_end: float = 0.95
    """Muon's momentum after the warm-up (the training's ``muon_momentum``)."""
    langevin_warmup_steps: int = 0
    """Steps over which the Langevin noise's σ ramps up from 0 (record #87: 50)."""
    langevin_end_step: int | None = None
    """The step where the Langevin noise reaches 0 (None: the cooldown's start; record #87: 346)."""

    @classmethod
    def of(cls, settings: LrMomentumSchedule, **run: Any) -> ScheduleConfig:
        """The fields of :class:`LrMomentumSchedule` read from ``settings`` (one, or an extension such as
        :class:`speedrun.training.config.ScheduleSettings`) with ``run``: ``steps`` and the momentum's ends."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(LrMomentumSchedule)}, **run)
