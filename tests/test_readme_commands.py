"""Every `snakemake` command of README.md's bash blocks, planned as written with `-n` (issue 21, item 4).

The README's YAML blocks that start with a comment `# <name>.yaml` are files the commands name: the test writes
them beside the copied workflow. A placeholder config name (`...`) stands for the one real config the README
runs (`configs/fineweb-8xh100.yaml`). Each command is split as the shell would, its `snakemake` part taken from a
`&&` chain, `--cores all` and `-n` kept, and planned in a copy of the checkout, so nothing lands in this one.
A config that reads its inputs from a modded-nanogpt clone (`clone: ~/modded-nanogpt`,
configs/recursive-from-best.yaml) finds one under a home folder of the test's (HOME): the record logs it names,
made in the records' layout from a script of ours, and a folder of shards (`fake_clone`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hub_server import random_documents_shard

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PLACEHOLDER_CONFIG = "configs/fineweb-8xh100.yaml"

pytestmark = pytest.mark.slow


def fenced_blocks(text: str, language: str) -> list[str]:
    """The bodies of the README's fenced code blocks of `language` (```bash ... ```)."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def snakemake_commands(text: str) -> list[list[str]]:
    """Each `snakemake` command of the bash blocks, as argument lists (comments dropped, `&&` chains split)."""
    commands = []
    for block in fenced_blocks(text, "bash"):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            chain, part = [], []
            for word in [*words, "&&"]:
                if word == "&&":
                    chain.append(part)
                    part = []
                else:
                    part.append(word)
            commands += [[PLACEHOLDER_CONFIG if w == "..." else w for w in cmd]
                         for cmd in chain if cmd and cmd[0] == "snakemake"]
    return [list(c) for c in dict.fromkeys(map(tuple, commands))]  # each distinct command once, in order


def named_yaml_files(text: str) -> dict[str, str]:
    """The YAML blocks that name their file in a first comment (`# two-nodes.yaml: ...`): name -> text."""
    files = {}
    for block in fenced_blocks(text, "yaml"):
        m = re.match(r"#\s*([\w.-]+\.ya?ml)\b", block)
        if m:
            files[m.group(1)] = block
    return files


def test_the_readme_has_the_commands_it_documents():
    commands = snakemake_commands(README.read_text())
    assert len(commands) >= 6
    assert ["snakemake", "-n"] in commands
    # --resources takes every following word: a target after it would be read as a resource
    for cmd in commands:
        if "--resources" in cmd:
            after = cmd[cmd.index("--resources") + 1:]
            assert all("=" in w for w in after[:next((i for i, w in enumerate(after) if w.startswith("-")),
                                                     len(after))]), cmd


def test_parsing_splits_chains_and_fills_placeholders():
    text = ("```bash\n./install.sh && . x && snakemake --cores all report   # note\n"
            "snakemake -c1 a --configfile ...\nsnakemake -c1 a --configfile ...\n```\n")
    assert snakemake_commands(text) == [["snakemake", "--cores", "all", "report"],
                                        ["snakemake", "-c1", "a", "--configfile", PLACEHOLDER_CONFIG]]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of what the commands read: Snakefile, config.yaml, configs/, profiles/, workflow/, src/."""
    work = tmp_path_factory.mktemp("readme")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("workflow", "src", "configs", "profiles"):
        shutil.copytree(ROOT / name, work / name, ignore=ignore)
    for name in ("Snakefile", "config.yaml"):
        shutil.copy2(ROOT / name, work / name)
    for name, body in named_yaml_files(README.read_text()).items():
        (work / name).write_text(body)
    fake_clone(work / "home", work / "configs")
    return work


def fake_clone(home: Path, configs: Path) -> None:
    """Under ``home``, each clone that a config of ``configs`` names (``clone: ~/<folder>``): the record logs
    of its script variants (a script of ours, tests/data/replicate_script.py, then a line of 100 `=` and a log
    line, as the records' logs are laid out) and data/fineweb10B with a validation and two train shards."""
    script = (Path(__file__).parent / "data" / "replicate_script.py").read_text()
    for path in sorted(configs.glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text()) or {}
        if not str(cfg.get("clone", "")).startswith("~/"):
            continue
        clone = home / cfg["clone"][2:]
        for variant in cfg.get("variants", {}).values():
            log = clone / ((variant or {}).get("script") or {}).get("log", "")
            if log != clone:
                log.parent.mkdir(parents=True, exist_ok=True)
                log.write_text(script + "\n" + "=" * 100 + "\nstep:0/1 val_loss:10.8 train_time:0ms step_avg:0.00ms\n")
        shards = clone / cfg["data"]["shards"]["path"]
        shards.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(("fineweb_val_000000.bin", "fineweb_train_000001.bin", "fineweb_train_000002.bin")):
            (shards / name).write_bytes(random_documents_shard(i, 4096))


def _dry_run(work: Path, cmd: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["HOME"] = str(work / "home")          # where a config's `clone: ~/...` is found (fake_clone)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(work / "src")
    env.pop("PYTHONSAFEPATH", None)
    args = [sys.executable, "-m", "snakemake", *cmd[1:], "-n"]
    return subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", snakemake_commands(README.read_text()), ids=shlex.join)
def test_readme_command_plans(checkout, command):
    if "--profile" in command and "slurm" in command[command.index("--profile") + 1]:
        pytest.importorskip("snakemake_executor_plugin_slurm")
    proc = _dry_run(checkout, command)
    out = proc.stdout + proc.stderr
    if "--report" in command:  # "(after a run)": the command parses and builds the DAG, then wants the outputs
        assert "marked for report but does not exist" in out, out[-2000:]
        return
    assert proc.returncode == 0, f"{shlex.join(command)} -n failed ({proc.returncode}):\n{out[-4000:]}"
    if "--unlock" in command:  # the recovery step: it plans nothing, it only removes a killed run's lock
        assert "Unlocked working directory" in out, out[-2000:]
        return
    assert "Job stats:" in out or "Nothing to be done" in out, out[-2000:]
