"""Annealed Langevin (SGLD) noise for NorMuon (record 2026-06-11 "RecursiveFromBest": "NorMuon with
annealed row-RMS-scaled Langevin (SGLD) noise that is zero by the cooldown"; Welling & Teh 2011 for SGLD).

The record gives no formula; ours is:

    u <- u + σ_t · rms(u) · ξ,   ξ ~ N(0, 1) elementwise,
    σ_t = σ · (1 - t / cooldown_start)  for t < cooldown_start,   0 from cooldown_start on,

(record #87's own script, 2026-06-11, does give one: the same line ending at step int(0.25 · scheduled steps)
and ramped up over its first 50 steps, :func:`langevin_sigma`'s ``end_step`` and ``warmup_steps``; its noise
is drawn per shard of its banks, so its draw depends on the GPUs' layout where ours does not)

applied to the update u after NorMuon's variance normalization (before the learning rate and the shape
multiplier scale it), with ``cooldown_start = int(steps · (1 - cooldown_frac))`` the step at which the learning
rate starts to fall (:func:`speedrun.optim.schedules.lr_factor`). ``rms(u)`` is taken along the side that
NorMuon normalizes: per row when rows >= cols, else per column, so every "row" in NorMuon's sense gets noise
of its own size. ξ comes from a ``torch.Generator`` per matrix, seeded by :func:`matrix_seed` from the run's
noise seed, the optimizer step and the parameter's place in its group, so that the draw is the same on every
rank and does not depend on the world size or on how the matrices are banked or sharded.
"""

from __future__ import annotations

import hashlib

import torch


def langevin_sigma(step: int, steps: int, cooldown_frac: float, scale: float, *, warmup_steps: int = 0,
                   end_step: int | None = None) -> float:
    """σ_t at ``step`` (0-based) of ``steps``: ``scale · (1 - step / end)`` for step < end, 0 from there on,
    with end = ``end_step``, or ``cooldown_start = int(steps · (1 - cooldown_frac))`` when it is None; and during
    the first ``warmup_steps`` times ``step / warmup_steps`` as well (record #87's schedule: warm-up 50, end
    int(0.25 · 1387) = 346, its ``get_normuon_noise_scale``). Raises ``ValueError`` for a negative ``scale``,
    ``cooldown_frac`` outside [0, 1], a negative ``warmup_steps`` or ``end_step``, or ``step`` outside
    [0, steps]."""
    if scale < 0 or not 0.0 <= cooldown_frac <= 1.0 or warmup_steps < 0 or (end_step is not None and end_step < 0):
        raise ValueError(f"langevin noise needs scale >= 0, cooldown_frac in [0, 1], warmup_steps >= 0 and "
                         f"end_step >= 0, got {scale}, {cooldown_frac}, {warmup_steps}, {end_step}")
    if not 0 <= step <= steps:
        raise ValueError(f"step {step} is outside 0..{steps}")
    end = int(steps * (1.0 - cooldown_frac)) if end_step is None else end_step
    if step >= end:
        return 0.0
    sigma = scale * (1.0 - step / end)
    return sigma * step / warmup_steps if step < warmup_steps else sigma


def matrix_seed(noise_seed: int, step: int, group_index: int, param_index: int) -> int:
    """A 63-bit seed for the noise of parameter ``param_index`` of param group ``group_index`` at optimizer
    update ``step`` of a run with ``noise_seed``: a hash (BLAKE2b) of the four integers, the same in every
    process and independent of world size and banking."""
    digest = hashlib.blake2b(f"{noise_seed}:{step}:{group_index}:{param_index}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little") >> 1


def standard_normal(shape: tuple[int, ...], seeds: list[int | None], dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor:
    """A (len(seeds), *shape) ``dtype`` tensor whose slice i is N(0, 1) drawn from a generator seeded by
    ``seeds[i]`` on ``device``, or zeros where ``seeds[i]`` is None (padding slots of a sharded bank). One
    ``randn`` per matrix."""
    out = torch.zeros((len(seeds), *shape), dtype=dtype, device=device)
    for i, seed in enumerate(seeds):
        if seed is not None:
            generator = torch.Generator(device=device).manual_seed(seed)
            torch.randn(shape, generator=generator, dtype=dtype, device=device, out=out[i])
    return out


def row_rms(update: torch.Tensor) -> torch.Tensor:
    """RMS of ``update`` (..., rows, cols) along NorMuon's side: (..., rows, 1) per row when rows >= cols,
    else (..., 1, cols) per column, in ``update``'s dtype (computed in fp32 at least)."""
    reduce_dim = -1 if update.size(-2) >= update.size(-1) else -2
    stats = torch.promote_types(update.dtype, torch.float32)       # bf16 updates: the mean in fp32
    return update.to(stats).square().mean(dim=reduce_dim, keepdim=True).sqrt().to(update.dtype)


def add_langevin_noise(update: torch.Tensor, sigma: float, noise: torch.Tensor) -> torch.Tensor:
    """``update + sigma · row_rms(update) · noise`` for ``update`` and ``noise`` (..., rows, cols) of one
    float dtype; a new tensor. A zero update (a padding slot) stays zero."""
    return torch.addcmul(update, row_rms(update), noise, value=sigma)
