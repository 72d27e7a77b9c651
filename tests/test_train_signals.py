"""How ``speedrun train`` stops: SIGTERM and SIGINT end the log with a ``run failed: ...`` line that the parser
reads as ``failed``, leave it as ``<--out>.stopped`` (never under ``--out``: a stopped run is not done) and exit
with 128 + the signal; the run dies with its launcher (PR_SET_PDEATHSIG, Linux);
a negative or too large ``--seed`` is refused before anything starts. The signal tests run a real CPU training
in a subprocess and signal it once its first ``step:`` line is in the temporary log."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

import speedrun
from speedrun import cli
from speedrun.analysis.logs import read_record
from speedrun.support.stopping import RunStopped, die_with_parent, stop_on_signals
from speedrun.training.loop import failure_line
from synthetic_data import counting_documents, write_dataset

SRC = Path(speedrun.__file__).resolve().parents[1]              # the code under test, for the subprocesses
# Long enough to be still training when signalled (952 steps of data); each test stops it early.
SETTINGS = {"preset": "tiny", "model": {"n_layer": 2, "model_dim": 32, "n_head": 2, "head_dim": 16},
            "steps": 800, "tokens_per_step": 512, "micro_batches": 2, "max_seq_len": 128, "val_tokens": 512,
            "val_batch_tokens": 256, "val_every": 0, "device": "cpu", "dtype": "float32"}
STOPPED = {signal.SIGTERM: "run failed: terminated by SIGTERM", signal.SIGINT: "run failed: interrupted by SIGINT"}
PR_GET_PDEATHSIG = 2                                            # <linux/prctl.h>
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, Path]:
    return write_dataset(tmp_path_factory.mktemp("synth"), counting_documents(7000), shard_tokens=65536)


def train_command(shards: Path, bos: Path, log: Path) -> list[str]:
    return [sys.executable, "-m", "speedrun", "train", "--config", json.dumps(SETTINGS), "--variant", "v",
            "--seed", "0", "--shards-dir", str(shards), "--bos-dir", str(bos), "--out", str(log), "--threads", "1"]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}


def default_signals() -> None:
    """In the child before exec: SIGINT and SIGTERM as a fresh process has them (pytest run from a background
    job would otherwise pass SIGINT on ignored)."""
    for s in STOPPED:
        signal.signal(s, signal.SIG_DFL)


def wait_for_first_step(log: Path, running: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll the temporary log beside ``log`` until it holds a ``step:`` line, while ``running()``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert running(), "the training process ended before its first step line"
        for tmp in log.parent.glob(f".tmp-{log.name}.*"):
            if any(line.startswith("step:") for line in tmp.read_text().splitlines()):
                return
        time.sleep(0.05)
    raise AssertionError(f"no step line in a temporary log of {log} after {timeout} s")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie awaiting its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def assert_stopped_log(out: Path, signum: int) -> None:
    """The run's log is at ``<out>.stopped``, whole, and nothing is at ``out`` or left as a temporary log."""
    log = out.with_name(out.name + ".stopped")
    lines = log.read_text().splitlines()
    assert lines[-1] == STOPPED[signum]
    assert lines[-2].startswith("phases: ") and lines[-3].startswith("peak memory allocated: ")
    assert any(line.startswith("step:0/800 val_loss:") for line in lines)
    assert not any(line.startswith("step:800/800 val_loss:") for line in lines)     # stopped early
    record = read_record(log)
    assert (record.status, record.reason) == ("failed", STOPPED[signum])
    assert sorted(p.name for p in log.parent.iterdir()) == [log.name]                # no --out, no .tmp-*


