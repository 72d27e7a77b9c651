"""The `fineweb`, `fineweb-gpt2` and `files` data sources end to end: `snakemake` in a subprocess downloads from a
loopback Hub (tests/hub_server.py, HF_ENDPOINT in its environment), tokenizes or takes the shards, and indexes them.

Shards are compared byte for byte with an independent reference: the public speedrun's rule (every document
`[50256] + encode_ordinary(text)`, concatenated in dataset order, cut every `shard_tokens` tokens, the header
written by tests/hub_server.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from cluster_support import copy_workflow, micro_config
from hub_server import HubServer, fineweb_parquet_bytes, random_documents_shard, shard_bytes

from speedrun.data.tokenizer import gpt2_encoding

RAW, GPT2 = "HuggingFaceFW/fineweb", "kjj0/fineweb10B-gpt2"
SHARD_TOKENS = 4096

pytestmark = pytest.mark.slow


def web_texts(count: int, seed: int) -> list[str]:
    """Short web-page-like documents: mixed scripts, markup, a literal <|endoftext|>, one long page."""
    rng = np.random.default_rng(seed)
    words = ["The", " city", " council", " voted", " on", " Tuesday", ",", " 2013", ".", "\n\n", " café",
             " naïve", " 東京", " 🙂", " <b>", "</b>", " http://example.com", " don't", "  ", "\t", " <|endoftext|>"]
    texts = ["".join(rng.choice(words, size=rng.integers(5, 300))) for _ in range(count)]
    texts[count // 2] = " ".join(["A long page about the weather in Lisbon."] * 400)  # > one shard
    return texts


RAW_TEXTS = [web_texts(40, seed) for seed in range(3)]


def reference_shards(texts: list[str], dataset: str) -> dict[str, bytes]:
    """The public speedrun's shards of `texts` (speedrun-spec.md section 1.2), built without speedrun.tokenize."""
    encoding = gpt2_encoding()
    stream = [t for text in texts for t in [50256, *encoding.encode_ordinary(text)]]
    cuts = range(0, len(stream), SHARD_TOKENS)
    return {f"{dataset}_{'val' if i == 0 else 'train'}_{i:06d}.bin": shard_bytes(stream[start:start + SHARD_TOKENS])
            for i, start in enumerate(cuts)}



GPT2_FILES = {"fineweb_val_000000.bin": random_documents_shard(0, 6000),
              **{f"fineweb_train_{i:06d}.bin": random_documents_shard(i, 9000) for i in (1, 2, 3)}}


@pytest.fixture(scope="module")
def hub():
    with HubServer() as server:
        server.add_dataset(RAW, {f"sample/10BT/{i:03d}_00000.parquet": fineweb_parquet_bytes(texts, first_id=40 * i)
                                 for i, texts in enumerate(RAW_TEXTS)})
        server.add_dataset(GPT2, GPT2_FILES)
        yield server


def make_workflow(tmp_path: Path, data: dict) -> Path:
    return copy_workflow(tmp_path / "workflow", micro_config(data=data))


def snakemake(workdir: Path, hub: HubServer, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=str(workdir / "src"), HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1",
               HF_HOME=str(workdir / "hf-home"))
    env.pop("PYTHONSAFEPATH", None)
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args]
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        logs = "\n".join(f"--- {p}\n{p.read_text()[-2000:]}" for p in sorted((workdir / "logs").rglob("*.log")))
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n{logs}")
    return proc


def check_bos_index(workdir: Path, dataset: str, names: list[str]) -> None:
    manifest = json.loads((workdir / f"results/bos_index/{dataset}/manifest.json").read_text())
    assert [e["shard"] for e in manifest["shards"]] == names
    for name in names:
        tokens = np.frombuffer((workdir / f"results/shards/{dataset}/{name}").read_bytes()[1024:], dtype="<u2")
        index = np.load(workdir / f"results/bos_index/{dataset}/{name.replace('.bin', '.npy')}")
        assert index.tolist() == [p for p, t in enumerate(tokens.tolist()) if t == 50256]


def test_fineweb_source(hub: HubServer, tmp_path: Path) -> None:
    data = {"source": "fineweb", "name": "fw", "shuffle_seed": 0, "shard_tokens": SHARD_TOKENS,
            "fineweb": {"repo": RAW, "config": "sample-10BT", "revision": "main", "parquet_files": 2}}
    workdir = make_workflow(tmp_path, data)
    snakemake(workdir, hub, "results/bos_index/fw")

    served = hub.repo(RAW).files
    downloads = workdir / "results/download/HuggingFaceFW--fineweb/main/sample/10BT"
    assert sorted(p.name for p in downloads.iterdir()) == ["000_00000.parquet", "001_00000.parquet"]
    for path in downloads.iterdir():
        assert path.read_bytes() == served[f"sample/10BT/{path.name}"]
    assert not hub.gets("sample/10BT/002_00000.parquet")

    expected = reference_shards(RAW_TEXTS[0] + RAW_TEXTS[1], "fw")
    shards = workdir / "results/shards/fw"
    assert len(expected) >= 4
    assert {p.name: p.read_bytes() for p in shards.glob("*.bin")} == expected
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["documents"] == 80
    assert [s["sha256"] for s in manifest["shards"]] == [hashlib.sha256(b).hexdigest() for b in expected.values()]
    assert not list((workdir / "results").rglob("tokens/fw/*.bin"))  # token streams are temporary
    check_bos_index(workdir, "fw", list(expected))

    requests = len(hub.requests)
    again = snakemake(workdir, hub, "results/bos_index/fw")
    assert "Nothing to be done" in again.stdout + again.stderr
    plan = snakemake(workdir, hub, "-n", "report")
    assert "rule train:" in plan.stdout and "download_parquet" not in plan.stdout
    assert len(hub.requests) == requests  # nothing fetched again, planning never touches the network


