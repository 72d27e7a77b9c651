"""The step prefetcher (speedrun.data.prefetch) against drawing the steps directly from the loader: the same
tokens in the same order through a batch-size schedule, errors raised by the step that hits them, order
enforced, and the thread stopped by close."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speedrun.data.loader import BosAlignedBatches, to_torch
from speedrun.data.prefetch import StepPrefetcher
from speedrun.errors import SpeedrunError

BOS = 50256


def documents_shard(seed: int = 0, tokens: int = 20000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shard = rng.integers(0, 50000, tokens).astype(np.uint16)
    starts = np.sort(rng.choice(np.arange(1, tokens), tokens // 100, replace=False))
    shard[0] = BOS
    shard[starts] = BOS
    return shard, np.flatnonzero(shard == BOS).astype(np.int64)


def shape_at(step: int) -> tuple[int, int]:
    return (64, 32) if step < 3 else (128, 64)


def direct_steps(shard, bos, steps, rank=0, world_size=1):
    loader = BosAlignedBatches([shard], [bos], 64, 32)
    out = []
    for step in range(steps):
        if shape_at(step) != (loader.micro_batch_tokens, loader.max_seq_len):
            loader.set_batch(*shape_at(step))
        out.append([to_torch(mb, "cpu") for mb in loader.next_step(4, rank, world_size)])
    return out


@pytest.mark.parametrize("rank,world_size", [(0, 1), (1, 2)])
def test_prefetched_steps_equal_the_directly_drawn_ones(rank, world_size):
    shard, bos = documents_shard()
    expected = direct_steps(shard, bos, 6, rank, world_size)
    loader = BosAlignedBatches([shard], [bos], 64, 32)
    with StepPrefetcher(loader, 6, shape_at, 4, rank, world_size, torch.device("cpu"), depth=2) as prefetch:
        got = [prefetch.get(step) for step in range(6)]
    assert len(got) == 6 and [len(step) for step in got] == [4 // world_size] * 6
    for step_got, step_expected in zip(got, expected):
        for tensors_got, tensors_expected in zip(step_got, step_expected):
            for a, b in zip(tensors_got, tensors_expected):
                assert a.dtype == b.dtype and torch.equal(a, b)
    assert got[0][0][0].numel() == 64 and got[5][0][0].numel() == 128


def test_running_out_of_data_is_raised_by_the_step_that_hits_it():
    shard, bos = documents_shard(tokens=1200)
    loader = BosAlignedBatches([shard], [bos], 64, 32)
    with StepPrefetcher(loader, 50, shape_at, 4, 0, 1, torch.device("cpu")) as prefetch:
        step = 0
        with pytest.raises(SpeedrunError, match="ran out of training data"):
            while True:
                prefetch.get(step)
                step += 1
    assert 0 < step < 50


def test_steps_must_come_in_order_and_within_range():
    shard, bos = documents_shard()
    loader = BosAlignedBatches([shard], [bos], 64, 32)
    with StepPrefetcher(loader, 1, shape_at, 4, 0, 1, torch.device("cpu")) as prefetch:
        with pytest.raises(ValueError, match="expected step 0, got 1"):
            prefetch.get(1)
        prefetch.get(0)
        with pytest.raises(ValueError, match="beyond the 1 steps"):
            prefetch.get(1)
    with pytest.raises(ValueError, match="depth"):
        StepPrefetcher(loader, 1, shape_at, 4, 0, 1, torch.device("cpu"), depth=0)


def test_close_stops_a_thread_blocked_on_a_full_queue():
    shard, bos = documents_shard()
    loader = BosAlignedBatches([shard], [bos], 64, 32)
    prefetch = StepPrefetcher(loader, 10, shape_at, 4, 0, 1, torch.device("cpu"), depth=1)
    prefetch.get(0)
    prefetch.close()
    assert not prefetch._thread.is_alive()
