"""A run's phases (issue 21, item 3): the ``phases:`` line a tiny CPU training writes, its values against what
the test measures from outside, the parser's reading of it (and of an older log without it), and the report's
run-time table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speedrun.analysis.logs import RunRecord, read_record
from speedrun.analysis.tables import run_time_table
from speedrun.errors import SpeedrunError
from speedrun.support.phases import (IMPORTED_AT, PHASES, RunPhases, other_seconds, overhead_seconds, parse_phases,
                                     process_start)
from speedrun.training.config import TrainConfig
from speedrun.training.loop import run_training
from synthetic_data import counting_documents, write_dataset
from test_logs import our_log, write
from test_train import QUICK, STEP_RE

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, Path]:
    return write_dataset(tmp_path_factory.mktemp("synth"), counting_documents(600), shard_tokens=16384)


def phases_line(log: Path) -> str:
    [line] = [x for x in log.read_text().splitlines() if x.startswith("phases: ")]
    return line


def check_phases(seconds: dict[str, float], log: Path) -> None:
    """Every phase present and >= 0, their sum at most the wall, training equal to the final train_time."""
    assert set(PHASES) | {"wall"} <= set(seconds)
    assert all(seconds[p] >= 0 for p in PHASES), seconds
    assert sum(seconds[p] for p in PHASES) <= seconds["wall"] + 1e-3 * len(PHASES)    # each rounded to 1 ms
    final = [m for m in map(STEP_RE.match, log.read_text().splitlines()) if m and m.group(3) == "val"][-1]
    assert seconds["training"] == pytest.approx(int(final.group(5)) / 1000, abs=0.002)


# ---- the line, by hand -----------------------------------------------------------------------------------


def test_the_line_round_trips_and_counts_each_interval_once():
    phases = RunPhases(start=time.perf_counter())
    with phases.timed("model"):
        time.sleep(0.02)
    with pytest.raises(RuntimeError):
        with phases.timed("data"):                 # counted when the block raises too
            time.sleep(0.01)
            raise RuntimeError("x")
    phases.add("validation", 0.5)
    phases.add("validation", 0.25)
    phases.validations = 2
    with pytest.raises(ValueError, match="unknown phase 'lunch'"):
        phases.add("lunch", 1.0)
    line = phases.line()
    seconds, count = parse_phases(line)
    assert line.startswith("phases: startup:") and count == 2 and "first_batch" not in seconds
    assert "first_step" not in seconds
    assert list(seconds) == [*PHASES, "wall"]
    assert seconds["model"] >= 0.02 and seconds["data"] >= 0.01 and seconds["validation"] == 0.75
    assert seconds["wall"] >= seconds["startup"] + seconds["model"] + seconds["data"] - 0.002   # real intervals
    assert other_seconds(seconds) == pytest.approx(seconds["wall"] - sum(seconds[p] for p in PHASES))
    assert overhead_seconds(seconds) == pytest.approx(seconds["wall"] - seconds["training"] - seconds["compile"])


@pytest.mark.parametrize("line", ["phases: startup:1.0s validations:2", "phases: startup:x wall:1s",
                                  "phases: wall:1.0s validations:2.5", "phases: wall:1.0s teardown:-1s"])
def test_a_malformed_line_is_refused(line):
    with pytest.raises(ValueError):
        parse_phases(line)


def test_the_process_start_is_before_the_import_and_falls_back_to_it(tmp_path):
    start = process_start()
    assert start <= IMPORTED_AT <= time.perf_counter()
    if Path("/proc/self/stat").is_file():         # the interpreter and pytest started before this module's import
        assert start < IMPORTED_AT
    assert process_start(str(tmp_path / "missing")) == IMPORTED_AT
    (tmp_path / "stat").write_text("1 (a b) R " + " ".join(["0"] * 30))   # started at boot: older than the import
    assert process_start(str(tmp_path / "stat")) < IMPORTED_AT
    (tmp_path / "late").write_text("1 (x) R " + " ".join([str(10**15)] * 30))   # after now: not believed
    assert process_start(str(tmp_path / "late")) == IMPORTED_AT


# ---- a tiny training -------------------------------------------------------------------------------------


def test_a_tiny_run_logs_its_phases_and_the_parser_reads_them(synthetic, tmp_path):
    shards, bos = synthetic
    log = tmp_path / "seed0.txt"
    began = time.perf_counter()
    run_training(TrainConfig.from_dict({**QUICK, "val_every": 2}), variant="v", seed=0, shards_dir=shards,
                 bos_dir=bos, log_path=log, env={}, phases=RunPhases(start=began))
    took = time.perf_counter() - began
    lines = log.read_text().splitlines()
    assert lines[-1].startswith("phases: ") and lines[-2].startswith("peak memory allocated: ")
    seconds, count = parse_phases(lines[-1])
    check_phases(seconds, log)
    assert count == 4                                          # steps 0, 2, 4, 6
    assert seconds["wall"] <= took and seconds["compile"] == 0.0 and seconds["process_group"] == 0.0
    assert seconds["model"] > 0 and seconds["data"] > 0 and seconds["validation"] > 0
    assert 0 <= seconds["first_batch"] <= seconds["training"]
    before = sum(seconds[p] for p in ("startup", "device", "data", "process_group", "model", "optimizer", "compile"))
    assert before - 0.005 <= seconds["first_step"] <= before + seconds["validation"] + other_seconds(seconds) + 0.005
    record = read_record(log)
    assert record.phases_s == seconds and record.validations == 4
    assert record.overhead_s == pytest.approx(seconds["wall"] - seconds["training"], abs=1e-9)
    assert RunRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_a_diverged_run_logs_its_phases_before_why(synthetic, tmp_path):
    shards, bos = synthetic
    log = tmp_path / "diverged.txt"
    result = run_training(TrainConfig.from_dict({**QUICK, "head_lr": 1e36}), variant="v", seed=0,
                          shards_dir=shards, bos_dir=bos, log_path=log, env={})
    assert result.status == "diverged" and result.reason == "non-finite train_loss at step 2"
    lines = log.read_text().splitlines()
    assert lines[-1] == "run diverged: non-finite train_loss at step 2" and lines[-2].startswith("phases: ")
    record = read_record(log)
    assert record.status == "diverged" and record.validations == 1 and record.phases_s["training"] > 0


def test_the_command_counts_from_the_process_start(synthetic, tmp_path):
    """``python -m speedrun train`` in a process of its own: startup holds the interpreter and the imports, and
    the wall is at most the process's life measured from outside (plus the 10 ms of the kernel's clock ticks)."""
    shards, bos = synthetic
    log = tmp_path / "seed0.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "speedrun", "train", "--config", json.dumps(QUICK), "--variant", "v",
                    "--seed", "0", "--shards-dir", str(shards), "--bos-dir", str(bos), "--out", str(log)],
                   env=env, check=True, capture_output=True, text=True)
    took = time.perf_counter() - began
    seconds, _ = parse_phases(phases_line(log))
    check_phases(seconds, log)
    assert seconds["wall"] <= took + 0.011
    assert seconds["startup"] > 0.2          # the torch import alone takes longer (about 1 s on a quiet CPU)


# ---- older logs, bad lines, the report --------------------------------------------------------------------


def test_an_older_log_without_the_line_parses_with_no_phases(tmp_path):
    text, _ = our_log()
    record = read_record(write(tmp_path / "old.txt", text))
    assert record.status == "complete"
    assert (record.phases_s, record.validations, record.overhead_s) == (None, None, None)
    assert RunRecord.from_json({k: v for k, v in record.to_json().items()
                                if k not in ("phases_s", "validations")}) == record   # an older parsed record


def test_a_malformed_phases_line_names_the_file(tmp_path):
    text, _ = our_log()
    log = write(tmp_path / "bad.txt", text + "phases: startup:1.0s\n")
    with pytest.raises(SpeedrunError, match=r"bad\.txt: line 'phases: startup:1\.0s'.*no wall"):
        read_record(log)


def test_the_run_time_table_shows_each_runs_overhead(tmp_path):
    text, _ = our_log()
    seconds = {"startup": 2.5, "device": 0.25, "data": 0.5, "process_group": 0.0, "model": 0.75, "optimizer": 0.0,
               "compile": 20.0, "training": 16.5, "validation": 3.0, "teardown": 0.5, "wall": 45.0}
    line = "phases: " + " ".join(f"{k}:{v:.3f}s" for k, v in seconds.items()) + " validations:4"
    new = read_record(write(tmp_path / "new" / "seed0.txt", text + line + "\n"))
    old = read_record(write(tmp_path / "old" / "seed0.txt", text))
    assert new.overhead_s == pytest.approx(45.0 - 16.5 - 20.0)
    table = run_time_table([new.to_json(), old.to_json()], ["new seed0", "old seed0"])
    assert table[0].split(" | ")[:5] == ["| Run", "wall", "train_time", "compile", "overhead"]
    assert len(table) == 3                                     # header, rule, one row: the old run has no phases
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    assert cells[:5] == ["new seed0", "45.00", "16.50", "20.00", "**8.50**"]
    assert "3.00 (4)" in cells and cells[-1] == f"{45.0 - sum(v for k, v in seconds.items() if k != 'wall'):.2f}"
    assert run_time_table([old.to_json()], ["old seed0"]) == []
