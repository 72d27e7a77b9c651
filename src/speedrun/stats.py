"""Stage ``stats``: per group of runs, val_loss and train_time statistics and the record-rule t-test.

``speedrun stats PATH... [--target 3.28] [--alpha 0.01] [--split-code] [--only FILE...] [--json]
[--json-out FILE] [--markdown-dir DIR]``

Each PATH is a training log, a parsed-run ``.json`` or a directory of them; a directory is one group, and files
named one by one are grouped by their folder (``DIR/*.txt`` is the group ``DIR``; grouping:
:mod:`speedrun.analysis.groups`; ``--split-code`` also splits by code version; ``--only`` reads just the files
listed). Among several PATHs (``reference-logs/*``), one that holds no run (a folder of subfolders only, a
README.md) is skipped with a note on stderr, unless none is left. Only complete, non-duplicate runs are counted in ``n``; incomplete runs (diverged, failed, truncated)
and duplicates are listed. The test is the record rule (modded-nanogpt README L207-220): one-sided
``scipy.stats.ttest_1samp(val_loss, target, alternative="less")``, met when ``p < alpha`` with at least 3
counted runs; next to p, the runs needed for ``p < alpha`` at the observed mean and std
(:mod:`speedrun.analysis.power`). Output layout: docs/formats.md "Statistics".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from speedrun.analysis.group_stats import compute_stats
from speedrun.analysis.options import add_group_test_options, check_group_test_options, code_split
from speedrun.support.atomic import printable, write_json, write_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="training logs, parsed-run .json files, or directories of them: each directory is "
                             "one group, and files named one by one are grouped by their folder (DIR/*.txt is "
                             "the group DIR)")
    add_group_test_options(parser, paths="the PATHs", sides=False)
    parser.add_argument("--json", action="store_true", help="print the JSON list instead of the table")
    parser.add_argument("--json-out", metavar="FILE", help="also write the JSON list to FILE (summary.json)")
    parser.add_argument("--markdown-dir", metavar="DIR", help="also write DIR/<group>/statistics.md per group")


def main(args: argparse.Namespace) -> int:
    check_group_test_options(args)
    notes: list[str] = []
    results = compute_stats(args.paths, args.target, args.alpha, code_split(args), args.only, notes)
    for note in notes:
        print(printable(f"speedrun stats: note: {note}"), file=sys.stderr)
    objects = [s.to_json() for s in results]
    if args.json_out:
        write_json(args.json_out, objects)
    if args.markdown_dir:                            # <dir>/<group slug>/statistics.md, each atomically
        from speedrun.analysis.tables import statistics_markdown

        for s in results:
            write_text(Path(args.markdown_dir) / s.group.slug / "statistics.md", statistics_markdown(s))
    if args.json:
        print(json.dumps(objects, indent=2))
    else:
        from speedrun.analysis.tables import stats_table

        print(printable(stats_table(results)))  # file names that are not UTF-8 as backslash escapes
    return 0
