"""Muon: momentum orthogonalized by a Newton–Schulz-type iteration (Keller Jordan 2024, "Muon: An optimizer
for hidden layers in neural networks"; records #3 and #4 of the public speedrun, Polar Express record #38),
optionally with NorMuon's variance normalization (records #41, #42, #48) and cautious weight decay (#43).

For each 2-D parameter W (rows, cols) with gradient G, at momentum β, learning rate η, lr multiplier
μ = max(1, rows/cols)^0.5 and weight decay λ:

    buf <- β·buf + (1-β)·G                       (momentum as an EMA)
    u   <- (1-β)·G + β·buf   (Nesterov)  or  buf
    u   <- orthogonalize(u)
    u   <- normalize(u)      (NorMuon, with beta2; see :func:`variance_normalize`)
    W   <- W·(1 - η·λ) - η·μ·u                   (decoupled decay, the default)
    W   <- W - η·λ·η·μ·W·[u·W >= 0] - η·μ·u       (cautious decay, record #43: ∝ η², and only where
                                                  the update also shrinks W)

The EMA form and the shape multiplier follow speedrun-spec.md 3.2 (the record: lr 0.023, beta2 0.9,
weight decay 1.2, cautious).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from speedrun.optim.base import PerParameterOptimizer
from speedrun.optim.orthogonalize import ORTHOGONALIZERS, Orthogonalizer, orthogonalize

NORMUON_EPS = 1e-10


def muon_lr_multiplier(shape: torch.Size | tuple[int, ...]) -> float:
    """``max(1, rows/cols) ** 0.5`` for a (rows, cols) matrix: 1 for square and wide matrices, 2 for a
    (4C, C) MLP input matrix."""
    rows, cols = shape
    return max(1.0, rows / cols) ** 0.5


def nesterov_momentum(grad: torch.Tensor, buf: torch.Tensor, momentum: float, nesterov: bool = True
                      ) -> torch.Tensor:
    """Update ``buf`` in place to ``momentum·buf + (1-momentum)·grad``; return the update direction:
    ``(1-momentum)·grad + momentum·buf`` with Nesterov, else ``buf`` itself (a new tensor either way)."""
    buf.lerp_(grad, 1.0 - momentum)
    return grad.lerp(buf, momentum) if nesterov else buf.clone()


def second_moment_shape(shape: torch.Size | tuple[int, ...]) -> tuple[int, int]:
    """Shape of NorMuon's reduced second-moment buffer for a (rows, cols) update: (rows, 1) when
    rows >= cols (one value per row of the longer side), else (1, cols)."""
    rows, cols = shape
    return (rows, 1) if rows >= cols else (1, cols)


def variance_normalize(update: torch.Tensor, second_moment: torch.Tensor, beta2: float,
                       eps: float = NORMUON_EPS) -> torch.Tensor:
    """NorMuon's normalization (records #41, #42, #48; speedrun-spec.md 3.2) of an orthogonalized update
    (rows, cols) fp32.

    The mean of squares along the longer side (per row if rows >= cols, else per column) is averaged into
    ``second_moment`` (shape :func:`second_moment_shape`, updated in place: ``m <- beta2·m + (1-beta2)·v``);
    each row (column) is divided by ``sqrt(m + eps)``, and the result is rescaled to the Frobenius norm of
    ``update``. Returns a new tensor; a zero update stays zero.
    """
    reduce_dim = 1 if second_moment.size(1) == 1 else 0
    second_moment.lerp_(update.square().mean(dim=reduce_dim, keepdim=True), 1.0 - beta2)
    normalized = update * torch.rsqrt(second_moment + eps)
    scale = torch.linalg.matrix_norm(update) / torch.linalg.matrix_norm(normalized).clamp_min(1e-30)
    return normalized * scale


def cautious_mask(update: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """Bool tensor, True where ``update·param >= 0``: there the step ``param -= lr·update`` moves the
    weight towards zero, and cautious weight decay (record #43) applies."""
    return (update * param) >= 0


class Muon(PerParameterOptimizer):
    """Muon over 2-D parameters (``torch.optim.Optimizer`` interface).

    Args:
        params: parameters or parameter groups; every parameter must be 2-D.
        lr: learning rate η (per group; schedules rescale ``group["lr"]``).
        momentum: β in [0, 1) (scheduled through ``group["momentum"]``).
        nesterov: Nesterov-style update direction (default True).
        weight_decay: weight decay λ.
        orthogonalizer: ``"polar_express"`` (default, record #38) or ``"newton_schulz"`` (records #3-#37).
        normuon_beta2: None (plain Muon) or the beta2 in [0, 1) of NorMuon's variance normalization
            (record: 0.9).
        cautious_weight_decay: decay ∝ η² only where update and weight agree in sign (record #43); else
            decoupled decay W·(1 - η·λ).

    Raises ``ValueError`` on a parameter that is not 2-D or an invalid hyperparameter.
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.05, momentum: float = 0.95,
                 nesterov: bool = True, weight_decay: float = 0.0,
                 orthogonalizer: Orthogonalizer = "polar_express", normuon_beta2: float | None = None,
                 cautious_weight_decay: bool = False):
        if lr < 0 or not 0.0 <= momentum < 1.0 or weight_decay < 0:
            raise ValueError(f"Muon needs lr >= 0, 0 <= momentum < 1, weight_decay >= 0; got lr={lr}, "
                             f"momentum={momentum}, weight_decay={weight_decay}")
        if normuon_beta2 is not None and not 0.0 <= normuon_beta2 < 1.0:
            raise ValueError(f"normuon_beta2 must be None or in [0, 1), got {normuon_beta2}")
        if orthogonalizer not in ORTHOGONALIZERS:
            raise ValueError(f"unknown orthogonalizer {orthogonalizer!r}; expected {ORTHOGONALIZERS}")
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                        orthogonalizer=orthogonalizer, normuon_beta2=normuon_beta2,
                        cautious_weight_decay=cautious_weight_decay)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon updates 2-D matrices only, got a parameter of shape "
                                     f"{tuple(p.shape)}")

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
        grad = p.grad.float()
        direction = nesterov_momentum(grad, state["momentum_buffer"], group["momentum"], group["nesterov"])
        update = orthogonalize(direction, group["orthogonalizer"]).float()
        if group["normuon_beta2"] is not None:
            if "second_moment" not in state:
                state["second_moment"] = torch.zeros(second_moment_shape(p.shape), dtype=torch.float32,
                                                     device=p.device)
            update = variance_normalize(update, state["second_moment"], group["normuon_beta2"])
        lr, decay = group["lr"], group["weight_decay"]
        lr_eff = lr * muon_lr_multiplier(p.shape)
        if decay and group["cautious_weight_decay"]:
            mask = cautious_mask(update, p.float())
            p.sub_((p * mask).mul_(lr * decay * lr_eff))
        elif decay:
            p.mul_(1.0 - lr * decay)
        p.add_(update.to(p.dtype), alpha=-lr_eff)
