"""Helpers of the cluster tests: a copy of the workflow to run Snakemake in, the micro config reduced to a
few runs, and the job blocks of Snakemake's output."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MICRO = Path(__file__).parent / "data" / "micro-config.yaml"


def micro_config(variants: dict | None = None, data: dict | None = None) -> dict:
    """tests/data/micro-config.yaml with its variants replaced by ``variants`` and its ``data`` section by
    ``data`` (each kept where None)."""
    cfg = yaml.safe_load(MICRO.read_text())
    for key, value in (("variants", variants), ("data", data)):
        if value is not None:
            cfg[key] = copy.deepcopy(value)
    return cfg


def copy_workflow(workdir: Path, cfg: dict, profiles: bool = False) -> Path:
    """Snakefile, workflow/ and src/ (and profiles/) copied into ``workdir``, with ``cfg`` as config.yaml."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "Snakefile", workdir / "Snakefile")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "workflow", workdir / "workflow", ignore=ignore)
    shutil.copytree(ROOT / "src", workdir / "src", ignore=ignore)
    if profiles:
        shutil.copytree(ROOT / "profiles", workdir / "profiles")
    write_config(workdir / "config.yaml", cfg)
    return workdir


def write_config(path: Path, cfg: dict) -> None:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))


def workflow_env(workdir: Path, path_first: Path | None = None) -> dict[str, str]:
    """The environment of a Snakemake run in ``workdir``: this venv first on PATH (after ``path_first``), the
    copied package first on PYTHONPATH (Slurm jobs inherit both: sbatch --export=ALL)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(workdir / "src")
    env.pop("PYTHONSAFEPATH", None)
    return env


def snakemake(workdir: Path, *args: str, timeout: int = 300, path_first: Path | None = None,
              **env_vars: str) -> subprocess.CompletedProcess:
    """``python -m snakemake ARGS`` in ``workdir`` (with ``env_vars`` set, ``path_first`` first on PATH);
    stdout and stderr together in ``.stdout``."""
    env = {**workflow_env(workdir, path_first), **env_vars}
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=workdir, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


def job_blocks(output: str, rule: str) -> list[dict[str, str]]:
    """The ``key: value`` lines of each job of ``rule`` that Snakemake printed (``rule train:`` and the
    indented lines after it), plus ``shell`` when the command was printed (-p)."""
    blocks, current = [], None
    for line in output.splitlines():
        if re.match(rf"^(local)?rule {rule}:$", line):
            current = {}
            blocks.append(current)
        elif current is not None and line.startswith("    ") and ": " in line:
            key, value = line.strip().split(": ", 1)
            current[key] = value
        elif current is not None and line.startswith("Shell command: "):
            current["shell"] = line[len("Shell command: "):]
            current = None
        elif current is not None and not line.startswith("    "):
            current = None
    return blocks


def resources(block: dict[str, str]) -> dict[str, str]:
    """The ``resources:`` of a job block as {name: value}."""
    return dict(item.split("=", 1) for item in block["resources"].split(", "))


def wildcards(block: dict[str, str]) -> tuple[str, int]:
    """(variant, seed) of a train job block."""
    values = dict(item.split("=", 1) for item in block["wildcards"].split(", "))
    return values["variant"], int(values["seed"])


def write_dataset(root: Path, documents: int = 600, shard_tokens: int = 16384, seed: int = 0) -> tuple[Path, Path]:
    """Synthetic shards, manifests and BOS indices in the layout of the tokenize and bos_index stages
    (docs/formats.md): ``documents`` learnable counting documents (tests/synthetic_data.py)."""
    from synthetic_data import counting_documents, write_dataset as write

    return write(root, counting_documents(documents, seed), shard_tokens)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
