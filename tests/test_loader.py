"""BOS-aligned training batches and validation chunks against hand-computed cases and a naive,
line-by-line implementation of speedrun-spec.md section 1.3."""

from __future__ import annotations

import numpy as np
import pytest

from speedrun.data.loader import (
    BosAlignedBatches,
    MicroBatch,
    steps_available,
    padded_cu_seqlens,
    to_torch,
    validation_batches,
)
from speedrun.errors import SpeedrunError

BOS = 50256


def naive_bos(tokens) -> np.ndarray:
    return np.array([p for p, t in enumerate(tokens) if t == BOS], dtype=np.int64)


def naive_micro_batches(shards, schedule):
    """Buffers of T+1 tokens, one per (T, max_seq_len) in ``schedule``, by the spec's per-BOS loop.

    Stops early when the shards run out.
    """
    bos = [list(naive_bos(s)) for s in shards]
    out, shard, cursor = [], 0, 0
    for tokens, max_seq_len in schedule:
        while True:
            if shard >= len(shards):
                return out
            buf, i = [], cursor
            while len(buf) < tokens + 1 and i < len(bos[shard]):
                cur = bos[shard][i]
                nxt = bos[shard][i + 1] if i + 1 < len(bos[shard]) else len(shards[shard])
                end = min(nxt, cur + max_seq_len, cur + tokens + 1 - len(buf))
                buf += [int(t) for t in shards[shard][cur:end]]
                i += 1
            if len(buf) == tokens + 1:
                cursor = i
                out.append(buf)
                break
            shard, cursor = shard + 1, 0
    return out


def random_shards(seed: int, n_docs: int, max_doc: int, n_shards: int) -> list[np.ndarray]:
    """Documents [BOS, ids...] of random lengths, concatenated and cut at random points (documents
    continue across shard boundaries, as `speedrun tokenize` writes them)."""
    rng = np.random.default_rng(seed)
    docs = [np.concatenate(([BOS], rng.integers(0, BOS, size=rng.integers(0, max_doc))))
            for _ in range(n_docs)]
    stream = np.concatenate(docs).astype(np.uint16)
    cuts = np.sort(rng.choice(np.arange(1, len(stream)), size=n_shards - 1, replace=False))
    return np.split(stream, cuts)


def draw_all(batches: BosAlignedBatches, micro_batches: int, rank: int = 0, world_size: int = 1):
    steps = []
    while True:
        try:
            steps.append(batches.next_step(micro_batches, rank, world_size))
        except SpeedrunError:
            return steps


def test_hand_built_documents():
    # documents of 10, 5, 21 and 3 tokens; T = 8, max_seq_len = 6
    docs = [[BOS] + [1] * 9, [BOS] + [2] * 4, [BOS] + [3] * 20, [BOS] + [4] * 2]
    shard = np.array(sum(docs, []), dtype=np.uint16)
    batches = BosAlignedBatches([shard], [naive_bos(shard)], micro_batch_tokens=8, max_seq_len=6)
    first, second = batches.next_step(2, 0, 1)
    # doc 1 cut to 6 tokens, then 3 tokens of doc 2 fill T+1 = 9
    assert first.inputs.tolist() == [BOS, 1, 1, 1, 1, 1, BOS, 2]
    assert first.targets.tolist() == [1, 1, 1, 1, 1, BOS, 2, 2]
    assert first.cu_seqlens.tolist() == [0, 6, 8]
    # the rest of doc 2 is dropped; doc 3 cut to 6, doc 4 (3 tokens) ends the buffer exactly
    assert second.inputs.tolist() == [BOS, 3, 3, 3, 3, 3, BOS, 4]
    assert second.targets.tolist() == [3, 3, 3, 3, 3, BOS, 4, 4]
    assert second.cu_seqlens.tolist() == [0, 6, 8]
    assert first.inputs.dtype == np.int32 and first.targets.dtype == np.int64
    assert first.cu_seqlens.dtype == np.int32
    with pytest.raises(SpeedrunError, match="ran out of training data at step 2"):
        batches.next_step(1, 0, 1)


def test_last_token_bos_is_a_target_only():
    # T = 4: doc 1 has 4 tokens, so the 5th buffer token is doc 2's BOS, seen only as a target
    shard = np.array([BOS, 7, 7, 7, BOS, 8, 8], dtype=np.uint16)
    (mb,) = BosAlignedBatches([shard], [naive_bos(shard)], 4, 100).next_step(1, 0, 1)
    assert mb.inputs.tolist() == [BOS, 7, 7, 7]
    assert mb.targets.tolist() == [7, 7, 7, BOS]
    assert mb.cu_seqlens.tolist() == [0, 4]


