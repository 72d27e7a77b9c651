"""speedrun.workflow.launcher, the train rule's launcher: placement of processes, the torchrun/srun command lines
(written out by hand here), the GPU lock allocator under real concurrency, and the launcher end to end
(``python -m speedrun.workflow.launcher``) with stand-in `torchrun`, `srun` and `scontrol` programs that record
what they were given."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import speedrun.workflow.launcher as lt

SRC = Path(lt.__file__).resolve().parents[2]               # the src/ folder that holds this speedrun package
LAUNCHER = [sys.executable, "-m", "speedrun.workflow.launcher"]


# ---- placement and command lines ---------------------------------------------------------------------------


def test_placement_splits_the_world_evenly_over_nodes():
    assert lt.Placement(16, 2).per_node == 8
    assert lt.Placement(8, 1).per_node == 8
    with pytest.raises(lt.LaunchError, match=r"world_size 12 is not a multiple of train.nodes 8"):
        lt.Placement(12, 8)
    with pytest.raises(lt.LaunchError):
        lt.Placement(8, 0)


def test_standalone_and_agent_command_lines():
    program = ["speedrun", "train", "--out", "x.txt"]
    assert lt.standalone_command(8, program) == [
        "torchrun", "--standalone", "--nproc-per-node=8", "--no-python", "speedrun", "train", "--out", "x.txt"]
    assert lt.agent_command(lt.Placement(16, 2), "gpu01:31956", "slurm-42", program) == [
        "torchrun", "--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=gpu01:31956",
        "--rdzv-id=slurm-42", "--no-python", "speedrun", "train", "--out", "x.txt"]


def test_srun_starts_one_agent_per_node():
    command = lt.srun_command(lt.Placement(32, 4), ["speedrun", "train"], python="/venv/bin/python")
    assert command == [
        "srun", "--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--label",
        "/venv/bin/python", "-m", "speedrun.workflow.launcher", "agent", "--world-size=32", "--nodes=4", "--",
        "speedrun", "train"]


# ---- visible GPUs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,expected", [
    ("3,5,7", ["3", "5", "7"]),
    ("", []),
    ("0, 1", ["0", "1"]),
    ("0,-1,2", ["0"]),                                    # CUDA ignores every device after an invalid one
    ("GPU-8f1c,GPU-77aa", ["GPU-8f1c", "GPU-77aa"]),
])
def test_visible_gpus_follow_cuda_visible_devices(value, expected):
    assert lt.visible_gpus({"CUDA_VISIBLE_DEVICES": value}) == expected


def test_no_nvidia_smi_means_no_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert lt.visible_gpus({}) == []


def test_nvidia_smi_indices_are_the_gpus(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '0\\n1\\n2\\n3\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert lt.visible_gpus({}) == ["0", "1", "2", "3"]


def test_gpus_needed_by_device():
    assert lt.gpus_needed("cpu", 4, ["0", "1", "2", "3"]) == 0
    assert lt.gpus_needed("auto", 2, []) == 0
    assert lt.gpus_needed("auto", 2, ["0", "1", "2"]) == 2
    assert lt.gpus_needed("cuda", 8, [str(i) for i in range(8)]) == 8
    with pytest.raises(lt.LaunchError, match=r"expected 8 GPUs, found none"):
        lt.gpus_needed("cuda", 8, [])
    with pytest.raises(lt.LaunchError, match=r"expected 8 GPUs, found 4 \(0, 1, 2, 3\)"):
        lt.gpus_needed("cuda", 8, ["0", "1", "2", "3"])
    with pytest.raises(lt.LaunchError, match=r"expected 1 GPU, found none"):
        lt.gpus_needed("cuda", 1, [])


# ---- GPU locks ---------------------------------------------------------------------------------------------------


def test_runs_take_disjoint_gpus_and_give_them_back(tmp_path):
    gpus = ["0", "1", "2", "3"]
    first = lt.try_acquire_gpus(tmp_path, gpus, 3, "first")
    assert list(first) == ["0", "1", "2"]
    assert lt.try_acquire_gpus(tmp_path, gpus, 2, "second") is None       # one free GPU is not two
    assert list(lt.try_acquire_gpus(tmp_path, gpus, 1, "third")) == ["3"]
    assert "first" in (tmp_path / "gpu-1.lock").read_text()
    for fd in first.values():
        os.close(fd)
    assert list(lt.try_acquire_gpus(tmp_path, gpus, 2, "fourth")) == ["0", "1"]


def _hold_gpus(lock_dir: str, queue, hold_s: float) -> None:
    held = lt.acquire_gpus(Path(lock_dir), ["0", "1", "2", "3"], 2, poll_s=0.01, log=open(os.devnull, "w"))
    start = time.monotonic()
    time.sleep(hold_s)
    queue.put((sorted(held), start, time.monotonic()))
    for fd in held.values():
        os.close(fd)


def test_concurrent_runs_never_share_a_gpu(tmp_path):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_hold_gpus, args=(str(tmp_path), queue, 0.15)) for _ in range(8)]
    for p in procs:
        p.start()
    spans = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0
    assert all(len(set(gpus)) == 2 for gpus, _, _ in spans)
    for i, (gpus_a, start_a, end_a) in enumerate(spans):
        for gpus_b, start_b, end_b in spans[i + 1:]:
            if start_a < end_b and start_b < end_a:                       # held at the same time
                assert not set(gpus_a) & set(gpus_b)
    # 8 runs of 2 GPUs on 4 GPUs: at least 4 rounds of 0.15 s one after the other
    assert max(e for _, _, e in spans) - min(s for _, s, _ in spans) >= 4 * 0.15 - 0.02


def test_a_killed_run_releases_its_gpus(tmp_path):
    code = (f"import sys, time, pathlib; sys.path.insert(0, {str(SRC)!r}); import speedrun.workflow.launcher as lt; "
            f"lt.acquire_gpus(pathlib.Path({str(tmp_path)!r}), ['0', '1'], 2); print('held', flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert lt.try_acquire_gpus(tmp_path, ["0", "1"], 1) is None
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    assert list(lt.try_acquire_gpus(tmp_path, ["0", "1"], 2)) == ["0", "1"]


# ---- the launcher, with stand-in programs ----------------------------------------------------------------------------

RECORDER = """#!{python}
import fcntl, json, os, sys
from pathlib import Path
locks = Path(os.environ.get("LOCK_DIR", "/nonexistent"))
held = []
for path in sorted(locks.glob("*/gpu-*.lock")):
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.append(path.name)
    os.close(fd)
