"""The train stage builds the model under ``torch.device(<its device>)``, so that a GPU run initializes its weights
on the GPU (issue 21, run overhead: the record88 preset's 491M parameters took about 10 s of host
initialization and copy). Every preset must build that way: its parameters and buffers on the context's device,
except the tables built on the CPU on purpose (the bigram sign table: the same ±1 draws on every machine), which
``.to(device)`` then moves."""

from __future__ import annotations

import pytest
import torch

from speedrun.model.config import PRESETS
from speedrun.model.gpt import GPT

ON_THE_CPU_ON_PURPOSE = {"bigram.signs"}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_builds_on_the_devices_context(preset):
    with torch.device("meta"):                      # no memory, no init cost: where each tensor was made
        model = GPT(PRESETS[preset])
    elsewhere = {name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type != "meta"}
    assert elsewhere <= ON_THE_CPU_ON_PURPOSE
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_build_matches_a_cpu_build_in_layout_and_the_sign_table():
    """Built on the GPU and moved: the CPU build's parameters (names, shapes, dtypes), every tensor on the GPU,
    and the bigram sign table the CPU's bit for bit."""
    cpu = GPT(PRESETS["record89"])
    with torch.device("cuda"):
        gpu = GPT(PRESETS["record89"])
    gpu.to("cuda")
    layout = lambda m: [(n, tuple(p.shape), p.dtype) for n, p in m.named_parameters()]  # noqa: E731
    assert layout(gpu) == layout(cpu)
    assert all(t.is_cuda for t in [*gpu.parameters(), *gpu.buffers()])
    assert torch.equal(gpu.bigram.signs.cpu(), cpu.bigram.signs)
