"""The multi-node launch path without a cluster: two torchrun agents, as speedrun.workflow.launcher starts
them on two nodes (`agent`, c10d rendezvous), here both on 127.0.0.1 with one CPU process each (gloo). Their run
must be the single-process run with two accumulation steps: same tokens per step, same losses to 1e-5."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_support import free_port, write_dataset

SRC = Path(__file__).resolve().parents[1] / "src"
PROGRAM = Path(__file__).resolve().parent / "cluster_train_losses.py"
SETTINGS = {"preset": "tiny", "model": {"n_layer": 2, "model_dim": 32, "n_head": 2, "head_dim": 16},
            "steps": 5, "tokens_per_step": 512, "micro_batches": 2, "max_seq_len": 128, "val_tokens": 512,
            "val_batch_tokens": 256, "val_every": 2, "momentum_warmup_steps": 3, "embed_lr": 0.3,
            "head_lr": 0.02, "device": "cpu"}

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SRC))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _program(world_size: int, shards: Path, bos: Path, log: Path, losses: Path) -> list[str]:
    settings = json.dumps({**SETTINGS, "world_size": world_size})
    return [sys.executable, str(PROGRAM), settings, str(shards), str(bos), str(log), str(losses)]


def test_two_agents_with_c10d_rendezvous_train_like_one_process_with_accumulation(tmp_path):
    shards, bos = write_dataset(tmp_path / "data")
    one = subprocess.run(_program(1, shards, bos, tmp_path / "one.txt", tmp_path / "one-{rank}.json"),
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]

    endpoint = f"127.0.0.1:{free_port()}"
    program = _program(2, shards, bos, tmp_path / "two.txt", tmp_path / "two-{rank}.json")
    agents = [subprocess.Popen([sys.executable, "-m", "speedrun.workflow.launcher", "agent", "--world-size", "2",
                                "--nodes", "2", "--endpoint", endpoint, "--rdzv-id", "test-run", "--", *program],
                               env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for _ in range(2)]
    outputs = [a.communicate(timeout=300)[0] for a in agents]
    for agent, output in zip(agents, outputs):
        assert agent.returncode == 0, output[-3000:]
    assert all("--nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d" in out for out in outputs)

    reference = json.loads((tmp_path / "one-0.json").read_text())
    ranks = [json.loads((tmp_path / f"two-{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]                                 # both nodes saw the same averaged losses
    assert [(s, k) for s, k, _ in reference] == [(s, k) for s, k, _ in ranks[0]]
    assert len(reference) == 5 + 4                              # 5 train losses, val at steps 0, 2, 4, 5
    for (_, _, a), (_, _, b) in zip(reference, ranks[0]):
        assert a == pytest.approx(b, abs=1e-5)
    header = (tmp_path / "two.txt").read_text()
    assert "world_size: 2" in header and "tokens_per_step: 512" in header
