"""Schedules as pure functions of the step (speedrun-spec.md 3.5; modded-nanogpt L1968-2007).

``step`` counts optimizer updates from 0: the update that produces step s+1 uses the values at s.
"""

from __future__ import annotations

from typing import Sequence


def lr_factor(step: int, steps: int, cooldown_frac: float, lr_floor: float,
              stage_multipliers: Sequence[float] = ()) -> float:
    """Multiplier of every base learning rate at ``step`` of ``steps``.

    ``m``, the stage multiplier of ``step`` (``stage_multipliers[stage_index(step, steps, n)]`` over n
    equal stages; 1.0 when empty), until ``cooldown_start = int(steps * (1 - cooldown_frac))``, then
    ``m * (1 - t) + lr_floor * t`` with t linear from 0 at cooldown_start to 1 at ``steps``: the speedrun's
    linear warm-down to an absolute floor (0.15 since record #72), with the record's lr multipliers tied to
    its batch-size stages (1.0, 1.52, 1.73 over thirds; speedrun-spec.md 3.5). ``cooldown_frac`` 0 means
    ``m`` throughout. Raises ``ValueError`` when ``cooldown_frac`` is outside [0, 1], ``lr_floor`` outside
    [0, 1], a stage multiplier is negative or ``step`` is outside [0, steps].
    """
    if not 0.0 <= cooldown_frac <= 1.0 or not 0.0 <= lr_floor <= 1.0:
        raise ValueError(f"cooldown_frac and lr_floor must lie in [0, 1], got {cooldown_frac}, {lr_floor}")
    if not 0 <= step <= steps:
        raise ValueError(f"step {step} is outside 0..{steps}")
    if any(m < 0 for m in stage_multipliers):
        raise ValueError(f"stage multipliers must be >= 0, got {list(stage_multipliers)}")
    multiplier = stage_multipliers[stage_index(step, steps, len(stage_multipliers))] if stage_multipliers else 1.0
    start = int(steps * (1.0 - cooldown_frac))
    if step < start or start == steps:
        return multiplier
    t = (step - start) / (steps - start)
    return multiplier * (1.0 - t) + t * lr_floor


def muon_momentum(step: int, warmup_steps: int, start: float = 0.85, end: float = 0.95, *, steps: int = 0,
                  cooldown_steps: int = 0) -> float:
    """Muon momentum at ``step``: linear from ``start`` at step 0 to ``end`` at ``warmup_steps`` (records
    #9+, 0.85 -> 0.95 over 300 steps), then ``end``; with ``cooldown_steps``, linear from ``end`` at
    ``steps - cooldown_steps`` back down to ``start`` at ``steps`` (the record's last 50 steps,
    speedrun-spec.md 3.5). The warm-up wins where the two overlap, as in the record. ``warmup_steps`` 0
    means no warm-up. Raises ``ValueError`` for a negative step, warmup_steps or cooldown_steps, and with a
    cooldown for a ``step`` beyond ``steps``."""
    if warmup_steps < 0 or step < 0 or cooldown_steps < 0:
        raise ValueError(f"step, warmup_steps and cooldown_steps must be >= 0, got {step}, {warmup_steps}, "
                         f"{cooldown_steps}")
    if cooldown_steps and step > steps:
        raise ValueError(f"step {step} is beyond the {steps} steps of the momentum cooldown")
    if step < warmup_steps:
        frac = step / warmup_steps
        return (1.0 - frac) * start + frac * end
    cooldown_start = steps - cooldown_steps
    if cooldown_steps and step > cooldown_start:
        frac = (step - cooldown_start) / cooldown_steps
        return (1.0 - frac) * end + frac * start
    return end


def stage_index(step: int, steps: int, stages: int) -> int:
    """The stage (0..stages-1) of ``step`` when ``steps`` are split into ``stages`` stages ending at
    ``round(k/stages · steps)`` (halves rounded up), k = 1..stages (the speedrun's thirds: 1270 steps give
    boundaries 423, 847, speedrun-spec.md 3.5). Raises ``ValueError`` for stages < 1 or a step outside
    [0, steps]."""
    if stages < 1 or not 0 <= step <= steps:
        raise ValueError(f"need stages >= 1 and 0 <= step <= steps, got step {step}, steps {steps}, "
                         f"stages {stages}")
    return sum(step >= int(k * steps / stages + 0.5) for k in range(1, stages))


def window_blocks(step: int, steps: int, schedule: Sequence[tuple[int, int]],
                  final_long_blocks: int | None = None) -> tuple[int, int]:
    """``(short, long)`` attention windows in 128-token blocks at ``step`` of ``steps``: the schedule's
    entry for :func:`stage_index` (equal stages; records #13, #20, #31: (1, 3), (3, 7), (5, 11)). At
    ``step == steps`` (the final validation) the long window becomes ``final_long_blocks`` when given
    (record #33: 20 blocks). Raises ``ValueError`` on an empty schedule."""
    if not schedule:
        raise ValueError("the window schedule needs at least one (short, long) stage")
    short, long = schedule[stage_index(min(step, steps - 1) if steps else 0, steps, len(schedule))]
    if step == steps and final_long_blocks is not None:
        long = final_long_blocks
    return short, long


def stage_starts(steps: int, stages: int) -> list[int]:
    """First step of each of ``stages`` equal stages of ``steps`` (the boundaries of :func:`stage_index`):
    [0, round(steps/stages), ...]. Raises ``ValueError`` for stages < 1 or steps < 0."""
    if stages < 1 or steps < 0:
        raise ValueError(f"need stages >= 1 and steps >= 0, got {stages}, {steps}")
    return [0] + [int(k * steps / stages + 0.5) for k in range(1, stages)]


def batch_stages(steps: int, schedule: Sequence[tuple[int, int]], tokens_per_step: int,
                 max_seq_len: int) -> list[tuple[int, int, int]]:
    """The batch-size schedule (record #46: 131,072 -> 262,144 -> 393,216 tokens per step; with the
    max_seq_len schedule of record #72, 896 -> 2048) as ``(first_step, tokens_per_step, max_seq_len)``
    per stage, in order. ``schedule``: one ``(tokens_per_step, max_seq_len)`` pair per equal stage of the
    steps (:func:`stage_index`); empty: one stage of ``tokens_per_step`` and ``max_seq_len``. Stages that
    would start at the same step (more stages than steps) keep only the last."""
    if not schedule:
        return [(0, tokens_per_step, max_seq_len)]
    starts = stage_starts(steps, len(schedule))
    stages: dict[int, tuple[int, int, int]] = {}
    for start, (tokens, seq_len) in zip(starts, schedule):
        stages[start] = (start, tokens, seq_len)
    return sorted(stages.values())
