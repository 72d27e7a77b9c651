"""Time `snakemake -n` for a FineWeb-scale experiment on 8 GPUs: 4 variants x 10 seeds of the 8-GPU config.

Two states of the results folder are timed:
- fresh: nothing built yet; the BOS-index checkpoint is pending, so the 40 runs are planned without their data
  check;
- data in place: the data stages' outputs exist, fabricated at full scale (manifests of one validation and 24
  train shards of 100M tokens, BOS positions at FineWeb's mean document length of about 1,040 tokens; the shard
  files themselves are not needed for planning and are left out), so planning also checks, once per variant,
  that the train shards feed 3,200 steps of 524,288 tokens (the loader is simulated exactly).

The workflow (Snakefile, workflow/, profiles/, src/) is copied into a temporary folder with the config.

    python benchmarks/plan_fineweb.py [--configfile configs/fineweb-8xh100.yaml] [--repeat 3] [--embedded]

--embedded plans the same experiment with data.source `embedded` (for a checkout whose schema does not know the
config's source yet): the data stages differ, the 40 runs and their data checks do not. Prints one line per
state: the median wall time over the repeats, and the jobs planned.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOWNSTREAM = {"train", "parse", "stats", "compare", "report", "bundle", "all"}
VARIANTS = {"baseline": {}, "lr040": {"muon_lr": 0.04}, "lr045": {"muon_lr": 0.045}, "lr055": {"muon_lr": 0.055}}
SHARD_TOKENS, TRAIN_SHARDS, MEAN_DOCUMENT = 100_000_000, 24, 1040


def experiment(configfile: Path, embedded: bool) -> dict:
    """The config with 4 variants of 10 seeds each."""
    cfg = yaml.safe_load(configfile.read_text())
    cfg["variants"] = {name: {"seeds": list(range(10)), "train": dict(train)} for name, train in VARIANTS.items()}
    cfg["stats"]["baseline"] = "baseline"
    if embedded:
        cfg["data"] = {"source": "embedded", "name": cfg["data"]["name"], "shuffle_seed": 1234,
                       "shard_tokens": SHARD_TOKENS}
    return cfg


def copy_workflow(workdir: Path, cfg: dict) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copy(ROOT / "Snakefile", workdir / "Snakefile")
    for folder in ("workflow", "profiles", "src"):
        shutil.copytree(ROOT / folder, workdir / folder, ignore=ignore)
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def dry_run(workdir: Path) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=str(workdir / "src"))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "snakemake", "-n"], cwd=workdir, env=env, capture_output=True,
                          text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"snakemake -n failed in {workdir}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return elapsed, done.stdout + done.stderr


def planned_jobs(output: str) -> dict[str, int]:
    """Rule -> jobs, from the `Job stats` table."""
    table = output.split("Job stats:", 1)[1].splitlines()[3:]
    counts = {}
    for line in table:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


def upstream_outputs(output: str) -> list[str]:
    """The outputs of the jobs before training (download, corpus, tokenize, bos_index...), in printed order."""
    outputs, rule = [], None
    for line in output.splitlines():
        m = re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", line)
        if m:
            rule = m.group(1)
        elif rule and rule not in DOWNSTREAM and line.startswith("    output: "):
            outputs.extend(line[len("    output: "):].split(", "))
    return outputs


def fabricate_data(workdir: Path, outputs: list[str], dataset: str) -> None:
    """The data stages' outputs at full scale, each newer than what it is made from."""
    shards_dir, bos_dir = workdir / f"results/shards/{dataset}", workdir / f"results/bos_index/{dataset}"
    now = time.time()
    for path in (workdir / p for p in outputs):
        if path in (shards_dir, bos_dir):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        os.utime(path, (now + 10, now + 10))
    rng = np.random.default_rng(0)
    names = [f"{dataset}_val_000000.bin"] + [f"{dataset}_train_{i:06d}.bin" for i in range(1, TRAIN_SHARDS + 1)]
    shards = [{"file": n, "split": "val" if i == 0 else "train", "tokens": SHARD_TOKENS, "sha256": f"{i:064x}"}
              for i, n in enumerate(names)]
    shards_dir.mkdir(parents=True, exist_ok=True)
    (shards_dir / "manifest.json").write_text(json.dumps({"dataset": dataset, "shard_tokens": SHARD_TOKENS,
                                                          "shards": shards}))
    bos_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for shard in shards:
        lengths = rng.geometric(1 / MEAN_DOCUMENT, size=2 * SHARD_TOKENS // MEAN_DOCUMENT)
        positions = np.concatenate(([0], np.cumsum(lengths)))
        positions = positions[positions < SHARD_TOKENS].astype(np.int64)
        stem = shard["file"].replace(".bin", ".npy")
        np.save(bos_dir / stem, positions)
        entries.append({"file": stem, "shard": shard["file"], "shard_sha256": shard["sha256"],
                        "count": len(positions)})
    (bos_dir / "manifest.json").write_text(json.dumps({"dataset": dataset, "shards": entries}))
    for offset, folder in ((20, shards_dir), (30, bos_dir)):
        for path in [folder, *folder.iterdir()]:
            os.utime(path, (now + offset, now + offset))


def measure(workdir: Path, repeat: int) -> tuple[float, dict[str, int], str]:
    times, output = [], ""
    for _ in range(repeat):
        elapsed, output = dry_run(workdir)
        times.append(elapsed)
    return statistics.median(times), planned_jobs(output), output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", type=Path, default=ROOT / "configs" / "fineweb-8xh100.yaml")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--embedded", action="store_true", help="plan with data.source embedded")
    args = parser.parse_args()
    cfg = experiment(args.configfile, args.embedded)
    with tempfile.TemporaryDirectory(prefix="speedrun-plan-") as tmp:
        workdir = Path(tmp)
        copy_workflow(workdir, cfg)
        fresh, jobs, output = measure(workdir, args.repeat)
        print(f"snakemake -n, fresh folder:   {fresh:.2f} s (median of {args.repeat}), "
              f"{sum(v for k, v in jobs.items() if k != 'total')} jobs: {jobs}")
        fabricate_data(workdir, upstream_outputs(output), cfg["data"]["name"])
        ready, jobs, _ = measure(workdir, args.repeat)
        print(f"snakemake -n, data in place:  {ready:.2f} s (median of {args.repeat}), "
              f"{sum(v for k, v in jobs.items() if k != 'total')} jobs: {jobs}")
        print(f"({sys.platform}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; "
              f"{len(VARIANTS)} variants x 10 seeds, world_size {cfg['train']['world_size']}, "
              f"{cfg['train']['steps']} steps of {cfg['train']['tokens_per_step']} tokens, "
              f"{TRAIN_SHARDS} train shards of {SHARD_TOKENS} tokens)")


if __name__ == "__main__":
    main()
