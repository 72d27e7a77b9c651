"""Placement and scheduling of training runs, as Snakemake plans and runs them: the order runs start in (A/B
interleaving by priority), the resources a GPU run asks a scheduler for (one node, several nodes, CPU), the
settings the training job gets, and (slow) GPU runs on the local executor with the default profile, where a
stand-in `torchrun` records which GPUs each run saw and when."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from cluster_support import ROOT, copy_workflow, job_blocks, micro_config, resources, snakemake, wildcards

# A config whose batches divide over 16 ranks (micro_batches) and whose validation divides over 16 ranks.
GPU_TRAIN = {"device": "cuda", "world_size": 8, "tokens_per_step": 4096, "micro_batches": 16,
             "val_tokens": 16384, "val_batch_tokens": 1024}
# Listed candidate first: the baseline still starts each round.
VARIANTS = {
    "candidate": {"seeds": [0, 1], "train": {"muon_lr": 0.04}},
    "baseline": {"seeds": [0, 1, 2]},
    "wide": {"seeds": [5], "train": {"world_size": 16, "nodes": 2}},
    "cpu": {"seeds": [0], "train": {"device": "cpu", "world_size": 2}},
}


def gpu_config(variants: dict = VARIANTS) -> dict:
    cfg = micro_config(variants)
    cfg["train"].update(GPU_TRAIN)
    cfg["cluster"] = {"gpu_model": "H100", "gpu_memory_gib": 79}
    return cfg


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> dict[tuple[str, int], dict[str, str]]:
    """The train jobs of a dry run of the GPU config: (variant, seed) -> the job's printed lines."""
    workdir = copy_workflow(tmp_path_factory.mktemp("plan"), gpu_config())
    done = snakemake(workdir, "-n", "-p", "--cores", "16")
    assert done.returncode == 0, done.stdout
    return {wildcards(b): b for b in job_blocks(done.stdout, "train")}


def test_runs_start_seed_by_seed_with_the_variants_alternating(planned):
    order = sorted(planned, key=lambda run: -int(planned[run]["priority"]))
    assert order == [("baseline", 0), ("candidate", 0), ("wide", 5), ("cpu", 0),
                     ("baseline", 1), ("candidate", 1), ("baseline", 2)]
    assert sorted(int(b["priority"]) for b in planned.values()) == [1, 2, 3, 4, 5, 6, 7]


def test_a_one_node_gpu_run_holds_world_size_gpus(planned):
    job = planned[("baseline", 0)]
    assert resources(job)["gpu"] == "8" and resources(job)["nodes"] == "1"
    assert not {"gres", "mpi", "tasks", "tasks_per_gpu"} & set(resources(job))
    assert job["threads"] == "8"
    assert " run --world-size 8 --nodes 1 --device cuda --gpu-locks results/.gpu-locks " in job["shell"]
    assert job["shell"].endswith(" --gpu-model=H100 --gpu-memory-gib=79 >> logs/train/baseline/seed0.log 2>&1")


def test_a_two_node_run_asks_slurm_for_gpus_per_node_and_one_task_per_node(planned):
    job = resources(planned[("wide", 5)])
    assert {k: job[k] for k in ("gpu", "nodes", "gres", "mpi", "tasks", "tasks_per_gpu")} == {
        "gpu": "0", "nodes": "2", "gres": "gpu:8", "mpi": "srun", "tasks": "2", "tasks_per_gpu": "0"}
    assert planned[("wide", 5)]["threads"] == "8"                      # 8 processes on each node
    assert " run --world-size 16 --nodes 2 --device cuda " in planned[("wide", 5)]["shell"]


def test_a_cpu_run_holds_no_gpu(planned):
    job = planned[("cpu", 0)]
    assert resources(job)["gpu"] == "0" and "gres" not in resources(job)
    assert job["threads"] == "2"


def test_training_never_sees_the_placement(planned):
    """`nodes` places processes without changing what they compute: it is not among the training settings."""
    for (variant, _), job in planned.items():
        settings = json.loads(job["shell"].split("--config '", 1)[1].split("'", 1)[0])
        assert "nodes" not in settings
        assert settings["world_size"] == {"wide": 16, "cpu": 2}.get(variant, 8)


def test_world_size_must_split_evenly_over_nodes(tmp_path):
    workdir = copy_workflow(tmp_path, gpu_config({"baseline": {"seeds": [0], "train": {"nodes": 3}}}))
    done = snakemake(workdir, "-n", "--cores", "8")
    assert done.returncode != 0
    assert "train.world_size 8 is not a multiple of train.nodes 3" in done.stdout


# ---- the scheduler's GPU budget and the profiles ---------------------------------------------------------------

