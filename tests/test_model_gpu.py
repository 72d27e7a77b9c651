"""The GPU presets on a CUDA GPU: paired-head attention through the compiled FlexAttention kernel against
the reference, and a training step of ``gpt124m``, ``record28``, ``record12`` and ``record31`` at full size
(bf16 autocast, FP8 switches on, FlexAttention) with finite gradients for every parameter."""

from __future__ import annotations

import math

import pytest
import torch

from speedrun.model.attention import PackedDocuments
from speedrun.model.config import build_model_config
from speedrun.model.gpt import GPT
from speedrun.model.paired import paired_attention, paired_positions
from speedrun.model.rotary import rotary_frequencies, rotary_tables

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_paired_attention_through_flex_on_cuda_matches_the_reference():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1024, 6, 128, generator=g).cuda() for _ in range(3))
    cu = torch.tensor([0, 300, 301, 1024, 1024], dtype=torch.int32, device="cuda")
    positions = torch.cat([torch.arange(300), torch.arange(1), torch.arange(723)]).cuda()
    cos, sin = rotary_tables(paired_positions(positions),
                             rotary_frequencies(128, 1e4, torch.device("cuda"), "half_truncated"))
    outs = {backend: paired_attention(q, k, v, PackedDocuments(cu, 1024), cos, sin, 0.1, 256,
                                      rope="half_truncated", backend=backend)
            for backend in ("reference", "flex")}
    torch.testing.assert_close(outs["flex"], outs["reference"], rtol=2e-3, atol=2e-3)


@pytest.mark.slow                         # FlexAttention compiles a kernel per window and length: about a minute
@pytest.mark.parametrize("preset", ["gpt124m", "record28", "record12", "record31"])
def test_a_full_size_training_step_on_cuda(preset):
    torch.manual_seed(0)
    model = GPT(build_model_config(preset)).cuda().train()
    tokens = 16384
    inputs = torch.randint(0, 50257, (tokens,), dtype=torch.int32).cuda()
    targets = torch.randint(0, 50257, (tokens,)).cuda()
    cu = torch.tensor([0, 1000, 3000, 8000, 9000, tokens, tokens], dtype=torch.int32, device="cuda")
    with torch.autocast("cuda", torch.bfloat16):
        loss = model(inputs, targets, cu)
    loss.backward()
    if not model.tied:                                                     # zero head: exactly uniform
        assert loss.item() == pytest.approx(math.log(50304), abs=1e-3)
    assert math.isfinite(loss.item())
    model.fold_tied_gradients()                                            # tied: into the head's gradient
    for name, p in model.named_parameters():
        if name == "embed.weight" and model.tied:
            assert p.grad is None
        else:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        assert math.isfinite(model.eval()(inputs, targets, cu).item())
