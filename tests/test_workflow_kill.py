"""A killed workflow loses nothing and redoes nothing finished (README "Recovering from a crash"): the workflow
is killed with SIGKILL twice, once as a whole process group and once Snakemake alone, while one training run
runs and after another finished; every training process must end with it, the README's recovery steps
(``--unlock``, then the same call) must work, and only the killed run must rerun; and once with Ctrl-C (SIGINT
to the process group), after which the next call alone reruns the stopped run.

The micro config of test_workflow.py, with two variants: ``baseline`` (2 steps, finishes first) and ``slow``
(350 steps of 256 tokens, killed while it trains).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from test_workflow import MICRO, ROOT, _env, _planned_jobs, _write_config

pytestmark = pytest.mark.slow

TARGETS = ("results/train/baseline/seed0.txt", "results/train/slow/seed0.txt")


def _config() -> dict:
    cfg = yaml.safe_load(MICRO.read_text())
    cfg["train"]["val_every"] = 0
    cfg["variants"] = {"baseline": {"seeds": [0], "train": {"steps": 2}},
                       "slow": {"seeds": [0], "train": {"steps": 350, "tokens_per_step": 256}}}
    cfg["stats"]["baseline"] = "baseline"
    return cfg


def _processes_in(workdir: Path) -> list[int]:
    """Pids of the live processes whose working directory is ``workdir`` (Snakemake, shells, training)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/cwd") != str(workdir):
                continue
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            pids.append(int(entry))
    return pids


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=workdir,
                          env=_env(workdir), capture_output=True, text=True, timeout=300)


def _start(workdir: Path, *args: str) -> subprocess.Popen:
    """Snakemake on TARGETS in its own session (its own process group), output to snakemake.out."""
    out = open(workdir / "snakemake.out", "a")
    return subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1", *args, *TARGETS], cwd=workdir,
                            env=_env(workdir), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _slow_temporary_logs(workdir: Path) -> set[str]:
    slow = workdir / "results/train/slow"
    return {p.name for p in slow.iterdir() if p.name.startswith(".tmp-seed0.txt.")} if slow.is_dir() else set()


def _wait_until_slow_trains(workdir: Path, proc: subprocess.Popen, stale: set[str],
                            timeout: float = 240.0) -> None:
    """Until a new temporary log of the slow run exists (its model is built, it trains). The one that a
    SIGKILL left behind does not count: taken for the rerun's, it let the test kill Snakemake before the rerun's
    job had started (a flaky LockException where the incomplete run's refusal was expected). ``stale``: the
    temporary logs there before Snakemake started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _slow_temporary_logs(workdir) - stale:
            return
        if proc.poll() is not None:
            raise AssertionError(f"snakemake ended ({proc.returncode}):\n{(workdir / 'snakemake.out').read_text()}")
        time.sleep(0.5)
    raise AssertionError(f"the slow run did not start:\n{(workdir / 'snakemake.out').read_text()}")


def _all_end(workdir: Path, timeout: float = 60.0) -> list[int]:
    """The processes still alive in ``workdir`` after ``timeout`` s ([] when all ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _processes_in(workdir):
        time.sleep(0.5)
    return _processes_in(workdir)


def _recover_and_plan(workdir: Path) -> dict[str, int]:
    """The README's recovery: the next call is refused for the lock that the killed Snakemake left, naming
    ``--unlock``; ``--unlock`` lifts it. The killed run left nothing under its output's name (its log is
    ``seed0.txt.stopped``, or a temporary log when SIGKILL reached it), so the plain call and the one with
    ``--rerun-incomplete`` plan the same. Returns what the plain call would then run."""
    locked = _snakemake(workdir, *TARGETS)
    assert locked.returncode != 0 and "LockException" in locked.stderr and "--unlock" in locked.stderr, locked.stderr
    assert not (workdir / TARGETS[1]).exists()
    assert _snakemake(workdir, "--unlock", *TARGETS).returncode == 0
    plain = _planned_jobs(_snakemake(workdir, "-n", *TARGETS))
    assert _planned_jobs(_snakemake(workdir, "-n", "--rerun-incomplete", *TARGETS)) == plain
    return plain


@pytest.fixture
def workdir(tmp_path) -> Iterator[Path]:
    """A copy of the workflow (Snakefile, workflow/, src/) with :func:`_config` in ``tmp_path``; the processes
    that a test started there and left behind are killed at its end."""
    workdir = tmp_path.resolve()
    shutil.copy(ROOT / "Snakefile", workdir / "Snakefile")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "workflow", workdir / "workflow", ignore=ignore)
    shutil.copytree(ROOT / "src", workdir / "src", ignore=ignore)
    _write_config(workdir, _config())
    yield workdir
    for pid in _processes_in(workdir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_killed_workflow_ends_its_training_and_reruns_only_the_killed_run(workdir):
    # 1. The whole process group killed while `slow` trains, after `baseline` finished.
    proc = _start(workdir)
    _wait_until_slow_trains(workdir, proc, set())
    finished = (workdir / TARGETS[0]).read_bytes()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _all_end(workdir) == [], "training processes outlived the killed process group"
    assert _recover_and_plan(workdir) == {"train": 1}          # slow only: baseline is kept
    # 2. The README's rerun, killed again, Snakemake alone (its job shells and torchrun stay in its group).
    stale = _slow_temporary_logs(workdir)
    proc = _start(workdir)
    _wait_until_slow_trains(workdir, proc, stale)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _all_end(workdir) == [], "training processes outlived Snakemake (orphans)"
    assert _recover_and_plan(workdir) == {"train": 1}
    assert (workdir / TARGETS[0]).read_bytes() == finished


def test_ctrl_c_stops_the_training_and_the_next_call_reruns_only_the_stopped_run(workdir):
    """Ctrl-C in the terminal (SIGINT to Snakemake and its jobs, the whole process group): the runs end, the
    stopped run leaves its log as ``seed0.txt.stopped`` and nothing under its output's name (an interrupted
    Snakemake does not remove what its jobs wrote, snakemake/snakemake#1871, so a log there would be refused as
    incomplete, or taken as done after ``--cleanup-metadata``), and the next plain call, with no flag and no
    ``--unlock``, reruns that run alone (README "Recovering from a crash")."""
    proc = _start(workdir)
    _wait_until_slow_trains(workdir, proc, set())
    finished = (workdir / TARGETS[0]).read_bytes()
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    assert _all_end(workdir) == [], "training processes outlived Ctrl-C"
    slow = workdir / "results/train/slow"
    assert sorted(p.name for p in slow.iterdir()) == ["seed0.txt.stopped"], sorted(slow.iterdir())
    assert (slow / "seed0.txt.stopped").read_text().splitlines()[-1] == "run failed: interrupted by SIGINT"
    planned = _snakemake(workdir, "-n", *TARGETS)
    assert planned.returncode == 0, planned.stderr
    assert _planned_jobs(planned) == {"train": 1}
    assert (workdir / TARGETS[0]).read_bytes() == finished
