"""Provenance read from logs: our header lines, and val_tokens / compile flags from public code dumps."""

import hashlib
import json

import pytest

from speedrun.analysis.logs import RunRecord, read_record
from speedrun.analysis.provenance import code_compile_flags, code_val_tokens, config_compile_flags
from speedrun.errors import SpeedrunError
from test_logs import REFERENCE, SEP, modded_log, needs_reference, our_log, write

PROVENANCE = {"git_commit": "0123456789abcdef0123456789abcdef01234567", "git_dirty": "false",
              "config_sha256": "a" * 64, "train_data_sha256": "b" * 64, "val_data_sha256": "c" * 64,
              "val_tokens": "65536", "compile_s": "12.5"}


def test_every_provenance_header_line_is_parsed(tmp_path):
    text, config = our_log(header=PROVENANCE, device="NVIDIA H200 x 2", world_size=2)
    r = read_record(write(tmp_path / "seed0.txt", text))
    assert (r.git_commit, r.git_dirty) == (PROVENANCE["git_commit"], False)
    assert (r.config_sha256, r.train_data_sha256, r.val_data_sha256) == ("a" * 64, "b" * 64, "c" * 64)
    assert (r.val_tokens, r.world_size, r.tokens_per_step, r.compile_s) == (65536, 2, 4096, 12.5)
    assert (r.device, r.gpu, r.gpu_count, r.seed) == ("NVIDIA H200 x 2", "NVIDIA H200", 2, 0)
    assert r.versions == {"python": "3.11.7", "torch": "2.13.0+cpu"}   # a CPU build: no CUDA
    assert r.compile_flags == ("config:compile=false",)
    # the code version of our runs is the commit plus the resolved config
    assert r.code_hash == hashlib.sha256(f"git {PROVENANCE['git_commit']}\n{config}".encode()).hexdigest()
    dirty = read_record(write(tmp_path / "d.txt", our_log(header={**PROVENANCE, "git_dirty": "true"})[0]))
    assert dirty.git_dirty is True and dirty.code_hash != r.code_hash


def test_missing_provenance_is_none(tmp_path):
    r = read_record(write(tmp_path / "seed0.txt", our_log()[0]))
    for key in ("git_commit", "git_dirty", "config_sha256", "train_data_sha256", "val_data_sha256", "val_tokens",
                "compile_s"):
        assert getattr(r, key) is None, key
    assert r.device == "cpu" and r.tokens_per_step == 4096


@pytest.mark.parametrize("line, match", [
    ("git_dirty: maybe", "git_dirty: maybe'.*true or false"),
    ("compile_s: fast", "compile_s: fast'.*seconds"),
    ("val_tokens: 1e6", "val_tokens: 1e6'.*integer"),
])
def test_bad_provenance_values_are_named(tmp_path, line, match):
    key, value = line.split(": ")
    text, _ = our_log(header={key: value})
    with pytest.raises(SpeedrunError, match=match):
        read_record(write(tmp_path / "bad.txt", text))


def test_config_must_be_a_json_object(tmp_path):
    text, config = our_log()
    with pytest.raises(SpeedrunError, match="header 'config': not valid JSON"):
        read_record(write(tmp_path / "a.txt", text.replace(config, "{steps: 4}")))
    with pytest.raises(SpeedrunError, match="expected a JSON object"):
        read_record(write(tmp_path / "b.txt", text.replace(config, "[1, 2]")))


def test_record_json_round_trip_keeps_provenance(tmp_path):
    r = read_record(write(tmp_path / "seed0.txt", our_log(header=PROVENANCE)[0]))
    obj = json.loads(json.dumps(r.to_json()))
    assert obj["compile_flags"] == ["config:compile=false"] and obj["git_dirty"] is False
    assert RunRecord.from_json(obj) == r
    old = {k: v for k, v in obj.items() if k not in PROVENANCE and k != "compile_flags"}  # a record from before
    assert RunRecord.from_json(old).git_commit is None and RunRecord.from_json(old).compile_flags is None


def test_config_compile_flags_nested_and_sorted():
    config = {"compile": True, "lr": 0.1, "model": {"compile_mode": "max-autotune", "dim": 64},
              "inductor_options": {"coordinate_descent_tuning": True}}
    assert config_compile_flags(config) == (
        "config:compile=true", "config:inductor_options.coordinate_descent_tuning=true",
        'config:model.compile_mode="max-autotune"')


def test_code_dump_compile_flags_and_val_tokens():
    code = b"\n".join([
        b"import torch",
        b"#torch._inductor.config.coordinate_descent_tuning = True # banned",
        b"torch._inductor.config.max_autotune = True  # new flag",
        b"x = torch._inductor.config.max_autotune",            # a read, not a setting
        b"if torch._dynamo.config.cache_size_limit == 8: pass",  # a comparison, not a setting
        b"torch._dynamo.config.cache_size_limit = 64",
        b"@torch.compile(dynamic=False, fullgraph=True)",
        b"def f(x): return x",
        b"model = torch.compile(model, mode=\"max-autotune\", options={\"a\": 1, \"b\": 2})",
        b"# model = torch.compile(model, dynamic=True)",
        b"class Hyperparameters:",
        b"    val_loss_every = 250",
        b"    val_tokens: int = 10_485_760 # fixed",
        b"    other_val_tokens = 5",
    ])
    assert code_compile_flags(code) == (
        "dynamo.cache_size_limit=64", "inductor.max_autotune=True", 'torch.compile:dynamic=False',
        'torch.compile:fullgraph=True', 'torch.compile:mode="max-autotune"',
        'torch.compile:options={"a": 1, "b": 2}')
    assert code_val_tokens(code) == 10_485_760
    assert code_val_tokens(b"val_tokens = args.val_tokens\n") is None


def test_modded_record_reads_the_code_dump(tmp_path):
    text = modded_log().replace("import os", "import os\nval_tokens = 1048576\n@torch.compile(dynamic=False)")
    r = read_record(write(tmp_path / "x.txt", text))
    assert r.val_tokens == 1048576 and r.compile_flags == ("torch.compile:dynamic=False",)
    assert r.git_commit is None and r.device is None and r.gpu_count == 8
    assert SEP not in text[:text.index("val_tokens")]


@needs_reference
def test_reference_logs_val_tokens_and_compile_flags():
    """Every public log after llm.c validates on 10,485,760 tokens; naive search in the text agrees."""
    for path in sorted(REFERENCE.rglob("*.txt")):
        r = read_record(path)
        code = path.read_text().split("\n" + SEP + "\n")[0]
        naive = [line for line in code.splitlines() if line.strip().startswith("val_tokens")]
        assert r.val_tokens == 10_485_760 and "10485760" in naive[0].replace("_", ""), path
        compiled = any("torch.compile(" in line and "dynamic=False" in line.split("#")[0]
                       for line in code.splitlines())
        assert ("torch.compile:dynamic=False" in r.compile_flags) == compiled, path
