"""Launch one training run of the `train` rule: torchrun on one machine, or one torchrun per node of a Slurm job.

The train rule runs ``python -m speedrun.workflow.launcher run --world-size W --nodes N --device D --gpu-locks DIR
-- speedrun train ...`` (``TRAIN_LAUNCHER`` of workflow/rules/common.smk); the run_script rule the same with
``--own-torchrun -- speedrun run-script ...``, a program that starts its own torchrun, exec'd with the GPUs, locks
and environment a one-node run gets. What it starts depends on where it runs:

- one node (``--nodes 1``): ``torchrun --standalone --nproc-per-node=W --no-python speedrun train ...``. On the
  local executor (``--gpu-locks DIR``) a GPU run first takes W free GPUs of this machine through lock files and
  sees only those (``CUDA_VISIBLE_DEVICES``), so that runs started side by side never share a GPU; under a
  cluster executor (``--gpu-locks none``) the scheduler has already given the job step its GPUs. A CPU run
  sees no GPU.
- several nodes (``--nodes N``, inside a Slurm job that holds N nodes): ``srun`` starts one task per node, and
  each runs this module's ``agent`` command, which starts ``torchrun --nnodes=N --nproc-per-node=W/N
  --rdzv-backend=c10d --rdzv-endpoint=<first node>:<port> --rdzv-id=slurm-<job id>``. The agents of all nodes
  meet there (torch.distributed.elastic's c10d rendezvous) and start one world of W ranks. The tokens per step
  do not depend on N: speedrun train splits each step's micro-batches over the W ranks.

Every training process gets OMP_NUM_THREADS=1: the rule counts one core per process.

GPU locks: ``DIR/<host>/gpu-<id>.lock``, one per visible GPU (``id``: the entry of CUDA_VISIBLE_DEVICES, or the
nvidia-smi index), held with ``flock`` by the torchrun process (the launcher execs it with the locks open), so
they are released whenever it ends, even when killed. A run takes all of its GPUs at once while holding
``DIR/<host>/allocate.lock``: no two runs can each hold part of what the other needs, so none waits forever on
the other. The locks keep the runs of one workflow folder apart; they do not see GPUs used by other programs.

Dying with the workflow: the rule's shell ``exec``s the launcher, so its parent is Snakemake itself (the job's
thread), and before anything else the launcher asks Linux to send it SIGTERM when that parent ends
(``prctl(PR_SET_PDEATHSIG)``, prctl(2); the request survives the ``exec`` of torchrun or srun): a ``kill -9`` of
Snakemake alone, which leaves the job's shell of a rule without ``exec`` alive, now ends torchrun, torchrun ends
its workers (each of which also dies with torchrun: :func:`speedrun.support.stopping.die_with_parent`), and the
GPU locks go with torchrun. A parent that ended before the request stops the launcher (status 143). Elsewhere
than Linux nothing is requested (a note says so).

Its lines in the run's log start with ``launch_train:`` (its name when it was a script of workflow/scripts/).

Only the standard library is used (no torch import, nothing else of the package: ``speedrun`` and
``speedrun.workflow`` import nothing at their import), so the launcher starts in milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Mapping, Sequence, get_args

PARENT_PID_AT_START = os.getppid()    # read first: a parent that ends before the prctl is seen by the pid changing
PR_SET_PDEATHSIG = 1                  # <linux/prctl.h>
Device = Literal["cpu", "cuda", "auto"]
RDZV_PORT_BASE = 29500      # torchrun's default port; a Slurm job adds (job id mod RDZV_PORT_SPAN)
RDZV_PORT_SPAN = 10000
MODULE = "speedrun.workflow.launcher"    # run as python -m MODULE


class LaunchError(Exception):
    """The run cannot start here; the message says what was expected and what was found."""


@dataclass(frozen=True)
class Placement:
    """Where one run's ``world_size`` processes go: ``nodes`` machines with ``world_size / nodes`` each."""

    world_size: int
    nodes: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.nodes < 1:
            raise LaunchError(f"world size {self.world_size} and nodes {self.nodes} must be >= 1")
        if self.world_size % self.nodes:
            raise LaunchError(f"train.world_size {self.world_size} is not a multiple of train.nodes {self.nodes}: "
                              "every node runs the same number of processes")

    @property
    def per_node(self) -> int:
        """Processes (and GPUs, on a GPU run) on each node."""
        return self.world_size // self.nodes


