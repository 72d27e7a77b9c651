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


def _initial_parameters(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in GROUP0 + GROUP1]


def _gradient(rank, step, index, shape, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(1000 * rank + 10 * step + index)).to(dtype)


def _optimizer(params):
    return Muon([{"params": params[:len(GROUP0)], "lr": 0.02},
                 {"params": params[len(GROUP0):], "lr": 0.05}], **SETTINGS)


def _worker(rank, init_file, out_dir, backend, dtype=torch.float32):
    torch.set_num_threads(1)
    device = torch.device(f"cuda:{rank}" if backend == "nccl" else "cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        params = [nn.Parameter(p.detach().to(device)) for p in _initial_parameters(dtype)]
        opt = _optimizer(params)
        self_reduced = {id(p) for p in opt.self_reduced_parameters()} == {id(p) for p in params}
        for step in range(STEPS):
            for i, p in enumerate(params):
                p.grad = _gradient(rank, step, i, p.shape, dtype).to(device)
            opt.step()
        with_state = [i for i, p in enumerate(params) if "momentum_buffer" in opt.state.get(p, {})]
        stack = torch.arange(24, dtype=torch.float32, device=device).reshape(6, 2, 2) * (rank + 1)
        scattered = Communicator().reduce_scatter_mean(stack.clone()).wait()
        fallback = Communicator(reduce_scatter=False).reduce_scatter_mean(stack.clone()).wait()
        mantissas = [opt.state[p]["mantissa"].cpu() for p in params if "mantissa" in opt.state.get(p, {})]
        torch.save({"params": [p.detach().cpu() for p in params], "with_state": with_state, "mantissas": mantissas,
                    "self_reduced": self_reduced, "scattered": scattered.cpu(), "fallback": fallback.cpu()},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _single_process_reference(device, dtype=torch.float32):
    """The parameters and, for bf16 ones, the mantissas (in parameter order) after unsharded steps on the two
    ranks' mean gradients, computed in the gradients' dtype as the reduce-scatter does (bf16: the bf16 sum
    halved)."""
    params = [nn.Parameter(p.detach().to(device)) for p in _initial_parameters(dtype)]
    opt = _optimizer(params)
    for step in range(STEPS):
        for i, p in enumerate(params):
            p.grad = ((_gradient(0, step, i, p.shape, dtype) + _gradient(1, step, i, p.shape, dtype)) / 2).to(device)
        opt.step()
    mantissas = [opt.state[p]["mantissa"].cpu() for p in params if "mantissa" in opt.state.get(p, {})]
    return [p.detach().cpu() for p in params], mantissas


def _check_sharded_run(tmp_path, backend, tolerance, dtype=torch.float32):
    mp.spawn(_worker, args=(str(tmp_path / "rendezvous"), str(tmp_path), backend, dtype), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    reference, mantissas = _single_process_reference("cuda:0" if backend == "nccl" else "cpu", dtype)
    for result in ranks:
        assert result["self_reduced"]
        for got, expected in zip(result["params"], reference):
            assert got.dtype == dtype
            torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
    if dtype == torch.bfloat16:                      # each rank keeps the lower bits of its own slice only
        owned = [m for r in ranks for m in r["mantissas"]]
        order = ranks[0]["with_state"] + ranks[1]["with_state"]
        assert len(owned) == len(mantissas) == len(order) == 8
        for index, got in zip(order, owned):
            torch.testing.assert_close(got, mantissas[index], rtol=0, atol=0)
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


@pytest.mark.slow
def test_two_sharded_gloo_ranks_on_bf16_weights_reduce_in_bf16_and_keep_their_slices_mantissas(tmp_path):
    """bf16 weights (the records', ``train.weight_dtype: bfloat16``): the gradients travel in bf16, and both
    ranks' weights and each rank's mantissas equal the unsharded run on the bf16 mean gradients exactly."""
    _check_sharded_run(tmp_path, "gloo", 0.0, torch.bfloat16)


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
