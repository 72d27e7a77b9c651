"""BOS-aligned training batches and validation chunks against hand-computed cases and a naive,
line-by-line implementation of speedrun-spec.md section 1.3; contiguous training batches (record #12's) against
hand-computed slices of the token stream and a per-rank walk of its DistributedDataLoader."""

from __future__ import annotations

import numpy as np
import pytest

from speedrun.data.loader import (
    BosAlignedBatches,
    ContiguousBatches,
    MicroBatch,
    train_batches,
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


# ---- contiguous batches (record #12, 2024-11-19 FlexAttention) ----------------------------------------------

def test_contiguous_batches_are_consecutive_slices_of_the_stream_and_skip_a_short_shard_tail():
    shard0 = np.arange(100, 123, dtype=np.uint16)              # 23 tokens
    shard1 = np.arange(200, 214, dtype=np.uint16)              # 14 tokens
    shard0[[0, 7, 12]] = BOS
    shard1[[3]] = BOS
    batches = ContiguousBatches([shard0, shard1], [naive_bos(shard0), naive_bos(shard1)], 5, 5)
    drawn = [mb for step in draw_all(batches, 2) for mb in step]
    # T = 5: micro-batch m of a shard reads [5m, 5m + 6); shard 0 (23 tokens) holds starts 0, 5, 10, 15 (20 + 6
    # > 23), shard 1 (14) starts 0, 5 (10 + 6 > 14): 6 micro-batches, 3 steps of 2
    starts = [(shard0, 0), (shard0, 5), (shard0, 10), (shard0, 15), (shard1, 0), (shard1, 5)]
    assert len(drawn) == 6
    for mb, (shard, start) in zip(drawn, starts):
        assert mb.inputs.tolist() == shard[start:start + 5].tolist() and mb.inputs.dtype == np.int32
        assert mb.targets.tolist() == shard[start + 1:start + 6].tolist() and mb.targets.dtype == np.int64
    # documents start at the BOS tokens inside a slice (shard 0's 7 and 12: [5, 10) holds 7 at 2, [10, 15) holds
    # 12 at 2; shard 1's 3 at 3 of [0, 5)); a BOS at a slice's first token starts no new piece (0 and 10)
    assert [mb.cu_seqlens.tolist() for mb in drawn] == [[0, 5], [0, 2, 5], [0, 2, 5], [0, 5], [0, 3, 5], [0, 5]]
    assert batches.steps_drawn == 3
    with pytest.raises(SpeedrunError, match="ran out of training data at step 4"):
        batches.next_step(2, 0, 1)


def _record12_reads(tokens, T: int, world_size: int, rank: int, reads: int) -> list[list[int]]:
    """Record #12's DistributedDataLoader (2024-11-19_FlexAttention train_gpt.py) walked for one rank within one
    shard: it starts at rank x T, each next_batch returns tokens[pos : pos + T + 1] and moves pos on by
    T x world_size."""
    pos, out = rank * T, []
    for _ in range(reads):
        assert pos + T * world_size < len(tokens)                 # within the shard: its advance never fires
        out.append(tokens[pos:pos + T + 1].tolist())
        pos += T * world_size
    return out


@pytest.mark.parametrize("accumulation", [1, 2])
def test_contiguous_batches_split_over_two_ranks_as_record12s_loader(accumulation):
    """Two ranks, each `accumulation` micro-batches per step (the record: 8 ranks, 1 each): rank r's a-th
    micro-batch of step s is the record's rank r's read s x accumulation + a; and a 1-rank run with all the
    micro-batches of a step sees the same ones, in the order m = a x 2 + r."""
    rng = np.random.default_rng(3)
    shard = rng.integers(0, 50257, size=2000).astype(np.uint16)
    shard[rng.choice(2000, size=40, replace=False)] = BOS
    bos, T, steps = naive_bos(shard), 16, 20
    micro_batches = 2 * accumulation
    for rank in (0, 1):
        batches = ContiguousBatches([shard], [bos], T, T)
        ours = [mb.inputs.tolist() + [int(mb.targets[-1])]
                for _ in range(steps) for mb in batches.next_step(micro_batches, rank, 2)]
        assert ours == _record12_reads(shard, T, 2, rank, steps * accumulation)
    whole = ContiguousBatches([shard], [bos], T, T)
    for step in range(steps):
        for m, mb in enumerate(whole.next_step(micro_batches, 0, 1)):
            start = (step * micro_batches + m) * T
            assert mb.inputs.tolist() == shard[start:start + T].tolist()


@pytest.mark.parametrize("tokens,micro_batches", [(16, 1), (32, 3), (20, 4)])
def test_steps_available_counts_contiguous_batches(tokens, micro_batches):
    shards = random_shards(5, n_docs=300, max_doc=60, n_shards=4)
    bos = [naive_bos(s) for s in shards]
    lengths = [len(s) for s in shards]
    drawn = len(draw_all(train_batches("contiguous", shards, bos, tokens, tokens), micro_batches))
    by_hand = sum((n - 1) // tokens for n in lengths) // micro_batches     # whole micro-batches of T + 1 tokens
    assert drawn == by_hand > 5
    kind = {"kind": "contiguous"}
    assert steps_available(lengths, bos, tokens, tokens, micro_batches, 10**6, **kind) == drawn
    assert steps_available(lengths, bos, tokens, tokens, micro_batches, drawn - 2, **kind) == drawn - 2
    # the BOS-aligned count of the same shards is another one (documents cut at max_seq_len 8 lose their tails)
    assert steps_available(lengths, bos, tokens, 8, micro_batches, 10**6) < drawn


def test_train_batches_builds_the_named_loader_and_refuses_another():
    shard = np.array([BOS, 1, 2, 3, BOS, 5, 6, 7, 8], dtype=np.uint16)
    assert isinstance(train_batches("bos_aligned", [shard], [naive_bos(shard)], 2, 8), BosAlignedBatches)
    assert isinstance(train_batches("contiguous", [shard], [naive_bos(shard)], 2, 8), ContiguousBatches)
    with pytest.raises(SpeedrunError, match="train_batches must be one of bos_aligned, contiguous, got 'shuffled'"):
        train_batches("shuffled", [shard], [naive_bos(shard)], 2, 8)
    with pytest.raises(SpeedrunError, match="train_batches must be one of"):
        steps_available([9], [naive_bos(shard)], 2, 8, 1, 3, kind="shuffled")
    with pytest.raises(SpeedrunError, match="increasing positions"):
        ContiguousBatches([shard], [np.array([4, 0])], 2, 8)
    with pytest.raises(SpeedrunError, match="got 1 train shards but 2 BOS indices"):
        ContiguousBatches([shard], [naive_bos(shard)] * 2, 2, 8)
