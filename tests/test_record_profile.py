"""benchmarks/record_profile.py: the hook line patched into the records' own training loops (records #83, #87,
#88 and HEAD from ../shared/reference-code, skipped where absent), a script without that loop refused by name,
and the hook's profile of two steps written in the files and format of our ``gpu_speedrun.py --profile``."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT.parent / "shared" / "reference-code"
_SPEC = importlib.util.spec_from_file_location("record_profile", ROOT / "benchmarks" / "record_profile.py")
record_profile = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(record_profile)


@pytest.mark.parametrize("record", ["record83", "record87", "record88", "head"])
def test_patch_puts_the_hook_first_in_the_records_training_loop(record, tmp_path):
    src = REFERENCE / record / "train_gpt.py"
    if not src.exists():
        pytest.skip("../shared/reference-code is not beside the project")
    dst = tmp_path / "train_gpt.py"
    record_profile.patch(src, dst)
    before, after = src.read_text().splitlines(), dst.read_text().splitlines()
    assert len(after) == len(before) + 1
    at = after.index("for step in range(train_steps + 1):")
    assert after[at + 1] == "    " + record_profile.HOOK
    assert after[:at + 1] + after[at + 2:] == before
    compile(dst.read_text(), str(dst), "exec")                           # still a Python script


def test_patch_names_a_script_without_the_loop(tmp_path):
    src = tmp_path / "train_gpt.py"
    src.write_text("for step in range(10):\n    pass\n")
    with pytest.raises(SystemExit, match=r"train_gpt.py: expected one line .* found 0"):
        record_profile.patch(src, tmp_path / "out.py")


def test_the_hook_profiles_steps_first_to_first_plus_count(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))                 # the hook imports gpu_speedrun, as
    prefix = tmp_path / "profiles" / "record88"                           # on parity.sh's PYTHONPATH
    monkeypatch.setenv("RECORD_PROFILE_STEPS", "2,2")
    monkeypatch.setenv("RECORD_PROFILE_OUT", str(prefix))
    record_profile._from_environment.cache_clear()
    x = torch.randn(64, 64)
    for step in range(6):
        record_profile.at_step(step)
        for _ in range(step + 1):                                        # step s: s + 1 products
            x = torch.tanh(x @ x)
    trace = json.loads(gzip.open(f"{prefix}.trace.json.gz").read())["traceEvents"]
    products = [e for e in trace if e.get("name") == "aten::mm"]
    assert len(products) == 3 + 4                                        # steps 2 and 3 only
    assert Path(f"{prefix}.kernels.md").read_text().startswith("2 steps, wall ")
    assert "aten::mm" in Path(f"{prefix}.txt").read_text()


def test_a_malformed_step_range_is_refused(monkeypatch):
    monkeypatch.setenv("RECORD_PROFILE_STEPS", "3")
    record_profile._from_environment.cache_clear()
    with pytest.raises(SystemExit, match="RECORD_PROFILE_STEPS must be FIRST,COUNT"):
        record_profile.at_step(0)
