"""Per-run time of a finished (or partly finished) workflow: one line per parsed run, from the parse stage's
records (``results/parse/<variant>/seed<N>.json``) and Snakemake's own log of the call (the train job's start and
end, to the second), for benchmarks/gpu_workflow.sh.

    python benchmarks/workflow_runs.py WORKDIR SNAKEMAKE_LOG... [--json OUT.jsonl]

Columns (seconds): ``job`` (Snakemake's job from start to end: launcher, torchrun, the process and its exit),
``wall`` (our process, from its start to its log's ``phases:`` line; none for a script variant's log),
``compile`` (``compile_s``; none in a record's log), ``train_time``, ``overhead`` (``wall - train_time -
compile``; for a script variant ``job - train_time``, its compile included, as its log does not tell it apart)
``outside`` (``job - wall``: what the launcher, torchrun and the interpreter's exit add) and ``to_step``
(``first_step - compile``: from the process's start to its first timed step, the compile left out; issue 21 asks
at most 10 s with a warm compile cache).
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import datetime
from pathlib import Path

from speedrun.analysis.logs import RunRecord

# Snakemake 9's job lines: "[Thu Dec  3 07:01:02 2026]", a "rule train:" block naming its output and jobid,
# then "[...]" and "Finished jobid: 5 (Rule: train)".
_STAMP_RE = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]", re.M)
_JOB_RE = re.compile(r"^(?:local)?(?:rule|checkpoint) \w+:\n(?:[ \t]+.*\n)*?[ \t]+output: ([^,\s]+)[^\n]*\n"
                     r"(?:[ \t]+.*\n)*?[ \t]+jobid: (\d+)", re.M)
_DONE_RE = re.compile(r"^Finished jobid: (\d+)", re.M)


def job_seconds(log_text: str) -> dict[str, float]:
    """A job's first output path (``results/train/<variant>/seed<N>.txt`` for a training run) -> seconds from
    its start to its end (to the second), for every job that finished in this log."""
    stamps = [(m.start(), datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y"))
              for m in _STAMP_RE.finditer(log_text)]

    def stamp_before(pos: int) -> datetime | None:
        before = [t for p, t in stamps if p <= pos]
        return before[-1] if before else None

    starts = {m.group(2): (m.group(1), stamp_before(m.start())) for m in _JOB_RE.finditer(log_text)}
    out = {}
    for m in _DONE_RE.finditer(log_text):
        if m.group(1) in starts:
            output, began = starts[m.group(1)]
            ended = stamp_before(m.start())
            if began and ended:
                out[output] = (ended - began).total_seconds()
    return out


def run_rows(workdir: Path, log_texts: list[str]) -> list[dict]:
    """One row per parsed run under ``workdir/results/parse`` (module docstring); ``log_texts``: Snakemake's
    logs of the calls (job ids are numbered per call)."""
    jobs = {output: s for text in log_texts for output, s in job_seconds(text).items()}
    rows = []
    for path in sorted((workdir / "results" / "parse").glob("*/seed*.json")):
        record = RunRecord.from_json(json.loads(path.read_text()), str(path))
        variant, seed = path.parent.name, path.stem.removeprefix("seed")
        train = None if record.train_time_ms is None else record.train_time_ms / 1000
        phases = record.phases_s or {}
        job = jobs.get(f"results/train/{variant}/seed{seed}.txt")
        wall = phases.get("wall")
        if wall is not None:
            overhead = record.overhead_s
        elif job is not None and train is not None:
            overhead = job - train
        else:
            overhead = None
        rows.append({"variant": variant, "seed": seed, "status": record.status, "val_loss": record.val_loss,
                     "job": job, "wall": wall, "compile": record.compile_s, "train_time": train,
                     "overhead": overhead, "outside": None if job is None or wall is None else job - wall,
                     "to_step": (phases["first_step"] - phases.get("compile", 0.0)) if "first_step" in phases else None,
                     "phases": phases or None})
    return rows


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("snakemake_logs", type=Path, nargs="+", help="Snakemake's output of each call")
    parser.add_argument("--json", type=Path, help="also write the rows here, one JSON object a line")
    args = parser.parse_args()
    texts = [p.read_text(errors="replace") for p in args.snakemake_logs if p.is_file()]
    rows = run_rows(args.workdir, texts)
    print(f"{'run':<20} {'status':<9} {'job':>7} {'wall':>7} {'compile':>7} {'train':>7} {'overhead':>8} "
          f"{'outside':>7} {'to_step':>7}  val_loss")
    for r in rows:
        print(f"{r['variant'] + ' ' + r['seed']:<20} {r['status']:<9} {_cell(r['job']):>7} {_cell(r['wall']):>7} "
              f"{_cell(r['compile']):>7} {_cell(r['train_time']):>7} {_cell(r['overhead']):>8} "
              f"{_cell(r['outside']):>7} {_cell(r['to_step']):>7}  {r['val_loss']}")
    if args.json:
        args.json.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