def test_the_scheduler_holds_8_gpus_unless_a_budget_is_given(tmp_path):
    """The Snakefile's budget of 8 GPUs is the global limit a one-node 16-GPU run is cut down to (Snakemake
    constrains a job's resource to the global one); `--resources gpu=64` replaces it. profiles/default, read on
    its own, still prints each job's command (printshellcmds: no -p here)."""
    cfg = gpu_config({"big": {"seeds": [0], "train": {"world_size": 16}}})
    cfg["stats"]["baseline"] = "big"
    workdir = copy_workflow(tmp_path, cfg, profiles=True)
    gpus = {}
    for budget in ([], ["--resources", "gpu=64"]):
        done = snakemake(workdir, "-n", "--cores", "16", "results/train/big/seed0.txt", *budget)
        assert done.returncode == 0, done.stdout
        assert "Using workflow specific profile profiles/default" in done.stdout
        [job] = job_blocks(done.stdout, "train")
        assert " run --world-size 16 --nodes 1 --device cuda " in job["shell"]
        gpus[tuple(budget)] = resources(job)["gpu"]
    assert gpus == {(): "8", ("--resources", "gpu=64"): "16"}


@pytest.mark.parametrize("profile", ["slurm", "slurm-multinode"])
def test_a_profile_on_the_command_line_keeps_its_gpu_budget(profile, monkeypatch):
    """`--profile profiles/slurm` in the project folder: Snakemake also reads profiles/default there, and reads
    it last, so its settings win; the Slurm profile's `resources: {gpu: 64}` must survive (it did not while
    profiles/default held `resources: {gpu: 8}`), and the default's printed commands and failed logs stay."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    from snakemake.cli import parse_args

    monkeypatch.chdir(ROOT)
    shipped = yaml.safe_load((ROOT / "profiles" / profile / "config.yaml").read_text())["resources"]
    _, args = parse_args(["--profile", f"profiles/{profile}", "-n", "report"])
    assert {name: res.value for name, res in args.resources.items()} == shipped == {"gpu": 64}
    assert args.printshellcmds and args.show_failed_logs and args.executor == "slurm"


# ---- GPU runs on the local executor, with a stand-in torchrun ---------------------------------------------------

FAKE_TORCHRUN = """#!{python}
import argparse, json, os, sys, time
from pathlib import Path
from speedrun.train import add_arguments
args = sys.argv[1:]
parser = argparse.ArgumentParser()
add_arguments(parser)
parser.parse_args(args[args.index("train") + 1:])          # the command line speedrun train would get
start = time.time()
time.sleep(1.0)
out = Path(args[args.index("--out") + 1])
out.write_text("stand-in training log\\n")
record = {{"run": str(out), "gpus": os.environ["CUDA_VISIBLE_DEVICES"], "start": start, "end": time.time()}}
with open(os.environ["TORCHRUN_RECORD"], "a") as f:
    f.write(json.dumps(record) + "\\n")
"""


@pytest.mark.slow
def test_local_gpu_runs_share_the_machine_without_sharing_a_gpu(tmp_path):
    """8 pretend GPUs, the Snakefile's default budget gpu=8, runs of 4 GPUs (and cores for all four): the scheduler
    starts two at a time (none waits for a GPU lock), on disjoint GPUs, seed 0 of both variants first."""
    cfg = gpu_config({"baseline": {"seeds": [0, 1]}, "candidate": {"seeds": [0, 1], "train": {"muon_lr": 0.04}}})
    cfg["train"]["world_size"] = 4
    del cfg["cluster"]                                               # the defaults: any GPU model and memory
    workdir = copy_workflow(tmp_path / "wf", cfg, profiles=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(FAKE_TORCHRUN.format(python=sys.executable))
    (bin_dir / "torchrun").chmod(0o755)
    record = tmp_path / "torchrun.jsonl"
    targets = [f"results/train/{v}/seed{s}.txt" for v in ("baseline", "candidate") for s in (0, 1)]
    done = snakemake(workdir, "--cores", "16", *targets, path_first=bin_dir,
                     CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7", TORCHRUN_RECORD=str(record))
    assert done.returncode == 0, done.stdout
    assert "Using workflow specific profile profiles/default" in done.stdout
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(r["run"] for r in runs) == targets
    for r in runs:
        assert len(set(r["gpus"].split(","))) == 4
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            if a["start"] < b["end"] and b["start"] < a["end"]:
                assert not set(a["gpus"].split(",")) & set(b["gpus"].split(","))
    first = {r["run"] for r in sorted(runs, key=lambda r: r["start"])[:2]}
    assert first == {"results/train/baseline/seed0.txt", "results/train/candidate/seed0.txt"}
    assert max(r["start"] for r in runs) >= min(r["end"] for r in runs)   # never all four at once
    for log in Path(workdir, "logs/train").glob("*/*.log"):
        assert "waiting for" not in log.read_text()                     # kept apart by the scheduler
    locks = sorted(p.name for p in Path(workdir, "results/.gpu-locks").glob("*/gpu-*.lock"))
    assert locks == [f"gpu-{i}.lock" for i in range(8)]
