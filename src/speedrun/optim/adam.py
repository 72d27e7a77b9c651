"""Adam for the embedding, the LM head and scalar parameters (the speedrun keeps Adam for these,
speedrun-spec.md 3.3): ``torch.optim.AdamW`` with decoupled weight decay (Loshchilov & Hutter 2019), or
:class:`CautiousAdam`, Adam with cautious weight decay (record #50)."""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from speedrun.kernels import optional_kernel
from speedrun.optim.base import PerParameterOptimizer

# the one-pass CUDA update (None without the triton package); torch.compile does not trace the optimizers
_FUSED_UPDATE = optional_kernel("adam", "cautious_adam_")
_FUSED_MANY = optional_kernel("adam", "cautious_adam_many_")          # the same, many small parameters per launch
_FUSED_COPTIM = optional_kernel("adam", "cautious_adam_coptim_")      # with C-Optim's mask, in two passes
_MANY_MAX_NUMEL = optional_kernel("adam", "MANY_MAX_NUMEL")              # its largest parameter


def build_adamw(param_groups: Iterable[dict[str, Any]], betas: tuple[float, float], eps: float,
                weight_decay: float, fused: bool, cautious_weight_decay: bool = False) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` over ``param_groups`` (each with its own ``lr``), decoupled weight decay
    ``weight_decay``; ``fused`` only on CUDA (``fused=False`` on CPU). With ``cautious_weight_decay``, a
    :class:`CautiousAdam` instead."""
    if cautious_weight_decay:
        return CautiousAdam(list(param_groups), betas=betas, eps=eps, weight_decay=weight_decay)
    return torch.optim.AdamW(list(param_groups), betas=betas, eps=eps, weight_decay=weight_decay,
                             fused=fused)


def is_adam(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is one of our Adams (``torch.optim.AdamW`` or :class:`CautiousAdam`)."""
    return isinstance(optimizer, (torch.optim.AdamW, CautiousAdam))


def set_adam_eps(optimizers: Iterable[torch.optim.Optimizer], eps: float) -> None:
    """Set ε to ``eps`` in every parameter group of the Adam optimizers among ``optimizers`` (``AdamW`` and
    :class:`CautiousAdam`; others untouched), for the next step: both read their group's ``eps`` at every step
    (``OptimConfig.adam_eps_units`` micro_batch_sum: the records' ε per stage)."""
    for optimizer in optimizers:
        if is_adam(optimizer):
            for group in optimizer.param_groups:
                group["eps"] = eps


class CautiousAdam(PerParameterOptimizer):
    """Adam with cautious weight decay (record #50; speedrun-spec.md 3.3), fp32 state. At step t (from 1):

        m <- β1·m + (1-β1)·g;  v <- β2·v + (1-β2)·g²
        u  = m / (sqrt(v) + eps)
        u <- (1 - s)·u + s·u·k / max(mean(k), 1e-3),  k = [u·g > 0]    (only in a group with ``coptim`` s > 0)
        p <- p - η²·λ·p·[u·p > 0] - η·sqrt(1-β2^t)/(1-β1^t) · u

    The decay (∝ η², the scheduled lr squared) applies only where the step also moves p towards zero. The
    third line is C-Optim's sign-agreement mask (record #87, 2026-06-11 RecursiveFromBest, strength 0.5 on its
    value-embedding and bigram tables): the coordinates whose step disagrees with the gradient's sign are damped,
    the others scaled up by 1/mean(k), the mean over the whole tensor. Parameters of any shape and float dtype
    (the new p is computed in fp32 and rounded once to p's dtype: for the records' bf16 weights, as their
    ``_adam_update_step``); ``lr``, ``eps`` and ``coptim`` (default 0) per group. On CUDA each parameter is
    updated in one pass of :func:`speedrun.kernels.adam.cautious_adam_` (the same formula; the records compile
    theirs into one kernel), the small ones together in one launch (:func:`speedrun.kernels.adam.cautious_adam_many_`,
    :meth:`step`), and a group with C-Optim in the two passes of :func:`speedrun.kernels.adam.cautious_adam_coptim_`;
    elsewhere the eager update below. Raises ``ValueError`` on an invalid hyperparameter.
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.008, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-10, weight_decay: float = 0.0):
        if lr < 0 or eps <= 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"CautiousAdam needs lr >= 0, 0 <= betas < 1, eps > 0, weight_decay >= 0; got "
                             f"lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update of every parameter that has a gradient (:meth:`_update`), except that on CUDA the small ones
        the one-pass kernel takes (at most 65,536 elements, in a group without C-Optim: the records' scalars, gates,
        lambdas and MUDD weights) are collected and updated together in one launch per dtype pair
        (:func:`speedrun.kernels.adam.cautious_adam_many_`, the same values). Returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        many: list[tuple[torch.Tensor, tuple[float, float, float, float, float]]] = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if (_FUSED_MANY is not None and p.numel() <= _MANY_MAX_NUMEL and not group.get("coptim", 0.0)
                        and self._fused(p, group)):
                    many.append((p, self._advance(p, group)))
                else:
                    self._update(p, group)
        if many:
            state = [self.state[p] for p, _ in many]
            _FUSED_MANY([p for p, _ in many], [p.grad for p, _ in many], [s["exp_avg"] for s in state],
                        [s["exp_avg_sq"] for s in state], [settings for _, settings in many])
        return loss

    @torch.no_grad()
    def warm_up(self) -> None:
        """Compile (or load) the CUDA kernels that :meth:`step` will launch, for the dtypes of this optimizer's
        parameters, on scratch tensors of 16 elements (Triton specializes on the dtypes and on sizes divisible by
        16, as the real ones are): the first update then compiles nothing inside the timed run. No parameter or
        state changes; nothing off CUDA or without Triton."""
        fused = [(p, bool(group.get("coptim", 0.0))) for group in self.param_groups
                 for p in group["params"] if p.is_cuda and p.dtype != torch.float64]
        device = fused[0][0].device if fused else None
        for dtype, coptim in {(p.dtype, coptim) for p, coptim in fused}:
            p, m, v = torch.zeros(16, dtype=dtype, device=device), *torch.zeros(2, 16, device=device)
            settings = (0.9, 0.95, 1e-8, 0.0, 0.0)                    # a zero step: the scratch stays zero
            if coptim:
                if _FUSED_COPTIM is not None:
                    _FUSED_COPTIM(p, p.clone(), m, v, *settings, 0.5)
                continue
            if _FUSED_UPDATE is not None:
                _FUSED_UPDATE(p, p.clone(), m, v, *settings)
            if _FUSED_MANY is not None:
                _FUSED_MANY([p], [p.clone()], [m], [v], [settings])

    def _advance(self, p: torch.Tensor, group: dict[str, Any]) -> tuple[float, float, float, float, float]:
        """Count the step in ``p``'s state (made at its first step: ``step`` 0, fp32 zero moments) and return the
        fused update's settings: (beta1, beta2, eps, step size lr·sqrt(1-β2^t)/(1-β1^t), decay lr²·λ)."""
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
        state["step"] += 1
        beta1, beta2 = group["betas"]
        lr, t = group["lr"], state["step"]
        step_size = lr * math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)
        return beta1, beta2, group["eps"], step_size, lr * lr * group["weight_decay"]

    @staticmethod
    def _fused(p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Whether a kernel updates ``p``: on CUDA, not fp64, contiguous; the one-pass kernel without C-Optim,
        the two-pass one with it."""
        kernel = _FUSED_COPTIM if group.get("coptim", 0.0) else _FUSED_UPDATE
        return (kernel is not None and p.is_cuda and p.dtype != torch.float64 and p.is_contiguous()
                and p.grad.is_contiguous())

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        beta1, beta2, eps, step_size, decay = self._advance(p, group)
        state = self.state[p]
        strength = group.get("coptim", 0.0)
        if self._fused(p, group):
            if strength:
                _FUSED_COPTIM(p, p.grad, state["exp_avg"], state["exp_avg_sq"], beta1, beta2, eps, step_size,
                              decay, strength)
            else:
                _FUSED_UPDATE(p, p.grad, state["exp_avg"], state["exp_avg_sq"], beta1, beta2, eps, step_size,
                              decay)
            return
        grad = p.grad.float()
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.lerp_(grad, 1.0 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        update = m / (v.sqrt() + eps)
        if strength:
            keep = ((update * grad) > 0).float()                  # C-Optim (record #87): agreeing coordinates
            update = update * ((1.0 - strength) + strength * keep / keep.mean().clamp_min(1e-3))
        exact = torch.promote_types(p.dtype, torch.float32)      # fp32, or fp64 for fp64 parameters
        step = update.to(exact).mul_(step_size)
        if group["weight_decay"]:
            weight = p.to(exact)
            step.addcmul_(weight, (step * weight) > 0, value=decay)                      # strictly: #50
        p.sub_(step)                       # computed in fp32, rounded once to p's dtype (bf16: as the records)
