"""When a run has diverged: the rule shared by the training loop (which stops the run) and the log parser (which
reports it as ``diverged``, never counted), docs/formats.md "Divergence".

A run has diverged at the first logged loss that is

- not finite (NaN or infinite), train or val;
- a ``val_loss`` at a step after 0 above the run's step-0 ``val_loss`` (the untrained model's); or
- a smoothed train loss above the run's first ``train_loss`` (the loss of the untrained model on the first
  batch). Smoothed: the exponential moving average ``s_1 = l_1``, ``s_k = 0.9 s_(k-1) + 0.1 l_k`` over the logged
  train losses in order, so that one noisy step of a run still near its start does not count, while a loss that
  explodes (one step at twice the first loss already does) or stays above the start does.

Why this rule: a model that does worse than it did untrained has learnt nothing the target could reward, and in
the public record logs (/work/shared/reference-logs: 94 logs, every era from llm.c to 2026, parsed with
:mod:`speedrun.analysis.logs`) no run comes near it: the highest val_loss after step 0 is 6.17 against a step-0
value of 11.01 (llm.c, 2024-10-13), every later record stays below 6.04, and of the logs that print train losses
none has even one raw train loss above its first (the highest: 10.96 against 11.01, 2024-10-13_llmc; 10.08
against 10.83, 2024-11-19_FlexAttention). The issue's exploded runs (val_loss 562,200 from 10.8) are caught at
their first validation or within a few train steps.

Pure Python, no imports of the package: :mod:`speedrun.training.loop` and :mod:`speedrun.analysis.logs` use it.
"""

from __future__ import annotations

import math

SMOOTHING = 0.9           # weight of the previous average in the smoothed train loss


class DivergenceWatch:
    """Fed a run's losses in log order; :meth:`val` and :meth:`train` return why the run has diverged
    (one phrase, e.g. ``val_loss 562200 at step 20 above its step-0 value 10.83``) or ``None``."""

    def __init__(self) -> None:
        self.val0: float | None = None
        self.train0: float | None = None
        self.smoothed: float | None = None

    def val(self, step: int, loss: float) -> str | None:
        """The val_loss logged at ``step``: the first one at step 0 is the reference."""
        if not math.isfinite(loss):
            return f"non-finite val_loss at step {step}"
        if step == 0 and self.val0 is None:
            self.val0 = loss
            return None
        if self.val0 is not None and loss > self.val0:
            return f"val_loss {loss:.6g} at step {step} above its step-0 value {self.val0:.6g}"
        return None

    def train(self, step: int, loss: float) -> str | None:
        """The train_loss logged at ``step`` (the first one is the reference)."""
        if not math.isfinite(loss):
            return f"non-finite train_loss at step {step}"
        if self.train0 is None:
            self.train0 = self.smoothed = loss
            return None
        self.smoothed = SMOOTHING * self.smoothed + (1.0 - SMOOTHING) * loss
        if self.smoothed > self.train0:
            return (f"smoothed train_loss {self.smoothed:.6g} at step {step} above its first value "
                    f"{self.train0:.6g} (train_loss {loss:.6g})")
        return None
