"""Every parameter of a model is initialized bit for bit as when record #12's input matrices were chosen by
parameter names: same values, same parameters, same order of random draws.

tests/data/init_digests.json is the frozen record: written by ``describe`` below from the code at commit
e2df56c (speedrun.model.init choosing the matrices that ``linear_init: torch`` re-initializes by the name
suffixes ``.attn.q.weight``, ``.attn.k.weight``, ``.attn.v.weight``, ``.mlp.fc.weight``), before the
attention and the MLP declared them by role, with ``PYTHONPATH=src python tests/test_init_digests.py --write``
(torch 2.13.0+cpu; the CPU generator's uniform and normal draws are what it records). Rewriting it from later
code makes this test compare that code with itself: do it only for a change meant to move the initialization,
and say so in the commit. Each case is a preset at a small width (C 64, 2 heads of 32, V 256, its own
layer count) built on the CPU after ``torch.manual_seed(1234)``: per parameter, in the order of
``named_parameters()``, its name, shape, dtype and the sha256 of its bytes, and the sha256 of the generator
state after the model is built (the same number of draws). Record #12 (``linear_init: torch``) as it is and
with a block without attention and one without MLP; record #31 (``linear_init: speedrun``) as it is.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

from speedrun.model.config import build_model_config
from speedrun.model.gpt import GPT

FIXTURE = Path(__file__).parent / "data" / "init_digests.json"
SEED = 1234
SMALL = {"model_dim": 64, "n_head": 2, "head_dim": 32, "vocab_size": 256}
CASES = {"record12": ("record12", {}),
         "record12/holes": ("record12", {"attention_free_layers": (3,), "mlp_free_layers": (5,)}),
         "record31": ("record31", {})}


def sha256(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def describe(preset: str, overrides: dict) -> dict:
    """``preset`` with :data:`SMALL` and ``overrides``, built on the CPU after ``torch.manual_seed(SEED)``:
    ``params`` [name, shape, dtype, sha256 of the bytes] per parameter in order, ``rng`` the sha256 of the
    CPU generator's state after the build."""
    torch.manual_seed(SEED)
    model = GPT(build_model_config(preset, {**SMALL, **overrides}))
    params = [[name, list(p.shape), str(p.dtype), sha256(p)] for name, p in model.named_parameters()]
    return {"params": params, "rng": sha256(torch.random.get_rng_state())}


def record_all() -> dict:
    return {case: describe(*CASES[case]) for case in CASES}


@pytest.fixture(scope="module")
def frozen() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("case", sorted(CASES))
def test_initialization_is_that_of_the_name_choice(frozen, case):
    got, expected = describe(*CASES[case]), frozen[case]
    assert [p[:3] for p in got["params"]] == [p[:3] for p in expected["params"]]
    changed = [name for (name, *_, a), (_, *_, b) in zip(got["params"], expected["params"]) if a != b]
    assert changed == []
    assert got["rng"] == expected["rng"]


def test_the_fixture_covers_every_case_and_the_torch_init_draws(frozen):
    assert sorted(frozen) == sorted(CASES)
    by_case = {case: {name: (shape, digest) for name, shape, _, digest in v["params"]} for case, v in frozen.items()}
    drawn = [f"blocks.{layer}.{suffix}" for layer in range(12)
             for suffix in ("attn.q.weight", "attn.k.weight", "attn.v.weight", "mlp.fc.weight")]
    for name in drawn:                   # record #12's q, k, v and fc are drawn: none is all zeros
        shape, digest = by_case["record12"][name]
        assert digest != sha256(torch.zeros(shape))
    assert "blocks.3.attn.q.weight" not in by_case["record12/holes"]
    assert "blocks.5.mlp.fc.weight" not in by_case["record12/holes"]
    assert by_case["record12"]["blocks.0.attn.q.weight"] != by_case["record31"]["blocks.0.attn.q.weight"]

if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: PYTHONPATH=src python tests/test_init_digests.py --write")
    cases = [f' {json.dumps(case)}: {{"rng": {json.dumps(v["rng"])}, "params": [\n'
             + ",\n".join(f"  {json.dumps(p)}" for p in v["params"]) + "]}" for case, v in record_all().items()]
    FIXTURE.write_text("{\n" + ",\n".join(cases) + "\n}\n")            # one line per parameter
    print(f"wrote {FIXTURE}")
