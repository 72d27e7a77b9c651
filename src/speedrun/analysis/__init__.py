"""Analysis of training logs: parsing, grouping of runs, the record statistics and their rendering.

Modules, one concept each (none imports torch, so statistics over a thousand logs stay fast):

* :mod:`speedrun.analysis.logs`: ``parse_log`` reads one training log of any era (llm.c, the public
  modded-nanogpt speedrun, our own ``speedrun train`` logs) into per-step metrics and a ``RunRecord``.
* :mod:`speedrun.analysis.provenance`: what a log says about where the run came from (git commit, config and
  data hashes, validation tokens, hardware, versions, compile settings).
* :mod:`speedrun.analysis.groups`: ``collect_runs`` turns paths (logs, parsed-run JSON, directories)
  into groups of comparable runs, splitting a directory by step count or GPU count (and, on request, code
  version) and flagging duplicate runs (identical files or loss curves).
* :mod:`speedrun.analysis.tests`: the statistical tests (one-sample t-test against the target, Welch t-tests,
  confidence intervals, speedup, the fixed-sigma z-rule) as small pure functions returning named records.
* :mod:`speedrun.analysis.power`: the runs a group needs for p < alpha at its observed mean and std.
* :mod:`speedrun.analysis.rules`: the rules check of a candidate against its baseline (same data, validation
  tokens, hardware, compile flags).
* :mod:`speedrun.analysis.parsed_files`: a parsed run's files (metrics CSV, record JSON).
* :mod:`speedrun.analysis.options`: the command-line options the stages over groups of runs share.
* :mod:`speedrun.analysis.report_inputs`: the report's inputs (parsed runs, summary.json, comparisons), read and
  checked against each other.
* :mod:`speedrun.analysis.bundle_folder`: the ready-to-submit record folder (logs found and copied, statistics
  of the copies).
* Rendering, computing nothing: :mod:`~speedrun.analysis.tables` (stats table, statistics.md),
  :mod:`~speedrun.analysis.comparison_tables`, :mod:`~speedrun.analysis.snippets` (scipy code that reproduces
  the figures), :mod:`~speedrun.analysis.bundle_readme`, :mod:`~speedrun.analysis.report_tables` and
  :mod:`~speedrun.analysis.report_plots` (the report stage's Markdown and plots).
"""
