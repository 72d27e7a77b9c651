"""GPT.parameter_kinds picks each parameter's optimizer kind by the module that holds it, and counts: every
parameter gets exactly one kind. Compared, on every preset (meta tensors, nothing allocated), with the rule
written out by parameter name (speedrun-spec.md 3.2-3.3: embeddings, head, block matrices, the rest scalars)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from speedrun.model.config import PRESETS, build_model_config
from speedrun.model.gpt import GPT


def by_name(model: GPT) -> dict[str, str]:
    """The kinds from the parameters' names: an independent statement of the same rule."""
    kinds = {}
    for name, param in model.named_parameters():
        if name == "embed.weight":
            kinds[name] = "head" if model.config.tie_embed_head else "embed"
        elif name.startswith(("value_embeds.", "bigram.table")):
            kinds[name] = "embed"
        elif name.startswith("lm_head."):
            kinds[name] = "head"
        elif name.startswith("blocks.") and param.ndim == 2 and ".attn.gate." not in name \
                and ".attn.ve_gate." not in name:
            kinds[name] = "matrix"
        else:
            kinds[name] = "scalar"
    return kinds


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("overrides", [{}, {"tie_embed_head": True}, {"attention_gate_layers": [0, 1]}])
def test_every_parameter_gets_the_kind_of_its_module(preset, overrides):
    with torch.device("meta"):
        model = GPT(build_model_config(preset, overrides))
    kinds = model.parameter_kinds()
    assert list(kinds) == [name for name, _ in model.named_parameters()]
    assert kinds == by_name(model)


def test_a_parameter_no_module_claims_is_refused():
    with torch.device("meta"):
        model = GPT(build_model_config("tiny", {}))
    model.stray = nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match=r"parameters \['stray'\] have no optimizer kind"):
        model.parameter_kinds()
