"""Analysis of training logs: parsing, grouping of runs and the record statistics.

Modules, one concept each (none imports torch, so statistics over a thousand logs stay fast):

* :mod:`speedrun.analysis.logs`: ``parse_log`` reads one training log of any era (llm.c, the public
  modded-nanogpt speedrun, our own ``speedrun train`` logs) into per-step metrics and a ``RunRecord``.
* :mod:`speedrun.analysis.groups`: ``collect_runs`` turns paths (logs, parsed-run JSON, directories)
  into groups of comparable runs, splitting a directory by step count or GPU count and flagging
  duplicate runs.
* :mod:`speedrun.analysis.tests`: the statistical tests (one-sample t-test against the target,
  Welch t-tests, confidence intervals, speedup) as small pure functions returning named records.
* :mod:`speedrun.analysis.tables`: text and Markdown rendering of those records.
"""
