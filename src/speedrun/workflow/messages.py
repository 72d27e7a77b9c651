"""Hints appended to the workflow's config messages, kept apart from :mod:`speedrun.workflow.planning` (which
calls them) so that each says where a wrong value really comes from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Iterable

from speedrun.errors import number_text_hint

ENV_TEXT_HINT = " (the environment holds text: write true/false in quotes)"


def schema_value_hint(config_files: str, key: str, value: Any) -> str:
    """How to fix a number that reached the schema as text. With ``--config`` among ``config_files``
    (``config.yaml + --config``), quotes are not the cause: Snakemake's ``--config`` hands the numbers inside a
    list or mapping (``--config 'variants={"baseline": {"seeds": [0]}}'``) to the workflow as text, so the hint
    says to set ``key`` in a ``--configfile`` instead. Otherwise :func:`speedrun.errors.number_text_hint`
    (``write 0 without quotes``); ``""`` for a value that is no number written as text. A variant's ``seeds``
    given as one integer (``seeds: 3``) or as text of integers (``seeds: 0,1,2``) is shown as the list it may
    have meant. A script variant's ``env`` value true/false (YAML's booleans) is to be quoted."""
    if key.endswith(".seeds") and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        runs = ", ".join(map(str, range(value))) if value <= 4 else f"0, 1, ..., {value - 1}"
        more = f", [{runs}] for {value} runs" if value > 1 else ""
        return f" (seeds is a list, one run per seed: [{value}] for seed {value}{more})"
    if ".script.env." in f".{key}" and isinstance(value, bool):       # a script variant's env: {FLAG: true}
        return ENV_TEXT_HINT
    parts = value.replace(",", " ").split() if isinstance(value, str) else []
    if key.endswith(".seeds") and parts and all(part.isdigit() for part in parts):
        return f" (seeds is a YAML list: [{', '.join(parts)}])"
    hint = number_text_hint(value)
    if not hint or "--config" not in config_files.replace("--configfile", ""):
        return hint
    return (f" (text, not a number: Snakemake's --config passes the numbers inside a list or mapping as text, "
            f"with or without quotes; set {key} in a YAML file given with --configfile)")


def value_span(values: Iterable[int]) -> str:
    """``values`` as one number, or as ``min-max`` where they differ (a staged schedule's tokens per step or
    max_seq_len)."""
    values = list(values)
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def more_data_hint(train_shards: int, steps: int, fed: int, tokens: int, stages: Sequence[tuple[int, int, int]],
                   documents: int | None) -> str:
    """What more data a run that the train shards cannot feed needs (after "or "). ``stages``: ``(first step,
    tokens per step, max_seq_len)`` per batch stage (:meth:`speedrun.training.config.TrainConfig.batch_stages`).
    When the steps fed read most of the tokens, more shards of the same kind: about ``train_shards * steps /
    fed``. When they read less than half (documents longer than ``max_seq_len`` lose their tails: a one-document
    corpus feeds one sequence however many shards it fills), cutting the same documents into more shards would
    not help: the hint counts documents instead (``documents``: how many the train shards hold, their BOS
    tokens; None: no document is cut, contiguous batches, so more shards always help). Their number: at least
    one per max_seq_len tokens of every step, summed over the stages (the sequences the steps read), and about
    ``documents`` x the sequences of all ``steps`` / those of the ``fed`` ones (documents feed sequences in
    proportion, copies of a shard included)."""
    tokens_per_step = stages[0][1]
    if documents is None or fed * tokens_per_step >= tokens / 2:
        return f"use more data (about {-(-train_shards * steps // max(fed, 1))} train shards)"
    ends = [first for first, _, _ in stages[1:]] + [steps]

    def demand(upto: int) -> int:   # sequences of max_seq_len that steps [0, upto) read, at least one document each
        return sum(-(-max(0, min(end, upto) - first) * per_step // seq_len)
                   for (first, per_step, seq_len), end in zip(stages, ends))
    needed, bound = demand(steps), "at least"
    if documents and fed:
        needed, bound = max(needed, -(-documents * needed // demand(fed))), "about"
    return (f"use more documents: the train shards hold {documents} document start(s) (BOS) and feed {fed} steps; "
            f"each document feeds a step at most max_seq_len {value_span(s for _, _, s in stages)} tokens, so {steps} "
            f"steps need {bound} "
            f"{needed} documents (the same documents cut into more shards would not help)")
