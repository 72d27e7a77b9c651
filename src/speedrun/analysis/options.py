"""The command-line options of the stages that test groups of runs (``speedrun stats``, ``compare``, ``bundle``),
declared once: ``--target``, ``--alpha``, ``--split-code`` and ``--only`` (:func:`add_group_test_options`), their
check (:func:`check_group_test_options`) and the grouping they ask for (:func:`code_split`); compare's and
bundle's ``--describe-baseline`` / ``--describe-candidate`` (:func:`add_side_description_options`).
"""

from __future__ import annotations

import argparse

from speedrun.analysis.group_stats import DEFAULT_ALPHA, DEFAULT_TARGET, check_alpha, check_target
from speedrun.analysis.groups import CodeSplit


def add_group_test_options(parser: argparse.ArgumentParser, *, paths: str, sides: bool,
                           target: float | None = DEFAULT_TARGET) -> None:
    """Add ``--target``, ``--alpha``, ``--split-code`` and ``--only`` to ``parser``.

    Args:
        paths: how the help of ``--only`` names the stage's paths (``the PATHs``, ``BASELINE and CANDIDATE``).
        sides: the stage takes a baseline and a candidate, each of which must be one group (``--split-code``
            then splits a side, which must hold one code version).
        target: the default of ``--target`` (val_loss, nats/token); None makes the target optional (compare:
            it adds each side's z-rule and, at the public 3.28, the val_tokens rule).
    """
    if target is None:
        parser.add_argument("--target", type=float, default=None,
                            help=f"the experiment's val_loss target: adds each side's z-rule, and with "
                                 f"{DEFAULT_TARGET} (the public metric) val_tokens other than 10,485,760 is a rule "
                                 "violation")
    else:
        parser.add_argument("--target", type=float, default=target,
                            help=f"val_loss to beat (default {target}, the public record rule)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help=f"significance level of the one-sided tests (default {DEFAULT_ALPHA})")
    parser.add_argument("--split-code", action="store_true",
                        help="split a side by code version too (it must then hold one version)" if sides else
                        "also split a directory by code version (hash of the code dump; default: pool them and "
                        "list the versions, as the published figures do)")
    parser.add_argument("--only", nargs="+", metavar="FILE",
                        help=f"read only these files of {paths} (a directory keeps its group name; the workflow "
                             "passes the configured seeds)")


def add_side_description_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--describe-baseline TEXT`` and ``--describe-candidate TEXT`` (compare, bundle): what each side
    runs, one line, shown with the rules check (the workflow: our model's preset and the settings that differ,
    or a script variant's script path and sha256); read back with :func:`side_descriptions`."""
    parser.add_argument("--describe-baseline", metavar="TEXT",
                        help="what the baseline runs, one line (the workflow: our model's settings, or a script "
                             "variant's script path and sha256); shown with the rules check")
    parser.add_argument("--describe-candidate", metavar="TEXT", help="what the candidate runs, as --describe-baseline")


def side_descriptions(args: argparse.Namespace) -> dict[str, str]:
    """``baseline``/``candidate`` -> the text of ``--describe-<side>``, for the sides given one."""
    return {side: text for side, text in (("baseline", args.describe_baseline),
                                          ("candidate", args.describe_candidate)) if text}


def check_group_test_options(args: argparse.Namespace) -> None:
    """Refuse an ``--alpha`` outside (0, 1) or a ``--target`` (when given) that is not a finite val_loss above 0.

    Raises:
        SpeedrunError: naming the option and its value (:func:`~speedrun.analysis.group_stats.check_alpha`,
            :func:`~speedrun.analysis.group_stats.check_target`).
    """
    check_alpha(args.alpha)
    if args.target is not None:
        check_target(args.target)


def code_split(args: argparse.Namespace) -> CodeSplit:
    """The grouping ``--split-code`` asks for: ``split`` by code version, else ``pool`` the versions."""
    return "split" if args.split_code else "pool"
