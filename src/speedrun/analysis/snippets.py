"""Python snippets that reproduce the statistics with scipy alone, for statistics.md and a bundle's README.

The public records paste such snippets into their READMEs (speedrun-spec.md 5.1: ``losses = [...]``, ``times =
[...]``, ``scipy.stats.ttest_1samp(losses, 3.28, alternative="less")``); ours print exactly the line that our
tables show, so a reader can check every figure by running the snippet (tests/test_bundle.py does).
Values are written with ``repr``: the logged 4-decimal val_loss and train_time in seconds (ms / 1000).
"""

from __future__ import annotations

from typing import Sequence

SNIPPET_IMPORTS = ["import numpy as np", "from scipy import stats", ""]


def _values(name: str, values: Sequence[float]) -> str:
    return f"{name} = [{', '.join(repr(float(v)) for v in values)}]"


def one_sample_snippet(val_loss: Sequence[float], train_time_s: Sequence[float], target: float) -> str:
    """Code printing :func:`speedrun.analysis.tables.test_line` for these runs (n >= 2 val_losses).

    ``val_loss`` (nats/token) and ``train_time_s`` (s) have shape ``(n,)`` and ``(m,)``, ``m <= n`` (llm.c
    logs have no time). The time part is computed when ``m >= 2``, else printed as the table prints it.
    """
    time_part = ('time={np.mean(train_time_s):.2f}±{np.std(train_time_s, ddof=1):.2f}s'
                 if len(train_time_s) >= 2 else
                 f"time={train_time_s[0]:.2f}±–s" if len(train_time_s) == 1 else "time=–±–s")
    lines = SNIPPET_IMPORTS + [
        _values("val_loss", val_loss),
        _values("train_time_s", train_time_s),
        f"res = stats.ttest_1samp(val_loss, {target!r}, alternative=\"less\")",
        'print(f"n={len(val_loss)} val_loss={np.mean(val_loss):.4f}±{np.std(val_loss, ddof=1):.4f} '
        f't={{res.statistic:.3f}} p(mean<{target:g})={{res.pvalue:.4g}} {time_part}")',
    ]
    return "\n".join(lines) + "\n"


def welch_snippet(baseline: Sequence[float], candidate: Sequence[float], quantity: str, unit: str) -> str:
    """Code printing the one-sided Welch test of H1: mean(candidate) < mean(baseline) on ``quantity``.

    ``baseline``/``candidate`` have shapes ``(n_b,)``, ``(n_c,)``, both n >= 2, in ``unit``. The printed line
    is ``<quantity>: diff=<mean c - mean b> t=<t> dof=<dof> p=<p>``.
    """
    lines = SNIPPET_IMPORTS + [
        _values(f"baseline_{quantity}", baseline),
        _values(f"candidate_{quantity}", candidate),
        f"res = stats.ttest_ind(candidate_{quantity}, baseline_{quantity}, equal_var=False, alternative=\"less\")",
        f'print(f"{quantity}: diff={{np.mean(candidate_{quantity}) - np.mean(baseline_{quantity}):.4f}}{unit} '
        't={res.statistic:.3f} dof={res.df:.1f} p={res.pvalue:.4g}")',
    ]
    return "\n".join(lines) + "\n"
