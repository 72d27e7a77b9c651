"""benchmarks/parity.sh's data, prepared without a GPU: both sides read the same files, and our three parity configs
are fed by them (the workflow's planning-time check through ``gpu_speedrun.py --check-data``).

Two device calls of 2026-12-03 were lost to this data: our side read 4 copies of the train shard (79 of the 120 steps
fed: both loaders cut documents at the stage's max_seq_len) and the unpadded validation shard (1,048,576 tokens, one
fewer than val_tokens + 1). These tests run the same part of parity.sh on the real debian-docs shards of
../shared (skipped where it is absent).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from speedrun.data.dataset import read_manifest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DD = SHARED / "corpora" / "debian-docs"
TOOLS = SHARED / "reference-code" / "tools"
CONFIGS = ("parity-record87", "parity-record88", "parity-record89")

pytestmark = pytest.mark.skipif(not (DD / "debiandocs_train_000001.bin").exists() or
                                not (TOOLS / "lay_out_data.py").exists(),
                                reason="needs ../shared/corpora/debian-docs and ../shared/reference-code/tools")


def _prepare(tmp_path: Path, copies: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PARITY_ROOT=str(tmp_path / "parity"), PARITY_DD=str(DD), PARITY_TOOLS=str(TOOLS),
               COPIES=str(copies), OUT=str(tmp_path / "out"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", "benchmarks/parity.sh", "prepare-data"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_prepared_data_feeds_every_parity_config_from_the_records_own_files(tmp_path):
    result = _prepare(tmp_path, copies=12)
    assert result.returncode == 0, result.stderr[-2000:]
    for config in CONFIGS:
        assert f"benchmarks/configs/{config}.yaml: {tmp_path / 'parity' / 'ours-data'} feeds its 120 steps and " \
               f"1048576 validation tokens" in result.stdout
    shards = read_manifest(tmp_path / "parity" / "ours-data" / "shards", "shards", ("file", "tokens"),
                           stage="tokenize")["shards"]
    records = tmp_path / "parity" / "data" / "data" / "fineweb10B"
    # our validation shard is the records' padded file: 1,048,576 scored tokens + 1,200,000 of padding
    assert shards[0]["tokens"] == 1_048_576 + 1_200_000
    assert (records / "fineweb_val_000000.bin").stat().st_size == 1024 + 2 * shards[0]["tokens"]
    assert [s["tokens"] for s in shards[1:]] == [13_997_572] * 12


def test_four_copies_are_refused_before_any_gpu_work(tmp_path):
    result = _prepare(tmp_path, copies=4)
    assert result.returncode != 0
    assert ("benchmarks/configs/parity-record87.yaml: 120 steps of 131072-393216 tokens (documents cut at max_seq_len "
            "896-2048) need more data than the 4 train shards") in result.stderr
    assert "they feed only 79 steps" in result.stderr
    # 5,029 documents a copy; 8 copies feed the 120 steps (7: 118), so about 6.8 copies is the estimate
    assert "the train shards hold 20116 document start(s) (BOS) and feed 79 steps" in result.stderr
    assert "so 120 steps need about 34107 documents" in result.stderr
