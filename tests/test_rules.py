"""The rules check between a candidate and its baseline, and how compare shows violations."""

import json
import re
from dataclasses import replace

import pytest

from speedrun import cli
from speedrun.analysis.comparison import compare_groups, one_group
from speedrun.analysis.groups import Group
from speedrun.analysis.rules import check_rules, violations
from test_logs import REFERENCE, needs_reference, our_log, write
from test_stats import record

GOOD = dict(train_data_sha256="a1" * 32, val_data_sha256="c3" * 32, val_tokens=10_485_760, world_size=8,
            gpu="NVIDIA H100 80GB HBM3", gpu_count=8, compile_flags=("torch.compile:dynamic=False",))


def group(name, n=3, **changes):
    runs = tuple(replace(record(f"{name}{i}.txt", 3.278 + i / 1000, 9e4 + i), **{**GOOD, **changes}) for i in range(n))
    return Group(name, name, name, runs)


def statuses(checks):
    return {c.rule: c.status for c in checks}


def test_all_rules_hold():
    checks = check_rules(group("b"), group("c"), 3.28)
    assert statuses(checks) == {r: "ok" for r in ("train data", "validation data", "validation tokens", "world size",
                                                  "GPUs", "compile flags")}
    assert violations(checks) == []


@pytest.mark.parametrize("change, rule, words", [
    (dict(train_data_sha256="b2" * 32), "train data",
     "train_data_sha256 differs: baseline a1a1a1a1a1a1, candidate b2b2b2b2b2b2"),
    (dict(val_data_sha256="d4" * 32), "validation data", "val_data_sha256 differs"),
    (dict(world_size=4), "world size", "world_size differs: baseline 8, candidate 4"),
    (dict(gpu="NVIDIA H200"), "GPUs", "baseline NVIDIA H100 80GB HBM3 x 8, candidate NVIDIA H200 x 8"),
    (dict(gpu_count=1), "GPUs", "candidate NVIDIA H100 80GB HBM3 x 1"),
    (dict(compile_flags=("torch.compile:dynamic=False", "inductor.coordinate_descent_tuning=True")),
     "compile flags", "candidate adds {inductor.coordinate_descent_tuning=True}"),
    (dict(compile_flags=()), "compile flags", "candidate drops {torch.compile:dynamic=False}"),
    (dict(val_tokens=5_000_000), "validation tokens", "val_tokens differs: baseline 10485760, candidate 5000000"),
])
def test_each_violation_is_named(change, rule, words):
    checks = check_rules(group("b"), group("c", **change), 3.28)
    assert statuses(checks)[rule] == "violation"
    assert [c.rule for c in checks if c.status == "violation"] == [rule]
    assert words in next(c.detail for c in checks if c.rule == rule)
    assert violations(checks) == [f"rule violated: {rule}: {c.detail}" for c in checks if c.rule == rule]


def test_a_side_that_mixes_values_is_a_violation():
    mixed = group("c")
    runs = mixed.runs[:2] + (replace(mixed.runs[2], val_data_sha256="e5" * 32),)
    checks = check_rules(group("b"), Group("c", "c", "c", runs), 3.28)
    detail = next(c.detail for c in checks if c.rule == "validation data")
    assert statuses(checks)["validation data"] == "violation" and detail.startswith("the candidate's runs differ")


def test_val_tokens_is_a_violation_only_for_the_public_target():
    small = dict(val_tokens=65_536)
    public = check_rules(group("b", **small), group("c", **small), 3.28)
    ours = check_rules(group("b", **small), group("c", **small), 7.0)
    assert statuses(public)["validation tokens"] == "violation" and statuses(ours)["validation tokens"] == "note"
    assert "not the public metric's 10,485,760" in next(c.detail for c in ours if c.rule == "validation tokens")


def test_unrecorded_facts_are_unknown_not_ok():
    checks = check_rules(group("b", train_data_sha256=None), group("c"), 3.28)
    assert statuses(checks)["train data"] == "unknown"
    empty = Group("e", "e", "e", (replace(record("e.txt", None, None, status="diverged"), **GOOD),))
    assert set(statuses(check_rules(group("b"), empty, 3.28)).values()) == {"unknown"}


def test_compare_shows_violations_in_json_markdown_and_console(tmp_path, capsys):
    header = {"train_data_sha256": "a" * 64, "val_data_sha256": "b" * 64, "val_tokens": 65536}
    for side, lr, device in (("baseline", 0.05, "cpu"), ("candidate", 0.04, "NVIDIA H200 x 1")):
        for seed in range(3):
            text, _ = our_log(seed=seed, device=device, losses=[10.8, 9.0, 8.0, 7.5, 6.9 - seed / 50 - lr],
                              config={"muon_lr": lr, "compile": side == "candidate"}, header=header)
            write(tmp_path / side / f"seed{seed}.txt", text)
    out_json, out_md = tmp_path / "cmp.json", tmp_path / "cmp.md"
    assert cli.main(["compare", str(tmp_path / "baseline"), str(tmp_path / "candidate"), "--target", "7",
                     "--json-out", str(out_json), "--markdown-out", str(out_md)]) == 0
    c = json.loads(out_json.read_text())
    assert {r["rule"]: r["status"] for r in c["rules"]} == {
        "train data": "ok", "validation data": "ok", "validation tokens": "note", "world size": "ok",
        "GPUs": "violation", "compile flags": "violation"}
    assert c["rules_ok"] is False and c["target"] == 7.0
    assert "rule violated: GPUs: GPU model and count differs: baseline CPU, candidate NVIDIA H200 x 1" in c["warnings"]
    assert any(w.startswith("rule violated: compile flags") and "config:compile=true" in w for w in c["warnings"])
    md = out_md.read_text()
    assert "> **Warning: 2 rule(s) violated**" in md and "| GPUs | **VIOLATION** |" in md
    assert "| validation tokens | note | val_tokens is 65,536 on both sides" in md
    console = capsys.readouterr().out
    assert re.search(r"^  GPUs\s+\*\*VIOLATION\*\*\s+GPU model and count differs", console, re.M)


@needs_reference
def test_public_records_pass_what_their_logs_record():
    folder = REFERENCE / "2026-05-20_BigramsSignTrick"
    c = compare_groups(one_group(str(folder / "baseline"), "B"), one_group(str(folder / "pr299"), "C"), target=3.28)
    assert statuses(c.rules) == {"train data": "unknown", "validation data": "unknown", "validation tokens": "ok",
                                 "world size": "unknown", "GPUs": "ok", "compile flags": "ok"}
    old = compare_groups(one_group(str(REFERENCE / "2025-01-16_Sub3Min"), "B"), one_group(str(folder / "pr299"), "C"))
    assert statuses(old.rules)["compile flags"] == "violation"  # Sub3Min still tuned with coordinate descent


def test_rules_ok_is_false_on_a_violation_none_when_a_rule_is_unknown_true_when_all_hold():
    from speedrun.analysis.comparison import rules_ok
    from speedrun.analysis.rules import RuleCheck

    ok, note = RuleCheck("world size", "ok", "8 on both sides"), RuleCheck("validation tokens", "note", "")
    unknown, bad = RuleCheck("train data", "unknown", ""), RuleCheck("GPUs", "violation", "")
    assert rules_ok([ok, note]) is True
    assert rules_ok([ok, unknown]) is None and rules_ok([unknown]) is None
    assert rules_ok([bad, unknown, ok]) is False
