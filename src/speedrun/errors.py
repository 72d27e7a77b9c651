"""User-facing errors.

Every error a user can cause (a bad config value, a corrupt shard, a missing column) is raised as
:class:`SpeedrunError` with a message that names the file, key or value and what was expected. The
``speedrun`` command prints such errors as one line and exits with status 2 instead of a traceback.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Iterable

import yaml


class SpeedrunError(Exception):
    """An error in the user's input or data, with a message meant to be read by that user."""


def number_text_hint(value: Any) -> str:
    """A hint for a number that arrived as text, for error messages: YAML 1.1 (PyYAML, Snakemake's config)
    reads ``1e-10`` (no decimal point) or ``4.6e0`` (no exponent sign) as a string, and a quoted number is
    text too; the hint says how to write it so that YAML reads a number: a whole number as an integer (which
    integer and float settings both take), any other as a float. Empty for anything else."""
    if not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    if number.is_integer() and abs(number) < 1e15:
        written = str(int(number))                   # "10" -> 10, 1e3 -> 1000: an integer setting takes it
    else:
        mantissa, e, exponent = repr(number).partition("e")
        written = (mantissa if "." in mantissa else mantissa + ".0") + e + exponent   # 1e-10 -> 1.0e-10
    if isinstance(yaml.safe_load(value), str):
        return f" (text, not a number: YAML reads {value} as a string; write it as {written})"
    return f" (text, not a number: write {written} without quotes)"


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """`` (did you mean 'steps'?)`` for a misspelt ``key`` when one to three of ``known`` are close to it
    (difflib's ratio >= 0.75, as ``stesp`` to ``steps``), else ``""``."""
    close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.75)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
