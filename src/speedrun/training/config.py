"""The settings of ``speedrun train`` (config.yaml ``train`` with a variant's overrides): :class:`TrainConfig`,
its validation, and the ``--config`` argument that carries it (a JSON object or a JSON/YAML file).

In config.yaml and on the command line the settings are one flat mapping (``train.muon_lr``); in the code
they are grouped into typed sections: the run's sizes on :class:`TrainConfig` itself, ``optimizer``
(:class:`speedrun.optim.config.OptimConfig`, the one declaration of the optimizers' settings), ``schedule``
(:class:`ScheduleSettings`), ``evaluation`` (:class:`EvalSettings`) and ``compute`` (:class:`ComputeSettings`).
Each field is documented once, where it is declared, and its default is there (the workflow's schema
documents and validates the same keys without defaults: tests/test_train_config.py checks that they
correspond). :meth:`TrainConfig.from_dict` and :meth:`TrainConfig.settings` map between the two forms.

Every check runs once, when the config is built, and raises :class:`speedrun.errors.SpeedrunError` naming the
setting (``train.<name>``), the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, get_args

from speedrun.data.loader import TRAIN_BATCHES, TrainBatchesKind
from speedrun.errors import SpeedrunError, did_you_mean, number_text_hint
from speedrun.model.config import PRESETS, GPTConfig, build_model_config
from speedrun.optim.config import (ADAM_EPS_UNITS, ALL_ADAM_KINDS, LOSS_UNITS, MOMENTUM_FORMS, ORTHOGONALIZERS,
                                   RECORD_ADAM_KINDS, LrMomentumSchedule, OptimConfig, ScheduleConfig)
from speedrun.optim.schedules import batch_stages, stage_index, stage_starts, window_blocks
from speedrun.optim.stages import StagedSchedule, record_schedule

DeviceChoice = Literal["cpu", "cuda", "auto"]
ComputeDtype = Literal["auto", "float32", "bfloat16"]
WeightDtype = Literal["float32", "bfloat16", "bfloat16_embeddings"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"]
WindowStageSpan = Literal["steps", "steps_plus_one"]


@dataclass(frozen=True)
class ScheduleSettings(LrMomentumSchedule):
    """What changes over the steps: the learning rates and Muon's momentum (the fields of
    :class:`speedrun.optim.config.LrMomentumSchedule`, declared there), the batch size, the attention windows
    and the untying of the embedding. Each schedule of equal stages splits the steps into as many equal parts
    (:func:`speedrun.optim.schedules.stage_index`); ``staged_schedule`` gives stages of their own durations
    instead."""

    batch_schedule: tuple[tuple[int, int], ...] = ()
    """Batch-size schedule (records #46, #72): one ``[tokens_per_step, max_seq_len]`` pair per equal stage of
    the steps, replacing ``tokens_per_step`` and ``max_seq_len`` (empty: constant)."""
    window_schedule: tuple[tuple[int, int], ...] = ()
    """Attention windows (:func:`speedrun.optim.schedules.window_blocks`, records #13, #31, #33): one
    ``[short, long]`` pair of windows in blocks per equal stage of the steps, short <= long (empty: the
    model's fixed windows); needs the model's ``window_pattern``. More stages than steps are accepted: a
    smoke run (a few steps of a full config) skips the later ones."""
    final_window_long_blocks: int | None = None
    """The long window, in blocks, at the final validation (null: unchanged); at least that validation's short
    window; needs the model's ``window_pattern``."""
    final_window_short_blocks: int | None = None
    """The short window, in blocks, at the final validation (null: that of the last step's stage, else the
    model's; record #31: 13 // 2 = 6 with its final long window 13); at most that validation's long window;
    needs the model's ``window_pattern``."""
    window_stage_span: WindowStageSpan = "steps"
    """How ``window_schedule`` splits the steps: ``steps`` (equal stages of the steps,
    :func:`speedrun.optim.schedules.stage_index`) or ``steps_plus_one`` (record #31's get_ws: step s < steps
    is in stage ``int(n·s / (steps + 1))`` of n; for 1670 steps the third stage starts at 1114, not 1113);
    the final validation takes the last stage's windows either way (:meth:`TrainConfig.window_blocks_at`,
    :meth:`TrainConfig.window_stage_starts`)."""
    untie_step: int | None = None
    """With the model's ``tie_embed_head``, the step at which the embedding is untied from the head and
    inherits its Adam state (record #53: 2/3 of the steps; null: tied throughout; at ``steps`` or later:
    never untied, as in a smoke run, the optimizer steps being 0 to steps - 1)."""
    staged_schedule: StagedSchedule | None = None
    """A record-style staged schedule (:class:`speedrun.optim.stages.StagedSchedule`; written as its
    ``from_dict`` mapping, or ``{record: <name>, scheduled_steps: N, extension_steps: M}`` for a record's
    stages over other step counts). When set it gives the steps (``total_steps``), the batch and windows per
    stage, the final validation's window (no YaRN rescale there, as the record), the lr factor, Muon's
    momentum, the untie step and the multi-token / prefix-token loss weights per step, in place of the flat
    settings of :data:`STAGED_REPLACES` (null: those flat settings)."""


@dataclass(frozen=True)
class EvalSettings:
    """The validation: ``val_tokens`` tokens of the validation shard in chunks of ``val_batch_tokens`` per
    rank, at step 0, every ``val_every`` steps and at the last step (speedrun-spec.md 1.4)."""

    val_tokens: int = 32768
    """Validation tokens, from the start of the validation shard (the public metric: 10,485,760); a multiple
    of ``val_batch_tokens`` x ``world_size``."""
    val_batch_tokens: int = 1024
    """Validation tokens per forward pass per rank."""
    val_every: int = 20
    """Validate every this many steps, besides step 0 and the last step (0: only those two)."""


@dataclass(frozen=True)
class ComputeSettings:
    """Where and how the matrix products run."""

    device: DeviceChoice = "cpu"
    """``cpu``, ``cuda``, or ``auto`` (CUDA when torch sees a GPU)."""
    dtype: ComputeDtype = "auto"
    """Autocast dtype of the matrix products (``float32`` disables autocast); ``auto`` is ``bfloat16`` on CUDA
    and ``float32`` on a CPU (:func:`resolve_dtype`), resolved once the device is (:meth:`TrainConfig.
    resolved_for`)."""
    weight_dtype: WeightDtype = "float32"
    """Storage dtype of the weights (:meth:`speedrun.model.gpt.GPT.store_weights`): ``float32``; ``bfloat16``
    as records #57-#89 and HEAD store theirs (the matrices, embedding tables, head, gates and MUDD weights in
    bf16, the scalars and lambdas fp32; the residual stream and those weights' gradients then bf16; Muon
    updates the fp32 weight kept as bf16 plus its lower 16 bits, :mod:`speedrun.optim.precision`; Adam rounds
    each new weight once to bf16); or ``bfloat16_embeddings``, the embedding tables only (kind ``embed``), as
    records #12 and #31 (the residual stream bf16 too). Either bf16 setting needs the matrix products in bf16:
    with ``dtype: auto`` on a CPU, where they run in fp32, the weights stay fp32 (:meth:`TrainConfig.
    resolved_for`), and with ``dtype: float32`` it is refused. Adam's moments are fp32 in
    :class:`speedrun.optim.adam.CautiousAdam` (``cautious_weight_decay``, records #50-#89) and in the weights'
    dtype in torch's AdamW, as in the records' own Adams before #50."""
    compile: bool = False
    """``torch.compile`` the model: one static-shape graph per batch shape and window setting, all compiled in
    the untimed warm-up."""
    compile_mode: CompileMode = "default"
    """The ``torch.compile`` mode: ``default`` as in the public records (their rules ban other compile flags);
    ``reduce-overhead`` replays CUDA graphs, ``max-autotune-no-cudagraphs`` tunes the matrix products (longer
    compile): for measuring, not for record runs."""


# The flat settings a staged_schedule replaces: giving one of them besides it is refused (TrainConfig.from_dict).
STAGED_REPLACES = ("steps", "tokens_per_step", "max_seq_len", "batch_schedule", "window_schedule",
                   "lr_stage_multipliers", "cooldown_frac", "lr_floor", "momentum_warmup_steps",
                   "momentum_cooldown_steps", "untie_step", "final_window_long_blocks", "final_window_short_blocks",
                   "window_stage_span")
STAGED = "train.staged_schedule"

# The sections of TrainConfig, by field name; a flat setting's section is the one that declares it.
SECTIONS: dict[str, type] = {"optimizer": OptimConfig, "schedule": ScheduleSettings, "evaluation": EvalSettings,
                             "compute": ComputeSettings}
# Fields of a section that are not training settings: set per run (OptimConfig.langevin_seed: the run's seed).
PER_RUN_FIELDS = frozenset({"langevin_seed"})


@dataclass(frozen=True)
class TrainConfig:
    """The training settings of one variant (config.yaml ``train`` with the variant's overrides), in typed
    sections (module docstring); build it from the flat settings with :meth:`from_dict`.

    Raises :class:`SpeedrunError` naming the setting on a wrong type or value, on a batch that does not
    divide: micro_batches % world_size, tokens_per_step % micro_batches, val_tokens % (val_batch_tokens *
    world_size), on a ``model.rotary_positions`` below :meth:`rotary_positions`, on a ``batch_schedule`` with
    more stages than ``steps``, on a ``window_schedule`` stage whose short window exceeds its long one and on a
    ``final_window_long_blocks`` below the final validation's short window (:meth:`window_blocks_at`). A
    ``window_schedule`` with more stages than ``steps`` or an ``untie_step`` >= ``steps`` is accepted: a smoke
    run (a few steps of a full config) skips those stages and never unties.
    """

    preset: str = "tiny"
    """Model preset (:data:`speedrun.model.config.PRESETS`)."""
    model: Mapping[str, Any] = field(default_factory=dict)
    """Overrides of the preset (:class:`speedrun.model.config.GPTConfig` fields); the rotary tables are sized
    to the run unless it sets ``rotary_positions`` (:meth:`model_config`)."""
    steps: int = 60
    """Optimizer steps."""
    tokens_per_step: int = 4096
    """Tokens of one optimizer step over all ranks, whatever the world size."""
    micro_batches: int = 4
    """Forward passes per step over all ranks (gradient accumulation: micro_batches / world_size each)."""
    max_seq_len: int = 1024
    """Longest document in a batch, in tokens; longer ones are cut."""
    train_batches: TrainBatchesKind = "bos_aligned"
    """How the training micro-batches are read from the train shards (:mod:`speedrun.data.loader`):
    ``bos_aligned``, each starts at a document start and documents are cut at ``max_seq_len`` (record #26 on);
    ``contiguous``, consecutive slices of the token stream, whatever the document boundaries (the records
    before #26: record #12, 2024-11-19 FlexAttention, reads its 64K-token sequences so); no document is cut,
    so ``max_seq_len`` must be at least every stage's tokens per micro-batch."""
    world_size: int = 1
    """Processes of the run (torchrun's); it must divide ``micro_batches``."""
    optimizer: OptimConfig = field(default_factory=OptimConfig)
    """The optimizers' learning rates and hyperparameters (:class:`speedrun.optim.config.OptimConfig`)."""
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)
    """What changes over the steps (:class:`ScheduleSettings`)."""
    evaluation: EvalSettings = field(default_factory=EvalSettings)
    """The validation (:class:`EvalSettings`)."""
    compute: ComputeSettings = field(default_factory=ComputeSettings)
    """Device, dtype and compilation (:class:`ComputeSettings`)."""

    @classmethod
    def setting_names(cls) -> dict[str, str | None]:
        """Every training setting (a key of config.yaml ``train``, flat) -> the section that holds it (None:
        :class:`TrainConfig` itself), in declaration order."""
        names: dict[str, str | None] = {}
        for f in dataclasses.fields(cls):
            if f.name in SECTIONS:
                names.update({g.name: f.name for g in dataclasses.fields(SECTIONS[f.name])
                              if g.name not in PER_RUN_FIELDS})
            else:
                names[f.name] = None
        return names

    def setting(self, name: str) -> Any:
        """The value of the flat setting ``name`` (a key of :meth:`setting_names`)."""
        section = self.setting_names()[name]
        return getattr(self if section is None else getattr(self, section), name)

    def settings(self) -> dict[str, Any]:
        """Every setting, flat (the form of config.yaml ``train`` and of ``--config``)."""
        settings = {name: self.setting(name) for name in self.setting_names()}
        if self.schedule.staged_schedule is not None:
            settings["staged_schedule"] = self.schedule.staged_schedule.to_dict()
        return settings

    def __post_init__(self) -> None:
        for name in ("steps", "tokens_per_step", "micro_batches", "max_seq_len", "val_tokens",
                     "val_batch_tokens", "world_size"):
            _check_int(name, self.setting(name), 1)
        _check_int("val_every", self.evaluation.val_every, 0)
        _check_int("momentum_warmup_steps", self.schedule.momentum_warmup_steps, 0)
        _check_int("momentum_cooldown_steps", self.schedule.momentum_cooldown_steps, 0)
        _check_int("adam_every", self.optimizer.adam_every, 1)
        _check_int("muon_qk_block_heads", self.optimizer.muon_qk_block_heads, 0)
        for name in ("embed_lr", "head_lr", "scalar_lr", "muon_lr", "weight_decay", "adam_weight_decay",
                     "langevin_noise", "mlp_proj_lr_mul", "mlp_fc_lr_mul"):
            _check_number(name, self.setting(name), 0.0, math.inf)
        for name in ("cooldown_frac", "lr_floor"):
            _check_number(name, self.setting(name), 0.0, 1.0)
        _check_number("muon_momentum", self.optimizer.muon_momentum, 0.0, 1.0, open_high=True)
        if not isinstance(self.schedule.lr_stage_multipliers, tuple):
            raise SpeedrunError(f"train.lr_stage_multipliers must be a list of numbers, one per equal stage of "
                                f"the steps, got {_written(self.schedule.lr_stage_multipliers)}")
        for multiplier in self.schedule.lr_stage_multipliers:
            _check_number("lr_stage_multipliers", multiplier, 0.0, math.inf)
        if not isinstance(self.optimizer.adam_betas, tuple) or len(self.optimizer.adam_betas) != 2:
            raise SpeedrunError(f"train.adam_betas must be a pair [beta1, beta2], "
                                f"got {_written(self.optimizer.adam_betas)}")
        for beta in self.optimizer.adam_betas:
            _check_number("adam_betas", beta, 0.0, 1.0, open_high=True)
        self._check_adam_kind_betas()
        ok = isinstance(self.optimizer.adam_eps, (int, float)) and not isinstance(self.optimizer.adam_eps, bool)
        if not ok or not 0.0 < self.optimizer.adam_eps < math.inf:
            raise SpeedrunError(f"train.adam_eps must be a finite number > 0 (Adam's ε), "
                                f"got {self.optimizer.adam_eps!r}"
                                f"{number_text_hint(self.optimizer.adam_eps)}")
        for name in ("compile", "cautious_weight_decay", "shard_muon", "muon_attention_gates"):
            if not isinstance(self.setting(name), bool):
                raise SpeedrunError(f"train.{name} must be true or false, got {self.setting(name)!r}")
        if self.optimizer.normuon_beta2 is not None:
            _check_number("normuon_beta2", self.optimizer.normuon_beta2, 0.0, 1.0, open_high=True)
        _check_choice("preset", self.preset, tuple(PRESETS))
        _check_choice("train_batches", self.train_batches, TRAIN_BATCHES)
        _check_choice("device", self.compute.device, get_args(DeviceChoice))
        _check_choice("dtype", self.compute.dtype, get_args(ComputeDtype))
        self._check_weight_dtype()
        _check_choice("compile_mode", self.compute.compile_mode, get_args(CompileMode))
        _check_choice("orthogonalizer", self.optimizer.orthogonalizer, ORTHOGONALIZERS)
        _check_choice("muon_momentum_form", self.optimizer.muon_momentum_form, MOMENTUM_FORMS)
        _check_choice("adam_eps_units", self.optimizer.adam_eps_units, ADAM_EPS_UNITS)
        _check_choice("loss_units", self.optimizer.loss_units, LOSS_UNITS)
        self._check_record87_optimizer()
        _check_choice("window_stage_span", self.schedule.window_stage_span, get_args(WindowStageSpan))
        if not isinstance(self.model, Mapping):
            raise SpeedrunError(f"train.model must be a mapping of model settings, got {self.model!r}")
        self._check_device()
        if self.optimizer.muon_attention_gates and not self._preset_model().attention_gate_layers:
            raise SpeedrunError("train.muon_attention_gates needs a model with attention gates "
                                "(model.attention_gate_layers is empty)")
        heads = self.optimizer.muon_qk_block_heads
        if heads and self._preset_model().n_head % heads:
            raise SpeedrunError(f"train.muon_qk_block_heads {heads} must divide the model's n_head "
                                f"{self._preset_model().n_head} (Muon's q and k blocks are whole heads)")
        self._check_schedules()
        self._check_staged()
        self._check_divisions()
        self._check_rotary_positions()

    def _preset_model(self) -> GPTConfig:
        """``preset`` with the ``model`` overrides as written (for the checks made before the batch sizes)."""
        return build_model_config(self.preset, self.model)

    def _check_device(self) -> None:
        backend = self._preset_model().attention_backend
        if self.compute.device == "cpu" and backend in ("flex", "varlen", "fa3", "fa4"):
            raise SpeedrunError(f"train.model.attention_backend {backend!r} trains on CUDA only (it has no CPU "
                                f"kernel with a backward), and train.device is 'cpu': set train.device: cuda, or "
                                f"train.model: {{attention_backend: sdpa_docs}} (or auto) on a CPU")

    def _check_weight_dtype(self) -> None:
        """``weight_dtype`` is a :data:`WeightDtype`; a bf16 one needs bf16 matrix products (not ``dtype:
        float32``)."""
        weights = self.compute.weight_dtype
        _check_choice("weight_dtype", weights, get_args(WeightDtype))
        if weights != "float32" and self.compute.dtype == "float32":
            raise SpeedrunError(f"train.weight_dtype {weights} needs the matrix products in bf16, and train.dtype "
                                f"is float32: set train.dtype: bfloat16 (or auto), or train.weight_dtype: float32")

    def _check_adam_kind_betas(self) -> None:
        """``adam_kind_betas`` maps Adam kinds (:data:`ALL_ADAM_KINDS`) to [beta1, beta2] pairs and
        ``adam_kind_lrs`` the records' kinds (:data:`RECORD_ADAM_KINDS`) to lrs >= 0."""
        betas = _kind_mapping("adam_kind_betas", self.optimizer.adam_kind_betas, ALL_ADAM_KINDS,
                              "a pair [beta1, beta2]")
        for kind, pair in betas.items():
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise SpeedrunError(f"train.adam_kind_betas.{kind} must be a pair [beta1, beta2], "
                                    f"got {_written(pair)}")
            for beta in pair:
                _check_number(f"adam_kind_betas.{kind}", beta, 0.0, 1.0, open_high=True)
        lrs = _kind_mapping("adam_kind_lrs", self.optimizer.adam_kind_lrs, tuple(RECORD_ADAM_KINDS),
                            "a learning rate", " (embed, head and scalar take embed_lr, head_lr and scalar_lr)")
        for kind, lr in lrs.items():
            _check_number(f"adam_kind_lrs.{kind}", lr, 0.0, math.inf)

    def _check_record87_optimizer(self) -> None:
        """``adam_kind_wd_mul`` (multipliers >= 0 per Adam kind), ``adam_kind_coptim`` (strengths in [0, 1] per
        Adam kind, with cautious decay), ``langevin_warmup_steps`` (>= 0) and ``langevin_end_frac`` (null or in
        (0, 1]): records #83-#89's per-kind weight decay and record #87's optimizer settings."""
        wd_mul = _kind_mapping("adam_kind_wd_mul", self.optimizer.adam_kind_wd_mul, ALL_ADAM_KINDS,
                               "a weight-decay multiplier >= 0")
        for kind, mul in wd_mul.items():
            _check_number(f"adam_kind_wd_mul.{kind}", mul, 0.0, math.inf)
        coptim = _kind_mapping("adam_kind_coptim", self.optimizer.adam_kind_coptim, ALL_ADAM_KINDS,
                               "a C-Optim strength in [0, 1]")
        for kind, strength in coptim.items():
            _check_number(f"adam_kind_coptim.{kind}", strength, 0.0, 1.0)
        if any(coptim.values()) and not self.optimizer.cautious_weight_decay:
            raise SpeedrunError("train.adam_kind_coptim (record #87's C-Optim) runs in the cautious Adam: it needs "
                                "train.cautious_weight_decay true")
        _check_int("langevin_warmup_steps", self.optimizer.langevin_warmup_steps, 0)
        end = self.optimizer.langevin_end_frac
        if end is not None:
            _check_number("langevin_end_frac", end, 0.0, 1.0)
            if end == 0:
                raise SpeedrunError("train.langevin_end_frac must be null or a number in (0, 1], got 0")

    def units_at(self, units: str, step: int) -> float:
        """The size of a gradient in ``units`` at training step ``step``, relative to the mean loss's: 1 for
        ``mean_loss``, the step's tokens per micro-batch (``tokens_per_step(step) / micro_batches``) for
        ``micro_batch_sum`` (:data:`speedrun.optim.config.LOSS_UNITS`)."""
        return 1.0 if units == "mean_loss" else self.batch_at(step)[0] / self.micro_batches

    def loss_scale_at(self, step: int) -> float:
        """What the training loop multiplies the step's mean loss by before its backward pass: 1 with
        ``loss_units`` mean_loss, the tokens per micro-batch of ``step`` with micro_batch_sum (the records'
        ``loss.sum() * grad_scale``; :class:`speedrun.optim.config.OptimConfig`)."""
        return self.units_at(self.optimizer.loss_units, step)

    def adam_eps_at(self, step: int) -> float:
        """Adam's ε at training step ``step``: ``adam_eps`` taken from ``adam_eps_units`` to the gradients'
        ``loss_units`` (so ``adam_eps`` itself where the two agree; with micro_batch_sum ε on mean_loss
        gradients ``adam_eps · micro_batches / tokens_per_step(step)``, the records' ε on a loss summed over a
        micro-batch's tokens, :class:`speedrun.optim.config.OptimConfig`)."""
        opt = self.optimizer
        return opt.adam_eps * self.units_at(opt.loss_units, step) / self.units_at(opt.adam_eps_units, step)

    def _check_schedules(self) -> None:
        schedule = self.schedule.window_schedule
        if not _positive_pairs(schedule):
            raise SpeedrunError(f"train.window_schedule must be a list of [short, long] block counts >= 1, "
                                f"got {_written(schedule)}")
        for index, (short, long) in enumerate(schedule):
            if short > long:
                raise SpeedrunError(f"train.window_schedule stage {index + 1} of {len(schedule)} is "
                                    f"{_written((short, long))}: its short window is longer than its long one; "
                                    f"each stage is [short, long] with short <= long")
        if self.schedule.final_window_long_blocks is not None:
            _check_int("final_window_long_blocks", self.schedule.final_window_long_blocks, 1)
        if self.schedule.untie_step is not None:
            _check_int("untie_step", self.schedule.untie_step, 0)
            if not self._preset_model().tie_embed_head:
                raise SpeedrunError("train.untie_step needs a model with tie_embed_head: true")
        batches = self.schedule.batch_schedule
        if not _positive_pairs(batches):
            raise SpeedrunError(f"train.batch_schedule must be a list of [tokens_per_step, max_seq_len] pairs of "
                                f"positive integers, got {_written(batches)}")
        if (schedule or self.schedule.final_window_long_blocks is not None) and not self._preset_model().window_pattern:
            raise SpeedrunError("train.window_schedule and train.final_window_long_blocks need a model "
                                "window_pattern (which layers take the short and the long window)")
        self._check_final_window()
        self._check_final_short_window()

    def _check_final_short_window(self) -> None:
        """``final_window_short_blocks``: null, or an integer >= 1 that needs a window_pattern and is at most
        the final validation's long window (record #31: 13 // 2 = 6 with the long window 13)."""
        final = self.schedule.final_window_short_blocks
        if final is None:
            return
        _check_int("final_window_short_blocks", final, 1)
        if not self._preset_model().window_pattern:
            raise SpeedrunError("train.final_window_short_blocks needs a model window_pattern")
        blocks = self._scheduled_window_blocks(self.steps)
        long = blocks[1] if blocks is not None else self._preset_model().window_long_blocks
        if final > long:
            raise SpeedrunError(f"train.final_window_short_blocks {final} is longer than the final validation's "
                                f"long window of {long} blocks; expected short <= long")

    def _check_staged(self) -> None:
        """The staged schedule's needs: a window_pattern, tie_embed_head for its untie, prefix_token_loss for a
        prefix weight > 0, the flat settings it replaces at the values it gives them (:meth:`from_dict`), and
        ``muon_momentum`` equal to its ``momentum_max``."""
        staged = self.schedule.staged_schedule
        if staged is None:
            return
        if not isinstance(staged, StagedSchedule):
            raise SpeedrunError(f"{STAGED} must be a staged schedule mapping, got {staged!r}")
        model = self._preset_model()
        if not model.window_pattern:
            raise SpeedrunError(f"{STAGED} sets attention windows and needs a model window_pattern (which "
                                f"layers take the short and the long window)")
        if staged.untie_step() is not None and not model.tie_embed_head:
            raise SpeedrunError(f"{STAGED}.untie_stage needs a model with tie_embed_head: true")
        prefix = [i for i, st in enumerate(staged.stages) if max(st.prefix_weight_start, st.prefix_weight_end) > 0]
        if prefix and not model.prefix_token_loss:
            raise SpeedrunError(f"{STAGED}.stages[{prefix[0]}] has a prefix_weight > 0, which needs "
                                f"model.prefix_token_loss: true")
        implied = _staged_implied(staged)
        for name in STAGED_REPLACES:
            wanted = implied.get(name, getattr(ScheduleSettings, name, None))
            if self.setting(name) != wanted:
                raise SpeedrunError(f"{STAGED} and train.{name} are both given: the staged schedule sets "
                                    f"{name}; remove train.{name}")
        if self.optimizer.muon_momentum != staged.momentum_max:
            raise SpeedrunError(f"{STAGED}.momentum_max {staged.momentum_max} and train.muon_momentum "
                                f"{self.optimizer.muon_momentum} differ: the staged schedule sets Muon's momentum")

    def _check_final_window(self) -> None:
        """Raise :class:`SpeedrunError` for a ``final_window_long_blocks`` below the final validation's short
        window (in blocks; :meth:`window_blocks_at`): the short window of the last step's ``window_schedule``
        stage, else the model's ``window_short_blocks``; as for a stage whose short window exceeds its long one."""
        final = self.schedule.final_window_long_blocks
        if final is None:
            return
        if self.schedule.window_schedule:        # the stage window_blocks takes at step == steps (steps >= 1 here)
            index = stage_index(self.steps - 1, self.steps, len(self.schedule.window_schedule))
            short = self.schedule.window_schedule[index][0]
            source = (f"train.window_schedule stage {index + 1} of {len(self.schedule.window_schedule)}, "
                      f"{_written(self.schedule.window_schedule[index])}, the stage of the last step")
        else:
            short = self._preset_model().window_short_blocks
            source = f"model.window_short_blocks {short}"
        if final < short:
            raise SpeedrunError(f"train.final_window_long_blocks {final} is below the short window of {short} "
                                f"blocks at the final validation ({source}); expected a long window >= the "
                                f"short one")

    def _check_divisions(self) -> None:
        if self.micro_batches % self.world_size:
            raise SpeedrunError(f"train.micro_batches {self.micro_batches} is not a multiple of "
                                f"train.world_size {self.world_size}")
        if len(self.schedule.batch_schedule) > self.steps:
            raise SpeedrunError(f"train.batch_schedule has {len(self.schedule.batch_schedule)} stages for "
                                f"{self.steps} steps; each stage needs at least one step")
        where = "train.batch_schedule: " if self.schedule.batch_schedule else "train."
        for _, tokens, _ in self.batch_stages():
            if tokens % self.micro_batches:
                raise SpeedrunError(f"{where}tokens_per_step {tokens} is not a multiple of "
                                    f"train.micro_batches {self.micro_batches}")
        if self.train_batches == "contiguous":
            for first, tokens, seq_len in self.batch_stages():
                if seq_len < tokens // self.micro_batches:
                    raise SpeedrunError(f"train.train_batches contiguous reads whole micro-batches of "
                                        f"{tokens // self.micro_batches} tokens (from step {first}) with no "
                                        f"document cut, so train.max_seq_len must be at least that, got {seq_len}")
        if self.evaluation.val_tokens % (self.evaluation.val_batch_tokens * self.world_size):
            raise SpeedrunError(f"train.val_tokens {self.evaluation.val_tokens} is not a multiple of "
                                f"val_batch_tokens x "
                                f"world_size = {self.evaluation.val_batch_tokens * self.world_size}")

    def _check_rotary_positions(self) -> None:
        given, needed = self._preset_model().rotary_positions, self.rotary_positions()
        if "rotary_positions" in self.model and given < needed:
            raise SpeedrunError(f"train.model.rotary_positions {given} is below the {needed} positions of this "
                                f"run's largest forward pass (TrainConfig.rotary_positions)")

    @classmethod
    def from_dict(cls, settings: Mapping[str, Any]) -> "TrainConfig":
        """Build from a flat mapping of settings (missing ones take the defaults). Raises
        :class:`SpeedrunError` naming an unknown key, with the valid keys."""
        names = cls.setting_names()
        for key in settings:
            if key not in names:
                raise SpeedrunError(f"unknown training setting {key!r}{did_you_mean(key, names)}; expected one of "
                                    f"{', '.join(names)}")
        values = dict(settings)
        for key in ("adam_betas", "lr_stage_multipliers"):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        if isinstance(values.get("adam_kind_betas"), Mapping):
            values["adam_kind_betas"] = {kind: tuple(pair) if isinstance(pair, list) else pair
                                         for kind, pair in values["adam_kind_betas"].items()}
        if values.get("staged_schedule") is not None:
            values.update(_staged_settings(values))
        for key in ("window_schedule", "batch_schedule"):
            if isinstance(values.get(key), list):
                values[key] = tuple(tuple(p) if isinstance(p, list) else p for p in values[key])
        sections = {section: SECTIONS[section](**{k: v for k, v in values.items() if names[k] == section})
                    for section in SECTIONS}
        return cls(**{k: v for k, v in values.items() if names[k] is None}, **sections)

    def resolved_for(self, device: Any) -> "TrainConfig":
        """This config with ``dtype`` resolved for ``device`` (a ``torch.device`` or its type, ``"cpu"`` or
        ``"cuda"``; :func:`resolve_dtype`; ``weight_dtype`` float32 where that is float32), and
        ``model.attention_backend: auto`` resolved to the backend that runs there
        (:func:`speedrun.model.attention.resolve_backend`): what a run on it computes in and with, and what its
        log's ``config`` header shows. Call it once the device is resolved (``device: auto``)."""
        device_type = device if isinstance(device, str) else device.type
        dtype = resolve_dtype(self.compute.dtype, device_type)
        weights = self.compute.weight_dtype if dtype == "bfloat16" else "float32"     # auto on a CPU: fp32
        compute = dataclasses.replace(self.compute, dtype=dtype, weight_dtype=weights)
        resolved = dataclasses.replace(self, compute=compute)
        backend = self._preset_model().attention_backend
        if backend != "auto":
            return resolved
        from speedrun.model.attention import resolve_backend      # torch: imported only when resolving

        model = {**self.model, "attention_backend": resolve_backend(backend, device)}
        return dataclasses.replace(resolved, model=model)

    @property
    def micro_batch_tokens(self) -> int:
        """Tokens per forward pass of the first stage: tokens_per_step / micro_batches."""
        return self.batch_stages()[0][1] // self.micro_batches

    def batch_stages(self) -> list[tuple[int, int, int]]:
        """``(first_step, tokens_per_step, max_seq_len)`` per stage of the batch-size schedule
        (:func:`speedrun.optim.schedules.batch_stages`; one stage without a schedule)."""
        if self.schedule.staged_schedule is not None:
            return self.schedule.staged_schedule.batch_stages()
        return batch_stages(self.steps, self.schedule.batch_schedule, self.tokens_per_step, self.max_seq_len)

    def batch_at(self, step: int) -> tuple[int, int]:
        """``(tokens_per_step, max_seq_len)`` of ``step``."""
        return next((tokens, seq_len) for first, tokens, seq_len in reversed(self.batch_stages())
                    if first <= step)

    def train_tokens(self) -> int:
        """Tokens of the whole run: the sum over steps of their tokens per step."""
        bounds = [first for first, _, _ in self.batch_stages()] + [self.steps]
        return sum((bounds[i + 1] - bounds[i]) * tokens for i, (_, tokens, _) in enumerate(self.batch_stages()))

    def model_config(self) -> GPTConfig:
        """``preset`` with the ``model`` overrides; unless they set ``rotary_positions``, the rotary tables
        get exactly :meth:`rotary_positions` rows (no memory or table building for unused positions)."""
        model = self._preset_model()
        if "rotary_positions" in self.model:
            return model
        return dataclasses.replace(model, rotary_positions=self.rotary_positions())

    def rotary_positions(self) -> int:
        """Rows of rotary tables this run needs: the tokens of its largest forward pass, a training
        micro-batch (tokens_per_step // micro_batches of any batch stage) or a validation chunk
        (val_batch_tokens), doubled when the model pairs heads (the doubled sequence has positions up to
        2T-1; see :class:`speedrun.model.config.GPTConfig` ``rotary_positions``)."""
        train = [tokens // self.micro_batches for _, tokens, _ in self.batch_stages()]
        tokens = max(train + [self.evaluation.val_batch_tokens])
        return 2 * tokens if self._preset_model().paired_head_layers else tokens

    def window_blocks_at(self, step: int) -> tuple[int, int] | None:
        """The (short, long) windows in blocks for ``step`` (``steps``: the final validation, with
        ``final_window_short_blocks`` when set; a ``staged_schedule``'s windows when given), or None when the
        model keeps its windows."""
        if self.schedule.staged_schedule is not None:
            return self.schedule.staged_schedule.window_blocks(step)
        blocks = self._scheduled_window_blocks(step)
        final_short = self.schedule.final_window_short_blocks
        if step != self.steps or final_short is None:
            return blocks
        long = blocks[1] if blocks is not None else self.model_config().window_long_blocks
        return final_short, long

    def window_stage_starts(self) -> list[int]:
        """The first step of each ``window_schedule`` stage (empty without one): the stage starts of
        :func:`speedrun.optim.schedules.stage_starts`, or with ``window_stage_span`` ``steps_plus_one`` the
        smallest s with ``n·s >= k·(steps + 1)`` for stage k of n (record #31: 0, 557, 1114 of 1670)."""
        n = len(self.schedule.window_schedule)
        if not n:
            return []
        if self.schedule.window_stage_span == "steps_plus_one":
            return [-(-k * (self.steps + 1) // n) for k in range(n)]
        return stage_starts(self.steps, n)

    def _scheduled_window_blocks(self, step: int) -> tuple[int, int] | None:
        """:meth:`window_blocks_at` before ``final_window_short_blocks``."""
        schedule = self.schedule.window_schedule
        if schedule and self.schedule.window_stage_span == "steps_plus_one" and step < self.steps:
            return schedule[len(schedule) * step // (self.steps + 1)]                  # record #31's get_ws
        if self.schedule.window_schedule:
            return window_blocks(step, self.steps, self.schedule.window_schedule,
                                 self.schedule.final_window_long_blocks)
        if step == self.steps and self.schedule.final_window_long_blocks is not None:
            model = self.model_config()
            return model.window_short_blocks, self.schedule.final_window_long_blocks
        return None

    def untie_step(self) -> int | None:
        """The first step trained with the embedding untied (the staged schedule's
        :meth:`~speedrun.optim.stages.StagedSchedule.untie_step`, else ``untie_step``); None: tied."""
        staged = self.schedule.staged_schedule
        return self.schedule.untie_step if staged is None else staged.untie_step()

    def yarn_at_window_change(self, step: int) -> bool:
        """Whether the window change before ``step`` rescales RoPE (YaRN, in the model): always, except at a
        staged schedule's final validation, whose extended window the record uses unrescaled."""
        staged = self.schedule.staged_schedule
        return staged is None or step != staged.total_steps

    def loss_weights_at(self, step: int) -> tuple[tuple[float, ...], float | None] | None:
        """The staged schedule's (multi-token-prediction weights, prefix-token weight) of training step
        ``step``; the prefix weight None when the model has no ``prefix_token_loss``; None without a staged
        schedule (the plain next-token loss)."""
        staged = self.schedule.staged_schedule
        if staged is None:
            return None
        prefix = staged.prefix_weight(step) if self._preset_model().prefix_token_loss else None
        return tuple(staged.mtp_weights(step)), prefix

    def schedule_config(self) -> ScheduleConfig:
        """The step schedules of :mod:`speedrun.optim.schedules` for this run (the lr factor and momentum of a
        staged schedule come from it instead, :meth:`staged_factors`; Langevin's σ from this)."""
        schedule = self.schedule
        staged = schedule.staged_schedule
        end_frac = self.optimizer.langevin_end_frac
        scheduled = self.steps if staged is None else staged.scheduled_steps
        langevin = dict(langevin_warmup_steps=self.optimizer.langevin_warmup_steps,
                        langevin_end_step=None if end_frac is None else int(end_frac * scheduled))
        if staged is not None:
            return ScheduleConfig(steps=self.steps, cooldown_frac=staged.cooldown_frac, lr_floor=staged.lr_floor,
                                  momentum_warmup_steps=staged.momentum_warmup_steps,
                                  momentum_end=staged.momentum_max,
                                  momentum_cooldown_steps=staged.momentum_cooldown_steps, **langevin)
        return ScheduleConfig.of(schedule, steps=self.steps, momentum_end=self.optimizer.muon_momentum, **langevin)

    def to_json(self) -> str:
        """One line of JSON: every setting, flat (:meth:`settings`), with ``model`` resolved to the full model
        config."""
        settings = json.loads(json.dumps(self.settings()))
        settings["model"] = dataclasses.asdict(self.model_config())
        return json.dumps(settings, sort_keys=True, separators=(",", ":"))


def _staged_implied(staged: StagedSchedule) -> dict[str, Any]:
    """The flat settings a staged schedule gives: steps, and the first stage's batch."""
    tokens, max_seq_len = staged.batch_at(0)
    return {"steps": staged.total_steps, "tokens_per_step": tokens, "max_seq_len": max_seq_len}


def _staged_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``staged_schedule`` of the flat ``values`` built (a mapping: :meth:`StagedSchedule.from_dict`, or
    ``{record, scheduled_steps, extension_steps}``: :func:`record_schedule` with those steps) and the flat
    settings it gives. A replaced setting (:data:`STAGED_REPLACES`) counts as given when it is present, not
    null and not the value the schedule gives it (steps, tokens_per_step, max_seq_len: the schedule's total
    and first batch, so that a config's :meth:`TrainConfig.settings` build the same config) or the default
    (the others); one given is refused, naming both."""
    data = values["staged_schedule"]
    if isinstance(data, StagedSchedule):
        staged = data
    elif isinstance(data, Mapping) and "record" in data:
        unknown = [k for k in data if k not in ("record", "scheduled_steps", "extension_steps")]
        if unknown:
            raise SpeedrunError(f"{STAGED}.{unknown[0]} is not a setting of a record's schedule; the settings are "
                                f"record, scheduled_steps, extension_steps")
        base = record_schedule(data["record"])
        steps = data.get("scheduled_steps", base.scheduled_steps), data.get("extension_steps", base.extension_steps)
        staged = StagedSchedule.from_dict({**base.to_dict(), "scheduled_steps": steps[0],
                                           "extension_steps": steps[1]}, where=STAGED)
    else:
        staged = StagedSchedule.from_dict(data, where=STAGED)
    implied = _staged_implied(staged)
    defaults = ScheduleSettings()
    for name in STAGED_REPLACES:
        value = values.get(name)
        if value is None:
            continue
        if isinstance(value, list):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        if value != implied.get(name, getattr(defaults, name, None)):
            raise SpeedrunError(f"{STAGED} and train.{name} are both given: the staged schedule sets {name} "
                                f"(to {implied.get(name, 'its own values')!r}); remove train.{name}")
    return {**{name: getattr(defaults, name) for name in STAGED_REPLACES if name not in implied},
            **implied, "staged_schedule": staged}


def resolve_dtype(dtype: str, device_type: str) -> str:
    """The compute dtype ``dtype`` (a :data:`ComputeDtype`) stands for on a device of type ``device_type``
    (``torch.device.type``): ``auto`` is ``bfloat16`` on ``cuda`` (the public records' autocast dtype) and
    ``float32`` elsewhere; ``float32`` and ``bfloat16`` are kept. On a CPU without bf16 units (AVX2 only)
    bf16 matrix products run about 15x slower than fp32 ones (tests/data/micro-config.yaml: 9.3 s per step
    against 0.56 s). Raises :class:`SpeedrunError` for another ``dtype``."""
    _check_choice("dtype", dtype, get_args(ComputeDtype))
    if dtype != "auto":
        return dtype
    return "bfloat16" if device_type == "cuda" else "float32"


def _written(value: Any) -> str:
    """``value`` as the user wrote it in the JSON/YAML config: the tuples :meth:`TrainConfig.from_dict` made
    of lists as JSON lists (``[[1, 2, 3]]``, not ``((1, 2, 3),)``); ``repr`` when it is not JSON."""
    def plain(item: Any) -> Any:
        if isinstance(item, (tuple, list)):
            return [plain(x) for x in item]
        if isinstance(item, Mapping):
            return {key: plain(x) for key, x in item.items()}
        return item
    try:
        return json.dumps(plain(value))
    except (TypeError, ValueError):
        return repr(value)


def _positive_pairs(value: Any) -> bool:
    """Whether ``value`` is a tuple of pairs (tuples) of integers >= 1 (a schedule as :meth:`TrainConfig.from_dict`
    makes it of YAML's lists)."""
    return isinstance(value, tuple) and all(
        isinstance(pair, tuple) and len(pair) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in pair) for pair in value)


def _kind_mapping(name: str, value: Any, kinds: tuple[str, ...], what: str, hint: str = "") -> Mapping[str, Any]:
    """``value`` when it is a mapping whose keys are all in ``kinds``; else :class:`SpeedrunError` naming
    ``train.<name>``, the unknown kind and the expected ones (``what``: what each kind maps to)."""
    if not isinstance(value, Mapping):
        raise SpeedrunError(f"train.{name} must be a mapping from Adam kind ({', '.join(kinds)}) to {what}, "
                            f"got {_written(value)}")
    for kind in value:
        if kind not in kinds:
            raise SpeedrunError(f"train.{name} has an unknown Adam kind {kind!r}; expected one of "
                                f"{', '.join(kinds)}{hint}")
    return value


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise SpeedrunError(f"train.{name} must be an integer >= {minimum}, got {value!r}{number_text_hint(value)}")


def _check_number(name: str, value: Any, low: float, high: float, open_high: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high or (open_high and value >= high):
        bracket = ")" if open_high else "]"
        wanted = f"a finite number >= {low}" if high == math.inf else f"a number in [{low}, {high}{bracket}"
        raise SpeedrunError(f"train.{name} must be {wanted}, got {value!r}{number_text_hint(value)}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpeedrunError(f"train.{name} must be one of {', '.join(choices)}; got {value!r}")


def load_config_argument(value: str) -> dict[str, Any]:
    """The ``--config`` value as a dict: a JSON object, or the path of a JSON (``.json``) or YAML file
    holding one. JSON is parsed as JSON (YAML 1.1 would read ``1e-05`` as a string).

    Raises :class:`SpeedrunError` for unreadable text or a value that is not a mapping.
    """
    is_json = value.lstrip().startswith("{")
    text = value
    if not is_json:
        path = Path(value)
        if not path.is_file():
            raise SpeedrunError(f"--config {value!r} is neither a JSON object nor an existing file")
        text, is_json = path.read_text(encoding="utf-8"), path.suffix == ".json"
    try:
        loaded = json.loads(text) if is_json else _load_yaml(text)
    except ValueError as e:
        raise SpeedrunError(f"--config: cannot parse {value[:80]!r}: {e}") from None
    if not isinstance(loaded, dict):
        raise SpeedrunError(f"--config must hold a mapping of training settings, got {type(loaded).__name__}")
    if "train" in loaded and "variants" in loaded:
        raise SpeedrunError(f"--config {value[:80]!r} is a workflow config (data, train, variants, ...): "
                            "`speedrun train` takes the training settings alone, i.e. its `train` section with "
                            "a variant's overrides (the workflow passes exactly that)")
    return loaded


def _load_yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(str(e)) from None
