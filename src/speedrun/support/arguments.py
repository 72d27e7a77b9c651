"""Command-line values of the form ``NAME=VALUE``, read one way by every stage that takes them
(``speedrun run-script --env NAME=VALUE``, ``speedrun report --describe VARIANT=TEXT``)."""

from __future__ import annotations

from typing import Sequence

from speedrun.errors import SpeedrunError


def name_value_pairs(pairs: Sequence[str], option: str, form: str = "NAME=VALUE") -> dict[str, str]:
    """``pairs`` (each ``NAME=VALUE``; the value may hold ``=`` and may be empty) as name -> value, later
    names winning.

    Raises:
        SpeedrunError: a pair without ``=`` or with an empty name, naming ``option`` and the ``form`` expected
            (e.g. ``--env 'X': expected NAME=VALUE``).
    """
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SpeedrunError(f"{option} {pair!r}: expected {form}")
        out[name] = value
    return out
