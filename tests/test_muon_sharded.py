"""The sharded Muon update on two gloo ranks (torch.multiprocessing, file:// rendezvous): each rank holds its own
gradients; after three sharded steps (NorMuon, cautious weight decay, Langevin noise, banks of 3, 2 and 1
matrices, so padding and a rank that owns only padding), both ranks' parameters equal a single-process Muon
step on the averaged gradients, and each rank keeps state only for its slice. Also the reduce-scatter helper
on both of its paths (the reduce-scatter of one tensor, and the all-reduce fallback) against the mean by hand.
The shard bounds by hand."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from speedrun.optim.muon import Muon
from speedrun.optim.sharding import Communicator, shard_bounds

WORLD = 2
STEPS = 3
GROUP0 = [(8, 4), (4, 6), (8, 4), (5, 5), (4, 6), (8, 4)]    # banks: 3 x (8, 4), 2 x (4, 6), 1 x (5, 5)
GROUP1 = [(6, 6), (6, 6)]
SETTINGS = dict(momentum=0.9, weight_decay=1.2, normuon_beta2=0.9, cautious_weight_decay=True,
                langevin_noise=0.3, langevin_seed=7)


def _initial_parameters():
    g = torch.Generator().manual_seed(0)
    return [nn.Parameter(torch.randn(s, generator=g)) for s in GROUP0 + GROUP1]


def _gradient(rank, step, index, shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(1000 * rank + 10 * step + index))


def _optimizer(params):
    return Muon([{"params": params[:len(GROUP0)], "lr": 0.02},
                 {"params": params[len(GROUP0):], "lr": 0.05}], **SETTINGS)


def _worker(rank, init_file, out_dir, backend):
    torch.set_num_threads(1)
    device = torch.device(f"cuda:{rank}" if backend == "nccl" else "cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        params = [nn.Parameter(p.detach().to(device)) for p in _initial_parameters()]
        opt = _optimizer(params)
        self_reduced = {id(p) for p in opt.self_reduced_parameters()} == {id(p) for p in params}
        for step in range(STEPS):
            for i, p in enumerate(params):
                p.grad = _gradient(rank, step, i, p.shape).to(device)
            opt.step()
        with_state = [i for i, p in enumerate(params) if "momentum_buffer" in opt.state.get(p, {})]
        stack = torch.arange(24, dtype=torch.float32, device=device).reshape(6, 2, 2) * (rank + 1)
        scattered = Communicator().reduce_scatter_mean(stack.clone()).wait()
        fallback = Communicator(reduce_scatter=False).reduce_scatter_mean(stack.clone()).wait()
        torch.save({"params": [p.detach().cpu() for p in params], "with_state": with_state,
                    "self_reduced": self_reduced, "scattered": scattered.cpu(), "fallback": fallback.cpu()},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _single_process_reference(device):
    params = [nn.Parameter(p.detach().to(device)) for p in _initial_parameters()]
    opt = _optimizer(params)
    for step in range(STEPS):
        for i, p in enumerate(params):
            p.grad = ((_gradient(0, step, i, p.shape) + _gradient(1, step, i, p.shape)) / 2).to(device)
        opt.step()
    return [p.detach().cpu() for p in params]


def _check_sharded_run(tmp_path, backend, tolerance):
    mp.spawn(_worker, args=(str(tmp_path / "rendezvous"), str(tmp_path), backend), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    reference = _single_process_reference("cuda:0" if backend == "nccl" else "cpu")
    for result in ranks:
        assert result["self_reduced"]
        for got, expected in zip(result["params"], reference):
            torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
    # slices: (8, 4) bank [0, 2, 5] -> rank 0 owns 0, 2; rank 1 owns 5 (+1 padding); (4, 6) [1, 4] -> one
    # each; (5, 5) [3] -> rank 0 (rank 1 holds padding only); (6, 6) [6, 7] -> one each
    assert ranks[0]["with_state"] == [0, 1, 2, 3, 6]
    assert ranks[1]["with_state"] == [4, 5, 7]
    mean = torch.arange(24, dtype=torch.float32).reshape(6, 2, 2) * 1.5     # (1 + 2) / 2
    for rank, result in enumerate(ranks):
        torch.testing.assert_close(result["scattered"], mean[3 * rank:3 * rank + 3], rtol=0, atol=0)
        torch.testing.assert_close(result["fallback"], mean[3 * rank:3 * rank + 3], rtol=0, atol=0)


@pytest.mark.slow                                 # two spawned processes: ~12 s on 2 cores, mostly imports
def test_two_sharded_gloo_ranks_equal_one_unsharded_step_on_the_averaged_gradients(tmp_path):
    _check_sharded_run(tmp_path, "gloo", 1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_sharded_nccl_ranks_equal_one_unsharded_step_on_the_averaged_gradients(tmp_path):
    """NCCL averages in the collective (ReduceOp.AVG) and orthogonalizes in bf16: equal up to bf16."""
    _check_sharded_run(tmp_path, "nccl", 2e-3)


def test_shard_bounds_by_hand():
    assert shard_bounds(3, 2, 0) == (4, 0, 2) and shard_bounds(3, 2, 1) == (4, 2, 2)
    assert shard_bounds(22, 8, 7) == (24, 21, 3)
    assert shard_bounds(1, 1, 0) == (1, 0, 1)
    with pytest.raises(ValueError, match="rank 2"):
        shard_bounds(3, 2, 2)
