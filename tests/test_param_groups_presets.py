"""Every model preset gives the same parameter kinds and optimizer groups (parameter names per group, lr,
betas, weight decay, in order) as the groups chosen by parameter names did.

tests/data/param_groups_presets.json is the frozen record of those groups: written by ``describe`` below from
the code at commit d320a76 (groups.py choosing the MLP matrices by the name suffixes ``.mlp.fc.weight`` /
``.mlp.proj.weight`` and the attention gates by the mark ``.attn.gate.``), before the modules declared their
parameters' roles, with ``PYTHONPATH=src python tests/test_param_groups_presets.py --write``. Rewriting it
from later code makes this test compare that code with itself: do it only for a change meant to move the
groups, and say so in the commit. Each preset is built on the meta device (its full shapes, nothing
allocated), as it is, tied (``tie_embed_head``) and with attention gates on layers 0 and 1, under three
optimizer settings: the defaults, the MLP lr factors of the records (fc 0.5, proj 4), and those with
``muon_attention_gates`` (a model without attention gates refuses it: the message is recorded).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from speedrun.model.config import build_model_config
from speedrun.model.gpt import GPT
from speedrun.optim.groups import OptimConfig, build_optimizers

FIXTURE = Path(__file__).parent / "data" / "param_groups_presets.json"
PRESETS = ("tiny", "gpt124m", "record28", "record88", "record89", "record12", "record31")
MODELS = {"as_is": {}, "tied": {"tie_embed_head": True}, "gated": {"attention_gate_layers": (0, 1)}}
RECORD_OPTIM = {"mlp_fc_lr_mul": 0.5, "mlp_proj_lr_mul": 4.0,
                "adam_kind_betas": {"head": (0.5, 0.95), "embed": (0.75, 0.95), "scalar": (0.9, 0.99)}}
OPTIMS = {"default": {}, "record": RECORD_OPTIM, "muon_gates": {**RECORD_OPTIM, "muon_attention_gates": True}}


def describe(preset: str, model_overrides: dict) -> dict:
    """The kinds (name -> kind) of ``preset`` with ``model_overrides`` on the meta device and, per optimizer
    setting of :data:`OPTIMS`, the groups ``build_optimizers`` gives: per group its optimizer (class name),
    kind, lr, initial_lr, betas and weight_decay where set, and its parameters' names in order; or the
    ValueError's message in place of the groups."""
    with torch.device("meta"):
        model = GPT(build_model_config(preset, model_overrides))
    kinds = model.parameter_kinds()
    names = {id(p): n for n, p in model.named_parameters()}
    out: dict = {"kinds": kinds}
    for setting, optim in OPTIMS.items():
        try:
            optimizers = build_optimizers(model, kinds, OptimConfig(**optim))
        except ValueError as e:
            out[setting] = {"error": str(e)}
            continue
        groups = []
        for opt in optimizers.optimizers:
            for g in opt.param_groups:
                entry = {"optimizer": type(opt).__name__, "kind": g["kind"], "lr": g["lr"],
                         "initial_lr": g["initial_lr"], "params": [names[id(p)] for p in g["params"]]}
                if "betas" in g:
                    entry["betas"] = list(g["betas"])
                if "weight_decay" in g:
                    entry["weight_decay"] = g["weight_decay"]
                groups.append(entry)
        out[setting] = {"groups": groups}
    return out


CASES = [(p, m) for p in PRESETS for m in MODELS]


def record_all() -> dict:
    return {f"{p}/{m}": describe(p, MODELS[m]) for p, m in CASES}


@pytest.fixture(scope="module")
def frozen() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("preset,model", CASES)
def test_groups_are_those_the_names_chose(frozen, preset, model):
    expected = frozen[f"{preset}/{model}"]
    got = json.loads(json.dumps(describe(preset, MODELS[model])))
    assert got["kinds"] == expected["kinds"]
    for setting in OPTIMS:
        if "error" in expected[setting]:
            assert "error" in got[setting], f"{setting}: expected the refusal {expected[setting]['error']!r}"
        else:
            assert got[setting] == expected[setting], setting


def test_the_fixture_covers_every_case(frozen):
    assert sorted(frozen) == sorted(f"{p}/{m}" for p, m in CASES)
    outcomes = [v[s] for v in frozen.values() for s in OPTIMS]
    assert any("error" in o for o in outcomes) and any("groups" in o for o in outcomes)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: PYTHONPATH=src python tests/test_param_groups_presets.py --write")
    FIXTURE.write_text(json.dumps(record_all(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
