"""The record presets on a CUDA GPU: a full-size training step of ``record88`` and ``record89`` (bf16 autocast,
FlexAttention, the fused kernels, FP8 head) with finite gradients for every parameter, and ``record88``
compiled as one graph against its eager loss. record89's DC goes through the tests' stand-in of
``speedrun.model.dc.dc_attention`` (tests/test_record_residual.py) until that module lands."""

from __future__ import annotations

import math

import pytest
import torch

from speedrun.model.config import build_model_config
from speedrun.model.gpt import GPT
from test_record_residual import dc_module  # noqa: F401 (fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TOKENS = 8192


def _batch():
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 50257, (TOKENS,), generator=g, dtype=torch.int32).cuda()
    targets = torch.randint(0, 50257, (TOKENS,), generator=g).cuda()
    cu = torch.tensor([0, 1000, 3000, 5000, 6000, TOKENS, TOKENS], dtype=torch.int32, device="cuda")
    return inputs, targets, cu


@pytest.mark.parametrize("preset", ["record88", "record89"])
def test_a_full_size_record_training_step_on_cuda(dc_module, preset):  # noqa: F811
    torch.manual_seed(0)
    model = GPT(build_model_config(preset, {"rotary_positions": 2 * TOKENS})).cuda().train()
    batch = _batch()
    with torch.autocast("cuda", torch.bfloat16):
        loss = model(*batch)
    loss.backward()
    assert math.isfinite(loss.item()) and abs(loss.item() - math.log(50304)) < 0.1
    model.fold_tied_gradients()
    for name, p in model.named_parameters():
        if name == "embed.weight":
            assert p.grad is None
        else:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        assert math.isfinite(model.eval()(*batch).item())


@pytest.mark.slow                                             # compiles the whole model: minutes
def test_record88_compiles_as_one_graph_on_cuda():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(build_model_config("record88", {"rotary_positions": 2 * TOKENS})).cuda().train()
    with torch.no_grad():
        for name, p in model.named_parameters():                 # move the zero inits so every path counts
            p.add_(0.02 * torch.randn_like(p))
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, dynamic=False, fullgraph=True)
    batch = _batch()
    with torch.autocast("cuda", torch.bfloat16):
        loss = compiled(*batch)
        eager = model(*batch)
    loss.backward()
    assert counter.frame_count == 1
    assert abs(loss.item() - eager.item()) < 2e-2, (loss.item(), eager.item())
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