record = {{"program": os.path.basename(sys.argv[0]), "args": sys.argv[1:], "held": held,
          "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "OMP": os.environ.get("OMP_NUM_THREADS")}}
Path(os.environ["RECORD"]).write_text(json.dumps(record))
"""


@pytest.fixture
def stand_ins(tmp_path):
    """A PATH with `torchrun`, `srun` and `scontrol` stand-ins; returns a function running the launcher."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("torchrun", "srun", "speedrun"):
        (bin_dir / name).write_text(RECORDER.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    (bin_dir / "scontrol").write_text("#!/bin/sh\n[ \"$3\" = 'gpu[07-08]' ] && printf 'gpu07\\ngpu08\\n'\n")
    (bin_dir / "scontrol").chmod(0o755)
    record = tmp_path / "record.json"

    def run(args: list[str], **env_vars: str) -> tuple[subprocess.CompletedProcess, dict | None]:
        env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "RECORD": str(record), "PYTHONPATH": str(SRC),
               "LOCK_DIR": str(tmp_path / "locks"), "OMP_NUM_THREADS": "16", **env_vars}
        record.unlink(missing_ok=True)
        done = subprocess.run([*LAUNCHER, *args], env=env, capture_output=True, text=True, cwd=tmp_path,
                              timeout=60)
        return done, (json.loads(record.read_text()) if record.exists() else None)

