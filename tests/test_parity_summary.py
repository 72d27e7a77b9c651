"""benchmarks/parity.sh summary (benchmarks/parity_summary.py) on hand-written logs of both sides: the val_loss
rows with the record's spread, our mean, the difference and issue 20's tolerance, the median step time per
stage, each run's train_time and its medians over odd and even steps apart (an Adam-step cost); and a profiled run of ours, whose ``--profile`` operator table lies beside its log, read as one run (the
summary of session 37 stopped on that table)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def log(vals: dict[int, float], step_ms: float, steps: int = 6, even_extra_ms: float = 0.0) -> str:
    """A record-style log: train lines every step at ``step_ms`` a step (``even_extra_ms`` more on even steps),
    val lines at the steps of ``vals``."""
    lines, t = [], 0.0
    for step in range(steps + 1):
        if step in vals:
            lines.append(f"step:{step}/{steps} val_loss:{vals[step]:.4f} train_time:{t:.0f}ms step_avg:1.00ms")
        if step < steps:
            t += step_ms + (even_extra_ms if (step + 1) % 2 == 0 else 0.0)
            lines.append(f"step:{step + 1}/{steps} train_time:{t:.0f}ms step_avg:{t / (step + 1):.2f}ms")
    return "\n".join(lines) + "\n"


def test_the_summary_compares_both_sides_and_skips_our_profile_table(tmp_path):
    (tmp_path / "record88-1.txt").write_text(log({0: 10.5, 6: 3.70}, 100.0))
    (tmp_path / "record88-2.txt").write_text(log({0: 10.5, 6: 3.72}, 102.0))
    for run, (val, ms, extra) in enumerate([(3.73, 110.0, 0.0), (3.75, 100.0, 24.0)], 1):
        folder = tmp_path / f"ours-parity-record88-{run}"
        folder.mkdir()
        (folder / f"parity-record88-{run}.txt").write_text(log({0: 10.5, 6: val}, ms, even_extra_ms=extra))
    (tmp_path / "ours-parity-record88-2" / "parity-record88-2.profile.txt").write_text("Name  Self CPU %\n")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"   # parity.sh runs python3
    env = {**os.environ, "PARITY_ROOT": str(tmp_path), "PATH": path}
    proc = subprocess.run(["bash", "benchmarks/parity.sh", "summary", "record88", "parity-record88", "0,3,6"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()}
    # step 6: record 3.70, 3.72 (spread 0.02, tolerance 0.04), ours 3.73 and 3.75 (mean 3.74): +0.03, within
    assert rows["6"][1:] == ["3.7000", "3.7200", "0.0200", "3.7300", "3.7500", "0.0300", "0.040", "True"]
    # ours, stage 2 (steps 5-6): run 1 at 110 ms a step, run 2 at 100 on step 5 and 124 on step 6
    assert "stage 2 (steps 5-6): median step reference 101.0 ms, ours 110.0 ms" in proc.stdout
    runs = [line.split() for line in proc.stdout.splitlines() if line.startswith(("reference ", "ours "))]
    # each run: train_time at step 6 (6 steps; run 2: 3 of them even), then per stage all (odd / even)
    assert runs[1][:3] == ["reference", "0.61", "s"] and runs[1][-1].endswith("record88-2.txt")
    assert runs[3][:9] == ["ours", "0.67", "s", "112.0", "(100.0", "/", "124.0)", "112.0", "(100.0"]
    assert runs[2][3:6] == ["110.0", "(110.0", "/"] and len(runs) == 4
    assert "race:" not in proc.stdout                  # the race is our HEAD preset's (parity-record89) alone


def test_the_race_reads_our_val_loss_at_the_records_evaluation_times(tmp_path):
    """parity.sh summary of our HEAD preset (parity-record89) against record #88's code adds the race: at each of
    the record's evaluations (mean train_time over its runs), our val_loss read off each run's curve (linear in
    time between its evaluations; its last past its end), averaged, and whether ours is at or below."""
    for run in (1, 2):
        (tmp_path / f"record88-{run}.txt").write_text(log({0: 10.0, 3: 5.0, 6: 4.0}, 100.0))
    # run 1 at 120 ms a step (evaluations at 0, 0.36, 0.72 s), run 2 at 50 ms (0, 0.15, 0.30 s: over by 0.3 s)
    for run, (vals, ms) in enumerate([({0: 10.0, 3: 4.4, 6: 3.7}, 120.0), ({0: 10.0, 3: 6.0, 6: 4.2}, 50.0)], 1):
        folder = tmp_path / f"ours-parity-record89-{run}"
        folder.mkdir()
        (folder / f"parity-record89-{run}.txt").write_text(log(vals, ms))
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PARITY_ROOT": str(tmp_path), "PATH": path}
    proc = subprocess.run(["bash", "benchmarks/parity.sh", "summary", "record88", "parity-record89", "0,3,6"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    race = [line.split() for line in lines[lines.index("step  train_time  reference  ours     ahead") + 1:]]
    # step 3 at 0.30 s: run 1 10 + (4.4 - 10)·0.30/0.36 = 5.3333, run 2 at its end 4.2: mean 4.7667 <= 5.0
    # step 6 at 0.60 s: run 1 4.4 + (3.7 - 4.4)·0.24/0.36 = 3.9333, run 2 4.2: mean 4.0667 > 4.0
    assert race == [["0", "0.00", "s", "10.0000", "10.0000", "True"],
                    ["3", "0.30", "s", "5.0000", "4.7667", "True"],
                    ["6", "0.60", "s", "4.0000", "4.0667", "False"]]