def test_fineweb_gpt2_source(hub: HubServer, tmp_path: Path) -> None:
    data = {"source": "fineweb-gpt2", "name": "fineweb", "shuffle_seed": 0, "shard_tokens": SHARD_TOKENS,
            "fineweb_gpt2": {"repo": GPT2, "revision": "main", "train_shards": 2}}
    workdir = make_workflow(tmp_path, data)
    hub.fail("fineweb_train_000002.bin", "status", status=500)  # retried inside the job
    snakemake(workdir, hub, "results/bos_index/fineweb")

    names = ["fineweb_val_000000.bin", "fineweb_train_000001.bin", "fineweb_train_000002.bin"]
    shards = workdir / "results/shards/fineweb"
    assert {p.name: p.read_bytes() for p in shards.glob("*.bin")} == {n: GPT2_FILES[n] for n in names}
    assert not hub.gets("fineweb_train_000003.bin")
    assert len(hub.gets("fineweb_train_000002.bin")) == 2
    manifest = json.loads((shards / "manifest.json").read_text())
    assert [(s["file"], s["split"], s["tokens"]) for s in manifest["shards"]] == [
        (names[0], "val", 6000), (names[1], "train", 9000), (names[2], "train", 9000)]
    assert manifest["documents"] == sum(np.count_nonzero(np.frombuffer(GPT2_FILES[n][1024:], "<u2") == 50256)
                                        for n in names)
    check_bos_index(workdir, "fineweb", names)
    assert "rule train:" in snakemake(workdir, hub, "-n", "report").stdout

    # Another revision of the same repository downloads to its own paths: its failure ("revision not found")
    # leaves the files of revision main as they were (they shared one path, and Snakemake deleted them).
    downloads = workdir / "results/download/kjj0--fineweb10B-gpt2"
    cfg = yaml.safe_load((workdir / "config.yaml").read_text())
    cfg["data"]["fineweb_gpt2"]["revision"] = "v99"
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    failed = snakemake(workdir, hub, "results/bos_index/fineweb", check=False)
    assert failed.returncode != 0
    logs = list((workdir / "logs/download/kjj0--fineweb10B-gpt2/v99").glob("*.bin.log"))
    assert logs and all("revision not found" in log.read_text() for log in logs)
    failed_outputs = re.findall(r"Error in rule download_shard:.*?output: (\S+)", failed.stdout + failed.stderr,
                                re.S)
    assert failed_outputs and len(failed_outputs) == len(set(failed_outputs))   # a final error: not run again
    assert {p.name: p.read_bytes() for p in (downloads / "main").iterdir()} == {n: GPT2_FILES[n] for n in names}
    assert not list((downloads / "v99").glob("*.bin"))
    cfg["data"]["fineweb_gpt2"]["revision"] = "main"
    cfg["train"]["val_tokens"] = 8192
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    refused = snakemake(workdir, hub, "-n", "report", check=False)
    assert refused.returncode != 0 and "validation shard" in refused.stdout + refused.stderr


def test_bad_pretokenized_shard_is_refused(hub: HubServer, tmp_path: Path) -> None:
    hub.add_dataset("someone/bad-shards", {"fineweb_val_000000.bin": GPT2_FILES["fineweb_val_000000.bin"],
                                           "fineweb_train_000001.bin": shard_bytes([50256, 1, 2], magic=20240521)})
    data = {"source": "fineweb-gpt2", "name": "bad", "shuffle_seed": 0, "shard_tokens": SHARD_TOKENS,
            "fineweb_gpt2": {"repo": "someone/bad-shards", "revision": "main", "train_shards": 1}}
    workdir = make_workflow(tmp_path, data)
    proc = snakemake(workdir, hub, "results/bos_index/bad", check=False)
    assert proc.returncode != 0
    log = (workdir / "logs/tokenize/bad.log").read_text()
    assert "fineweb_train_000001.bin: not a token shard: header magic 20240521" in log
    assert not (workdir / "results/shards/bad").exists()


def test_files_source(hub: HubServer, tmp_path: Path) -> None:
    """The user's own files: JSON Lines with a named field, then plain text, in pattern order."""
    jsonl = {name: web_texts(15, seed) for seed, name in ((7, "b.jsonl"), (8, "a.jsonl"))}
    page = "A page of plain text.\n" * 300
    data = {"source": "files", "name": "mine", "shuffle_seed": 0, "shard_tokens": SHARD_TOKENS,
            "files": {"paths": ["corpus/*.jsonl", "corpus/**/*.txt"], "text_column": "body"}}
    workdir = make_workflow(tmp_path, data)
    (workdir / "corpus/extra").mkdir(parents=True)
    for name, texts in jsonl.items():
        (workdir / "corpus" / name).write_text("".join(json.dumps({"body": t}) + "\n" for t in texts))
    (workdir / "corpus/extra/page.txt").write_text(page)
    snakemake(workdir, hub, "results/bos_index/mine")
    expected = reference_shards(jsonl["a.jsonl"] + jsonl["b.jsonl"] + [page], "mine")
    assert {p.name: p.read_bytes() for p in (workdir / "results/shards/mine").glob("*.bin")} == expected
    check_bos_index(workdir, "mine", list(expected))
