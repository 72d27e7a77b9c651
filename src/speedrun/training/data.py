"""The token data of one training run: the tokenize stage's shards and the bos_index stage's BOS indices,
checked against their manifests (docs/formats.md), and the check that they feed the whole run."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from speedrun.data.dataset import BOS_ENTRY_KEYS, SHARD_ENTRY_KEYS, check_splits, read_manifest
from speedrun.data.loader import TrainBatchesKind, steps_available
from speedrun.data.shards import load_shard, sha256_file, sha256_text
from speedrun.errors import SpeedrunError
from speedrun.training.config import TrainConfig


@dataclass(frozen=True)
class TrainingData:
    """The validation shard and the train shards (uint16 memory maps) with their BOS indices (int64);
    ``train_sha256``: sha256 of the train shards' manifest entries (file, tokens, sha256) as canonical JSON,
    which identifies the training token stream; ``val_sha256``: sha256 of the validation shard file."""

    val_tokens: np.ndarray
    val_bos: np.ndarray
    train_shards: list[np.ndarray]
    train_bos: list[np.ndarray]
    train_sha256: str = ""
    val_sha256: str = ""


def load_training_data(shards_dir: str | os.PathLike[str], bos_dir: str | os.PathLike[str]) -> TrainingData:
    """Shards listed in ``shards_dir/manifest.json`` (one ``val``, then the ``train`` ones in order,
    :func:`~speedrun.data.dataset.check_splits`; uint16 memory maps) and their BOS indices
    ``bos_dir/<stem>.npy`` (int64 positions). Raises :class:`SpeedrunError` on a missing or malformed manifest
    (:func:`~speedrun.data.dataset.read_manifest`), a missing file, a shard whose length differs from the
    manifest, a shard without a BOS index, a BOS index made from another version of a shard (its sha256
    differs) or one that does not hold the listed number of int64 positions."""
    shards_dir, bos_dir = Path(shards_dir), Path(bos_dir)
    entries = read_manifest(shards_dir, "shards", SHARD_ENTRY_KEYS, stage="tokenize")["shards"]
    bos_of = {e["shard"]: e for e in read_manifest(bos_dir, "shards", BOS_ENTRY_KEYS, stage="bos_index")["shards"]}
    check_splits(shards_dir, entries)
    arrays = []
    for entry in entries:
        tokens = load_shard(shards_dir / entry["file"])
        if len(tokens) != entry["tokens"]:
            raise SpeedrunError(f"{shards_dir / entry['file']}: {len(tokens)} tokens, its manifest says "
                                f"{entry['tokens']}: the shard changed since the tokenize stage wrote it; rerun it")
        arrays.append((tokens, _bos_index(shards_dir, bos_dir, entry, bos_of)))
    stream = [{"file": e["file"], "tokens": e["tokens"], "sha256": e["sha256"]} for e in entries[1:]]
    return TrainingData(val_tokens=arrays[0][0], val_bos=arrays[0][1],
                        train_shards=[a[0] for a in arrays[1:]], train_bos=[a[1] for a in arrays[1:]],
                        train_sha256=sha256_text(json.dumps(stream, sort_keys=True, separators=(",", ":"))),
                        val_sha256=sha256_file(shards_dir / entries[0]["file"]))


def _bos_index(shards_dir: Path, bos_dir: Path, entry: dict[str, Any],
               bos_of: dict[str, dict[str, Any]]) -> np.ndarray:
    """The BOS positions (int64) of the shard of manifest entry ``entry``, checked against ``bos_of`` (the
    BOS manifest's entries by shard file): present, made from this version of the shard, of the listed count."""
    shard, index = shards_dir / entry["file"], bos_of.get(entry["file"])
    if index is None:
        raise SpeedrunError(f"{shard}: no BOS index in {bos_dir}/manifest.json; run the bos_index stage on "
                            f"{shards_dir}")
    if index["shard_sha256"] != entry["sha256"]:
        raise SpeedrunError(f"{shard}: its BOS index in {bos_dir} is stale (made from a shard of sha256 "
                            f"{index['shard_sha256'][:12]}..., this one is {entry['sha256'][:12]}...); rerun "
                            f"the bos_index stage")
    positions = np.load(bos_dir / index["file"])
    if positions.dtype != np.int64 or positions.shape != (index["count"],):
        raise SpeedrunError(f"{bos_dir / index['file']}: expected {index['count']} int64 positions, found shape "
                            f"{positions.shape} of {positions.dtype}; rerun the bos_index stage")
    return positions


def cut_documents_hint(fed_steps: int, tokens_per_step: int, train_tokens: int, max_seq_len: int) -> str:
    """A sentence for a "the shards feed too few steps" error when the steps they feed read less than half
    of the ``train_tokens`` the shards hold (tokens per step x steps, about, under a batch schedule): the
    loader cuts documents at ``max_seq_len`` and drops their tails, which on a corpus of long documents
    (debian-docs: 64% of its tokens at 2,048) is where the data went. Empty otherwise."""
    used = fed_steps * tokens_per_step
    if used >= train_tokens / 2:
        return ""
    return (f" Those steps read about {used} of the {train_tokens} train tokens: documents longer than "
            f"max_seq_len {max_seq_len} lose their tails; a larger max_seq_len uses more of them.")


def steps_fed(steps: int, micro_batches: int, stages: Sequence[tuple[int, int, int]], lengths: Sequence[int],
              bos: Sequence[np.ndarray], train_batches: TrainBatchesKind = "bos_aligned") -> int:
    """How many of ``steps`` optimizer steps the train shards feed (at most ``steps``), the loader that
    ``train_batches`` names (BOS-aligned or contiguous, :attr:`TrainConfig.train_batches`) simulated exactly
    (:func:`speedrun.data.loader.steps_available`; no token is read). ``stages``: ``(first step, tokens per
    step, max_seq_len)`` per batch stage (:meth:`TrainConfig.batch_stages`); ``lengths``: the train shards'
    tokens; ``bos``: their BOS positions (int64)."""
    per_pass = [(first, tokens // micro_batches, seq_len) for first, tokens, seq_len in stages]
    return steps_available(list(lengths), list(bos), per_pass[0][1], per_pass[0][2], micro_batches, steps, per_pass,
                           kind=train_batches)


def check_data_feeds(config: TrainConfig, data: TrainingData) -> None:
    """Raise :class:`SpeedrunError` unless the train shards feed all ``steps`` and the validation shard
    holds ``val_tokens + 1`` tokens (:func:`steps_fed`; the same check the workflow makes at planning time,
    :func:`speedrun.workflow.planning.check_training_data`, before the data is loaded)."""
    fed = steps_fed(config.steps, config.micro_batches, config.batch_stages(), [len(s) for s in data.train_shards],
                    data.train_bos, config.train_batches)
    if fed < config.steps:
        hint = "" if config.train_batches == "contiguous" else cut_documents_hint(
            fed, config.tokens_per_step, sum(map(len, data.train_shards)), config.max_seq_len)
        raise SpeedrunError(f"the train shards feed {fed} steps of {config.tokens_per_step} tokens, fewer "
                            f"than train.steps = {config.steps}; add shards or lower steps.{hint}")
    if len(data.val_tokens) < config.evaluation.val_tokens + 1:
        raise SpeedrunError(f"the validation shard holds {len(data.val_tokens)} tokens, fewer than "
                            f"train.val_tokens + 1 = {config.evaluation.val_tokens + 1}")
