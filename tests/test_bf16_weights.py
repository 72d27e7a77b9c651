"""bf16 weights as records #57-#89 and HEAD store them (``train.weight_dtype: bfloat16``): the fp32 weight kept
as its bf16 upper half plus its lower 16 bits (:mod:`speedrun.optim.precision`), Muon on bf16 weights against
Muon on their fp32 values, CautiousAdam's single rounding, which parameters the model stores in bf16, the
residual stream then in bf16, the config's checks and a CPU training run."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from speedrun.errors import SpeedrunError
from speedrun.model.gpt import FP32_KINDS, GPT
from speedrun.optim.adam import CautiousAdam
from speedrun.optim.groups import Optimizers
from speedrun.optim.muon import Muon
from speedrun.optim.precision import join_bf16, split_fp32_
from speedrun.training.config import TrainConfig
from speedrun.training import loop
from speedrun.training.loop import run_training

from synthetic_data import counting_documents, write_dataset
from test_record_residual import CU, INPUTS, tiny
from test_training_staged import SETTINGS

BF16_SETTINGS = {**SETTINGS, "dtype": "bfloat16", "weight_dtype": "bfloat16", "cautious_weight_decay": True}
# (torch's AdamW also takes bf16 weights, its moments then bf16 as in the records before #50: the tests use
# CautiousAdam, the records' since #50, whose moments are fp32)


def _values() -> torch.Tensor:
    """fp32 values of both signs and many magnitudes, with zeros, a subnormal and infinities."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-60, 60, (4096,), generator=g).float())
    return torch.cat((x, torch.tensor([0.0, -0.0, 1e-40, -1e-40, math.inf, -math.inf, 1.0, -1.0])))


def test_split_then_join_gives_the_fp32_value_bit_for_bit_and_the_high_half_is_it_truncated():
    x = _values()
    high, low = torch.empty_like(x, dtype=torch.bfloat16), torch.empty_like(x, dtype=torch.int16)
    split_fp32_(x, high, low)
    assert torch.equal(join_bf16(high, low).view(torch.int32), x.view(torch.int32))
    bits = x.numpy().view(np.uint32)
    assert np.array_equal(high.view(torch.int16).numpy().view(np.uint16), (bits >> 16).astype(np.uint16))
    assert np.array_equal(low.numpy().view(np.uint16), (bits & 0xFFFF).astype(np.uint16))
    finite = torch.isfinite(x)
    assert torch.all(high.float()[finite].abs() <= x[finite].abs())              # towards zero, not rounded
    assert not torch.equal(high, x.to(torch.bfloat16))                           # (rounding differs somewhere)


def test_precision_helpers_refuse_other_dtypes():
    with pytest.raises(TypeError, match="bfloat16 and an int16"):
        join_bf16(torch.zeros(2), torch.zeros(2, dtype=torch.int16))
    with pytest.raises(TypeError, match="float32, bfloat16 and int16"):
        split_fp32_(torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.bfloat16),
                    torch.zeros(2, dtype=torch.int16))


@pytest.mark.parametrize("block_rows", [None, 4])
def test_muon_on_bf16_weights_updates_their_fp32_values_exactly(block_rows):
    """Five NorMuon steps with cautious decay on bf16 weights (two banks) and on fp32 copies of them, with the
    same gradients: the fp32 weight kept in the bf16 run (weight + mantissa) is the fp32 run's bit for bit,
    and the bf16 weight is its truncation."""
    g = torch.Generator().manual_seed(1)
    shapes = [(8, 16), (8, 16), (16, 8)]
    start = [torch.randn(s, generator=g).to(torch.bfloat16) for s in shapes]
    fp32 = [torch.nn.Parameter(w.float()) for w in start]
    bf16 = [torch.nn.Parameter(w.clone()) for w in start]
    settings = dict(lr=0.05, momentum=0.95, weight_decay=1.2, normuon_beta2=0.9, cautious_weight_decay=True,
                    block_rows=block_rows)
    opt32, opt16 = Muon(fp32, **settings), Muon(bf16, **settings)
    for _ in range(5):
        for a, b in zip(fp32, bf16):
            grad = torch.randn(a.shape, generator=g).to(torch.bfloat16)
            a.grad, b.grad = grad.float(), grad                     # the same values on both sides
        opt32.step()
        opt16.step()
        for a, b in zip(fp32, bf16):
            precise = join_bf16(b.detach(), opt16.state[b]["mantissa"])
            assert b.dtype == torch.bfloat16
            assert torch.equal(precise, a.detach())
            high = torch.empty_like(b, dtype=torch.bfloat16)
            split_fp32_(a.detach(), high, torch.empty_like(b, dtype=torch.int16))
            assert torch.equal(b.detach(), high)
    assert max((a.detach() - b.detach().float()).abs().max().item() for a, b in zip(fp32, bf16)) > 0


