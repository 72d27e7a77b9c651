"""The workflow on a real Slurm (CI starts a one-node one from Debian's packages: .ci/slurm-up.sh), through
snakemake-executor-plugin-slurm and the shipped profiles: the micro workflow end to end on CPUs, the multi-node
launcher's srun + c10d path inside a Slurm job, and the sbatch lines of GPU configs. That Slurm has no GPU, so a
GPU job is refused at submission: its sbatch line is read from the executor's verbose output instead.

Skipped where no Slurm controller answers (`sinfo`), e.g. on a developer's machine, and where the Slurm that
answers is not the test cluster of .ci/slurm-up.sh (ClusterName speedrun-ci): these tests submit jobs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster_support import (copy_workflow, micro_config, snakemake, workflow_env, write_config,
                             write_dataset)


TEST_CLUSTER = "speedrun-ci"          # the ClusterName .ci/slurm-up.sh writes


def _test_cluster_node() -> tuple[int, int] | None:
    """(CPUs, memory MB) of the first responding node of the test cluster that .ci/slurm-up.sh starts, or None
    when no Slurm answers, or when the Slurm that answers is another one (say, a real cluster's login node:
    these tests submit jobs, and they are not for it)."""
    if shutil.which("sinfo") is None or shutil.which("scontrol") is None:
        return None
    try:
        if subprocess.run(["scontrol", "ping"], capture_output=True, timeout=30).returncode != 0:
            return None                                     # answers at once when no controller is up
        config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
        done = subprocess.run(["sinfo", "--noheader", "--responding", "--format", "%c %m %t"], capture_output=True,
                              text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return None
    if not re.search(rf"^ClusterName\s*=\s*{TEST_CLUSTER}\s*$", config.stdout, re.M) or done.returncode != 0:
        return None
    for line in done.stdout.splitlines():
        cpus, memory, state = line.split()
        if state.startswith(("idle", "mix", "alloc")):
            return int(cpus.rstrip("+")), int(memory.rstrip("+"))
    return None


NODE = _test_cluster_node()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(NODE is None, reason=f"no Slurm of the test cluster {TEST_CLUSTER!r} answers here "
                                                      "(CI starts one as root: .ci/slurm-up.sh)")]
PREFIX = f"speedrun-test-{os.getpid()}"
SRC = Path(__file__).resolve().parents[1] / "src"
PROGRAM = Path(__file__).resolve().parent / "cluster_train_losses.py"
GPU_TRAIN = {"device": "cuda", "world_size": 8, "tokens_per_step": 4096, "micro_batches": 16,
             "val_tokens": 16384, "val_batch_tokens": 1024}


def _cancel_leftovers() -> None:
    """Cancel this session's jobs still in the queue (a failed test must not leave work behind)."""
    done = subprocess.run(["squeue", "--noheader", "--format", "%i %j"], capture_output=True, text=True)
    ids = [line.split()[0] for line in done.stdout.splitlines() if line.split()[1:2] and
           line.split()[1].startswith(PREFIX)]
    if ids:
        subprocess.run(["scancel", *ids], check=False)


