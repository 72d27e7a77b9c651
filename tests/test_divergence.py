"""Divergence beyond NaN (docs/formats.md "Divergence", :mod:`speedrun.support.divergence`): the rule on hand
-computed losses, the log parser's use of it (a log that never says ``run diverged`` is judged all the same),
the statistics that never count such a run, and the claim that no public record run meets the rule."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from speedrun.analysis.group_stats import compute_stats
from speedrun.analysis.logs import parse_log, read_record
from speedrun.errors import SpeedrunError
from speedrun.support.divergence import DivergenceWatch
from test_logs import REFERENCE

REFERENCE_LOGS = Path(os.environ.get("SPEEDRUN_REFERENCE_LOGS", REFERENCE))   # or test_logs' ../shared
SEP = "=" * 100


def test_a_val_loss_above_the_step0_value_diverges():
    watch = DivergenceWatch()
    assert watch.val(0, 10.8) is None
    assert watch.val(20, 10.8) is None                                   # equal is not above
    assert watch.val(40, 562200.0) == "val_loss 562200 at step 40 above its step-0 value 10.8"


def test_the_smoothed_train_loss_tolerates_a_noisy_step_but_not_an_explosion():
    watch = DivergenceWatch()
    assert watch.train(1, 10.0) is None
    assert watch.train(2, 8.0) is None              # s = 0.9 * 10 + 0.1 * 8 = 9.8
    assert watch.train(3, 11.0) is None             # s = 0.9 * 9.8 + 0.1 * 11 = 9.92: one step above the start
    why = watch.train(4, 20.0)                      # s = 0.9 * 9.92 + 0.1 * 20 = 10.928 > 10
    assert why == "smoothed train_loss 10.928 at step 4 above its first value 10 (train_loss 20)"
    rising = DivergenceWatch()                      # a rise from the start: s = 10.05 > 10 at once
    assert rising.train(1, 10.0) is None
    assert rising.train(2, 10.5) == "smoothed train_loss 10.05 at step 2 above its first value 10 (train_loss 10.5)"


def test_non_finite_losses_diverge_as_before():
    watch = DivergenceWatch()
    assert watch.val(0, float("nan")) == "non-finite val_loss at step 0"
    assert DivergenceWatch().train(3, float("inf")) == "non-finite train_loss at step 3"


def _log(val_losses: dict[int, float], steps: int = 4) -> str:
    """One of our logs with falling train losses and the given val_loss per step."""
    lines = ["speedrun: 0.1.0", "variant: v", "seed: 0", 'config: {"steps": 4}', "world_size: 1",
             "tokens_per_step: 4096", "device: cpu", SEP]
    for s in range(steps + 1):
        if s:
            lines.append(f"step:{s}/{steps} train_loss:{10.8 - s:.4f} train_time:{100 * s}ms step_avg:100.00ms")
        if s in val_losses:
            lines.append(f"step:{s}/{steps} val_loss:{val_losses[s]:.4f} train_time:{100 * s}ms "
                         "step_avg:100.00ms")
    lines.append("peak memory allocated: 1 MiB reserved: 1 MiB")
    return "\n".join(lines) + "\n"


def test_a_log_whose_val_loss_exploded_is_diverged_and_never_counted(tmp_path):
    group = tmp_path / "huge-lr"
    group.mkdir()
    (group / "seed0.txt").write_text(_log({0: 10.8, 2: 6.0, 4: 562200.0}))
    (group / "seed1.txt").write_text(_log({0: 10.8, 2: 6.0, 4: 819525.0}))
    (group / "seed2.txt").write_text(_log({0: 10.8, 2: 6.0, 4: 5.0}))
    record = read_record(group / "seed0.txt")
    assert (record.status, record.val_loss) == ("diverged", None)
    assert record.reason == "val_loss 562200 at step 4 above its step-0 value 10.8"
    [stats] = compute_stats([str(group)], target=6.0)
    summary = stats.to_json()
    assert summary["n"] == 1 and summary["val_loss_mean"] == pytest.approx(5.0)
    assert summary["incomplete"] == {"diverged": 2}
    assert [r["status"] for r in summary["runs"]] == ["diverged", "diverged", "complete"]


@pytest.mark.skipif(not REFERENCE_LOGS.is_dir(), reason="the public reference logs are absent")
def test_no_public_record_run_meets_the_rule():
    statuses = {}
    for path in sorted(glob.glob(str(REFERENCE_LOGS / "**" / "*"), recursive=True)):
        if not os.path.isfile(path) or path.endswith(".md"):
            continue
        try:
            statuses[path] = parse_log(path).record.status
        except SpeedrunError:
            continue
    assert len(statuses) >= 90
    assert "diverged" not in statuses.values()
