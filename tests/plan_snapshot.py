"""The jobs `snakemake -n -p --forceall` plans, as plain data that a test can compare across code changes.

Each job is its rule, wildcards, outputs, logs, priority, threads, resources and shell command (which carries
every param), plus its inputs other than the package's own source files (a module that moves changes those
paths but not what the job computes). The train rule's launcher (``<python> -m speedrun.workflow.launcher``,
recorded as ``workflow/scripts/launch_train.py`` before) is replaced by ``<launcher>``, and the interpreter's
path before any other ``-m`` by ``<python>``.

    python tests/plan_snapshot.py     (records the fixtures tests/data/plan-*.json; only on a reference commit)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("output", "log", "wildcards", "priority", "threads", "resources")


def _copy_workflow(workdir: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copy(ROOT / "Snakefile", workdir / "Snakefile")
    shutil.copy(ROOT / "config.yaml", workdir / "config.yaml")
    for folder in ("workflow", "profiles", "src"):
        shutil.copytree(ROOT / folder, workdir / folder, ignore=ignore)


def _job(block: list[str], workdir: Path) -> dict:
    header = re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", block[0])
    job: dict = {"rule": header.group(1)}
    for line in block[1:]:
        key, _, value = line.strip().partition(": ")
        if key == "input":
            job["input"] = [p for p in value.split(", ") if "/src/speedrun/" not in p and not
                            p.startswith("src/speedrun/")]
        elif key in FIELDS:
            job[key] = value
        elif line.startswith("Shell command: "):
            command = line[len("Shell command: "):]
            command = re.sub(r"\S+python\S* -m speedrun\.workflow\.launcher ", "<launcher> ", command)
            command = re.sub(r"\S*python[\d.]* -m ", "<python> -m ", command)      # the interpreter's path
            job["shell"] = command.replace(str(workdir), "<workdir>")
    if "resources" in job:
        job["resources"] = ", ".join(r for r in job["resources"].split(", ") if not r.startswith("tmpdir="))
    return job


def planned(configfile: dict | None = None) -> list[dict]:
    """The jobs a dry run of the whole workflow plans (the project's Snakefile and config.yaml, with
    `configfile` given as --configfile when not None; a fresh results folder), sorted by rule and output."""
    with tempfile.TemporaryDirectory(prefix="speedrun-plan-") as tmp:
        workdir = Path(tmp)
        _copy_workflow(workdir)
        extra = []
        if configfile is not None:
            (workdir / "extra.yaml").write_text(yaml.safe_dump(configfile, sort_keys=False))
            extra = ["--configfile", "extra.yaml"]
        env = dict(os.environ, PYTHONPATH=str(workdir / "src"))
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.pop("PYTHONSAFEPATH", None)
        done = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--forceall", "--cores", "2", *extra],
                              cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise AssertionError(f"snakemake -n failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        lines = (done.stdout + done.stderr).splitlines()
        blocks, current = [], None
        for line in lines:
            if re.match(r"^(?:local)?(?:rule|checkpoint) \w+:$", line):
                current = [line]
                blocks.append(current)
            elif current is not None and (line.startswith("    ") or line.startswith("Shell command: ")):
                current.append(line)
            else:
                current = None
        jobs = [_job(block, workdir) for block in blocks]
    return sorted(jobs, key=lambda j: (j["rule"], j.get("output", "")))


def fineweb_config() -> dict:
    """configs/fineweb-8xh100.yaml with a third variant that spans two nodes (nodes, gres, tasks, mpi)."""
    cfg = yaml.safe_load((ROOT / "configs" / "fineweb-8xh100.yaml").read_text())
    cfg["variants"]["wide"] = {"seeds": [0, 1], "train": {"nodes": 2, "world_size": 16, "micro_batches": 16,
                                                          "val_batch_tokens": 131072, "muon_lr": 0.03}}
    return cfg


CASES = {"plan-default.json": lambda: None, "plan-fineweb.json": fineweb_config}

if __name__ == "__main__":      # records the fixtures tests/test_plan_equivalence.py compares with
    for name, make in CASES.items():
        (ROOT / "tests" / "data" / name).write_text(json.dumps(planned(make()), indent=1) + "\n")