# ---- signals to the training process -------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_run_ends_its_log_as_failed_with_status_128_plus_signal(synthetic, tmp_path, signum):
    shards, bos = synthetic
    log = tmp_path / "train" / "seed0.txt"
    proc = subprocess.Popen(train_command(shards, bos, log), env=child_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        wait_for_first_step(log, lambda: proc.poll() is None)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, stderr
    name = signal.Signals(signum).name
    assert stderr.strip().splitlines()[-1] == f"speedrun train: {STOPPED[signum].removeprefix('run failed: ')}"
    assert "Traceback" not in stderr and name in stderr
    assert_stopped_log(log, signum)


def test_sigterms_repeated_during_the_cleanup_do_not_cut_it_short(synthetic, tmp_path):
    """torchrun signals its workers once per shutdown pass, then its exit sends the parent-death signal: a run
    SIGTERMed every few ms from its first signal on must still end its log as failed (a CI run of
    test_workflow_kill once found the log left as a .tmp-* file, killed by torchrun's second SIGTERM)."""
    shards, bos = synthetic
    log = tmp_path / "train" / "seed0.txt"
    proc = subprocess.Popen(train_command(shards, bos, log), env=child_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    sent = 0
    try:
        wait_for_first_step(log, lambda: proc.poll() is None)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(signal.SIGTERM)
            sent += 1
            time.sleep(0.002)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert sent >= 2, "the run ended before a second SIGTERM: the test signalled nothing during the cleanup"
    # 143, or killed by a SIGTERM that came after the block put the default action back, the log done: a shell
    # reports 143 for both
    assert proc.returncode in (128 + signal.SIGTERM, -signal.SIGTERM), stderr
    assert stderr.strip().splitlines()[-1] == "speedrun train: terminated by SIGTERM", stderr
    assert_stopped_log(log, signal.SIGTERM)


@linux_only
def test_the_run_dies_with_its_launcher(synthetic, tmp_path):
    shards, bos = synthetic
    log = tmp_path / "train" / "seed0.txt"
    launcher = ("import subprocess, sys\n"
                "with open(sys.argv[1], 'w') as out:\n"
                "    p = subprocess.Popen(sys.argv[2:], stdout=out, stderr=subprocess.STDOUT)\n"
                "print(p.pid, flush=True)\n"
                "p.wait()\n")
    middle = subprocess.Popen([sys.executable, "-c", launcher, str(tmp_path / "train.out"),
                               *train_command(shards, bos, log)], env=child_env(), stdout=subprocess.PIPE,
                              text=True, preexec_fn=default_signals)
    train_pid = int(middle.stdout.readline())
    try:
        wait_for_first_step(log, lambda: alive(train_pid))
        middle.send_signal(signal.SIGKILL)                         # the launcher gets no chance to pass anything on
        middle.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(train_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(train_pid), (tmp_path / "train.out").read_text()
    finally:
        if alive(train_pid):
            os.kill(train_pid, signal.SIGKILL)
    assert_stopped_log(log, signal.SIGTERM)


# ---- the pieces, in this process ---------------------------------------------------------------------------


def pdeathsig() -> int:
    """This process's parent-death signal, as the kernel reports it (prctl PR_GET_PDEATHSIG)."""
    value = ctypes.c_int(-1)
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0) == 0
    return value.value


@linux_only
def test_die_with_parent_asks_for_sigterm_and_clears_it_after():
    assert pdeathsig() == 0
    with die_with_parent(os.getppid()) as unprotected:
        assert unprotected is None
        assert pdeathsig() == signal.SIGTERM
    assert pdeathsig() == 0


@linux_only
def test_a_parent_gone_before_the_request_stops_at_once():
    gone = os.getppid() + 1                         # the parent seen at start is no longer the parent
    with pytest.raises(RunStopped, match=f"the launching process {gone} ended before the run started") as stop:
        with die_with_parent(gone):
            raise AssertionError("the block must not run")
    assert (stop.value.signum, stop.value.exit_status) == (signal.SIGTERM, 143)
    assert pdeathsig() == 0


def test_die_with_parent_is_a_noop_with_its_reason_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    with die_with_parent(os.getppid()) as unprotected:
        assert unprotected == "PR_SET_PDEATHSIG is Linux's; on darwin the run does not stop when its launcher dies"


def test_stop_on_signals_raises_once_then_restores_and_keeps_ignored_signals_ignored():
    before_term = signal.getsignal(signal.SIGTERM)
    before_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(RunStopped, match="^terminated by SIGTERM$") as stop:
            with stop_on_signals():
                assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
                signal.raise_signal(signal.SIGTERM)
                raise AssertionError("SIGTERM did not stop the block")
        assert stop.value.exit_status == 143
        assert signal.getsignal(signal.SIGTERM) == before_term
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before_int)
    assert str(RunStopped(signal.SIGINT)) == "interrupted by SIGINT" and RunStopped(signal.SIGINT).exit_status == 130


def test_after_the_first_stop_sigint_kills_and_sigterm_is_ignored():
    """During the cleanup: a second Ctrl-C forces (SIGINT's default action), a repeated SIGTERM is ignored. Both
    caught at the start, as in a terminal (pytest started as a background job inherits SIGINT ignored, which
    stop_on_signals keeps so)."""
    started_with = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for first in (signal.SIGTERM, signal.SIGINT):
            with pytest.raises(RunStopped) as stop:
                with stop_on_signals():
                    try:
                        signal.raise_signal(first)
                    except RunStopped:
                        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
                        assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL
                        signal.raise_signal(signal.SIGTERM)             # ignored: this process lives on
                        raise
            assert stop.value.signum == first
            assert signal.getsignal(signal.SIGINT) == signal.default_int_handler      # put back
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        for s, handler in started_with.items():
            signal.signal(s, handler)


def test_failure_lines_never_end_with_an_empty_message():
    assert failure_line(RunStopped(signal.SIGTERM)) == "run failed: terminated by SIGTERM"
    assert failure_line(RunStopped(signal.SIGINT)) == "run failed: interrupted by SIGINT"
    assert failure_line(KeyboardInterrupt()) == "run failed: KeyboardInterrupt"
    assert failure_line(RuntimeError("disk on fire\n  second line")) == "run failed: RuntimeError: disk on fire second line"


# ---- --seed -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_a_seed_out_of_range_is_refused_naming_the_option(tmp_path, capsys, seed):
    log = tmp_path / "never.txt"
    rc = cli.main(["train", "--config", json.dumps(SETTINGS), "--variant", "v", "--seed", seed,
                   "--shards-dir", str(tmp_path / "none"), "--bos-dir", str(tmp_path / "none"), "--out", str(log)])
    assert rc == 2
    assert capsys.readouterr().err == (f"speedrun train: error: --seed must be from 0 to 18446744073709551615 "
                                       f"(2**64 - 1, torch.manual_seed's range), got {seed}\n")
    assert list(tmp_path.iterdir()) == []