# ---- commands ------------------------------------------------------------------------------------------------


def standalone_command(nproc: int, program: Sequence[str]) -> list[str]:
    """torchrun on this machine alone (its own rendezvous on a free local port)."""
    return ["torchrun", "--standalone", f"--nproc-per-node={nproc}", "--no-python", *program]


def agent_command(placement: Placement, endpoint: str, rdzv_id: str, program: Sequence[str]) -> list[str]:
    """The torchrun of one node of a multi-node run: c10d rendezvous at ``endpoint`` (host:port), where the
    agent on that host serves the store; ``rdzv_id`` names the run (the same on every node)."""
    return ["torchrun", f"--nnodes={placement.nodes}", f"--nproc-per-node={placement.per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}", "--no-python",
            *program]


def srun_command(placement: Placement, program: Sequence[str], python: str = sys.executable) -> list[str]:
    """``srun`` of one task per node of the current Slurm job, each running this module's ``agent`` command
    (``python -m speedrun.workflow.launcher agent``; srun passes the job's environment on, ``PYTHONPATH`` too).
    A step gets all the CPUs and GPUs its job holds on each node (srun's default); a task that fails ends
    the others (``--kill-on-bad-exit``); output lines carry the task number (``--label``)."""
    return ["srun", f"--nodes={placement.nodes}", f"--ntasks={placement.nodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1", "--label", python, "-m", MODULE, "agent",
            f"--world-size={placement.world_size}", f"--nodes={placement.nodes}", "--", *program]


def slurm_rendezvous(env: Mapping[str, str]) -> tuple[str, str]:
    """(endpoint, rdzv_id) of a Slurm job's run: the first host of SLURM_JOB_NODELIST and a port derived from
    SLURM_JOB_ID (every node computes the same). Raises :class:`LaunchError` outside a Slurm job step."""
    nodelist, job_id = env.get("SLURM_JOB_NODELIST"), env.get("SLURM_JOB_ID")
    if not nodelist or not job_id:
        raise LaunchError("the multi-node agent runs inside `srun` (SLURM_JOB_NODELIST and SLURM_JOB_ID unset); "
                          "use --endpoint and --rdzv-id to run it by hand")
    hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                           check=True).stdout.split()
    port = RDZV_PORT_BASE + int(job_id) % RDZV_PORT_SPAN
    return f"{hosts[0]}:{port}", f"slurm-{job_id}"


# ---- GPUs ----------------------------------------------------------------------------------------------------


def visible_gpus(env: Mapping[str, str]) -> list[str]:
    """The GPUs this process may use: the entries of CUDA_VISIBLE_DEVICES when it is set (CUDA stops at the
    first ``-1``), else the indices nvidia-smi lists ([] without nvidia-smi or a driver)."""
    if "CUDA_VISIBLE_DEVICES" in env:
        entries = []
        for entry in env["CUDA_VISIBLE_DEVICES"].split(","):
            entry = entry.strip()
            if not entry or entry.startswith("-"):
                break
            entries.append(entry)
        return entries
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                          text=True)
    return done.stdout.split() if done.returncode == 0 else []


def gpus_needed(device: Device, nproc: int, gpus: Sequence[str]) -> int:
    """GPUs a one-node run takes: ``nproc`` for cuda, or for auto when this machine has GPUs; 0 for cpu.
    Raises :class:`LaunchError` when a GPU run needs more GPUs than are visible."""
    if device == "cpu" or (device == "auto" and not gpus):
        return 0
    if len(gpus) < nproc:
        found = f"{len(gpus)} ({', '.join(gpus)})" if gpus else "none"
        gpus_word = "GPU" if nproc == 1 else "GPUs"
        raise LaunchError(f"train.device is {device!r} with {nproc} processes per node: expected {nproc} {gpus_word}, "
                          f"found {found} (CUDA_VISIBLE_DEVICES or nvidia-smi)")
    return nproc


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding ``path``'s exclusive flock, or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _lock_name(gpu: str) -> str:
    return "gpu-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in gpu) + ".lock"


