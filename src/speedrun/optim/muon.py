"""Muon: momentum orthogonalized by a Newton–Schulz-type iteration (Keller Jordan 2024, "Muon: An optimizer
for hidden layers in neural networks"; records #3 and #4 of the public speedrun, Polar Express record #38).

For each 2-D parameter W (rows, cols) with gradient G, at momentum β and learning rate η:

    buf <- β·buf + (1-β)·G                       (momentum as an EMA)
    u   <- (1-β)·G + β·buf   (Nesterov)  or  buf
    W   <- W·(1 - η·λ) - η·max(1, rows/cols)^0.5 · orthogonalize(u)

with decoupled weight decay λ (AdamW-style; 0 by default). The EMA form and the shape multiplier follow
speedrun-spec.md 3.2 (the speedrun's Muon; modded-nanogpt L189-192, L509-522).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from speedrun.optim.orthogonalize import ORTHOGONALIZERS, Orthogonalizer, orthogonalize


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


class Muon(torch.optim.Optimizer):
    """Muon over 2-D parameters (``torch.optim.Optimizer`` interface).

    Args:
        params: parameters or parameter groups; every parameter must be 2-D.
        lr: learning rate η (per group; schedules rescale ``group["lr"]``).
        momentum: β in [0, 1) (scheduled through ``group["momentum"]``).
        nesterov: Nesterov-style update direction (default True).
        weight_decay: decoupled weight decay λ.
        orthogonalizer: ``"polar_express"`` (default, record #38) or ``"newton_schulz"`` (records #3-#37).

    Raises ``ValueError`` on a parameter that is not 2-D or an invalid hyperparameter.
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.05, momentum: float = 0.95,
                 nesterov: bool = True, weight_decay: float = 0.0,
                 orthogonalizer: Orthogonalizer = "polar_express"):
        if lr < 0 or not 0.0 <= momentum < 1.0 or weight_decay < 0:
            raise ValueError(f"Muon needs lr >= 0, 0 <= momentum < 1, weight_decay >= 0; got lr={lr}, "
                             f"momentum={momentum}, weight_decay={weight_decay}")
        if orthogonalizer not in ORTHOGONALIZERS:
            raise ValueError(f"unknown orthogonalizer {orthogonalizer!r}; expected {ORTHOGONALIZERS}")
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                        orthogonalizer=orthogonalizer)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon updates 2-D matrices only, got a parameter of shape "
                                     f"{tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update of every parameter that has a gradient. Returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
        grad = p.grad.float()
        direction = nesterov_momentum(grad, state["momentum_buffer"], group["momentum"], group["nesterov"])
        update = orthogonalize(direction, group["orthogonalizer"])
        lr = group["lr"]
        if group["weight_decay"]:
            p.mul_(1.0 - lr * group["weight_decay"])
        p.add_(update.to(p.dtype), alpha=-lr * muon_lr_multiplier(p.shape))
