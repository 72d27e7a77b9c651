"""Hints appended to the workflow's config messages, kept apart from :mod:`speedrun.workflow.planning` (which
calls them) so that each says where a wrong value really comes from."""

from __future__ import annotations

import difflib
from typing import Any, Iterable

from speedrun.errors import number_text_hint


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """`` (did you mean 'steps'?)`` for a misspelt ``key`` when one to three of ``known`` are close to it
    (difflib's ratio >= 0.75, as ``stesp`` to ``steps``), else ``""``."""
    close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.75)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def schema_value_hint(config_files: str, key: str, value: Any) -> str:
    """How to fix a number that reached the schema as text. With ``--config`` among ``config_files``
    (``config.yaml + --config``), quotes are not the cause: Snakemake's ``--config`` hands the numbers inside a
    list or mapping (``--config 'variants={"baseline": {"seeds": [0]}}'``) to the workflow as text, so the hint
    says to set ``key`` in a ``--configfile`` instead. Otherwise :func:`speedrun.errors.number_text_hint`
    (``write 0 without quotes``); ``""`` for a value that is no number written as text. A variant's ``seeds``
    given as one integer (``seeds: 3``) is shown as the list it may have meant."""
    if key.endswith(".seeds") and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        runs = ", ".join(map(str, range(value))) if value <= 4 else f"0, 1, ..., {value - 1}"
        more = f", [{runs}] for {value} runs" if value > 1 else ""
        return f" (seeds is a list, one run per seed: [{value}] for seed {value}{more})"
    hint = number_text_hint(value)
    if not hint or "--config" not in config_files.replace("--configfile", ""):
        return hint
    return (f" (text, not a number: Snakemake's --config passes the numbers inside a list or mapping as text, "
            f"with or without quotes; set {key} in a YAML file given with --configfile)")


def more_data_hint(train_shards: int, steps: int, fed: int, tokens: int, tokens_per_step: int, max_seq_len: int,
                   documents: int | None) -> str:
    """What more data a run that the train shards cannot feed needs (after "or "). When the steps fed read most
    of the tokens, more shards of the same kind: about ``train_shards * steps / fed``. When they read less than
    half (documents longer than ``max_seq_len`` lose their tails: a one-document corpus feeds one sequence
    however many shards it fills), more shards of the same documents would not help: the hint counts
    documents instead, ``steps * tokens_per_step / max_seq_len`` of them at least (``documents``: how many
    the train shards hold, their BOS tokens; None: no document is cut, contiguous batches, so more shards
    always help)."""
    if documents is None or fed * tokens_per_step >= tokens / 2:
        return f"use more data (about {-(-train_shards * steps // max(fed, 1))} train shards)"
    needed = -(-steps * tokens_per_step // max_seq_len)
    return (f"use more documents: the train shards hold {documents} document start(s) (BOS), each document feeds at "
            f"most max_seq_len "
            f"{max_seq_len} tokens, so {steps} steps need at least {needed} documents (more shards of the same "
            "documents would not help)")