def _sign(fd: int, label: str) -> None:
    """Write who holds the lock into it (read by people, never by the launcher)."""
    text = f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}: {label}\n".encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, text, 0)


def try_acquire_gpus(lock_dir: Path, gpus: Sequence[str], count: int, label: str = "") -> dict[str, int] | None:
    """Take ``count`` of ``gpus`` (the first free ones, in order) at once, or none: {gpu: open lock fd}, or
    None when fewer than ``count`` are free. Atomic with respect to every other caller on this host."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    with _locked(lock_dir / "allocate.lock"):
        held: dict[str, int] = {}
        for gpu in gpus:
            fd = _try_lock(lock_dir / _lock_name(gpu))
            if fd is not None:
                held[gpu] = fd
            if len(held) == count:
                for fd in held.values():
                    _sign(fd, label)
                return held
        for fd in held.values():
            os.close(fd)
    return None


def acquire_gpus(lock_dir: Path, gpus: Sequence[str], count: int, label: str = "", poll_s: float = 2.0,
                 log=sys.stderr) -> dict[str, int]:
    """:func:`try_acquire_gpus` until it succeeds (saying once on ``log`` that the run waits)."""
    waited = False
    while True:
        held = try_acquire_gpus(lock_dir, gpus, count, label)
        if held is not None:
            return held
        if not waited:
            print(f"launch_train: waiting for {count} free GPUs of {', '.join(gpus)} (locks in {lock_dir})",
                  file=log, flush=True)
            waited = True
        time.sleep(poll_s)


def host_lock_dir(root: str | os.PathLike[str]) -> Path:
    """The lock folder of this host under ``root`` (several hosts may share ``root`` on a network disk)."""
    return Path(root) / socket.gethostname().split(".")[0]


# ---- dying with the workflow ---------------------------------------------------------------------------------


def die_with_parent(parent: int | None = None) -> str | None:
    """Ask Linux to send this process (and what it execs) SIGTERM when its parent ends
    (``prctl(PR_SET_PDEATHSIG, SIGTERM)``). Returns None when in place (or not possible here: a note on stderr
    says why), or why the run must not start: the parent pid is no longer ``parent`` (default: the one read at
    import), i.e. the parent already ended and no signal will come."""
    parent = PARENT_PID_AT_START if parent is None else parent
    if not sys.platform.startswith("linux"):
        print(f"launch_train: note: on {sys.platform} the run does not stop when the workflow dies",
              file=sys.stderr)
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError) as e:
        print(f"launch_train: note: no prctl ({e}): the run does not stop when the workflow dies", file=sys.stderr)
        return None
    if prctl(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGTERM), ctypes.c_ulong(0), ctypes.c_ulong(0),
             ctypes.c_ulong(0)) != 0:
        print(f"launch_train: note: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}",
              file=sys.stderr)
        return None
    now = os.getppid()
    if now != parent:
        return f"error: the workflow process {parent} ended before the run started (parent is now {now})"
    return None


# ---- entry points ----------------------------------------------------------------------------------------------


def process_env(env: Mapping[str, str], gpus: Sequence[str] | None = None) -> dict[str, str]:
    """The training processes' environment: ``env`` with OMP_NUM_THREADS=1 (one core per process, as the rule
    counts them) and, when ``gpus`` is given, CUDA_VISIBLE_DEVICES set to them ("" hides every GPU)."""
    run_env = dict(env)
    run_env["OMP_NUM_THREADS"] = "1"
    if gpus is not None:
        run_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return run_env


Plan = tuple[list[str], dict[str, str], list[int]]


def plan_one_node(device: Device, nproc: int, program: Sequence[str], gpu_locks: str, env: Mapping[str, str],
                  label: str = "", own_torchrun: bool = False) -> Plan:
    """(command, environment, lock fds to keep open) of a one-node run. A CPU run sees no GPU. With
    ``gpu_locks`` a folder, a GPU run waits for and takes its GPUs there and sees only them; with ``none`` it
    uses the GPUs its environment shows (those Slurm gave the job step). ``own_torchrun``: the program starts
    its own torchrun of ``nproc`` processes (``speedrun run-script``, a script variant's run) and is exec'd
    as it is, with the same GPUs, locks and environment."""
    command = list(program) if own_torchrun else standalone_command(nproc, program)
    if device == "cpu":
        return command, process_env(env, gpus=[]), []
    if gpu_locks == "none":
        return command, process_env(env), []
    gpus = visible_gpus(env)
    count = gpus_needed(device, nproc, gpus)
    if count == 0:
        return command, process_env(env, gpus=[]), []
    held = acquire_gpus(host_lock_dir(gpu_locks), gpus, count, label)
    return command, process_env(env, gpus=list(held)), list(held.values())


def launch(args: argparse.Namespace, env: Mapping[str, str]) -> Plan:
    """The train rule's entry: what to exec for ``args`` (see the module docstring)."""
    placement = Placement(args.world_size, args.nodes)
    if placement.nodes == 1:
        return plan_one_node(args.device, placement.per_node, args.program, args.gpu_locks, env, args.label,
                             args.own_torchrun)
    if args.own_torchrun:
        raise LaunchError(f"--own-torchrun with {placement.nodes} nodes: a program that starts its own torchrun "
                          "(a script variant) runs on one node")
    if "SLURM_JOB_ID" not in env:
        raise LaunchError(f"train.nodes is {placement.nodes}: a multi-node run starts inside a Slurm job that "
                          "holds the nodes (snakemake --profile profiles/slurm-multinode); this is not one")
    return srun_command(placement, args.program), process_env(env), []


def agent(args: argparse.Namespace, env: Mapping[str, str]) -> Plan:
    """One node's torchrun of a multi-node run (started by ``srun``, or by hand with --endpoint/--rdzv-id)."""
    placement = Placement(args.world_size, args.nodes)
    if args.endpoint and args.rdzv_id:
        endpoint, rdzv_id = args.endpoint, args.rdzv_id
    else:
        endpoint, rdzv_id = slurm_rendezvous(env)
    return agent_command(placement, endpoint, rdzv_id, args.program), process_env(env), []


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    for name in ("run", "agent"):
        p = sub.add_parser(name)
        p.add_argument("--world-size", type=int, required=True, help="processes in all (train.world_size)")
        p.add_argument("--nodes", type=int, default=1, help="machines the processes spread over (train.nodes)")
        p.add_argument("program", nargs=argparse.REMAINDER, help="-- then the command each process runs")
    run = sub.choices["run"]
    run.add_argument("--device", choices=get_args(Device), required=True, help="train.device")
    run.add_argument("--gpu-locks", required=True,
                     help="folder of the GPU lock files (local executor), or `none` (the scheduler assigns GPUs)")
    run.add_argument("--label", default="", help="written into the lock files (e.g. the run's output path)")
    run.add_argument("--own-torchrun", action="store_true",
                     help="the program starts its own torchrun (speedrun run-script): exec it without one")
    agent_parser = sub.choices["agent"]
    agent_parser.add_argument("--endpoint", help="host:port of the c10d rendezvous (default: from Slurm)")
    agent_parser.add_argument("--rdzv-id", help="rendezvous id, the same on every node (default: from Slurm)")
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Parse, plan and exec the command (the lock descriptors stay open in it). Exit status 2 with one line
    on stderr when the run cannot start here."""
    env = dict(os.environ if env is None else env)
    if argv is None:                      # the command line (not a test calling main): die with the workflow
        orphaned = die_with_parent()
        if orphaned:
            print(f"launch_train: {orphaned}", file=sys.stderr)
            return 128 + signal.SIGTERM
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is not None:
        args.program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if args.command is None or not args.program:
        parser.print_usage(sys.stderr)
        return 2
    try:
        command, run_env, keep = (launch if args.command == "run" else agent)(args, env)
    except LaunchError as e:
        print(f"launch_train: error: {e}", file=sys.stderr)
        return 2
    for fd in keep:
        os.set_inheritable(fd, True)
    print(f"launch_train: {shlex.join(command)}"
          + (f"  (CUDA_VISIBLE_DEVICES={run_env['CUDA_VISIBLE_DEVICES']})" if keep else ""), flush=True)
    os.execvpe(command[0], command, run_env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
