"""How a training run stops: by a signal (:func:`stop_on_signals`) or with its launcher (:func:`die_with_parent`),
both as :class:`RunStopped`, which ``speedrun train`` logs as a failed run.

SIGTERM and SIGINT (within :func:`stop_on_signals`, around ``speedrun train``'s run) raise :class:`RunStopped` in
the main thread, so the log ends with ``run failed: terminated by SIGTERM`` or ``run failed: interrupted by
SIGINT``, is renamed to ``--out`` like any failed run's (no ``.tmp-*`` file is left) and the command exits with
128 + the signal's number (143, 130: the status a shell reports for a process that signal killed, which is what a
stopped run gave before it was caught, so that scripts can still tell a stop from an error, status 1 or 2; any
non-zero status fails the Snakemake job). During that cleanup a second SIGINT is not caught: it kills at once (a
forced stop, Ctrl-C twice), while further SIGTERMs are ignored: launchers repeat it (torchrun signals its workers once
per shutdown pass and exits, and its exit sends the parent-death signal), and one that killed the cleanup left the log
as a ``.tmp-*`` file, a run Snakemake could not see as incomplete; a launcher that wants a stuck run gone escalates to
SIGKILL (torchrun after its timeout, Slurm after KillWait). A signal ignored when the command started (``nohup``, a
background job) stays ignored.

The run also dies with its launcher: on Linux :func:`die_with_parent` asks the kernel to send it SIGTERM when its
parent process ends (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, prctl(2)), whatever killed the parent. torchrun starts
its workers in their own session (``start_new_session``), so a SIGKILL to Snakemake's process group reaches torchrun
but not the workers, which would otherwise train on as orphans and rename a complete-looking log into ``results/``
after Snakemake died. A parent that ended before the request (the parent pid changed since this module was imported,
before torch's import) stops the run at once, as the signal would have. Elsewhere (macOS, Windows) there is no such
request: the command says so on stderr and runs unprotected.

``speedrun tokenize`` stops the same way (:func:`stop_on_signals`, :class:`RunStopped`), and its encoding
workers die with it (:func:`request_parent_death_signal`, :mod:`speedrun.data.encode`).

This module imports no torch: :mod:`speedrun.train` (the stage) imports it first, so that :data:`PARENT_PID_AT_START` is
read before the seconds-long torch import.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from typing import Any, Callable, Iterator

# The parent pid as early as this process can read it: a parent that ends between this line and the
# PR_SET_PDEATHSIG request is seen by the pid changing (die_with_parent).
PARENT_PID_AT_START = os.getppid()

# What the log and stderr say for each stop signal: "<verb> by <name>".
STOP_SIGNALS: dict[int, str] = {signal.SIGTERM: "terminated", signal.SIGINT: "interrupted"}
PR_SET_PDEATHSIG = 1                      # <linux/prctl.h>


class RunStopped(BaseException):
    """The run was stopped by the signal ``signum`` (``str``: ``terminated by SIGTERM``, or ``reason`` when
    given). A BaseException, as KeyboardInterrupt, so that no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int, reason: str | None = None):
        self.signum = signum
        verb = STOP_SIGNALS.get(signum, "stopped")
        super().__init__(reason or f"{verb} by {signal.Signals(signum).name}")

    @property
    def exit_status(self) -> int:
        """128 + the signal's number: a shell's status for a process that signal killed (SIGTERM: 143)."""
        return 128 + self.signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise :class:`RunStopped` in the main thread (the handler runs
    between two bytecodes, so a long GPU kernel or C call finishes first). The first one also puts back SIGINT's
    default action, so that a second Ctrl-C during the cleanup kills at once, and ignores SIGTERM, which launchers
    repeat (module docstring). A signal that was ignored (SIG_IGN) stays ignored. The previous handlers are put
    back at the end. Main thread only (ValueError)."""
    def handler(signum: int, frame: Any) -> None:
        for s in previous:
            signal.signal(s, signal.SIG_IGN if s == signal.SIGTERM else signal.SIG_DFL)
        raise RunStopped(signum)

    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS if signal.getsignal(s) != signal.SIG_IGN}
    try:
        for s in previous:
            signal.signal(s, handler)
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def run_until_stopped(command: str, body: Callable[[], None]) -> int:
    """Run ``body`` within :func:`stop_on_signals`: 0 when it returns, or, when SIGTERM or SIGINT stopped it,
    the stop's :attr:`RunStopped.exit_status` (143, 130) after one line on stderr, ``speedrun <command>:
    terminated by SIGTERM``. Any other exception propagates."""
    with stop_on_signals():
        try:
            body()
        except RunStopped as e:
            print(f"speedrun {command}: {e}", file=sys.stderr)
            return e.exit_status
    return 0


@contextlib.contextmanager
def die_with_parent(parent: int = PARENT_PID_AT_START) -> Iterator[str | None]:
    """Within the block, the kernel sends this process SIGTERM when its parent process ends
    (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, Linux's prctl(2); the request is cleared at the end). Yields None
    when it is in place, else why not (not Linux, no libc prctl, prctl refused).

    ``parent``: the parent pid seen at start (:data:`PARENT_PID_AT_START`). When the parent pid is no longer
    that one after the request, the parent ended before it (the process now belongs to init or a subreaper,
    and no signal will come): raises :class:`RunStopped` (SIGTERM) at once. A parent pid of 1 alone is not
    taken as orphaned: in a container, init may well be the launcher.

    Linux sends the signal when the *thread* that forked this process ends; torchrun starts its workers from
    its main thread, so that is when torchrun ends."""
    why_not = request_parent_death_signal(signal.SIGTERM)
    if why_not is not None:
        yield why_not
        return
    try:
        now = os.getppid()
        if now != parent:
            raise RunStopped(signal.SIGTERM, f"terminated: the launching process {parent} ended before the "
                                             f"run started (parent is now {now})")
        yield None
    finally:
        request_parent_death_signal(0)


def request_parent_death_signal(signum: int) -> str | None:
    """Ask Linux to send this process ``signum`` when the thread that forked it ends
    (``prctl(PR_SET_PDEATHSIG, signum)``, prctl(2); 0 clears the request). Returns None when done, else why not:
    not Linux, no prctl in the C library, or prctl refused (its errno's message). Used by :func:`die_with_parent`
    (SIGTERM, a training run) and by the tokenizer's encoding workers (SIGKILL, :mod:`speedrun.data.encode`)."""
    if not sys.platform.startswith("linux"):
        return f"PR_SET_PDEATHSIG is Linux's; on {sys.platform} the run does not stop when its launcher dies"
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError) as e:
        return f"no prctl in the C library ({e})"
    if prctl(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signum), ctypes.c_ulong(0), ctypes.c_ulong(0),
             ctypes.c_ulong(0)) != 0:
        return f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}"
    return None
