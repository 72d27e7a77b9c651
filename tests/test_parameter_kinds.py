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
    """The kinds from the parameters' names: an independent statement of the same rule, with the records'
    Adam kinds of the sublayer form (record #88's table, speedrun-spec.md 3.3)."""
    sublayer = model.config.residual_form == "sublayer"
    kinds = {}
    for name, param in model.named_parameters():
        gate = ".attn.gate." in name or ".attn.ve_gate." in name
        if name == "embed.weight":
            kinds[name] = "head" if model.config.tie_embed_head else "embed"
        elif name.startswith(("value_embeds.", "bigram.table")):
            kinds[name] = "embed"
        elif name.startswith("lm_head."):
            kinds[name] = "head"
        elif name == "residual.resid_lambdas":
            kinds[name] = "resid_lambda"
        elif name in ("residual.post_lambdas", "residual.x0_lambdas") or name.endswith(".attn.xsa_alpha") \
                or (sublayer and name == "bigram.gates"):
            kinds[name] = "lambda"
        elif name == "skips.gate":
            kinds[name] = "skip_gate"
        elif name.startswith("mudd."):
            kinds[name] = "mudd_bias" if name.endswith(".b2") else "mudd"
        elif name.startswith("mudd_gates."):
            kinds[name] = "mudd_gate" if name.endswith((".w1", ".w2")) else "mudd_gate_bias"
        elif sublayer and gate:
            kinds[name] = "gate"
        elif sublayer and name == "smear.gate":
            kinds[name] = "smear_gate"
        elif name.startswith("blocks.") and param.ndim == 2 and not gate:
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
