"""The part every optimizer of ours shares: a ``torch.optim.Optimizer`` whose update is per parameter."""

from __future__ import annotations

from typing import Any

import torch


class PerParameterOptimizer(torch.optim.Optimizer):
    """``step()`` calls ``self._update(p, group)`` for every parameter with a gradient; a subclass writes
    only ``_update`` (the update rule of one tensor, with its state in ``self.state[p]``)."""

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