def test_muon_without_the_mantissa_would_lose_small_updates():
    """Why the lower bits are kept: a step of lr 1e-4 changes a bf16 weight of 1 by less than half its spacing
    (2^-8), so rounding each step to bf16 would leave it at 1 for ever; with the mantissa it moves."""
    w = torch.nn.Parameter(torch.ones(4, 4, dtype=torch.bfloat16))
    opt = Muon([w], lr=1e-4, momentum=0.0)
    for _ in range(40):
        w.grad = torch.ones(4, 4, dtype=torch.bfloat16)
        opt.step()
    precise = join_bf16(w.detach(), opt.state[w]["mantissa"])
    assert precise.max().item() < 1.0 - 40 * 1e-4 * 0.2                # every step counted in the fp32 value
    assert w.detach().float().max().item() < 1.0                        # and the bf16 weight follows it


def test_cautious_adam_rounds_each_new_bf16_weight_once():
    """CautiousAdam on a bf16 weight: the new weight is the fp32 computation of the records' Adam step
    (m, v in fp32; step = lr·sqrt(1-β2^t)/(1-β1^t)·m/(sqrt(v)+ε); decay lr²·λ·p where step·p > 0) rounded
    once to bf16, over three steps."""
    g = torch.Generator().manual_seed(2)
    p = torch.nn.Parameter(torch.randn(64, 8, generator=g).to(torch.bfloat16))
    lr, betas, eps, wd = 0.008, (0.9, 0.95), 1e-10, 5.0
    opt = CautiousAdam([p], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    expected = p.detach().float().clone()
    m, v = torch.zeros(64, 8), torch.zeros(64, 8)
    for t in range(1, 4):
        grad = torch.randn(64, 8, generator=g).to(torch.bfloat16)
        p.grad = grad
        opt.step()
        m = betas[0] * m + (1 - betas[0]) * grad.float()
        v = betas[1] * v + (1 - betas[1]) * grad.float() ** 2
        step = lr * math.sqrt(1 - betas[1] ** t) / (1 - betas[0] ** t) * (m / (v.sqrt() + eps))
        step = step + lr * lr * wd * expected * ((step * expected) > 0)
        expected = (expected - step).to(torch.bfloat16).float()
        assert p.dtype == torch.bfloat16
        torch.testing.assert_close(p.detach().float(), expected, rtol=0, atol=0)


def _fp32_activations(store: bool, device: str = "cpu") -> collections.Counter:
    """The fp32 (T, C) tensors that a tiny record89's forward under bf16 autocast makes, by operation."""
    torch.manual_seed(0)
    model = GPT(tiny("record89")).to(device)
    if store:
        model.store_weights(torch.bfloat16)
    width = model.config.model_dim
    seen: collections.Counter = collections.Counter()

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape[-1:] == (width,) \
                    and out.ndim == 2 and out.size(0) == INPUTS.numel():
                seen[getattr(func, "__name__", str(func))] += 1
            return out

    with torch.autocast(device, dtype=torch.bfloat16), Watch():
        model(INPUTS.to(device), torch.roll(INPUTS, -1).to(device), CU.to(device), 64)
    return seen


def test_bf16_weights_put_the_residual_stream_in_bf16():
    """With fp32 weights the embeddings and the residual stream are fp32 under autocast (dozens of fp32 (T, C)
    adds and multiplies); with the records' bf16 weights none is left."""
    assert sum(_fp32_activations(store=False).values()) > 20
    assert _fp32_activations(store=True) == collections.Counter()


@pytest.mark.parametrize("preset", ["record83", "record88", "record89", "gpt124m"])
def test_store_weights_keeps_the_scalars_and_lambdas_fp32(preset):
    model = GPT(tiny(preset)).store_weights(torch.bfloat16)
    kinds = model.parameter_kinds()
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    for name, dtype in dtypes.items():
        keep = kinds[name] in FP32_KINDS or model.get_parameter(name).ndim == 0
        assert dtype == (torch.float32 if keep else torch.bfloat16), (name, kinds[name], dtype)
    assert dtypes["lm_head.weight"] == dtypes["embed.weight"] == torch.bfloat16
    assert any(d == torch.float32 for d in dtypes.values())


@pytest.mark.parametrize("preset", ["record87", "record89"])
def test_fp8_weight_caches_of_bf16_weights_hold_copies_and_add_no_parameter(preset):
    """The FP8 caches keep a bf16 copy of each weight for the backward (``w_back``); of a bf16 weight, ``.to``
    would return the weight itself (a Parameter: set as the buffer, it became a parameter of the cache): the
    caches must neither alias the weights nor turn into parameters."""
    extra = {"fp8_attention_scales": "unit"} if preset == "record87" else {}
    model = GPT(tiny(preset, fp8_mlp=True, fp8_head=True, fp8_attention=True, **extra)).store_weights(torch.bfloat16)
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    model.use_fp8_weight_cache(True)
    model.quantize_fp8_weights()
    assert [name for name, _ in model.named_parameters(remove_duplicate=False)] == names
    weights = {p.data_ptr() for p in model.parameters()}
    filled = [b for name, b in model.named_buffers() if name.endswith("w_back") and b.numel()]
    assert filled and not any(b.data_ptr() in weights for b in filled)


@pytest.mark.parametrize("preset", ["record12", "record31"])
def test_embeddings_only_as_records_12_and_31_store_them(preset):
    """``kinds=("embed",)``: the token and value embedding tables bf16, everything else fp32; the residual
    stream is then bf16 too (the lookups are), as in those records."""
    model = GPT(tiny(preset)).store_weights(torch.bfloat16, kinds=("embed",))
    kinds = model.parameter_kinds()
    bf16 = {name for name, p in model.named_parameters() if p.dtype == torch.bfloat16}
    assert bf16 == {name for name in kinds if kinds[name] == "embed"} and "embed.weight" in bf16
    assert model.lm_head.weight.dtype == torch.float32


def test_the_loop_stores_each_weight_dtype(monkeypatch):
    calls = []
    monkeypatch.setattr(GPT, "store_weights", lambda self, dtype, kinds=None: calls.append((dtype, kinds)))
    for setting in ("float32", "bfloat16", "bfloat16_embeddings"):
        loop.store_weights(GPT(tiny("record89")), setting)
    assert calls == [(torch.bfloat16, None), (torch.bfloat16, ("embed",))]


def test_store_weights_refuses_an_integer_dtype():
    with pytest.raises(ValueError, match="floating-point"):
        GPT(tiny("record89")).store_weights(torch.int16)


def test_weight_dtype_checks_name_the_settings():
    with pytest.raises(SpeedrunError, match="train.weight_dtype bfloat16 needs the matrix products in bf16"):
        TrainConfig.from_dict({**BF16_SETTINGS, "dtype": "float32"})
    with pytest.raises(SpeedrunError, match="train.weight_dtype bfloat16_embeddings needs the matrix products"):
        TrainConfig.from_dict({**BF16_SETTINGS, "dtype": "float32", "weight_dtype": "bfloat16_embeddings"})
    with pytest.raises(SpeedrunError, match="weight_dtype"):
        TrainConfig.from_dict({**BF16_SETTINGS, "weight_dtype": "float16"})
    auto = TrainConfig.from_dict({**BF16_SETTINGS, "dtype": "auto"})
    assert auto.resolved_for("cpu").compute.weight_dtype == "float32"       # auto on a CPU computes in fp32
    assert auto.resolved_for("cuda").compute.weight_dtype == "bfloat16"
    assert TrainConfig.from_dict(BF16_SETTINGS).resolved_for("cpu").compute.weight_dtype == "bfloat16"


def test_the_loops_all_reduce_sends_each_dtype_in_its_own_dtype(monkeypatch):
    """Two ranks (simulated: the all-reduce doubles, as the sum of two equal ranks): the bf16 gradients go in one
    bf16 all-reduce, the fp32 ones and the loss in one fp32 all-reduce, and every tensor comes back averaged."""
    calls = []

    def all_reduce(flat, op):
        calls.append((flat.dtype, flat.numel()))
        flat.mul_(2)

    monkeypatch.setattr(loop.dist, "all_reduce", all_reduce)
    tensors = [torch.full((3, 2), 1.5, dtype=torch.bfloat16), torch.full((4,), 0.25), torch.tensor([3.0]),
               torch.full((5,), -2.0, dtype=torch.bfloat16)]
    expected = [t.clone() for t in tensors]
    loop._all_reduce_mean(tensors, 2)
    assert calls == [(torch.bfloat16, 11), (torch.float32, 5)]
    for got, want in zip(tensors, expected):
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("synth"), counting_documents(600), shard_tokens=16384)


