"""The files of a parsed run (docs/formats.md "Parsed run"): the per-step metrics CSV and the result record's
JSON, written atomically from :func:`speedrun.analysis.logs.parse_log` (:func:`parse_to_files`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import pandas as pd

from speedrun.analysis.logs import METRIC_COLUMNS, RunRecord, parse_log
from speedrun.errors import SpeedrunError
from speedrun.support.atomic import atomic_open, write_text


def write_metrics_csv(metrics: pd.DataFrame, f: Any) -> None:
    """Write the metrics table as docs/formats.md's CSV to the open text file ``f`` (empty cell = absent)."""
    metrics.to_csv(f, index=False, columns=list(METRIC_COLUMNS), na_rep="", lineterminator="\n")


def record_to_json_text(record: RunRecord) -> str:
    """The record as indented, key-sorted JSON text (non-finite floats are written as null)."""
    obj = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.to_json().items()}
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def parse_to_files(log: str, csv_path: str | None = None, json_path: str | None = None,
                   seed: int | None = None) -> str:
    """Parse ``log``; write the metrics CSV and/or record JSON atomically; return the record's JSON text.
    ``seed``: the run's seed, recorded where the log names none (a record's own script logs none: the workflow's
    seed numbers a script variant's replicates and names the run in the report).

    Raises:
        SpeedrunError: ``log`` cannot be read or is not a training log; the log names a seed other than ``seed``;
            an output path is a folder (checked before anything is written, so a refused call leaves neither
            file).
    """
    for path, what in ((csv_path, "--csv"), (json_path, "--json")):
        if path and os.path.isdir(path):
            raise SpeedrunError(f"{what} {path}: is a folder; expected a file name")
    parsed = parse_log(log)
    record = parsed.record
    if seed is not None:
        if record.seed not in (None, seed):
            raise SpeedrunError(f"{log}: the log's seed is {record.seed}, not the run's seed {seed} (--seed)")
        record = dataclasses.replace(record, seed=seed)
    text = record_to_json_text(record)
    if csv_path:
        with atomic_open(csv_path, newline="") as f:
            write_metrics_csv(parsed.metrics, f)
    if json_path:
        write_text(json_path, text)
    return text