    return run


PROGRAM = ["--", "speedrun", "train", "--config", '{"world_size": 2}', "--out", "results/train/b/seed0.txt"]


def test_a_gpu_run_takes_free_gpus_and_sees_only_them(stand_ins, tmp_path):
    done, record = stand_ins(["run", "--world-size", "2", "--device", "cuda", "--gpu-locks",
                              str(tmp_path / "locks"), "--label", "results/train/b/seed0.txt", *PROGRAM],
                             CUDA_VISIBLE_DEVICES="3,5,7")
    assert done.returncode == 0, done.stderr
    assert record["args"] == ["--standalone", "--nproc-per-node=2", "--no-python", "speedrun", "train", "--config",
                              '{"world_size": 2}', "--out", "results/train/b/seed0.txt"]
    assert record["CUDA_VISIBLE_DEVICES"] == "3,5" and record["OMP"] == "1"
    assert record["held"] == ["gpu-3.lock", "gpu-5.lock"]                   # torchrun itself holds the locks


def test_a_cpu_run_sees_no_gpu_and_takes_no_lock(stand_ins, tmp_path):
    done, record = stand_ins(["run", "--world-size", "2", "--device", "cpu", "--gpu-locks",
                              str(tmp_path / "locks"), *PROGRAM], CUDA_VISIBLE_DEVICES="0,1")
    assert done.returncode == 0, done.stderr
    assert record["CUDA_VISIBLE_DEVICES"] == "" and record["held"] == []
    assert not (tmp_path / "locks").exists()


def test_under_a_scheduler_the_job_steps_gpus_are_used_as_given(stand_ins):
    done, record = stand_ins(["run", "--world-size", "4", "--device", "cuda", "--gpu-locks", "none", *PROGRAM],
                             CUDA_VISIBLE_DEVICES="0,1,2,3")
    assert done.returncode == 0, done.stderr
    assert record["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and record["args"][:3] == [
        "--standalone", "--nproc-per-node=4", "--no-python"]


def test_a_program_with_its_own_torchrun_is_execd_with_the_gpus_and_locks(stand_ins, tmp_path):
    """A script variant's run (`speedrun run-script`, which starts torchrun itself): exec'd as it is, holding
    the GPUs' locks and seeing only them, as torchrun would."""
    program = ["--", "speedrun", "run-script", "--log", "r.txt", "--world-size", "2"]
    done, record = stand_ins(["run", "--own-torchrun", "--world-size", "2", "--device", "cuda", "--gpu-locks",
                              str(tmp_path / "locks"), *program], CUDA_VISIBLE_DEVICES="4,6,7")
    assert done.returncode == 0, done.stderr
    assert record["program"] == "speedrun" and record["args"] == ["run-script", "--log", "r.txt", "--world-size", "2"]
    assert record["CUDA_VISIBLE_DEVICES"] == "4,6" and record["held"] == ["gpu-4.lock", "gpu-6.lock"]
    done, record = stand_ins(["run", "--own-torchrun", "--world-size", "4", "--nodes", "2", "--device", "cuda",
                              "--gpu-locks", "none", *program], SLURM_JOB_ID="7")
    assert done.returncode == 2 and record is None and "runs on one node" in done.stderr


def test_too_few_gpus_fail_before_torchrun(stand_ins, tmp_path):
    done, record = stand_ins(["run", "--world-size", "8", "--device", "cuda", "--gpu-locks",
                              str(tmp_path / "locks"), *PROGRAM], CUDA_VISIBLE_DEVICES="0,1")
    assert done.returncode == 2 and record is None
    assert "expected 8 GPUs, found 2 (0, 1)" in done.stderr


def test_several_nodes_need_a_slurm_job(stand_ins):
    args = ["run", "--world-size", "16", "--nodes", "2", "--device", "cuda", "--gpu-locks", "none", *PROGRAM]
    done, record = stand_ins(args)
    assert done.returncode == 2 and record is None
    assert "train.nodes is 2" in done.stderr and "profiles/slurm-multinode" in done.stderr
    done, record = stand_ins(args, SLURM_JOB_ID="4242")
    assert done.returncode == 0, done.stderr
    assert record["program"] == "srun"
    assert record["args"][:8] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                                  "--label", sys.executable, "-m", "speedrun.workflow.launcher"]
    assert record["args"][8:] == ["agent", "--world-size=16", "--nodes=2", "--", "speedrun", "train", "--config",
                                  '{"world_size": 2}', "--out", "results/train/b/seed0.txt"]


def test_the_agent_meets_the_others_on_the_first_node_of_the_job(stand_ins):
    done, record = stand_ins(["agent", "--world-size", "16", "--nodes", "2", *PROGRAM],
                             SLURM_JOB_NODELIST="gpu[07-08]", SLURM_JOB_ID="123456")
    assert done.returncode == 0, done.stderr
    # port 29500 + 123456 mod 10000 = 32956, the same on every node of job 123456
    assert record["args"][:6] == ["--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d",
                                  "--rdzv-endpoint=gpu07:32956", "--rdzv-id=slurm-123456", "--no-python"]
    done, _ = stand_ins(["agent", "--world-size", "16", "--nodes", "2", *PROGRAM])
    assert done.returncode == 2 and "SLURM_JOB_NODELIST" in done.stderr