def test_next_shard_skips_tail_and_head():
    # shard 0 has 6 tokens after its only BOS (not enough for T+1 = 8); shard 1 starts mid-document
    shard0 = np.array([5, BOS, 1, 1, 1, 1, 1], dtype=np.uint16)
    shard1 = np.array([9, 9, BOS, 2, 2, 2, 2, 2, 2, 2, 2], dtype=np.uint16)
    batches = BosAlignedBatches([shard0, shard1], [naive_bos(shard0), naive_bos(shard1)], 7, 64)
    (mb,) = batches.next_step(1, 0, 1)
    assert mb.inputs.tolist() == [BOS, 2, 2, 2, 2, 2, 2]
    assert mb.targets.tolist() == [2, 2, 2, 2, 2, 2, 2]


@pytest.mark.parametrize("seed", range(6))
def test_matches_naive_loop(seed):
    shards = random_shards(seed, n_docs=300, max_doc=60, n_shards=3)
    tokens, max_seq_len = [(16, 8), (32, 24), (64, 1024), (5, 3), (40, 13), (1, 1)][seed]
    batches = BosAlignedBatches(shards, [naive_bos(s) for s in shards], tokens, max_seq_len)
    drawn = [mb for step in draw_all(batches, 1) for mb in step]
    expected = naive_micro_batches(shards, [(tokens, max_seq_len)] * 10**6)
    assert len(drawn) == len(expected) > 10
    for mb, buf in zip(drawn, expected):
        assert mb.inputs.tolist() == buf[:-1] and mb.targets.tolist() == buf[1:]
        assert mb.inputs[0] == BOS
        assert mb.cu_seqlens.tolist() == naive_bos(mb.inputs).tolist() + [tokens]
        assert np.diff(mb.cu_seqlens).max() <= max_seq_len


def test_set_batch_between_steps():
    shards = random_shards(11, n_docs=400, max_doc=50, n_shards=2)
    schedule = [(16, 8)] * 3 + [(48, 32)] * 5 + [(24, 16)] * 4
    batches = BosAlignedBatches(shards, [naive_bos(s) for s in shards], 16, 8)
    drawn = []
    for tokens, max_seq_len in schedule:
        batches.set_batch(tokens, max_seq_len)
        drawn += batches.next_step(1, 0, 1)
    expected = naive_micro_batches(shards, schedule)
    assert len(expected) == len(schedule)
    assert [mb.inputs.tolist() + [int(mb.targets[-1])] for mb in drawn] == expected
    assert batches.micro_batch_tokens == 24 and batches.max_seq_len == 16


