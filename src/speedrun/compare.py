"""Stage ``compare``: a candidate group of runs against a baseline group (Welch t-tests, CIs, speedup).

``speedrun compare BASELINE CANDIDATE [--target T] [--alpha 0.01] [--split-code] [--only FILE...]
[--json-out FILE] [--markdown-out FILE] [--json]``

Each side is a path as in ``speedrun stats`` that must resolve to exactly one group (``--only``: just the files
listed, as in ``speedrun stats``). Runs that are not complete (diverged, failed, truncated) are listed per side
with their reason, never counted; so are duplicates (a side's second log of one run: an identical file or loss
curve, :func:`speedrun.analysis.groups.find_duplicates`; the run counts once). Each such run is listed once, in log
order, with all its reasons (a copy of a diverged log: ``diverged, duplicate``). Tests (Welch 1947; the record rules ask
a candidate to be faster than the prior record, README L207-226, and the 2026-05-07 verifier uses a one-sided
Welch test on times):

* val_loss, H1: the candidate's mean val_loss is lower, ``ttest_ind(cand, base, equal_var=False,
  alternative="less")``;
* train_time (s), H1: the candidate is faster, same call on the times;
* the differences candidate - baseline with two-sided 95% Welch confidence intervals, and the speedup
  (baseline mean - candidate mean, s and % of the baseline);
* with ``--target``, the fixed-sigma z-rule ``(target - mean) * sqrt(n) >= 0.004`` of each side
  (:func:`speedrun.analysis.tests.z_rule`);
* the rules check (:mod:`speedrun.analysis.rules`): same train and validation data, validation tokens, world
  size, GPUs and compile flags; every violation is also a warning. With ``--describe-baseline`` /
  ``--describe-candidate`` it names what each side runs (the JSON's ``runs``). ``val_tokens`` other than 10,485,760 is a
  violation only with ``--target 3.28`` (the public metric), a note otherwise (also without ``--target``).
"""

from __future__ import annotations

import argparse
import json

from speedrun.analysis.comparison import compare_groups, one_group
from speedrun.analysis.groups import check_only
from speedrun.analysis.options import (add_group_test_options, add_side_description_options,
                                      check_group_test_options, code_split, side_descriptions)
from speedrun.support.atomic import printable, write_json, write_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("baseline", metavar="BASELINE", help="baseline runs: a directory, a log or a parsed-run .json")
    parser.add_argument("candidate", metavar="CANDIDATE", help="candidate runs, as BASELINE")
    add_group_test_options(parser, paths="BASELINE and CANDIDATE", sides=True, target=None)
    add_side_description_options(parser)
    parser.add_argument("--json-out", metavar="FILE", help="also write the comparison as JSON to FILE")
    parser.add_argument("--markdown-out", metavar="FILE", help="also write the comparison as Markdown to FILE")
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the table")


def main(args: argparse.Namespace) -> int:
    from speedrun.analysis.comparison_tables import comparison_markdown, comparison_text

    check_group_test_options(args)
    check_only([args.baseline, args.candidate], args.only)
    split = code_split(args)
    result = compare_groups(one_group(args.baseline, "BASELINE", split, args.only),
                            one_group(args.candidate, "CANDIDATE", split, args.only), args.alpha, args.target)
    sides = side_descriptions(args)
    output = {**result.to_json(), **({"runs": sides} if sides else {})}
    if args.json_out:
        write_json(args.json_out, output)
    if args.markdown_out:
        write_text(args.markdown_out, comparison_markdown(result, sides))
    # file names that are not UTF-8 as backslash escapes, as in speedrun stats
    print(printable(json.dumps(output, indent=2) if args.json else comparison_text(result)))
    return 0
