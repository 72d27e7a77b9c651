"""Synthetic token data for training tests: learnable documents, written as the data stages write them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from speedrun.data.shards import BOS_ID, sha256_file, shard_filename, write_shard


def counting_documents(count: int, seed: int = 0) -> list[np.ndarray]:
    """Documents that count up from a random start by a per-document stride (mod 97): learnable."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(count):
        length, start, stride = rng.integers(20, 200), rng.integers(0, 97), rng.integers(1, 4)
        docs.append((start + stride * np.arange(length)) % 97 + 1000)
    return docs


def write_dataset(root: Path, documents: list[np.ndarray], shard_tokens: int) -> tuple[Path, Path]:
    """Shards, manifests and BOS indices in the layout of the tokenize and bos_index stages (docs/formats.md);
    each document is prefixed with the BOS token 50256. Returns (shards folder, BOS index folder)."""
    stream = np.concatenate([np.concatenate(([BOS_ID], d)) for d in documents]).astype(np.uint16)
    shards_dir, bos_dir = root / "shards", root / "bos"
    shards_dir.mkdir(parents=True)
    bos_dir.mkdir(parents=True)
    entries, bos_entries = [], []
    for index, start in enumerate(range(0, len(stream), shard_tokens)):
        tokens = stream[start:start + shard_tokens]
        name = shard_filename("synth", index)
        write_shard(shards_dir / name, tokens)
        digest = sha256_file(shards_dir / name)
        entries.append({"file": name, "split": "val" if index == 0 else "train", "tokens": len(tokens),
                        "sha256": digest})
        positions = np.flatnonzero(tokens == BOS_ID).astype(np.int64)
        np.save(bos_dir / name.replace(".bin", ".npy"), positions)
        bos_entries.append({"file": name.replace(".bin", ".npy"), "shard": name, "shard_sha256": digest,
                            "count": len(positions)})
    (shards_dir / "manifest.json").write_text(json.dumps({"dataset": "synth", "shards": entries}))
    (bos_dir / "manifest.json").write_text(json.dumps({"dataset": "synth", "shards": bos_entries}))
    return shards_dir, bos_dir