@pytest.mark.parametrize("world_size", [2, 4])
def test_world_size_equivalence(world_size):
    shards = random_shards(3, n_docs=500, max_doc=70, n_shards=3)
    bos = [naive_bos(s) for s in shards]
    reference = draw_all(BosAlignedBatches(shards, bos, 32, 20), 4)
    per_rank = [draw_all(BosAlignedBatches(shards, bos, 32, 20), 4, r, world_size)
                for r in range(world_size)]
    assert len(reference) > 20
    for step, whole in enumerate(reference):
        merged = [per_rank[m % world_size][step][m // world_size] for m in range(4)]
        for a, b in zip(whole, merged):
            assert np.array_equal(a.inputs, b.inputs) and np.array_equal(a.targets, b.targets)
            assert np.array_equal(a.cu_seqlens, b.cu_seqlens)
    assert all(len(r) == len(reference) for r in per_rank)


@pytest.mark.parametrize("tokens,max_seq_len,micro_batches", [(16, 8, 1), (32, 32, 3), (20, 7, 4)])
def test_steps_available_agrees_with_drawing(tokens, max_seq_len, micro_batches):
    shards = random_shards(5, n_docs=400, max_doc=60, n_shards=4)
    bos = [naive_bos(s) for s in shards]
    drawn = len(draw_all(BosAlignedBatches(shards, bos, tokens, max_seq_len), micro_batches))
    lengths = [len(s) for s in shards]
    assert drawn > 5
    assert steps_available(lengths, bos, tokens, max_seq_len, micro_batches, 10**6) == drawn
    assert steps_available(lengths, bos, tokens, max_seq_len, micro_batches, drawn - 2) == drawn - 2
    assert steps_available(lengths, bos, tokens, max_seq_len, micro_batches, 0) == 0


def test_bad_arguments():
    shard = np.array([BOS, 1, 2, 3], dtype=np.uint16)
    batches = BosAlignedBatches([shard], [naive_bos(shard)], 2, 8)
    with pytest.raises(SpeedrunError, match="not a multiple of world_size 2"):
        batches.next_step(3, 0, 2)
    with pytest.raises(SpeedrunError, match="rank 2"):
        batches.next_step(2, 2, 2)
    with pytest.raises(SpeedrunError, match="max_seq_len"):
        batches.set_batch(2, 0)
    with pytest.raises(SpeedrunError, match="increasing positions"):
        BosAlignedBatches([shard], [np.array([0, 7])], 2, 8)
    with pytest.raises(SpeedrunError, match="no train shards"):
        BosAlignedBatches([], [], 2, 8)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_validation_chunks_cover_val_tokens(world_size):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, BOS + 1, size=1000).astype(np.uint16)
    tokens[[0, 3, 63, 64, 65, 200, 511, 512]] = BOS
    bos = naive_bos(tokens)
    val_tokens, batch = 512, 64
    chunks = {}
    for rank in range(world_size):
        mine = validation_batches(tokens, bos, val_tokens, batch, rank, world_size)
        assert len(mine) == val_tokens // batch // world_size
        for j, mb in enumerate(mine):
            chunks[j * world_size + rank] = mb
    assert sorted(chunks) == list(range(8))
    inputs = np.concatenate([chunks[c].inputs for c in range(8)])
    targets = np.concatenate([chunks[c].targets for c in range(8)])
    assert inputs.tolist() == tokens[:512].tolist()
    assert targets.tolist() == tokens[1:513].tolist()
    # chunk 1 spans 64..127: BOS at 64 (its start, not repeated) and 65
    assert chunks[1].cu_seqlens.tolist() == [0, 1, 64]
    assert chunks[0].cu_seqlens.tolist() == [0, 3, 63, 64]
    assert chunks[7].cu_seqlens.tolist() == [0, 63, 64]
    for c, mb in chunks.items():
        inside = [p - c * batch for p in bos if c * batch < p < (c + 1) * batch]
        assert mb.cu_seqlens.tolist() == [0] + inside + [batch]


def test_validation_errors():
    tokens = np.full(100, 7, dtype=np.uint16)
    with pytest.raises(SpeedrunError, match="not a multiple of val_batch_tokens x world_size"):
        validation_batches(tokens, np.array([], dtype=np.int64), 64, 16, 0, 3)
    with pytest.raises(SpeedrunError, match="holds 100 tokens"):
        validation_batches(tokens, np.array([], dtype=np.int64), 128, 16, 0, 2)
    assert len(validation_batches(tokens, np.array([], dtype=np.int64), 96, 16, 1, 2)) == 3
    with pytest.raises(SpeedrunError, match="holds 100 tokens"):
        validation_batches(tokens, np.array([], dtype=np.int64), 100, 10, 0, 1)


def test_to_torch():
    torch = pytest.importorskip("torch")
    mb = MicroBatch(inputs=np.array([BOS, 5, 6], dtype=np.int32),
                    targets=np.array([5, 6, BOS], dtype=np.int64),
                    cu_seqlens=np.array([0, 3], dtype=np.int32))
    inputs, targets, cu_seqlens = to_torch(mb, "cpu", doc_slot_multiple=4)
    assert inputs.dtype == torch.int32 and targets.dtype == torch.int64
    assert cu_seqlens.dtype == torch.int32
    assert inputs.tolist() == [BOS, 5, 6] and targets.tolist() == [5, 6, BOS]
    assert cu_seqlens.tolist() == [0, 3, 3, 3]
    assert to_torch(mb, "cpu", doc_slot_multiple=1)[2].tolist() == [0, 3]


def test_padded_cu_seqlens_fills_whole_multiples_with_the_token_count():
    cu = np.array([0, 5, 9, 12], dtype=np.int32)
    assert padded_cu_seqlens(cu, 3).tolist() == [0, 5, 9, 12, 12, 12]
    assert padded_cu_seqlens(cu, 4).tolist() == [0, 5, 9, 12]
    assert len(padded_cu_seqlens(cu)) == 128
    with pytest.raises(ValueError, match="multiple"):
        padded_cu_seqlens(cu, 0)
