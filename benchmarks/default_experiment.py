"""Time the default experiment end to end, and the no-op rerun after it.

Copies the workflow (Snakefile, workflow/, config.yaml) into a fresh folder so that nothing cached in the
checkout's results/ is reused, runs `snakemake --cores all report` there, then runs it again (it must do
nothing) and `snakemake -n`. Prints one line per measurement, ready for docs/benchmarks.md.

    python benchmarks/default_experiment.py [--configfile CONFIG] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(cmd: list[str], cwd: Path) -> tuple[float, str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout + proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", default=str(ROOT / "config.yaml"))
    parser.add_argument("--keep", help="run in this folder and keep it (default: a temporary folder)")
    args = parser.parse_args()
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="speedrun-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "Snakefile", workdir / "Snakefile")
    shutil.copytree(ROOT / "workflow", workdir / "workflow", dirs_exist_ok=True)
    shutil.copy(args.configfile, workdir / "config.yaml")
    snakemake = [sys.executable, "-m", "snakemake", "--cores", "all"]

    full, _ = run(snakemake + ["report"], workdir)
    again, out = run(snakemake + ["report"], workdir)
    assert "Nothing to be done" in out, out[-2000:]
    dry, _ = run(snakemake + ["-n", "report"], workdir)
    cores = os.cpu_count()
    print(f"machine: {platform.processor() or platform.machine()}, {cores} cores, Python {platform.python_version()}")
    print(f"config: {args.configfile}")
    print(f"full run (snakemake --cores all report): {full:.1f} s")
    print(f"no-op rerun (snakemake --cores all report): {again:.2f} s")
    print(f"dry run (snakemake -n report): {dry:.2f} s")
    print((workdir / "results/report/summary.md").read_text())
    if not args.keep:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