def test_a_cpu_run_with_bf16_weights_trains_them_in_bf16(synthetic, tmp_path, monkeypatch):
    """test_training_staged's schedule (8 steps, 2 stages) in bf16 on the CPU with bf16 weights: the run
    completes, Muon's weights are bf16 with their mantissa in its state, and its losses stay within 0.1 of the
    same run with fp32 weights; so do those of a run with bf16 embedding tables only and torch's AdamW."""
    shards, bos = synthetic
    seen = {}
    real_step = Optimizers.step

    def step(self, adam=True):
        result = real_step(self, adam=adam)
        muon = [opt for opt in self.optimizers if isinstance(opt, Muon)][0]
        params = [p for group in muon.param_groups for p in group["params"]]
        seen["dtypes"] = {p.dtype for p in params}
        seen["mantissa"] = all(getattr(muon.state[p].get("mantissa"), "dtype", None) == torch.int16 for p in params)
        return result

    monkeypatch.setattr(Optimizers, "step", step)
    runs = {}
    for weights in ("bfloat16", "float32", "bfloat16_embeddings"):
        cautious = weights != "bfloat16_embeddings"              # the older records' form: torch's AdamW
        cfg = TrainConfig.from_dict({**BF16_SETTINGS, "weight_dtype": weights, "cautious_weight_decay": cautious})
        runs[weights] = run_training(cfg, variant="v", seed=0, shards_dir=shards, bos_dir=bos,
                                     log_path=tmp_path / f"{weights}.txt", env={})
        assert runs[weights].status == "complete"
        if weights == "bfloat16":
            assert seen == {"dtypes": {torch.bfloat16}, "mantissa": True}
    val = {w: [loss for _, kind, loss in run.losses if kind == "val"] for w, run in runs.items()}
    for weights in ("bfloat16", "bfloat16_embeddings"):
        low, high = val[weights], val["float32"]
        assert len(low) == len(high) >= 2
        assert all(abs(a - b) < 0.1 for a, b in zip(low, high)), (weights, low, high)
        assert low[-1] < low[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_split_join_and_muon_on_bf16_weights_match_the_cpu():
    """The bit arithmetic on CUDA gives the CPU's bits, and a CUDA Muon step on bf16 weights (one fused pass,
    speedrun.kernels.muon_update) keeps the fp32 weight of a CUDA Muon step on fp32 copies (the eager step) to a
    few fp32 ulps: the same update on both sides (the orthogonalization in bf16 on the same inputs), the step's
    multiply-adds contracted only in the kernel; the step itself is about 1e-3 of a weight."""
    x = _values()
    pairs = {}
    for device in ("cpu", "cuda"):
        v = x.to(device)
        high, low = torch.empty_like(v, dtype=torch.bfloat16), torch.empty_like(v, dtype=torch.int16)
        split_fp32_(v, high, low)
        pairs[device] = (high.cpu(), low.cpu(), join_bf16(high, low).cpu())
    for a, b in zip(pairs["cpu"], pairs["cuda"]):                         # bf16, int16 and fp32: the bits
        bits = torch.int32 if a.dtype == torch.float32 else torch.int16
        assert torch.equal(a.view(bits), b.view(bits))
    g = torch.Generator().manual_seed(3)
    start = torch.randn(2, 256, 768, generator=g).to(torch.bfloat16).cuda()
    fp32 = [torch.nn.Parameter(w.float()) for w in start]
    bf16 = [torch.nn.Parameter(w.clone()) for w in start]
    settings = dict(lr=0.023, momentum=0.95, weight_decay=1.2, normuon_beta2=0.9, cautious_weight_decay=True)
    opt32, opt16 = Muon(fp32, **settings), Muon(bf16, **settings)
    for _ in range(3):
        for a, b in zip(fp32, bf16):
            grad = torch.randn(a.shape, generator=g).to(torch.bfloat16).cuda()
            a.grad, b.grad = grad.float(), grad
        opt32.step()
        opt16.step()
    for a, b, w in zip(fp32, bf16, start):
        joined, want = join_bf16(b.detach(), opt16.state[b]["mantissa"]), a.detach()
        assert ((joined - want).abs() <= 8 * torch.finfo(torch.float32).eps * (want.abs() + 0.05)).all()
        assert (want - w.float()).abs().max() > 1e-3                         # the three steps moved the weights


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bf16_weights_put_the_residual_stream_in_bf16():
    """CUDA autocast runs rms_norm in fp32: speedrun.model.norm.rms_norm returns its input's dtype, so the
    stream stays bf16 there too (x0 = norm(embedding) would otherwise start an fp32 stream)."""
    assert sum(_fp32_activations(store=False, device="cuda").values()) > 20
    assert _fp32_activations(store=True, device="cuda") == collections.Counter()


def test_sa_lambdas_scale_the_bf16_weights_as_the_records_products_do():
    """Record #88 L1086, L1135: ``F.linear(x, sa_lambdas[0] * W_qkv)`` and ``F.linear(y, sa_lambdas[1] * W_o)``
    with bf16 weights and a 0-d fp32 λ (the product stays bf16): the q/k/v and output products of a bf16
    model are these to the bit, and λ's gradient is the sum of W ⊙ dL/d(λW) over the weight."""
    torch.manual_seed(0)
    model = GPT(tiny("record88"))
    model.store_weights(torch.bfloat16)
    attn = model.blocks[1].attn
    with torch.no_grad():
        attn.sa_lambdas.copy_(torch.tensor([0.7137, 1.3141]))
    x = torch.randn(20, 24).to(torch.bfloat16)
    w_qkv = torch.cat((attn.q.weight, attn.k.weight, attn.v.weight))
    qkv = attn._qkv(x)
    assert qkv.dtype == torch.bfloat16
    assert torch.equal(qkv, torch.nn.functional.linear(x, attn.sa_lambdas[0] * w_qkv))
    assert not torch.equal(qkv, attn.sa_lambdas[0].to(torch.bfloat16) * torch.nn.functional.linear(x, w_qkv))
    qkv.float().square().sum().backward()
    scaled = (attn.sa_lambdas[0].detach() * w_qkv.detach()).requires_grad_()
    torch.nn.functional.linear(x, scaled).float().square().sum().backward()
    expected = (scaled.grad.float() * w_qkv.detach().float()).sum()
    torch.testing.assert_close(attn.sa_lambdas.grad[0], expected, rtol=1e-2, atol=0)