def _fit_profile(workdir: Path, name: str) -> None:
    """Scale the copied profile's memory per CPU down to what this node has (the shipped value is for GPU
    nodes); everything else stays as shipped."""
    path = workdir / "profiles" / name / "config.yaml"
    profile = yaml.safe_load(path.read_text())
    cpus, memory = NODE
    per_cpu = profile["default-resources"]["mem_mb_per_cpu"]
    profile["default-resources"]["mem_mb_per_cpu"] = min(per_cpu, memory // (2 * cpus))
    path.write_text(yaml.safe_dump(profile, sort_keys=False))


def _slurm_snakemake(workdir: Path, profile: str, targets: list[str], *options: str) -> subprocess.CompletedProcess:
    """Snakemake with a shipped profile on this Slurm: its CPUs as --cores (the tokenizer's threads), no
    account, squeue for job states (no accounting database), a first status check after 10 s (a job here
    takes 5 to 10 s: Snakemake starts twice in it), job names starting with this session's PREFIX, sbatch
    lines in the (verbose) output."""
    assert importlib.util.find_spec("snakemake_executor_plugin_slurm"), \
        "Slurm is up but snakemake-executor-plugin-slurm is missing: pip install -e '.[slurm]' (./install.sh does)"
    return snakemake(workdir, *targets, "--profile", f"profiles/{profile}", "--cores", str(NODE[0]),
                     "--slurm-no-account", "--slurm-status-command", "squeue",
                     "--slurm-init-seconds-before-status-checks", "10", "--slurm-jobname-prefix", PREFIX,
                     "--verbose", *options, timeout=600)


def _sbatch_lines(output: str, rule: str) -> dict[str, str]:
    """The sbatch command line of each job of ``rule``, by the job's wildcards (e.g. ``baseline_0``), in
    submission order."""
    lines = {}
    for line in output.splitlines():
        m = re.search(rf"sbatch call: (sbatch .*--comment rule_{rule}_wildcards_(\S+) .*?) --wrap=", line)
        if m:
            lines.setdefault(m.group(2), m.group(1))
    return lines


@pytest.fixture(scope="module")
def slurm_workflow(tmp_path_factory):
    """The micro workflow, reduced to one seed of each of two variants, run to its report through Slurm."""
    cfg = micro_config({"baseline": {"seeds": [0]}, "candidate": {"seeds": [0], "train": {"muon_lr": 0.04}}})
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm"), cfg, profiles=True)
    for name in ("slurm", "slurm-multinode"):
        _fit_profile(workdir, name)
    try:
        done = _slurm_snakemake(workdir, "slurm", ["report"])
        yield workdir, done
    finally:
        _cancel_leftovers()


def test_the_micro_workflow_runs_through_slurm(slurm_workflow):
    workdir, done = slurm_workflow
    assert done.returncode == 0, done.stdout[-6000:]
    for variant in ("baseline", "candidate"):
        record = json.loads((workdir / f"results/parse/{variant}/seed0.json").read_text())
        assert record["status"] == "complete"
    assert (workdir / "results/report/summary.md").stat().st_size > 0
    # Inside the job step the run is torchrun --standalone, without GPU locks (Slurm places jobs)
    log = (workdir / "logs/train/baseline/seed0.log").read_text()
    assert log.startswith("launch_train: torchrun --standalone --nproc-per-node=1 --no-python speedrun train")
    assert not (workdir / "results/.gpu-locks").exists()


def test_slurm_jobs_are_named_and_logged_where_a_user_finds_them(slurm_workflow):
    workdir, done = slurm_workflow
    train = _sbatch_lines(done.stdout, "train")
    assert set(train) == {"baseline_0", "candidate_0"}
    line = train["baseline_0"]
    assert f"--job-name {PREFIX}_" in line
    assert f"--output {workdir}/logs/slurm/rule_train/baseline_0/%j.log" in line
    assert " -t 30 " in line and " --nodes=1 " in line and "--cpus-per-task=1" in line   # CPU run: 1 process
    assert "--gpus" not in line and "--gres" not in line
    slurm_logs = list((workdir / "logs/slurm/rule_train/baseline_0").glob("*.log"))
    assert len(slurm_logs) == 1 and slurm_logs[0].stem.isdigit()


def test_one_node_gpu_runs_ask_for_their_gpus_in_priority_order(slurm_workflow):
    """4 runs of 8 GPUs with a budget of 8: submitted one at a time, seed 0 of both variants first."""
    workdir, _ = slurm_workflow
    cfg = micro_config({"baseline": {"seeds": [0, 1]}, "candidate": {"seeds": [0, 1], "train": {"muon_lr": 0.04}}})
    cfg["train"].update(GPU_TRAIN)
    write_config(workdir / "config.yaml", cfg)
    targets = [f"results/train/{v}/seed{s}.txt" for v in ("baseline", "candidate") for s in (0, 1)]
    done = _slurm_snakemake(workdir, "slurm", targets, "--keep-going", "--resources", "gpu=8")
    assert done.returncode != 0                                  # no GPU on this Slurm: sbatch refuses them
    train = _sbatch_lines(done.stdout, "train")
    assert list(train) == ["baseline_0", "candidate_0", "baseline_1", "candidate_1"]
    for line in train.values():
        assert " --gpus=8" in line and " --nodes=1 " in line and " -t 30 " in line
        assert "--cpus-per-gpu=8" in line and "--ntasks-per-gpu" not in line


def test_a_two_node_run_asks_for_nodes_tasks_and_gpus_per_node(slurm_workflow):
    workdir, _ = slurm_workflow
    cfg = micro_config({"baseline": {"seeds": [0], "train": {"world_size": 16, "nodes": 2}}})
    cfg["train"].update(GPU_TRAIN)
    write_config(workdir / "config.yaml", cfg)
    done = _slurm_snakemake(workdir, "slurm-multinode", ["results/train/baseline/seed0.txt"])
    assert done.returncode != 0
    line = _sbatch_lines(done.stdout, "train")["baseline_0"]
    for flag in (" --nodes=2 ", " --ntasks=2 ", " --gres=gpu:8", " -t 45 ", "--cpus-per-gpu=8", "--exclusive"):
        assert flag in line
    assert "--gpus=" not in line and "--ntasks-per-gpu" not in line


def test_srun_and_c10d_rendezvous_inside_a_slurm_job(tmp_path):
    """The multi-node launch inside a real Slurm allocation, on the one node there is: srun starts the agent,
    which finds the job's first host with scontrol and meets torchrun's two ranks there."""
    from speedrun.workflow import launcher as launch_train

    shards, bos = write_dataset(tmp_path / "data")
    settings = json.dumps({"preset": "tiny", "model": {"n_layer": 1, "model_dim": 32, "n_head": 2, "head_dim": 16},
                           "steps": 2, "tokens_per_step": 512, "micro_batches": 2, "max_seq_len": 128,
                           "val_tokens": 512, "val_batch_tokens": 256, "val_every": 0, "world_size": 2})
    program = [sys.executable, str(PROGRAM), settings, str(shards), str(bos), str(tmp_path / "run.txt"),
               str(tmp_path / "losses-{rank}.json")]
    srun = launch_train.srun_command(launch_train.Placement(world_size=2, nodes=1), program)
    cpus = min(2, NODE[0])
    done = subprocess.run(["salloc", f"--job-name={PREFIX}-srun", "--nodes=1", "--ntasks=1",
                           f"--cpus-per-task={cpus}", "--mem=4000", "-t", "10", *srun],
                          env={**workflow_env(tmp_path), "PYTHONPATH": str(SRC)}, capture_output=True, text=True,
                          timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert re.search(r"--rdzv-endpoint=\S+:\d+ --rdzv-id=slurm-\d+", output)
    ranks = [json.loads((tmp_path / f"losses-{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] and len(ranks[0]) == 2 + 2
    assert "world_size: 2" in (tmp_path / "run.txt").read_text()
