"""Schedules as pure functions of the step (speedrun-spec.md 3.5; modded-nanogpt L1968-2007).

``step`` counts optimizer updates from 0: the update that produces step s+1 uses the values at s.
"""

from __future__ import annotations


def lr_factor(step: int, steps: int, cooldown_frac: float, lr_floor: float) -> float:
    """Multiplier of every base learning rate at ``step`` of ``steps``.

    1.0 until ``cooldown_start = int(steps * (1 - cooldown_frac))``, then linear from 1.0 at
    cooldown_start to ``lr_floor`` at ``steps`` (the speedrun's linear warm-down; floor 0.15 since record
    #72). ``cooldown_frac`` 0 means constant 1.0. Raises ``ValueError`` when ``cooldown_frac`` is outside
    [0, 1], ``lr_floor`` outside [0, 1] or ``step`` outside [0, steps].
    """
    if not 0.0 <= cooldown_frac <= 1.0 or not 0.0 <= lr_floor <= 1.0:
        raise ValueError(f"cooldown_frac and lr_floor must lie in [0, 1], got {cooldown_frac}, {lr_floor}")
    if not 0 <= step <= steps:
        raise ValueError(f"step {step} is outside 0..{steps}")
    start = int(steps * (1.0 - cooldown_frac))
    if step < start or start == steps:
        return 1.0
    t = (step - start) / (steps - start)
    return (1.0 - t) + t * lr_floor


def muon_momentum(step: int, warmup_steps: int, start: float = 0.85, end: float = 0.95) -> float:
    """Muon momentum at ``step``: linear from ``start`` at step 0 to ``end`` at ``warmup_steps``, then
    ``end`` (records #9+, 0.85 -> 0.95 over 300 steps). ``warmup_steps`` 0 means ``end`` throughout."""
    if warmup_steps < 0 or step < 0:
        raise ValueError(f"step and warmup_steps must be >= 0, got {step}, {warmup_steps}")
    if warmup_steps == 0 or step >= warmup_steps:
        return end
    frac = step / warmup_steps
    return (1.0 - frac) * start + frac * end
