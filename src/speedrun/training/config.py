"""The settings of ``speedrun train`` (config.yaml ``train`` with a variant's overrides): :class:`TrainConfig`,
its validation, and the ``--config`` argument that carries it (a JSON object or a JSON/YAML file).

Every check runs once, when the config is built, and raises :class:`speedrun.errors.SpeedrunError` naming the
setting (``train.<name>``), the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, get_args

from speedrun.errors import SpeedrunError, number_text_hint
from speedrun.model.config import PRESETS, GPTConfig, build_model_config
from speedrun.optim.config import ADAM_KINDS, ORTHOGONALIZERS, OptimConfig, ScheduleConfig
from speedrun.optim.schedules import batch_stages, stage_index, window_blocks

DeviceChoice = Literal["cpu", "cuda", "auto"]
ComputeDtype = Literal["auto", "float32", "bfloat16"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"]


@dataclass(frozen=True)
class TrainConfig:
    """The training settings of one variant (config.yaml ``train`` with the variant's overrides).

    Sizes: ``steps`` optimizer steps of ``tokens_per_step`` tokens in ``micro_batches`` forward passes over
    all ranks; documents cut at ``max_seq_len`` tokens; ``val_tokens`` validation tokens in chunks of
    ``val_batch_tokens`` per rank, every ``val_every`` steps (0: only at step 0 and the last). Model:
    ``preset`` with ``model`` overrides (:class:`speedrun.model.config.GPTConfig` fields), the rotary tables
    sized to the run unless ``model`` sets ``rotary_positions`` (:meth:`model_config`). Optimizers
    (:class:`speedrun.optim.groups.OptimConfig`): AdamW ``embed_lr``, ``head_lr``, ``scalar_lr``,
    ``adam_betas``; Muon ``muon_lr``, ``muon_momentum`` (reached after ``momentum_warmup_steps`` from 0.85,
    and back down to 0.85 over the last ``momentum_cooldown_steps``: the record's 300 and 50, speedrun-spec.md
    3.5; 0: no cooldown), ``orthogonalizer``, ``normuon_beta2`` (null: plain Muon; records #41-#48 use NorMuon
    with 0.9); ``weight_decay`` (Muon's; the record 1.2) and ``adam_weight_decay`` (Adam's; the record 0.005),
    decoupled or, with ``cautious_weight_decay``, cautious (records #43, #50); ``langevin_noise``: the initial
    scale of NorMuon's annealed Langevin noise (2026-06-11 record; 0: off, :mod:`speedrun.optim.langevin`),
    seeded by the run's seed; ``shard_muon``: on several ranks, each rank updates a slice of every bank of
    matrices (reduce-scatter, update, all-gather; speedrun-spec.md 3.4); ``mlp_proj_lr_mul``: an extra lr
    factor for the MLP output matrices (the record's 4: it stores them as (4C, C), shape factor 2, and doubles
    that, speedrun-spec.md 3.2; ours are (C, 4C), shape factor 1); ``mlp_fc_lr_mul``: the same for the MLP
    input matrices, whose (4C, C) layout keeps Muon's shape factor 2 on top (record #28, 2025-08-23
    SparseAttnGate, its train_gpt.py: 0.5, since it stores c_fc as (C, 4C), shape factor 1);
    ``adam_eps``: Adam's ε (> 0) in units of the gradient of the mean loss (nats/token); record #28's ε 1e-10
    on its summed loss is 1e-10·W/393216 here on W GPUs (2.54e-16 on one, :class:`speedrun.optim.config.
    OptimConfig`);
    ``adam_kind_betas``: Adam kind (``embed``, ``head``, ``scalar``) -> a ``[beta1, beta2]`` pair (each in
    [0, 1)) for that kind's Adam group, overriding ``adam_betas``; empty: ``adam_betas`` for all. The current
    record's per-parameter table (speedrun-spec.md 3.3) is ``{head: [0.5, 0.95], embed: [0.75, 0.95],
    scalar: [0.9, 0.99]}``: lm_head and the token embedding (0.5, 0.95), the value and bigram tables
    (0.75, 0.95), the scalars and gates (0.9, 0.99). Our token embedding is of kind ``head`` while tied and
    after ``untie_step``; only a model untied from the start trains it as ``embed``, with the tables' betas,
    not the record's (0.5, 0.95) (:meth:`speedrun.model.gpt.GPT.parameter_kinds`);
    ``muon_attention_gates``: train the attention output gates' (H, 12) weights with Muon at ``muon_lr``
    instead of Adam at ``scalar_lr`` (record #28's ``dampen``; needs ``model.attention_gate_layers``).
    LR schedule (:func:`speedrun.optim.schedules.lr_factor`): every base lr times the multiplier of its stage
    in ``lr_stage_multipliers``, one per equal stage of the steps (the record's 1.0, 1.52, 1.73 with its three
    batch-size stages; empty: 1.0 throughout), then over the last ``cooldown_frac`` of the steps linear from
    that multiplier down to ``lr_floor`` times the base (absolute, not scaled by the stage: the record's
    cooldown_frac 0.6 and floor 0.15). Attention windows (:func:`speedrun.optim.schedules.window_blocks`,
    records #13, #31, #33): ``window_schedule``, a list of ``[short, long]`` windows in blocks, one per equal
    stage of the steps (empty: the model's fixed windows), and ``final_window_long_blocks``, the long window
    at the final validation (null: unchanged); both need the model's ``window_pattern``. ``untie_step``: with
    the model's ``tie_embed_head``, the step at which the embedding is untied from the head and inherits its
    Adam state (record #53: 2/3 of the steps; null: tied throughout; at ``steps`` or later: never untied, as in
    a smoke run of a few steps, the optimizer steps being 0 to steps - 1). ``dtype``: autocast dtype of the matrix products (``float32`` disables
    autocast); ``auto``, the default, is ``bfloat16`` on CUDA and ``float32`` on a CPU (:func:`resolve_dtype`),
    resolved once the device is (:meth:`resolved_for`). ``compile``: ``torch.compile`` the model (one
    static-shape graph per batch shape and window setting, all compiled in the untimed warm-up);
    ``compile_mode``: the ``torch.compile`` mode, ``default`` as in the public records (their rules ban other
    compile flags);
    ``reduce-overhead`` replays CUDA graphs (less launch overhead), ``max-autotune-no-cudagraphs`` tunes the
    matrix products (longer compile): for measuring, not for record runs. ``batch_schedule``:
    the batch-size schedule (records #46, #72), one ``[tokens_per_step, max_seq_len]`` pair per equal stage of
    the steps; when set it replaces ``tokens_per_step`` and ``max_seq_len`` (empty: constant).

    Raises :class:`SpeedrunError` naming the setting on a wrong type or value, on a batch that does not
    divide: micro_batches % world_size, tokens_per_step % micro_batches, val_tokens % (val_batch_tokens *
    world_size), on a ``model.rotary_positions`` below :meth:`rotary_positions`, on a ``batch_schedule`` with
    more stages than ``steps``, on a ``window_schedule`` stage whose short window exceeds its long one and on a
    ``final_window_long_blocks`` below the final validation's short window (:meth:`window_blocks_at`). A
    ``window_schedule`` with more stages than ``steps`` or an ``untie_step`` >= ``steps`` is accepted: a smoke
    run (a few steps of a full config) skips those stages and never unties.
    """

    preset: str = "tiny"
    model: Mapping[str, Any] = field(default_factory=dict)
    steps: int = 60
    tokens_per_step: int = 4096
    micro_batches: int = 4
    max_seq_len: int = 1024
    val_tokens: int = 32768
    val_batch_tokens: int = 1024
    val_every: int = 20
    world_size: int = 1
    device: DeviceChoice = "cpu"
    compile: bool = False
    compile_mode: CompileMode = "default"
    dtype: ComputeDtype = "auto"
    embed_lr: float = 0.6
    head_lr: float = 0.008
    scalar_lr: float = 0.04
    adam_betas: tuple[float, float] = (0.8, 0.95)
    adam_eps: float = 1e-10
    adam_kind_betas: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    muon_lr: float = 0.05
    muon_momentum: float = 0.95
    momentum_warmup_steps: int = 300
    momentum_cooldown_steps: int = 0
    weight_decay: float = 0.0
    adam_weight_decay: float = 0.0
    langevin_noise: float = 0.0
    shard_muon: bool = True
    mlp_proj_lr_mul: float = 1.0
    mlp_fc_lr_mul: float = 1.0
    muon_attention_gates: bool = False
    cooldown_frac: float = 0.4
    lr_floor: float = 0.0
    lr_stage_multipliers: tuple[float, ...] = ()
    orthogonalizer: str = "polar_express"
    normuon_beta2: float | None = None
    cautious_weight_decay: bool = False
    window_schedule: tuple[tuple[int, int], ...] = ()
    final_window_long_blocks: int | None = None
    untie_step: int | None = None
    batch_schedule: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        for name in ("steps", "tokens_per_step", "micro_batches", "max_seq_len", "val_tokens",
                     "val_batch_tokens", "world_size"):
            _check_int(name, getattr(self, name), 1)
        _check_int("val_every", self.val_every, 0)
        _check_int("momentum_warmup_steps", self.momentum_warmup_steps, 0)
        _check_int("momentum_cooldown_steps", self.momentum_cooldown_steps, 0)
        for name in ("embed_lr", "head_lr", "scalar_lr", "muon_lr", "weight_decay", "adam_weight_decay",
                     "langevin_noise", "mlp_proj_lr_mul", "mlp_fc_lr_mul"):
            _check_number(name, getattr(self, name), 0.0, math.inf)
        for name in ("cooldown_frac", "lr_floor"):
            _check_number(name, getattr(self, name), 0.0, 1.0)
        _check_number("muon_momentum", self.muon_momentum, 0.0, 1.0, open_high=True)
        if not isinstance(self.lr_stage_multipliers, tuple):
            raise SpeedrunError(f"train.lr_stage_multipliers must be a list of numbers, one per equal stage of "
                                f"the steps, got {_written(self.lr_stage_multipliers)}")
        for multiplier in self.lr_stage_multipliers:
            _check_number("lr_stage_multipliers", multiplier, 0.0, math.inf)
        if not isinstance(self.adam_betas, tuple) or len(self.adam_betas) != 2:
            raise SpeedrunError(f"train.adam_betas must be a pair [beta1, beta2], got {_written(self.adam_betas)}")
        for beta in self.adam_betas:
            _check_number("adam_betas", beta, 0.0, 1.0, open_high=True)
        self._check_adam_kind_betas()
        ok = isinstance(self.adam_eps, (int, float)) and not isinstance(self.adam_eps, bool)
        if not ok or not 0.0 < self.adam_eps < math.inf:
            raise SpeedrunError(f"train.adam_eps must be a finite number > 0 (Adam's ε), got {self.adam_eps!r}"
                                f"{number_text_hint(self.adam_eps)}")
        for name in ("compile", "cautious_weight_decay", "shard_muon", "muon_attention_gates"):
            if not isinstance(getattr(self, name), bool):
                raise SpeedrunError(f"train.{name} must be true or false, got {getattr(self, name)!r}")
        if self.normuon_beta2 is not None:
            _check_number("normuon_beta2", self.normuon_beta2, 0.0, 1.0, open_high=True)
        _check_choice("preset", self.preset, tuple(PRESETS))
        _check_choice("device", self.device, get_args(DeviceChoice))
        _check_choice("dtype", self.dtype, get_args(ComputeDtype))
        _check_choice("compile_mode", self.compile_mode, get_args(CompileMode))
        _check_choice("orthogonalizer", self.orthogonalizer, ORTHOGONALIZERS)
        if not isinstance(self.model, Mapping):
            raise SpeedrunError(f"train.model must be a mapping of model settings, got {self.model!r}")
        self._check_device()
        if self.muon_attention_gates and not self._preset_model().attention_gate_layers:
            raise SpeedrunError("train.muon_attention_gates needs a model with attention gates "
                                "(model.attention_gate_layers is empty)")
        self._check_schedules()
        self._check_divisions()
        self._check_rotary_positions()

    def _preset_model(self) -> GPTConfig:
        """``preset`` with the ``model`` overrides as written (for the checks made before the batch sizes)."""
        return build_model_config(self.preset, self.model)

    def _check_device(self) -> None:
        backend = self._preset_model().attention_backend
        if self.device == "cpu" and backend in ("flex", "varlen"):
            raise SpeedrunError(f"train.model.attention_backend {backend!r} trains on CUDA only (torch has no CPU "
                                f"backward for it), and train.device is 'cpu': set train.device: cuda, or "
                                f"train.model: {{attention_backend: sdpa_docs}} on a CPU")

    def _check_adam_kind_betas(self) -> None:
        betas = self.adam_kind_betas
        if not isinstance(betas, Mapping):
            raise SpeedrunError(f"train.adam_kind_betas must be a mapping from Adam kind "
                                f"({', '.join(ADAM_KINDS)}) to a pair [beta1, beta2], got {_written(betas)}")
        for kind, pair in betas.items():
            if kind not in ADAM_KINDS:
                raise SpeedrunError(f"train.adam_kind_betas has an unknown Adam kind {kind!r}; expected one of "
                                    f"{', '.join(ADAM_KINDS)}")
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise SpeedrunError(f"train.adam_kind_betas.{kind} must be a pair [beta1, beta2], "
                                    f"got {_written(pair)}")
            for beta in pair:
                _check_number(f"adam_kind_betas.{kind}", beta, 0.0, 1.0, open_high=True)

    def _check_schedules(self) -> None:
        schedule = self.window_schedule
        if not isinstance(schedule, tuple) or not all(
                isinstance(pair, tuple) and len(pair) == 2 and all(
                    isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in pair) for pair in schedule):
            raise SpeedrunError(f"train.window_schedule must be a list of [short, long] block counts >= 1, "
                                f"got {_written(schedule)}")
        for index, (short, long) in enumerate(schedule):
            if short > long:
                raise SpeedrunError(f"train.window_schedule stage {index + 1} of {len(schedule)} is "
                                    f"{_written((short, long))}: its short window is longer than its long one; "
                                    f"each stage is [short, long] with short <= long")
        if self.final_window_long_blocks is not None:
            _check_int("final_window_long_blocks", self.final_window_long_blocks, 1)
        if self.untie_step is not None:
            _check_int("untie_step", self.untie_step, 0)
            if not self._preset_model().tie_embed_head:
                raise SpeedrunError("train.untie_step needs a model with tie_embed_head: true")
        batches = self.batch_schedule
        if not isinstance(batches, tuple) or not all(
                isinstance(pair, tuple) and len(pair) == 2 and all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in pair) for pair in batches):
            raise SpeedrunError(f"train.batch_schedule must be a list of [tokens_per_step, max_seq_len] pairs of "
                                f"positive integers, got {_written(batches)}")
        if (schedule or self.final_window_long_blocks is not None) and not self._preset_model().window_pattern:
            raise SpeedrunError("train.window_schedule and train.final_window_long_blocks need a model "
                                "window_pattern (which layers take the short and the long window)")
        self._check_final_window()

    def _check_final_window(self) -> None:
        """Raise :class:`SpeedrunError` for a ``final_window_long_blocks`` below the final validation's short
        window (in blocks; :meth:`window_blocks_at`): the short window of the last step's ``window_schedule``
        stage, else the model's ``window_short_blocks``; as for a stage whose short window exceeds its long one."""
        final = self.final_window_long_blocks
        if final is None:
            return
        if self.window_schedule:        # the stage window_blocks takes at step == steps (steps >= 1 here)
            index = stage_index(self.steps - 1, self.steps, len(self.window_schedule))
            short = self.window_schedule[index][0]
            source = (f"train.window_schedule stage {index + 1} of {len(self.window_schedule)}, "
                      f"{_written(self.window_schedule[index])}, the stage of the last step")
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
        if len(self.batch_schedule) > self.steps:
            raise SpeedrunError(f"train.batch_schedule has {len(self.batch_schedule)} stages for "
                                f"{self.steps} steps; each stage needs at least one step")
        where = "train.batch_schedule: " if self.batch_schedule else "train."
        for _, tokens, _ in self.batch_stages():
            if tokens % self.micro_batches:
                raise SpeedrunError(f"{where}tokens_per_step {tokens} is not a multiple of "
                                    f"train.micro_batches {self.micro_batches}")
        if self.val_tokens % (self.val_batch_tokens * self.world_size):
            raise SpeedrunError(f"train.val_tokens {self.val_tokens} is not a multiple of val_batch_tokens x "
                                f"world_size = {self.val_batch_tokens * self.world_size}")

    def _check_rotary_positions(self) -> None:
        given, needed = self._preset_model().rotary_positions, self.rotary_positions()
        if "rotary_positions" in self.model and given < needed:
            raise SpeedrunError(f"train.model.rotary_positions {given} is below the {needed} positions of this "
                                f"run's largest forward pass (TrainConfig.rotary_positions)")

    @classmethod
    def from_dict(cls, settings: Mapping[str, Any]) -> "TrainConfig":
        """Build from a mapping of settings (missing ones take the defaults). Raises :class:`SpeedrunError`
        naming an unknown key, with the valid keys."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in settings:
            if key not in names:
                raise SpeedrunError(f"unknown training setting {key!r}; expected one of {', '.join(names)}")
        values = dict(settings)
        for key in ("adam_betas", "lr_stage_multipliers"):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        if isinstance(values.get("adam_kind_betas"), Mapping):
            values["adam_kind_betas"] = {kind: tuple(pair) if isinstance(pair, list) else pair
                                         for kind, pair in values["adam_kind_betas"].items()}
        for key in ("window_schedule", "batch_schedule"):
            if isinstance(values.get(key), list):
                values[key] = tuple(tuple(p) if isinstance(p, list) else p for p in values[key])
        return cls(**values)

    def resolved_for(self, device: Any) -> "TrainConfig":
        """This config with ``dtype`` resolved for ``device`` (a ``torch.device`` or its type, ``"cpu"`` or
        ``"cuda"``; :func:`resolve_dtype`): what a run on it computes in, and what its log's ``config``
        header shows. Call it once the device is resolved (``device: auto``)."""
        device_type = device if isinstance(device, str) else device.type
        return dataclasses.replace(self, dtype=resolve_dtype(self.dtype, device_type))

    @property
    def micro_batch_tokens(self) -> int:
        """Tokens per forward pass of the first stage: tokens_per_step / micro_batches."""
        return self.batch_stages()[0][1] // self.micro_batches

    def batch_stages(self) -> list[tuple[int, int, int]]:
        """``(first_step, tokens_per_step, max_seq_len)`` per stage of the batch-size schedule
        (:func:`speedrun.optim.schedules.batch_stages`; one stage without a schedule)."""
        return batch_stages(self.steps, self.batch_schedule, self.tokens_per_step, self.max_seq_len)

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
        tokens = max(train + [self.val_batch_tokens])
        return 2 * tokens if self._preset_model().paired_head_layers else tokens

    def window_blocks_at(self, step: int) -> tuple[int, int] | None:
        """The (short, long) windows in blocks for ``step`` (``steps``: the final validation), or None when
        the model keeps its windows."""
        if self.window_schedule:
            return window_blocks(step, self.steps, self.window_schedule, self.final_window_long_blocks)
        if step == self.steps and self.final_window_long_blocks is not None:
            model = self.model_config()
            return model.window_short_blocks, self.final_window_long_blocks
        return None

    def optim_config(self) -> OptimConfig:
        """The :class:`OptimConfig` fields that are training settings of the same name (the rest, e.g.
        ``langevin_seed``, keep their defaults)."""
        shared = {f.name for f in dataclasses.fields(OptimConfig)} & {f.name for f in dataclasses.fields(self)}
        return OptimConfig(**{name: getattr(self, name) for name in shared})

    def schedule_config(self) -> ScheduleConfig:
        return ScheduleConfig(steps=self.steps, cooldown_frac=self.cooldown_frac, lr_floor=self.lr_floor,
                              momentum_warmup_steps=self.momentum_warmup_steps,
                              momentum_end=self.muon_momentum, lr_stage_multipliers=self.lr_stage_multipliers,
                              momentum_cooldown_steps=self.momentum_cooldown_steps)

    def to_json(self) -> str:
        """One line of JSON: every setting, with ``model`` resolved to the full model config."""
        settings = dataclasses.asdict(self)
        settings["model"] = dataclasses.asdict(self.model_config())
        return json.dumps(settings, sort_keys=True, separators=(",", ":"))


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
