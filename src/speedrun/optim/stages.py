"""A record-style staged training schedule as data, and its values at every step (speedrun-spec.md 3.5).

Since record #46 (batch-size schedule) the public records describe their schedule as one table of stages
(``TRAINING_STAGES``, HEAD's train_gpt.py L1979-1989) read by a schedule object (``TrainingSchedule``). Here
that table is a :class:`StagedSchedule` of :class:`Stage` rows, plain frozen data (no torch), written to and
read from a config's ``train.schedule`` section with :meth:`StagedSchedule.to_dict` /
:meth:`StagedSchedule.from_dict`; :func:`record_schedule` gives the records' own tables.

How a record's schedule maps onto the fields (HEAD, record #89, as the example):

* ``scheduled_steps`` 1270 and ``extension_steps`` 15 are the record's ``num_scheduled_iterations`` and
  ``num_extension_iterations``: 1285 optimizer steps (0..1284), then the final validation at step 1285.
* ``stages``: one row per ``TrainingStage``, in order. Every row but the last has a ``fraction`` (the
  record's ``duration``) of the scheduled steps; the last row is the extension stage (``fraction: null``),
  which runs the ``extension_steps`` and gives the final validation its values. A stage ends at
  ``round(cumulative fraction x scheduled_steps)`` (Python's round, as the record): thirds of 1270 give the
  boundaries [0, 423, 847, 1270, 1285]; record #87's 0.36 / 0.32 / 0.32 of 1387 give [0, 499, 943, 1387, 1398].
* ``tokens_per_step`` is the record's ``batch_size``: tokens of one optimizer step over all GPUs and
  accumulation steps (131,072 = 8 x 2048 x 8 -> 262,144 -> 393,216); ``max_seq_len`` its
  ``train_max_seq_len``, the longest document piece (896 -> 2048).
* ``window_blocks``: its ``window_sizes``, the (short, long) attention windows in 128-token blocks (1/3 ->
  3/7 -> 5/11 -> 6/13); ``final_window_long_blocks`` its ``ws_post_yarn_ext`` (20), the long window of the
  final validation only. The record rescales RoPE (YaRN) where the long window changes between stages
  (:meth:`StagedSchedule.yarn_steps`: 423, 847, 1270), not for the final extension.
* ``lr_mul``: the stage's lr multiplier (1.0, 1.52 = (16/8)^0.6, 1.73 = (24/8)^0.5), until the cooldown
  starts at ``int(scheduled_steps x (1 - cooldown_frac))`` (0.6: step 508); from there the factor is
  ``lr_mul x (1 - t) + lr_floor x t`` with t linear from 0 there to 1 at ``scheduled_steps`` and the
  multiplier still the stage's (so it steps up at 847 mid-cooldown), and ``lr_floor`` (0.15, absolute)
  during the extension (:meth:`StagedSchedule.lr_factor`). The extension stage's ``lr_mul`` is never used.
* ``mtp_weights_start`` / ``_end``: the multi-token-prediction weights (record #53), linear in the step
  within the stage ([1, 0.5, 0.25 -> 0], [1, 0.5 -> 0], [1], [1]); the list gets shorter between stages.
  ``prefix_weight_start`` / ``_end``: the prefix-token loss weight (record #88: 0.25, 0.25 -> 0, 0, 0).
* ``untie_stage``: the record's ``split_embed_stage`` (2; null for record #87, which never unties). The
  record unties after the update of step ``start | 1`` (847, made odd because its Adam only steps on odd
  steps); the first step trained untied is the next one (:meth:`StagedSchedule.untie_step`: 848).
* ``momentum_*``: Muon's momentum 0.85 -> 0.95 over the first 300 steps and back to 0.85 over the last 50
  of all steps (the record's ``get_muon_momentum`` defaults, not scaled with the steps).

A compressed schedule (the parity benchmark's 105 + 15 steps) keeps the stages and changes the two step
counts (:meth:`StagedSchedule.with_steps`), as the reference code's ``patch_schedule.py`` does.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from typing import Any, Mapping, Sequence

from speedrun.errors import SpeedrunError, number_text_hint

SETTING = "train.staged_schedule"            # where the schedule sits in a training config, for error messages


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One stage of a :class:`StagedSchedule` (one row of a record's ``TRAINING_STAGES``).

    ``fraction``: the stage's share of the scheduled steps, in (0, 1]; None for the extension stage (the
    last). ``tokens_per_step``: tokens of one optimizer step over all ranks and micro-batches.
    ``max_seq_len``: the longest document piece in tokens. ``window_blocks``: (short, long) attention windows
    in 128-token blocks, short <= long. ``lr_mul``: the stage's lr multiplier (unused in the extension stage).
    ``mtp_weights_start`` / ``mtp_weights_end``: the multi-token-prediction weights (record #53; the first
    is the next token's) at the stage's first step and at its end, linear in between; the same length;
    ``mtp_weights_end`` None: constant. ``prefix_weight_start`` / ``prefix_weight_end``: the same for the
    prefix-token loss weight (record #88; 0: off). Lists are stored as tuples. The values are checked by
    the schedule that holds the stage (:class:`StagedSchedule`), which names the stage's index."""

    fraction: float | None = None
    tokens_per_step: int
    max_seq_len: int
    window_blocks: tuple[int, int]
    lr_mul: float = 1.0
    mtp_weights_start: tuple[float, ...] = (1.0,)
    mtp_weights_end: tuple[float, ...] | None = None
    prefix_weight_start: float = 0.0
    prefix_weight_end: float | None = None

    def __post_init__(self) -> None:
        for name in ("window_blocks", "mtp_weights_start", "mtp_weights_end"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        if self.mtp_weights_end is None:
            object.__setattr__(self, "mtp_weights_end", self.mtp_weights_start)
        if self.prefix_weight_end is None:
            object.__setattr__(self, "prefix_weight_end", self.prefix_weight_start)


_STAGE_REQUIRED = ("tokens_per_step", "max_seq_len", "window_blocks")


@dataclass(frozen=True, kw_only=True)
class StagedSchedule:
    """A record-style training schedule: ``stages`` (:class:`Stage`, the last being the extension stage),
    ``scheduled_steps`` over which the stages' fractions, the lr cooldown and the per-stage weight ramps run,
    and ``extension_steps`` after them (the module docstring maps a record's code onto these fields).

    ``cooldown_frac``: the last share of the scheduled steps over which the lr factor falls linearly to
    ``lr_floor`` (absolute, >= 0; kept during the extension). ``untie_stage``: the index of the stage at
    whose start (made odd) the embedding is untied from the head, as the record's ``split_embed_stage``;
    None: tied throughout. ``final_window_long_blocks``: the long window of the final validation (None: the
    extension stage's). Muon momentum: ``momentum_min`` -> ``momentum_max`` over ``momentum_warmup_steps``,
    back to ``momentum_min`` over the last ``momentum_cooldown_steps`` of all steps. Defaults are the
    records' (speedrun-spec.md 3.5). ``where``: the config key named in error messages (not compared).

    Steps count optimizer updates from 0: the update of step s uses the values at s, and step
    ``total_steps`` is the final validation. The per-step methods raise ``ValueError`` for a step outside
    [0, total_steps].

    Raises :class:`SpeedrunError` naming the setting (``train.schedule.stages[2].lr_mul``) on a wrong type
    or value: fewer than two stages, a fraction on the extension stage or none on another, fractions whose
    stages do not end at ``scheduled_steps``, MTP weight lists of different lengths within a stage, a short
    window above the long one, a final long window below the extension's short one, an ``untie_stage``
    that is no stage.
    """

    stages: tuple[Stage, ...]
    scheduled_steps: int
    extension_steps: int = 0
    cooldown_frac: float = 0.6
    lr_floor: float = 0.15
    untie_stage: int | None = None
    final_window_long_blocks: int | None = None
    momentum_warmup_steps: int = 300
    momentum_cooldown_steps: int = 50
    momentum_min: float = 0.85
    momentum_max: float = 0.95
    where: str = field(default=SETTING, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stages, list):
            object.__setattr__(self, "stages", tuple(self.stages))
        w = self.where
        _check_int(f"{w}.scheduled_steps", self.scheduled_steps, 1)
        _check_int(f"{w}.extension_steps", self.extension_steps, 0)
        _check_number(f"{w}.cooldown_frac", self.cooldown_frac, 0.0, 1.0)
        _check_number(f"{w}.lr_floor", self.lr_floor, 0.0, math.inf)
        _check_int(f"{w}.momentum_warmup_steps", self.momentum_warmup_steps, 0)
        _check_int(f"{w}.momentum_cooldown_steps", self.momentum_cooldown_steps, 0)
        _check_number(f"{w}.momentum_min", self.momentum_min, 0.0, 1.0, open_high=True)
        _check_number(f"{w}.momentum_max", self.momentum_max, 0.0, 1.0, open_high=True)
        if not isinstance(self.stages, tuple) or len(self.stages) < 2 or \
                not all(isinstance(s, Stage) for s in self.stages):
            raise SpeedrunError(f"{w}.stages must be a list of at least two stages (the scheduled ones, then the "
                                f"extension stage), got {self.stages!r}")
        for index, stage in enumerate(self.stages):
            _check_stage(stage, f"{w}.stages[{index}]", extension=index == len(self.stages) - 1)
        self._check_fractions()
        if self.untie_stage is not None:
            _check_int(f"{w}.untie_stage", self.untie_stage, 0)
            if self.untie_stage >= len(self.stages):
                raise SpeedrunError(f"{w}.untie_stage must be the index of a stage (0..{len(self.stages) - 1}) "
                                    f"or null (tied throughout), got {self.untie_stage}")
        if self.final_window_long_blocks is not None:
            short = self.stages[-1].window_blocks[0]
            _check_int(f"{w}.final_window_long_blocks", self.final_window_long_blocks, short)

    def _check_fractions(self) -> None:
        ends = self._scheduled_ends()
        if ends[-1] != self.scheduled_steps:
            total = sum(stage.fraction for stage in self.stages[:-1])
            raise SpeedrunError(f"{self.where}.stages[*].fraction must add up to 1 so that the scheduled stages "
                                f"end at scheduled_steps {self.scheduled_steps}; they add up to {total!r} and "
                                f"end at step {ends[-1]}")

    def _scheduled_ends(self) -> list[int]:
        return [round(c * self.scheduled_steps) for c in accumulate(s.fraction for s in self.stages[:-1])]

    # ---- steps and stages ----------------------------------------------------------------------------

    @property
    def total_steps(self) -> int:
        """All optimizer steps: scheduled plus extension (HEAD: 1285)."""
        return self.scheduled_steps + self.extension_steps

    def boundaries(self) -> list[int]:
        """The first step of every stage, then ``total_steps`` (HEAD: [0, 423, 847, 1270, 1285]). A stage may
        be empty (two equal boundaries) when the steps are fewer than the stages; it is then never used."""
        return [0, *self._scheduled_ends(), self.total_steps]

    def stage_ranges(self) -> list[tuple[int, int]]:
        """(first step, end step) of every stage, end exclusive."""
        return list(pairwise(self.boundaries()))

    def stage_index(self, step: int) -> int:
        """The index of the stage ``step`` is in: the first stage that ends after it; the extension stage at
        ``total_steps`` (the final validation)."""
        self._check_step(step)
        for index, (_, end) in enumerate(self.stage_ranges()):
            if step < end:
                return index
        return len(self.stages) - 1

    def stage_at(self, step: int) -> Stage:
        """The :class:`Stage` of ``step``."""
        return self.stages[self.stage_index(step)]

    def stage_progress(self, step: int) -> float:
        """How far ``step`` is through its stage: (step - start) / (end - start), in [0, 1); 1.0 at the
        final validation. The weight ramps interpolate with it."""
        index = self.stage_index(step)
        start, end = self.stage_ranges()[index]
        return 1.0 if step >= end else (step - start) / (end - start)

    def transition_steps(self) -> list[int]:
        """The first steps of the stages after the first, the extension's included (HEAD: [423, 847, 1270])."""
        return self.boundaries()[1:-1]

    def _check_step(self, step: int) -> None:
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= self.total_steps:
            raise ValueError(f"step {step!r} is outside 0..{self.total_steps}")

    # ---- batch and windows ---------------------------------------------------------------------------

    def batch_at(self, step: int) -> tuple[int, int]:
        """(tokens_per_step, max_seq_len) of ``step``."""
        stage = self.stage_at(step)
        return stage.tokens_per_step, stage.max_seq_len

    def batch_stages(self) -> list[tuple[int, int, int]]:
        """(first_step, tokens_per_step, max_seq_len) of every non-empty training stage, in order (as
        :func:`speedrun.optim.schedules.batch_stages`)."""
        return [(start, stage.tokens_per_step, stage.max_seq_len)
                for stage, (start, end) in zip(self.stages, self.stage_ranges()) if start < end]

    def total_tokens(self) -> int:
        """Training tokens of all steps (HEAD: 338,821,120)."""
        return sum((end - start) * stage.tokens_per_step for stage, (start, end) in zip(self.stages,
                                                                                           self.stage_ranges()))

    def window_blocks(self, step: int) -> tuple[int, int]:
        """(short, long) attention windows in 128-token blocks at ``step``; at ``total_steps`` those of the
        final validation (:meth:`final_window_blocks`)."""
        if step == self.total_steps:
            return self.final_window_blocks()
        short, long = self.stage_at(step).window_blocks
        return short, long

    def final_window_blocks(self) -> tuple[int, int]:
        """The final validation's windows: the extension stage's, its long one replaced by
        ``final_window_long_blocks`` when set (HEAD: (6, 20))."""
        short, long = self.stages[-1].window_blocks
        return short, long if self.final_window_long_blocks is None else self.final_window_long_blocks

    def window_change_steps(self) -> list[int]:
        """The steps whose (short, long) windows differ from the step before's (the final validation's
        extension not counted)."""
        return [s for s in self._distinct_transitions()
                if self.stage_at(s).window_blocks != self.stage_at(s - 1).window_blocks]

    def yarn_steps(self) -> list[int]:
        """The steps where the record rescales RoPE (YaRN, record #31): where the long window differs from
        the step before's (HEAD: [423, 847, 1270]); not at the final validation's extension."""
        return [s for s in self._distinct_transitions()
                if self.stage_at(s).window_blocks[1] != self.stage_at(s - 1).window_blocks[1]]

    def _distinct_transitions(self) -> list[int]:
        return sorted({s for s in self.transition_steps() if 0 < s})

    # ---- optimizer schedules -------------------------------------------------------------------------

    @property
    def cooldown_start(self) -> int:
        """The first step of the lr cooldown: ``int(scheduled_steps * (1 - cooldown_frac))`` (HEAD: 508)."""
        return int(self.scheduled_steps * (1.0 - self.cooldown_frac))

    def lr_factor(self, step: int) -> float:
        """The factor of every base learning rate at ``step``: the stage's ``lr_mul`` before
        :attr:`cooldown_start`, then ``lr_mul * (1 - t) + lr_floor * t`` with t = (step - start) /
        (scheduled_steps - start), capped at 1, so ``lr_floor`` from ``scheduled_steps`` on (HEAD
        TrainingSchedule.get_lr, L1968-1976). The multiplier stays the stage's during the cooldown."""
        lr_mul = float(self.stage_at(step).lr_mul)
        start = self.cooldown_start
        if step < start:
            return lr_mul
        span = self.scheduled_steps - start
        t = 1.0 if span == 0 else min(1.0, (step - start) / span)
        return lr_mul * (1.0 - t) + self.lr_floor * t

    def muon_momentum(self, step: int) -> float:
        """Muon's momentum at ``step``: linear from ``momentum_min`` at 0 to ``momentum_max`` at
        ``momentum_warmup_steps``, then ``momentum_max``, then after ``total_steps - momentum_cooldown_steps``
        linear back down, reaching ``momentum_min`` at ``total_steps``; the warm-up wins where the two overlap
        (HEAD get_muon_momentum, L1995-2007)."""
        self._check_step(step)
        low, high = self.momentum_min, self.momentum_max
        cooldown_start = self.total_steps - self.momentum_cooldown_steps
        if step < self.momentum_warmup_steps:
            return low + step / self.momentum_warmup_steps * (high - low)
        if self.momentum_cooldown_steps and step > cooldown_start:
            return high - (step - cooldown_start) / self.momentum_cooldown_steps * (high - low)
        return high

    # ---- auxiliary-loss weights ----------------------------------------------------------------------

    def mtp_weights(self, step: int) -> list[float]:
        """The multi-token-prediction loss weights at ``step`` (one per predicted offset, the next token's
        first), linear from the stage's start to its end weights by :meth:`stage_progress`; the length is the
        stage's."""
        stage, t = self.stage_at(step), self.stage_progress(step)
        return [a + (b - a) * t for a, b in zip(stage.mtp_weights_start, stage.mtp_weights_end)]

    def prefix_weight(self, step: int) -> float:
        """The prefix-token loss weight at ``step`` (record #88), linear within the stage like
        :meth:`mtp_weights`."""
        stage, t = self.stage_at(step), self.stage_progress(step)
        return stage.prefix_weight_start + (stage.prefix_weight_end - stage.prefix_weight_start) * t

    # ---- untying and warm-up -------------------------------------------------------------------------

    def split_step(self) -> int | None:
        """The record's split step: the first step of ``untie_stage`` made odd (``start | 1``: its Adam
        steps on odd steps only), whose update is still tied and after which the head's Adam state is copied
        to the embedding (HEAD: 847). None when never untied."""
        if self.untie_stage is None:
            return None
        return self.stage_ranges()[self.untie_stage][0] | 1

    def untie_step(self) -> int | None:
        """The first step trained with the embedding untied: :meth:`split_step` + 1 (HEAD: 848), the meaning
        of ``untie_step`` in :mod:`speedrun.train`, which unties before that step's forward. None when never
        untied or not before ``total_steps``."""
        split = self.split_step()
        if split is None or split + 1 >= self.total_steps:
            return None
        return split + 1

    def warm_up_steps(self) -> list[int]:
        """The record's untimed warm-up sample: 0, 1 and the two steps before and after every transition
        (s - 2 .. s + 1, those >= 2), sorted (HEAD: [0, 1, 421, 422, 423, 424, 845, ..., 1271]). Steps that
        are not training steps (>= total_steps, only with fewer than two extension steps) are left out."""
        steps = {0, 1} | {s + offset for s in self.transition_steps() for offset in (-2, -1, 0, 1) if s + offset >= 2}
        return sorted(s for s in steps if s < self.total_steps)

    # ---- conversion ----------------------------------------------------------------------------------

    def with_steps(self, scheduled_steps: int, extension_steps: int) -> "StagedSchedule":
        """The same stages over other step counts (a compressed run: HEAD's stages over 105 + 15 steps)."""
        return dataclasses.replace(self, scheduled_steps=scheduled_steps, extension_steps=extension_steps)

    def to_dict(self) -> dict[str, Any]:
        """The schedule as plain data for YAML or JSON: settings, then ``stages`` as a list of mappings."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("stages", "where")}
        data["stages"] = [{f.name: _plain(getattr(stage, f.name)) for f in dataclasses.fields(stage)}
                          for stage in self.stages]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = SETTING) -> "StagedSchedule":
        """The schedule of a config section (as :meth:`to_dict` writes it; omitted settings take their
        defaults, a stage's omitted ``mtp_weights_end`` / ``prefix_weight_end`` its start values). Raises
        :class:`SpeedrunError` naming ``where`` and the key for a key that is not a setting, a missing
        ``stages`` or stage setting, and every error of the constructor."""
        if not isinstance(data, Mapping):
            raise SpeedrunError(f"{where} must be a mapping of schedule settings, got {data!r}")
        names = [f.name for f in dataclasses.fields(cls) if f.name != "where"]
        _check_keys(data, names, where)
        if "stages" not in data or "scheduled_steps" not in data:
            raise SpeedrunError(f"{where} needs scheduled_steps and stages (a list of stage mappings)")
        stages = data["stages"]
        if not isinstance(stages, (list, tuple)):
            raise SpeedrunError(f"{where}.stages must be a list of stage mappings, got {stages!r}")
        built = tuple(_stage_from_dict(stage, f"{where}.stages[{i}]") for i, stage in enumerate(stages))
        return cls(**{**data, "stages": built}, where=where)


def _stage_from_dict(data: Any, where: str) -> Stage:
    if not isinstance(data, Mapping):
        raise SpeedrunError(f"{where} must be a mapping of stage settings, got {data!r}")
    _check_keys(data, [f.name for f in dataclasses.fields(Stage)], where)
    missing = [name for name in _STAGE_REQUIRED if name not in data]
    if missing:
        raise SpeedrunError(f"{where} needs {', '.join(missing)}")
    return Stage(**data)


def _check_keys(data: Mapping[str, Any], names: Sequence[str], where: str) -> None:
    unknown = [key for key in data if key not in names]
    if unknown:
        raise SpeedrunError(f"{where}.{unknown[0]} is not a setting; the settings are {', '.join(names)}")


def _check_stage(stage: Stage, where: str, extension: bool) -> None:
    if extension and stage.fraction is not None:
        raise SpeedrunError(f"{where}.fraction must be null: the last stage is the extension stage, whose length "
                            f"is extension_steps; got {stage.fraction!r}")
    if not extension:
        _check_number(f"{where}.fraction", stage.fraction, 0.0, 1.0, open_low=True)
    _check_int(f"{where}.tokens_per_step", stage.tokens_per_step, 1)
    _check_int(f"{where}.max_seq_len", stage.max_seq_len, 1)
    blocks = stage.window_blocks
    if not isinstance(blocks, tuple) or len(blocks) != 2 or \
            not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in blocks) or blocks[0] > blocks[1]:
        raise SpeedrunError(f"{where}.window_blocks must be [short, long] block counts >= 1 with short <= long, "
                            f"got {_plain(blocks)!r}")
    _check_number(f"{where}.lr_mul", stage.lr_mul, 0.0, math.inf)
    for name in ("mtp_weights_start", "mtp_weights_end"):
        weights = getattr(stage, name)
        if not isinstance(weights, tuple) or not weights:
            raise SpeedrunError(f"{where}.{name} must be a non-empty list of weights >= 0, got {weights!r}")
        for i, weight in enumerate(weights):
            _check_number(f"{where}.{name}[{i}]", weight, 0.0, math.inf)
    if len(stage.mtp_weights_start) != len(stage.mtp_weights_end):
        raise SpeedrunError(f"{where}.mtp_weights_end must have as many weights as mtp_weights_start "
                            f"({len(stage.mtp_weights_start)}), got {_plain(stage.mtp_weights_end)!r}")
    _check_number(f"{where}.prefix_weight_start", stage.prefix_weight_start, 0.0, math.inf)
    _check_number(f"{where}.prefix_weight_end", stage.prefix_weight_end, 0.0, math.inf)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise SpeedrunError(f"{name} must be an integer >= {minimum}, got {value!r}{number_text_hint(value)}")


def _check_number(name: str, value: Any, low: float, high: float, open_high: bool = False,
                  open_low: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high or (open_high and value >= high) or (open_low and value <= low):
        left, right = "(" if open_low else "[", ")" if open_high else "]"
        wanted = f"a finite number >= {low}" if high == math.inf else f"a number in {left}{low}, {high}{right}"
        raise SpeedrunError(f"{name} must be {wanted}, got {value!r}{number_text_hint(value)}")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


# ---- the records' schedules ------------------------------------------------------------------------------

def _record_stages(fractions: Sequence[float], prefix: bool) -> tuple[Stage, ...]:
    """The stage table shared by records #83-#89 (their TRAINING_STAGES), over ``fractions`` of the
    scheduled steps, with record #88's prefix-token weights when ``prefix``."""
    tokens = 8 * 2048 * 8                            # 131,072 tokens: 8 GPUs x 2048 x 8 sequences' worth
    mtp = [((1.0, 0.5, 0.25), (1.0, 0.5, 0.0)), ((1.0, 0.5), (1.0, 0.0)), ((1.0,), (1.0,))]
    prefixes = [(0.25, 0.25), (0.25, 0.0), (0.0, 0.0)] if prefix else [(0.0, 0.0)] * 3
    rows = [(896, 1, (1, 3), 1.0), (2048, 2, (3, 7), 1.52), (2048, 3, (5, 11), 1.73)]
    stages = [Stage(fraction=fraction, tokens_per_step=tokens * k, max_seq_len=seq, window_blocks=windows,
                    lr_mul=lr_mul, mtp_weights_start=start, mtp_weights_end=end, prefix_weight_start=p0,
                    prefix_weight_end=p1)
              for fraction, (seq, k, windows, lr_mul), (start, end), (p0, p1) in zip(fractions, rows, mtp, prefixes)]
    extension = Stage(tokens_per_step=tokens * 3, max_seq_len=2048, window_blocks=(6, 13), lr_mul=1.0)
    return (*stages, extension)


_THIRDS = (1 / 3, 1 / 3, 1 / 3)

_RECORDS = {
    # HEAD (f411b3d, record #89 2026-07-17 FP8DownProjection): 1270 + 15 steps
    "record89": StagedSchedule(stages=_record_stages(_THIRDS, prefix=True), scheduled_steps=1270, extension_steps=15,
                               untie_stage=2, final_window_long_blocks=20),
    # record #88, 2026-07-13 PrefixTokenPrediction: 1365 + 10 steps
    "record88": StagedSchedule(stages=_record_stages(_THIRDS, prefix=True), scheduled_steps=1365, extension_steps=10,
                               untie_stage=2, final_window_long_blocks=20),
    # record #87, 2026-06-11 RecursiveFromBest: stages of 0.36 / 0.32 / 0.32, 1387 + 11 steps, never untied
    "record87": StagedSchedule(stages=_record_stages((0.36, 0.32, 0.32), prefix=False), scheduled_steps=1387,
                               extension_steps=11, untie_stage=None, final_window_long_blocks=20),
    # record #83, 2026-05-20 BigramsSignTrick as re-run by #87 (baseline_pr299): 1375 + 10 steps
    "record83": StagedSchedule(stages=_record_stages(_THIRDS, prefix=False), scheduled_steps=1375, extension_steps=10,
                               untie_stage=2, final_window_long_blocks=20),
}
RECORD_SCHEDULES: Mapping[str, StagedSchedule] = {"head": _RECORDS["record89"], **_RECORDS}


def record_schedule(name: str) -> StagedSchedule:
    """The schedule of a record's own train_gpt.py (../shared/reference-code): ``head`` (= ``record89``),
    ``record88``, ``record87`` or ``record83``. Raises :class:`SpeedrunError` for another name."""
    if name not in RECORD_SCHEDULES:
        raise SpeedrunError(f"no record schedule {name!r}; the records are {', '.join(RECORD_SCHEDULES)}")
    return RECORD_SCHEDULES[name]
